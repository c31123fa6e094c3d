"""The study framework: multi-arm, multi-seed studies on one setting (the reward- and entropy-collapse studies,
the bf16 gap study; `experiments/<study>.py` are their launchers).

    from grpo_jax import study
    run = study.launch(argv, doc=__doc__, get_config=get_config, arms=ARMS, ...)  # run.study: the results

Per seed, one supervised warm start is shared by every arm (same starting policy, so arms differ only in
what the arm changes), or with `warm_seed` one warm start is shared by every seed too (seeds then vary only
the RL: sampling and data order); each arm is then a GRPO run in `<out>/<arm>/seed<k>/` with its own report files.
`--jobs N` splits the runs over N processes pinned one core each (`job_splits`, `run_jobs`). The study writes
`<out>/results.json`, `<out>/results.md` and comparison plots under `<out>/plots/` (`reporting.write_study`, `reporting.plot_curves`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gzip
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any

import flax.serialization
import numpy as np

from grpo_jax.cli import out_dir, parse_args
from grpo_jax import aot, interrupts, runlock, stats
from grpo_jax.assemble import RunParts, assemble
from grpo_jax.config import TrainConfig, flat_dict, from_dict, override, to_dict
from grpo_jax.fileio import atomic_write, atomic_write_text
from grpo_jax.provenance import package_versions, source_digest
from grpo_jax.runlog import read_jsonl
from grpo_jax.sft import warm_start
from grpo_jax.train import Trainer
from grpo_jax.train import main as train_main


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of a study: config overrides, plus optionally what happens mid-run.

    reload_at / reload_weights: at step `reload_at` the run's reward-weights file is rewritten with
    `reload_weights` ({dimension: weight}); the trainer re-reads it on the next step (the hot reload a
    researcher does by editing the file). The run is stopped at that step and resumed in the same
    directory, so the switch step is exact and the run stays reproducible.
    switch_at / switch: from step `switch_at` on the run trains with the extra overrides `switch` (a control
    switched on at a fixed step: stopped at that step and resumed with them, as a reload).
    on_pause: when an alarm pauses the run, run the rollback command the pause report names, with these
    extra overrides (the documented recovery), and continue to the configured steps; with `pause_resume`,
    continue from the paused step itself with them instead (no rollback)."""

    overrides: tuple = ()
    reload_at: int = 0
    reload_weights: tuple = ()  # ((dimension, weight), ...)
    switch_at: int = 0
    switch: tuple = ()
    on_pause: tuple | None = None
    pause_resume: bool = False


RECOMPUTE = "sampling.old_logp_source=recompute"
WARM_START_WAIT = 4 * 3600.0  # seconds a process waits for another one training the same warm start (--jobs)

# The objectives a researcher ablates on either collapse study's setting, one name each (--arms NAME):
# not run by default; each is the study's base config with one change (docs/algorithms.md §3-§4).
OBJECTIVE_ARMS = {
    "gspo": Arm(("loss.policy_loss=gspo",)),
    "cispo": Arm(("loss.policy_loss=cispo",)),
    "sapo": Arm(("loss.policy_loss=sapo",)),
    "gmpo": Arm(("loss.policy_loss=gmpo",)),
    "dppo_tv": Arm(("loss.policy_loss=dppo_tv",)),
    "dppo_kl": Arm(("loss.policy_loss=dppo_kl",)),
    "passk": Arm(("advantage.estimator=passk",)),
    "mask_truncated": Arm(("loss.mask_truncated=true",)),
    "tis": Arm((RECOMPUTE, "loss.tis_cap=2.0")),
    "icepop": Arm((RECOMPUTE, "loss.icepop=[0.5, 5.0]")),
    "opsm": Arm(("loss.opsm_delta=0.5",)),
    # staleness: one-step off-policy rollouts (rollout.off_policy_steps), the PPO ratio against the policy that
    # sampled them; and the same with truncated IS against the trainer's own pre-update logprobs
    "off_policy": Arm(("rollout.off_policy_steps=1",)),
    "off_policy_tis": Arm(("rollout.off_policy_steps=1", RECOMPUTE, "loss.tis_cap=2.0")),
}


def select_arms(arms: dict, names: str | None, extra: dict | None = None) -> dict:
    """The study's own arms (all of them without --arms), or the ones --arms names, in the order given; the
    names of `extra` (a study's arms that it does not run by default) and of OBJECTIVE_ARMS are accepted too.
    An unknown name is an error listing the known ones."""
    if not names:
        return dict(arms)
    extra = extra or {}
    known = {**arms, **extra, **{k: v for k, v in OBJECTIVE_ARMS.items() if k not in arms and k not in extra}}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        also = f"; not run by default: {', '.join(extra)}" if extra else ""
        raise SystemExit(f"--arms: unknown arm(s) {', '.join(unknown)}; this study's arms: {', '.join(arms)}{also}; "
                         f"objective arms: {', '.join(OBJECTIVE_ARMS)}")
    return {n: known[n] for n in wanted}


