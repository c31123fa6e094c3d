"""Recompute a study's results.md from the per-run files committed beside it, and compare with the committed one.

    python experiments/recompute.py experiments/results/entropy_coverage

The study's folder holds results.md, results.json and runs/<arm>/seed<s>/ (config.json, events.jsonl, manifest.json,
the metrics the launcher reads, problems.jsonl.gz: `grpo_jax.study.archive_runs`). This script copies runs/ into a
scratch folder (problems unpacked), runs the launcher named by results.json's provenance command with
--summarize-only --out <scratch> (the launcher's own summarize, comparisons and tables; no training, no model), and
compares the recomputed results.md with the committed one line by line. Exit 0 when every line matches; 1 with the
lines that differ.

The launcher is the one of the commit that recorded the study (provenance `git.commit`, clean), extracted with
`git archive` into the scratch folder: the code that produced the tables recomputes them, so a later change to a
default (a new alarm rule in the run config the launcher checks each run against) cannot make a committed study
unrecomputable. `--code current` uses the working tree instead; so does a study recorded from a dirty tree or a
commit this clone does not have (said on stdout).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DROPPED = {"--jobs": 1, "--out": 1, "--quiet": 0}  # flags of the original command the recomputation replaces


def launcher_args(command: str) -> tuple[str, list[str]]:
    """(the launcher script, its arguments without --jobs, --out and --quiet) of a provenance command."""
    words = shlex.split(command)
    script = next(w for w in words if w.endswith(".py"))
    rest, args = words[words.index(script) + 1:], []
    while rest:
        word = rest.pop(0)
        flag = word.split("=", 1)[0]
        if flag in DROPPED:
            del rest[:DROPPED[flag] if "=" not in word else 0]
            continue
        args.append(word)
    return script, args


def unpack(runs: str, scratch: str) -> None:
    """runs/ into scratch/, problems.jsonl.gz unpacked to problems.jsonl."""
    for folder, _, files in os.walk(runs):
        target = os.path.join(scratch, os.path.relpath(folder, runs))
        os.makedirs(target, exist_ok=True)
        for name in files:
            src = os.path.join(folder, name)
            if name.endswith(".gz"):
                with gzip.open(src, "rb") as f, open(os.path.join(target, name[:-3]), "wb") as g:
                    g.write(f.read())
            else:
                shutil.copyfile(src, os.path.join(target, name))


def recorded_source(provenance: dict, scratch: str) -> str | None:
    """A copy of the recording commit's tree under `scratch` (its path), or None where the study was recorded
    from a dirty tree or this clone lacks the commit."""
    git = provenance.get("git") or {}
    commit = git.get("commit")
    if not commit or git.get("dirty", True):
        return None
    if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True).returncode:
        return None
    src = os.path.join(scratch, "source")
    os.makedirs(src)
    archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    return src


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", help="a study's results folder (results.md, results.json, runs/)")
    ap.add_argument("--code", choices=("recorded", "current"), default="recorded",
                    help="the launcher of the commit that recorded the study (default) or of this working tree")
    args = ap.parse_args(argv)
    with open(os.path.join(args.study, "results.json")) as f:
        provenance = json.load(f)["provenance"]
    command = provenance["command"]
    if not os.path.isdir(os.path.join(args.study, "runs")):
        print(f"{args.study}: no runs/ folder; nothing to recompute from", file=sys.stderr)
        return 1
    script, extra = launcher_args(command)
    with tempfile.TemporaryDirectory() as scratch:
        runs = os.path.join(scratch, "runs")
        unpack(os.path.join(args.study, "runs"), runs)
        src = recorded_source(provenance, scratch) if args.code == "recorded" else None
        if src is None and args.code == "recorded":
            print(f"{args.study}: recorded from a dirty tree or a commit this clone lacks; using the current code")
        root = src or ROOT
        cmd = [sys.executable, os.path.join(root, script), *extra, "--summarize-only", "--quiet", "--out", runs]
        env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
        if done.returncode:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            return 1
        with open(os.path.join(runs, "results.md")) as f:
            recomputed = f.read().splitlines()
    with open(os.path.join(args.study, "results.md")) as f:
        committed = f.read().splitlines()
    diff = list(difflib.unified_diff(committed, recomputed, "committed", "recomputed", lineterm="", n=0))
    code = f"the code of {provenance['git']['commit'][:12]}" if src else "the current code"
    print(f"{' '.join([script, *extra])} --summarize-only ({code}): {len(committed)} lines, " + ("all equal" if not diff else f"{len(diff)} diff lines"))
    print("\n".join(diff))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