def study_settings(args, cfg: TrainConfig, default_out: str, *, warm: dict, smoke_warm: dict,
                   warm_seed_default: int | None = None, default_seeds: tuple = ()):
    """(out dir, seeds, warm-start settings, warm-start seed) shared by the studies: --seeds, else
    `default_seeds` (a study's pre-registered seeds), else 3 from cfg.seed (one with --smoke); the
    study's warm start (`sft.warm_start` keywords plus n_valid; `smoke_warm` and one seed with --smoke) and the
    seed of the one warm start every seed and arm starts from (--warm-seed, else `warm_seed_default`, else
    cfg.seed; None for -1: one warm start per seed)."""
    out = out_dir(args, default_out)
    seeds = [cfg.seed] if args.smoke else list(default_seeds) or [cfg.seed, cfg.seed + 1, cfg.seed + 2]
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
    chosen = args.warm_seed if args.warm_seed is not None else warm_seed_default
    warm_seed = cfg.seed if chosen is None else (None if chosen == -1 else chosen)
    return out, seeds, dict(smoke_warm if args.smoke else warm), warm_seed


@dataclasses.dataclass(frozen=True)
class Launched:
    """What `launch` did: the parsed command line, the base config, the output folder, the arms that ran,
    the seed of the shared warm start and the study's results (`run_study`)."""

    args: Any
    cfg: TrainConfig
    out: str
    arms: dict
    warm_seed: int
    study: dict


def launch(argv, *, doc: str, get_config, arms: dict, default_out: str, summarize, warm: dict, smoke_warm: dict,
           smoke_arms: dict | None = None, extra_arms: dict | None = None, smoke_extra_arms: dict | None = None,
           warm_seed_default: int | None = None, default_seeds: tuple = ()) -> Launched:
    """What every study's main() starts with: parse the command line, pick the arms (`select_arms`; from
    `smoke_arms` with --smoke when given; `extra_arms` by name only, `smoke_extra_arms` with --smoke), train
    (or with --summarize-only collect) every arm and seed. `warm_seed_default`: the --warm-seed when none is
    given (-1: each seed its own warm start; None: cfg.seed's for all); `default_seeds`: the seeds without --seeds.

    --jobs N re-runs the script that defines `get_config` (the launcher) in N process slots."""
    args, cfg = parse_args(argv, description=doc, get_config=get_config, default_out=default_out)
    if args.compile_only:  # the study's base config (its arms change the objective, not the shapes)
        return aot.compile_only(args, cfg)
    out, seeds, sft, warm_seed = study_settings(args, cfg, default_out, warm=warm, smoke_warm=smoke_warm,
                                                warm_seed_default=warm_seed_default, default_seeds=default_seeds)
    extra = smoke_extra_arms if args.smoke and smoke_extra_arms else extra_arms
    arms = select_arms(smoke_arms if args.smoke and smoke_arms else arms, args.arms, extra)
    if args.jobs < 1:
        raise SystemExit(f"--jobs: {args.jobs}; give 1 or more processes")
    wall = None
    if args.jobs > 1 and not args.summarize_only:
        script = os.path.abspath(sys.modules[get_config.__module__].__file__)
        argv = list(sys.argv[1:] if argv is None else argv)
        jobs = [[[sys.executable, script, *argv, *extra, "--jobs", "1", "--quiet"] for extra in pieces]
                for pieces in job_splits(arms, seeds, args.jobs)]
        wall = run_jobs(jobs, os.path.join(out, "jobs"))
    study = run_study(cfg, arms, seeds=seeds, out=out, sft=sft, quiet=args.quiet, summarize=summarize,
                      summarize_only=args.summarize_only or wall is not None, warm_seed=warm_seed)
    if wall is not None:
        study["wall_seconds"], study["jobs"] = wall, len(jobs)
    return Launched(args=args, cfg=cfg, out=out, arms=arms, warm_seed=warm_seed, study=study)


def job_splits(arms: dict, seeds: list[int], jobs: int) -> list[list[list[str]]]:
    """--jobs: what each process slot trains, as the extra arguments of the processes it runs one after
    another. The runs (arm, seed), seed by seed, are cut into `jobs` contiguous shares whose sizes differ by at
    most one run (13 arms x 3 seeds on 2 jobs: 20 and 19 runs); a share is one process per stretch of seeds with
    the same arms (`--arms A,B --seeds 0,1`). Seed by seed, so the slots mostly need different warm starts: each
    is trained once (`kept_warm_start`) and read from disk by any other process, and a slot rarely waits while
    another trains the one it needs (split arm by arm, every slot would want each seed's warm start at once).
    Argparse keeps the last value of a repeated option, so these override the parent's own --arms / --seeds."""
    runs = [(a, s) for s in seeds for a in arms]
    n = max(1, min(jobs, len(runs)))
    sizes = [len(runs) // n + (k < len(runs) % n) for k in range(n)]
    out, at = [], 0
    for size in sizes:
        share, at = runs[at:at + size], at + size
        # [(seed, [arms])] in the study's order, then neighbouring seeds with the same arms share a process
        by_seed = [(s, [a for a, _ in g]) for s, g in itertools.groupby(share, key=lambda r: r[1])]
        pieces = [(aa, [s for s, _ in g]) for aa, g in itertools.groupby(by_seed, key=lambda p: p[1])]
        out.append([["--arms", ",".join(aa), "--seeds", ",".join(map(str, ss))] for aa, ss in pieces])
    return out


def run_jobs(jobs: list[list[list[str]]], log_dir: str) -> float:
    """Run the process slots `jobs` at once, each its commands one after another, slot k pinned to core k mod
    the cores this process may use (a one-core process has its own float reduction order, the same on every
    run: the shipped study results were trained that way), its output in `log_dir/job<k>.log`. Waits for all;
    a slot stops at its first failed command. SystemExit naming each failed slot's log and its last lines.
    Returns the wall seconds."""
    os.makedirs(log_dir, exist_ok=True)
    pin = hasattr(os, "sched_setaffinity")
    cores = sorted(os.sched_getaffinity(0)) if pin else []

    def slot(k: int) -> tuple[int, str]:
        log = os.path.join(log_dir, f"job{k}.log")
        if pin:  # this thread only (Linux: pid 0 is the calling thread); the processes it starts inherit it
            os.sched_setaffinity(0, {cores[k % len(cores)]})
        with open(log, "w") as f:
            for cmd in jobs[k]:
                f.write(f"$ {shlex.join(cmd)}\n")
                f.flush()
                rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    return rc, log
        return 0, log

    start = time.perf_counter()
    for k, cmds in enumerate(jobs):
        where = f" (core {cores[k % len(cores)]})" if pin else ""
        print(f"job {k}{where}, {len(cmds)} process(es), log {os.path.join(log_dir, f'job{k}.log')}:", flush=True)
        for cmd in cmds:
            print(f"    {shlex.join(cmd[1:])}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        ended = list(pool.map(slot, range(len(jobs))))
    failed = [(rc, log) for rc, log in ended if rc != 0]
    if failed:
        tails = [f"{log} (exit {rc}):\n" + "".join(open(log).readlines()[-15:]) for rc, log in failed]
        raise SystemExit("--jobs: a job failed; the finished runs stay in place\n" + "\n".join(tails))
    return time.perf_counter() - start


def warm_start_note(warm_seed: int | None, accuracy: float = 0.30) -> str:
    """How the arms' starting policy was made (to `accuracy` greedy validation accuracy), for the results' notes."""
    if warm_seed is None:
        return f"warm start to {accuracy:.0%} validation accuracy per seed (shared by the arms of a seed)"
    return (f"one warm start to {accuracy:.0%} validation accuracy (seed {warm_seed}) shared by every seed and arm, so "
            "seeds vary the RL alone (sampling, data order, held-out rows)")


def _collect_finished(base: TrainConfig, arms, seeds, out: str, summarize, warm_seed: int | None) -> dict:
    """--summarize-only: the figures of every (arm, seed) run under `out` that finished all its steps
    (`warm_seed` as the runs were trained with: it is recorded, not checked)."""
    results = {arm: [] for arm in arms}
    for seed in seeds:
        for arm in arms:
            path = os.path.join(out, arm, f"seed{seed}", "metrics.jsonl")
            rows = read_jsonl(path) if os.path.exists(path) else []
            if not rows or max(r.get("step", -1) for r in rows) < base.steps:
                print(f"summarize-only: {arm} seed {seed} missing or unfinished ({path}); left out")
                continue
            check_run_config(os.path.dirname(path), override(base, [f"seed={seed}", *arms[arm].overrides]),
                             skip=segment_skip(arms[arm]))
            results[arm].append({**summarize(rows), **run_events(os.path.dirname(path)), "seed": seed,
                                 "warm_seed": seed if warm_seed is None else warm_seed})
    return {"results": {a: r for a, r in results.items() if r}, "seeds": list(seeds), "wall_seconds": 0.0}


def segment_skip(arm: Arm) -> tuple[str, ...]:
    """The config.json fields `check_run_config` cannot compare for this arm: a reload or switch arm's
    config.json is written by its first segment (steps = that step), and a reload arm names its own weights
    file."""
    return ("rewards.weights.weights_file", "steps") if arm.reload_at else ("steps",) if arm.switch_at else ()


def check_run_config(run_dir: str, expected: TrainConfig, skip: tuple[str, ...] = ()) -> None:
    """--summarize-only merges run folders trained by separate processes, and a resumed study continues the
    folders a stopped one left: each one's config.json must be the config its arm and seed would train with now (a field the record lacks counts when `expected` has that
    field's default: the run predates the field). Else SystemExit naming the folder and the fields."""
    path = os.path.join(run_dir, "config.json")
    with open(path) as f:
        recorded = flat_dict(json.load(f))
    want, default = flat_dict(to_dict(expected)), flat_dict(to_dict(TrainConfig()))
    wrong = [f"{k} = {recorded[k]!r}, the arm trains with {v!r}" if k in recorded else f"{k} missing"
             for k, v in want.items()
             if k not in skip and (recorded[k] != v if k in recorded else v != default.get(k))]
    if wrong:
        raise SystemExit(f"{path} is not this arm's run: {'; '.join(wrong)}")


def run_events(run_dir: str) -> dict:
    """What a run's events.jsonl says happened: the step it paused at (None) and the step a rollback
    restarted it from (None)."""
    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    pauses = [e["step"] for e in events if e["kind"] == "pause"]
    rollbacks = [e["to_step"] for e in events if e["kind"] == "rollback"]
    return {"paused_at": pauses[0] if pauses else None, "rolled_back_to": rollbacks[0] if rollbacks else None}


def run_progress(run_dir: str, steps: int) -> dict:
    """Where a study's run folder stands, from its own files: {"done": every step logged; "paused_at": the step
    of a pause with nothing logged after it (None); "paused": whether any alarm paused it; "rollback": the
    config of the last rollback (None); "checkpoint": the newest checkpoint's step (None)}."""
    read = lambda name: read_jsonl(path) if os.path.exists(path := os.path.join(run_dir, name)) else []  # noqa: E731
    rows = read("metrics.jsonl")
    last = max((r.get("step", -1) for r in rows), default=-1)
    events = read("events.jsonl")
    marks = [e for e in events if e["kind"] in ("pause", "rollback")]
    paused_at = marks[-1]["step"] if marks and marks[-1]["kind"] == "pause" and marks[-1]["step"] >= last else None
    rollbacks = [e["config"] for e in events if e["kind"] == "rollback"]
    checkpoints = os.path.join(run_dir, "checkpoints")
    kept = [int(n) for n in os.listdir(checkpoints) if n.isdigit()] if os.path.isdir(checkpoints) else []
    return {"done": last >= steps, "paused_at": paused_at, "paused": any(e["kind"] == "pause" for e in events),
            "rollback": rollbacks[-1] if rollbacks else None, "checkpoint": max(kept) if kept else None}


def arm_segments(cfg: TrainConfig, arm: Arm) -> list[tuple[int, TrainConfig]]:
    """The stretches an arm trains in, as (last step, config): one for most arms; a reload or a switch ends
    the first at its step (the config then says steps = that step) and trains the rest with the switch."""
    at = arm.reload_at or arm.switch_at
    if not at:
        return [(cfg.steps, cfg)]
    return [(at, override(cfg, [f"steps={at}"])), (cfg.steps, override(cfg, list(arm.switch)))]


def run_arm(cfg: TrainConfig, arm: Arm, run_dir: str, params, *, quiet: bool) -> None:
    """Train one arm from `params` in `run_dir` (see `Arm` for reloads, switches and pauses), or finish it: a
    folder a killed study left behind resumes from its newest checkpoint (`run_progress`; a folder with logs
    but no checkpoint starts again, `Trainer` sets its logs aside), a finished one is left as it is."""
    progress = run_progress(run_dir, cfg.steps)
    if progress["done"] or (progress["paused_at"] is not None and arm.on_pause is None):
        return
    if progress["paused_at"] is None:
        summary = _train_segments(cfg, arm, run_dir, params, progress, quiet=quiet)
        if summary is None or not summary["paused"] or arm.on_pause is None:
            return
        paused_at = summary["steps"]
    else:
        paused_at = progress["paused_at"]
    _continue_after_pause(cfg, arm, run_dir, paused_at, quiet=quiet)


def _train_segments(cfg: TrainConfig, arm: Arm, run_dir: str, params, progress: dict, *, quiet: bool):
    """`run_arm` before any pause it handles: train (or resume) each remaining segment; the last summary."""
    if progress["rollback"] is not None:  # rolled back after a pause: go on with the rollback's config
        return _train(Trainer(from_dict(TrainConfig, progress["rollback"]), run_dir, resume=True, quiet=quiet))
    if progress["paused"] and arm.pause_resume:  # continued after a pause with the arm's recovery
        return _train(Trainer(override(cfg, list(arm.on_pause)), run_dir, resume=True, quiet=quiet))
    summary, at = None, progress["checkpoint"]
    for end, seg_cfg in arm_segments(cfg, arm):
        if at is not None and at >= end:
            continue
        if arm.reload_at and end == cfg.steps:  # idempotent: a resumed study writes the same file again
            atomic_write_text(cfg.rewards.weights.weights_file, json.dumps(dict(arm.reload_weights)))
        trainer = Trainer(seg_cfg, run_dir, resume=at is not None, quiet=quiet)
        if at is None:
            trainer.set_params(params)
        summary, at = _train(trainer), end
        if summary["paused"]:
            return summary
    return summary


def _train(trainer: Trainer) -> dict:
    """`trainer.run()`; a run that Ctrl-C or SIGTERM stopped (checkpointed at the step reached) ends the study
    process with one line naming the run (`interrupts.exit_interrupted`): the same study command resumes it."""
    summary = trainer.run()
    if summary["interrupted"]:
        interrupts.exit_interrupted(summary["interrupted"], step=summary["steps"], steps=trainer.cfg.steps,
                                    run=trainer.out_dir, again="the same study command")
    return summary


def _continue_after_pause(cfg: TrainConfig, arm: Arm, run_dir: str, paused_at: int, *, quiet: bool) -> None:
    """The arm's recovery from the pause at `paused_at`: resume there with `on_pause` (`pause_resume`), or run
    the rollback command of the pause's alarm report with `on_pause` added."""
    if arm.pause_resume:
        _train(Trainer(override(cfg, list(arm.on_pause)), run_dir, resume=True, quiet=quiet))
        return
    report = json.loads(open(os.path.join(run_dir, "alarms", f"step-{paused_at}.json")).read())
    argv = shlex.split(report["rollback_command"])[3:]  # drop "python -m grpo_jax.train"
    train_main(argv + [x for o in arm.on_pause for x in ("--set", o)] + ["--quiet"])


def run_study(base: TrainConfig, arms: dict[str, Arm], *, seeds, out: str, sft: dict, quiet: bool,
              summarize, summarize_only: bool = False, warm_seed: int | None = None) -> dict:
    """Train every (arm, seed) from the seed's shared warm start; `summarize(rows) -> dict` turns one run's
    metrics into its figures (plus seed, warm-start steps and what the arm's run did: paused, rolled back).
    A study stopped at any point (kill -9 included) resumes with the same call: finished runs are kept, a
    stopped one continues from its newest checkpoint (`run_arm`), kept warm starts are read back.

    summarize_only: train nothing; collect the figures of every (arm, seed) run already under `out` that
    finished all its steps (seeds trained in separate processes with --seeds land in the same tree).
    warm_seed: train one warm start with this seed and start every seed's arms from it (None: one per seed)."""
    if summarize_only:
        return _collect_finished(base, arms, seeds, out, summarize, warm_seed)
    results = {arm: [] for arm in arms}
    start = time.perf_counter()
    sft = dict(sft)
    n_valid = sft.pop("n_valid", 100)
    warm_starts = {}  # warm-start seed -> (params, summary)
    for seed in seeds:
        seed_cfg = override(base, [f"seed={seed}"])
        ws = seed if warm_seed is None else warm_seed
        if ws not in warm_starts:
            warm_starts[ws] = kept_warm_start(override(base, [f"seed={ws}"]),
                                              os.path.join(out, "warm_start", f"seed{ws}"), n_valid, sft)
        params, sft_summary = warm_starts[ws]
        for name, arm in arms.items():
            run_dir = os.path.join(out, name, f"seed{seed}")
            cfg = override(seed_cfg, list(arm.overrides))
            if arm.reload_at:  # the file starts empty (base weights) and is rewritten at reload_at
                wfile = os.path.join(os.path.abspath(run_dir), "weights.json")
                os.makedirs(run_dir, exist_ok=True)
                atomic_write_text(wfile, "{}")
                cfg = override(cfg, [f"rewards.weights.weights_file={wfile}"])
            if os.path.exists(os.path.join(run_dir, "config.json")):  # left by an earlier, stopped study
                check_run_config(run_dir, cfg, skip=segment_skip(arm))
            run_arm(cfg, arm, run_dir, params, quiet=quiet)
            figures = summarize(read_jsonl(os.path.join(run_dir, "metrics.jsonl")))
            figures.update(seed=seed, warm_seed=ws, sft_steps=sft_summary["sft_steps"], **run_events(run_dir))
            results[name].append(figures)
            if not quiet:
                print(f"{name} seed {seed}: {figures}", flush=True)
    return {"results": results, "seeds": list(seeds), "wall_seconds": time.perf_counter() - start}


def kept_warm_start(cfg: TrainConfig, run_dir: str, n_valid: int, sft: dict):
    """The supervised warm start of `cfg.seed` (model init, data order, validation rows): (params, summary).

    Kept in `run_dir` (warm_start.msgpack, and warm_start.json with what made it): a later process of the same
    study (another --jobs piece, a rerun of one arm) loads it instead of training it again when the config,
    the warm-start settings and n_valid are the same, so every arm of a study starts from the same bits even
    when processes differ in core count (a one-core and a two-core process train different warm starts).
    Processes wanting the same warm start take turns: the run_dir lock is waited for (up to WARM_START_WAIT
    seconds), so the second one loads what the first trained."""
    lock = runlock.acquire(run_dir, wait=WARM_START_WAIT)
    try:
        return _load_or_train_warm_start(assemble(override(cfg, ["logging.tensorboard=false"])), run_dir, n_valid,
                                         sft)
    finally:
        lock.release()


def _load_or_train_warm_start(warm: RunParts, run_dir: str, n_valid: int, sft: dict):
    """`kept_warm_start` inside the warm-start folder's lock: load the kept one, or train and keep it."""
    cfg = warm.cfg
    made_by = json.loads(json.dumps({"config": to_dict(cfg), "sft": sft, "n_valid": n_valid,
                                     "code": source_digest(), "packages": package_versions()}))
    meta_path, blob_path = (os.path.join(run_dir, f"warm_start.{x}") for x in ("json", "msgpack"))
    template = warm.policy_params(warm.state)
    if os.path.exists(meta_path) and os.path.exists(blob_path):
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("made_by") == made_by:
            with open(blob_path, "rb") as f:
                params = flax.serialization.from_bytes(template, f.read())
            print(f"warm start: loaded {blob_path}", flush=True)
            return params, meta["summary"]
        print(f"warm start: {meta_path} was made with other settings; training it again", flush=True)
    valid = warm.task.generate("valid", n_valid, cfg.seed)
    params, summary = warm_start(warm.actor, template, warm.rows, valid,
                                 solution=warm.task.solutions, seed=cfg.seed, log=(lambda *_: None), **sft)
    blob = flax.serialization.to_bytes(params)
    atomic_write(blob_path, lambda f: f.write(blob))  # the blob first: a json without it is never read
    atomic_write_text(meta_path, json.dumps({"made_by": made_by, "summary": summary}, indent=1, default=float))
    return params, summary


# ---- the per-run files a study commits, so every table can be recomputed without the runs ---------------------

ARCHIVED = ("config.json", "config_history.jsonl", "events.jsonl", "manifest.json")  # copied as they are


def archive_runs(out: str, dest: str, arms, seeds, *, metric_keys: tuple[str, ...]) -> dict:
    """Copy each finished (arm, seed) run under `out` into `dest`/<arm>/seed<s>/ as a study commits it: its
    config, events and manifest as they are, problems.jsonl gzipped, and metrics.jsonl cut to the rows and keys
    that start with one of `metric_keys` (plus "step"): what the launcher's summarize and plots read. A launcher's
    --summarize-only over `dest` then recomputes its tables from these files alone. Returns {path: bytes}."""
    sizes = {}
    for arm in arms:
        for seed in seeds:
            src, dst = os.path.join(out, arm, f"seed{seed}"), os.path.join(dest, arm, f"seed{seed}")
            if not os.path.exists(os.path.join(src, "metrics.jsonl")):
                continue
            os.makedirs(dst, exist_ok=True)
            for name in ARCHIVED:
                if os.path.exists(os.path.join(src, name)):
                    shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))
            rows = [{k: v for k, v in r.items() if k == "step" or k.startswith(metric_keys)}
                    for r in read_jsonl(os.path.join(src, "metrics.jsonl"))]
            atomic_write_text(os.path.join(dst, "metrics.jsonl"),
                              "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows if len(r) > 1))
            if os.path.exists(os.path.join(src, "problems.jsonl")):
                with open(os.path.join(src, "problems.jsonl"), "rb") as f:
                    blob = gzip.compress(f.read(), mtime=0)
                atomic_write(os.path.join(dst, "problems.jsonl.gz"), lambda f: f.write(blob))
            sizes.update({os.path.join(dst, n): os.path.getsize(os.path.join(dst, n)) for n in os.listdir(dst)})
    return sizes


# ---- paired statistics between arms: per-problem results of the final evaluation (problems.jsonl) -------------

def publish(out: str, arms, seeds, *, metric_keys: tuple[str, ...]) -> dict:
    """The end of a study that commits its runs: the per-run files archived under `out`/runs (`archive_runs`),
    results.md printed, and a line saying where the files are and how to recompute from them. Returns {path: bytes}."""
    sizes = archive_runs(out, os.path.join(out, "runs"), arms, seeds, metric_keys=metric_keys)
    with open(os.path.join(out, "results.md")) as f:
        print(f.read())
    print(f"per-run files for the repository: {os.path.join(out, 'runs')} ({len(sizes)} files, "
          f"{sum(sizes.values()) / 1e6:.2f} MB); python experiments/recompute.py <its folder> recomputes results.md")
    return sizes


def problem_scores(run_dir: str, metric: str) -> np.ndarray | None:
    """[P] per-problem score of a run's final evaluation: "greedy" (0/1 correct) or "t1" (the fraction of the
    k samples at T = 1 that are correct); None when the run logged no such evaluation."""
    path = os.path.join(run_dir, "problems.jsonl")
    rows = [r for r in read_jsonl(path) if metric == "greedy" or "t1_correct" in r] if os.path.exists(path) else []
    if not rows:
        return None
    last = rows[-1]
    return (np.asarray(last["greedy_correct"], float) if metric == "greedy"
            else np.asarray(last["t1_correct"], float) / last["samples"])


def arm_scores(out: str, arm: str, seeds, metric: str) -> np.ndarray | None:
    """[S, P] `problem_scores` of one arm over the seeds (paired by seed index with every other arm: seed s of
    each arm evaluates the same held-out problems); None when a seed has none."""
    scores = [problem_scores(os.path.join(out, arm, f"seed{s}"), metric) for s in seeds]
    return None if any(x is None for x in scores) else np.stack(scores)


def compare_arms(out: str, arms, seeds, *, baseline: str, null: str | None = None, metric: str = "greedy",
                 n_boot: int = 10_000) -> dict:
    """Each arm against `baseline` on the per-problem `metric` of the final evaluation: the paired bootstrap 95%
    CI of the difference over seeds and problems (`stats.paired_bootstrap_ci`), McNemar per seed (greedy only)
    and, with a `null` arm (the baseline with only its rollout key changed: `sampling.key_offset`), the noise
    floor it calibrates and each arm's verdict (`stats.verdict`: a win must clear the floor). {} when the
    baseline has no per-problem results."""
    base = arm_scores(out, baseline, seeds, metric)
    if base is None:
        return {}
    null_scores = arm_scores(out, null, seeds, metric) if null else None
    floor = stats.noise_floor(base, null_scores, n_boot=n_boot) if null_scores is not None else None
    result = {"baseline": baseline, "metric": metric, "seeds": list(seeds), "noise_floor": floor, "arms": {}}
    for arm in arms:
        scores = arm_scores(out, arm, seeds, metric)
        if arm == baseline or scores is None:
            continue
        ci = stats.paired_bootstrap_ci(base, scores, n_boot=n_boot)
        entry = {"diff": ci, "verdict": stats.verdict(ci, floor) if floor else None}
        if metric == "greedy":
            entry["mcnemar"] = [stats.mcnemar(a > 0.5, b > 0.5) for a, b in zip(base, scores)]
        result["arms"][arm] = entry
    return result


def compare_seeds(results: dict, *, baseline: str, metric: str, arms, null: str | None = None,
                  level: float = 0.95, family: int | None = None, sesoi: float | None = None) -> dict:
    """Each of `arms` against `baseline` on one per-run figure (`metric`, a key of the arms' summaries), paired by
    seed: the paired t-interval over seeds (`stats.paired_t_ci`, the seed as the unit), the same at the
    Bonferroni level 1 - (1 - level) / family (the pre-registered comparisons; default len(arms)), and with a `null` arm (the
    baseline with only its rollout key changed) the noise floor, floor = max(|low|, |high|) of null - baseline,
    and each arm's `stats.verdict`. Only seeds present in both arms (and the null) are paired; an arm with
    fewer than 2 such seeds is left out.

    sesoi (the smallest effect of interest, in the metric's units): also each arm's paired t-test, Holm's
    adjustment over every arm of the table (`stats.holm`: the family is what the table prints), the equivalence
    test at +-sesoi (`stats.paired_tost`) and a `decision`: "win" / "loss" when the Holm-adjusted p is below
    1 - level and the difference clears the noise floor in its direction, else "equivalent" when the TOST p is
    below 1 - level (the effect is smaller than sesoi), else "inconclusive" (too few seeds to tell)."""
    by_seed = {a: {r["seed"]: r[metric] for r in results.get(a, []) if r.get(metric) is not None} for a in results}
    base = by_seed.get(baseline, {})
    family = family or max(1, len(arms))
    out = {"baseline": baseline, "metric": metric, "level": level, "family": family,
           "adjusted_level": 1 - (1 - level) / family, "noise_floor": None, "arms": {}}
    if null in by_seed:
        seeds = sorted(set(base) & set(by_seed[null]))
        if len(seeds) >= 2:
            ci = stats.paired_t_ci([base[s] for s in seeds], [by_seed[null][s] for s in seeds], level=level)
            out["noise_floor"] = {**ci, "floor": max(abs(ci["low"]), abs(ci["high"])), "seed_list": seeds}
    for arm in arms:
        seeds = sorted(set(base) & set(by_seed.get(arm, {})))
        if arm == baseline or len(seeds) < 2:
            continue
        a, b = [base[s] for s in seeds], [by_seed[arm][s] for s in seeds]
        ci = stats.paired_t_ci(a, b, level=level)
        entry = {"diff": ci, "adjusted": stats.paired_t_ci(a, b, level=out["adjusted_level"]), "seed_list": seeds,
                 "verdict": stats.verdict(ci, out["noise_floor"]) if out["noise_floor"] else None}
        out["arms"][arm] = entry
    if sesoi is not None:
        _decide(out, sesoi, 1.0 - level)
    return out


def _decide(comparison: dict, sesoi: float, alpha: float) -> None:
    """`compare_seeds`' tests, Holm's adjustment over the table's arms and each arm's decision, in place."""
    entries = comparison["arms"]
    floor = comparison["noise_floor"]["floor"] if comparison["noise_floor"] else 0.0
    for e in entries.values():
        d = e["diff"]["per_seed"]
        e["test"] = stats.paired_t_test(np.zeros(len(d)), d)
        e["tost"] = stats.paired_tost(np.zeros(len(d)), d, margin=sesoi, alpha=alpha)
    for e, adj in zip(entries.values(), stats.holm([e["test"]["p_value"] for e in entries.values()])):
        diff = e["diff"]["diff"]
        e["holm_p"] = adj
        e["decision"] = ("win" if adj < alpha and diff > max(floor, 0.0) else
                         "loss" if adj < alpha and diff < -floor else
                         "equivalent" if e["tost"]["equivalent"] else "inconclusive")
    comparison.update(sesoi=sesoi, holm_family=len(entries))


def preregistered_comparisons(study: dict, *, baseline: str, metrics, primary, sesoi: float,
                              null: str = "null") -> list[dict]:
    """A pre-registered study's analysis, the same in every study that fixes these rules in advance: each of
    `metrics` compared with `baseline` over seeds (`compare_seeds` with the `null` arm's floor, Holm and TOST at
    `sesoi`; every arm but the baseline and the null), then the first metric again without the seeds where any
    arm's run is `broken` (the secondary analysis). Writes study["broken"] (arm -> seeds), study["verdict"] (each
    `primary` arm's decision on the first metric) and study["secondary_without_broken"]; returns the comparisons,
    the secondary last."""
    results = study["results"]
    others = [a for a in results if a not in (baseline, null)]
    compare = lambda res, metric: compare_seeds(res, baseline=baseline, metric=metric, null=null,  # noqa: E731
                                                arms=others, sesoi=sesoi)
    comparisons = [compare(results, m) for m in metrics]
    secondary = {**compare(without_broken(results), metrics[0]),
                 "metric": f"{metrics[0]}, the seeds of broken runs left out"}
    study["secondary_without_broken"] = secondary
    study["broken"] = {a: [r["seed"] for r in runs if r.get("broken")] for a, runs in results.items()}
    first = comparisons[0]["arms"]
    study["verdict"] = {a: first[a]["decision"] for a in primary if a in first}
    return [*comparisons, secondary]


def without_broken(results: dict) -> dict:
    """The results with every seed where any arm's summary says `broken` left out (a study's secondary analysis)."""
    broken = {r["seed"] for runs in results.values() for r in runs if r.get("broken")}
    return {a: [r for r in runs if r["seed"] not in broken] for a, runs in results.items()}


def last_mean(rows: list[dict], key: str, n: int | None = 20) -> float:
    """Mean of a metric over the last n steps that report it (None: all of them; nan if none)."""
    values = [r[key] for r in rows if key in r and isinstance(r[key], (int, float))][-n if n else None:]
    return float(np.mean(values)) if values else float("nan")
