"""What a GRPO run at real model sizes needs on a TPU slice, known before the slice is rented: each row of the
scaling table in docs/tpu.md is one command compiling every program of the run for a topology on a CPU host.

    python experiments/tpu_plan.py --compile-only --topology v5e-64 --set model.preset=qwen2.5-7b \\
        --set mesh.fsdp=64 --set microbatches=4 --set mesh.rollout_data=-1 --set mesh.rollout_tensor=4
    python experiments/tpu_plan.py table [--jobs 2] [--rows 0,3,7]   # every row below, then the table

The work is GSM8K-like: 64 prompts x G = 8 completions, 256-token prompts, 1,024 new tokens, KL to the
reference (beta 0.04, so full fine-tuning holds a reference copy; LoRA's reference is its base), bf16 weights
and matmuls, remat full, the scanned layer stack and the chunked head (docs/tpu.md says why each). A row
compiles in 2-10 minutes on a 2-core machine; `table` writes experiments/results/tpu_plan/<row>.json and
the table between the markers in docs/tpu.md. The figures are the compiler's (memory) and a roofline
ESTIMATE (time); nothing here ran on a TPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from grpo_jax import aot
from grpo_jax.cli import for_people, parse_args
from grpo_jax.config import TrainConfig, override

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "experiments", "results", "tpu_plan")
DOC = os.path.join(ROOT, "docs", "tpu.md")
BEGIN, END = "<!-- tpu_plan table: begin -->", "<!-- tpu_plan table: end -->"

WORK = ["task.name=jsonl", "task.chat=always", "prompts_per_step=64", "sampling.group_size=8",
        "sampling.max_new_tokens=1024", "loss.beta=0.04", "optim.lr=1e-6", "model.param_dtype=bfloat16",
        "model.dtype=bfloat16", "model.remat=full", "model.scan_layers=true", "model.logits_chunk=128"]
PROMPT_LEN = 256
ROW_PROGRAMS = ("train_step", "lora_merge", "to_rollout_mesh", "prefill", "decode", "rollout")


def get_config(smoke: bool = False) -> TrainConfig:
    """The GRPO work of every row; a row adds the model, LoRA and the mesh."""
    return override(TrainConfig(), WORK + (["model.preset=qwen2.5-0.5b"] if smoke else []))


@dataclasses.dataclass(frozen=True)
class Row:
    model: str  # models.PRESETS key
    topology: str  # aot.topology_name
    mesh: tuple  # --set overrides: the mesh and microbatches recommended for this model and slice
    lora: int = 0  # adapter rank (0 = full fine-tuning)
    fix: str = ""  # for a row that does not fit: what makes it fit (rows of this table that show it)

    @property
    def name(self) -> str:
        return f"{self.model}-{'lora' if self.lora else 'full'}-{self.topology}"

    def argv(self) -> list[str]:
        sets = [f"model.preset={self.model}", *self.mesh] + ([f"lora.rank={self.lora}"] if self.lora else [])
        # the logprob pass runs inside the train step; compiled on its own it only repeats part of it
        return (["--compile-only", "--topology", self.topology, "--programs", ",".join(ROW_PROGRAMS)]
                + [a for s in sets for a in ("--set", s)])


def _mesh(fsdp: int, micro: int, rollout_tensor: int = 1, tensor: int = 1) -> tuple:
    """fsdp x tensor for the update (the rest of the chips data-parallel), `micro` microbatches, and a rollout
    mesh over every chip with the weights split rollout_tensor ways (replicated when 1: each chip decodes its
    own groups in its own loop)."""
    return (f"mesh.fsdp={fsdp}", f"mesh.tensor={tensor}", f"microbatches={micro}", "mesh.rollout_data=-1",
            f"mesh.rollout_tensor={rollout_tensor}")


ROWS = [
    Row("qwen2.5-0.5b", "v5e-8", _mesh(8, 16)),
    Row("qwen2.5-0.5b", "v5e-8", _mesh(8, 16), lora=16),
    Row("qwen2.5-1.5b", "v5e-8", _mesh(8, 16)),
    Row("qwen2.5-1.5b", "v5e-8", _mesh(8, 16), lora=16),
    Row("qwen2.5-7b", "v5e-8", _mesh(8, 16, rollout_tensor=4),  # 4 KV heads: tensor 4 x data 2 splits the cache
        fix="the train state (7.1 GiB a chip) and the update's temporaries (11.9 GiB) exceed 16; LoRA on this "
            "slice fits (row 5), full fine-tuning on v5e-64 fits (row 6)"),
    Row("qwen2.5-7b", "v5e-8", _mesh(8, 16, rollout_tensor=4), lora=16),
    Row("qwen2.5-7b", "v5e-64", _mesh(64, 4, rollout_tensor=4)),
    Row("qwen2.5-7b", "v5e-64", _mesh(64, 4, rollout_tensor=4), lora=16),
    Row("qwen2.5-7b", "v5p-64", _mesh(64, 4)),
    Row("qwen2.5-7b", "v6e-64", _mesh(64, 4, rollout_tensor=2)),
    Row("qwen3-8b", "v5e-64", _mesh(64, 4, rollout_tensor=4)),
    Row("qwen3-8b", "v5e-64", _mesh(64, 4, rollout_tensor=4), lora=16),
    Row("qwen3-8b", "v5p-64", _mesh(64, 4)),
    Row("qwen3-8b", "v6e-64", _mesh(64, 4, rollout_tensor=2)),
    Row("qwen2.5-14b", "v5e-64", _mesh(64, 4, rollout_tensor=8)),
    Row("qwen2.5-14b", "v5e-64", _mesh(64, 4, rollout_tensor=8), lora=16),
    Row("qwen2.5-14b", "v5p-64", _mesh(64, 4, rollout_tensor=2)),
    Row("qwen2.5-14b", "v6e-64", _mesh(64, 4, rollout_tensor=4)),
    Row("qwen2.5-7b", "v5e-256", _mesh(256, 2, rollout_tensor=4)),
    Row("qwen3-8b", "v5e-256", _mesh(256, 2, rollout_tensor=4)),
    Row("qwen2.5-14b", "v5e-256", _mesh(256, 2, rollout_tensor=8)),
]


def run_row(row: Row) -> dict:
    """Compile one row in its own process (libtpu and XLA's memory start fresh); its report is saved beside the
    log. Exit code 3 (does not fit) still leaves the report."""
    os.makedirs(OUT, exist_ok=True)
    report, log = os.path.join(OUT, f"{row.name}.json"), os.path.join(OUT, f"{row.name}.log")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, os.path.abspath(__file__), *row.argv(), "--report", report, "--quiet"]
    with open(log, "w", encoding="utf-8") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False).returncode
    if code not in (0, aot.NOT_FIT_EXIT_CODE) or not os.path.exists(report):
        return {"row": row.name, "error": f"exit code {code}; see {os.path.relpath(log, ROOT)}"}
    with open(report, encoding="utf-8") as f:
        return {"row": row.name, **json.load(f)}


def table(results: list[tuple[Row, dict]]) -> str:
    """The scaling table in markdown: a line per row with its command."""
    lines = ["| # | model | tuning | slice (chips) | mesh: update / rollout | GiB per chip (peak program) | fits "
             "| step s (est.) | rollout tok/s/chip (est.) | MFU (est.) | compile s |", "|---" * 11 + "|"]
    for row, r in results:
        i = ROWS.index(row)
        if "error" in r:
            lines.append(f"| {i} | {row.model} | {'LoRA r' + str(row.lora) if row.lora else 'full'} | {row.topology} | "
                         f"{' '.join(row.mesh)} | failed: {r['error']} | | | | | |")
            continue
        m, peak, est = r["mesh"], r["peak"], r["estimate"]
        data = r["chips"] // (m["fsdp"] * m["tensor"])
        rollout = (f"data {r['chips'] // m['rollout_tensor']} x tensor {m['rollout_tensor']}" if m["rollout_data"]
                   else "the update's")
        lines.append(
            f"| {i} | {row.model} | {'LoRA r' + str(row.lora) if row.lora else 'full'} | "
            f"{r['topology']} ({r['chips']}) | "
            f"data {data} x fsdp {m['fsdp']} x tensor {m['tensor']}, {r['work']['microbatches']} microbatches / "
            f"{rollout} | {peak['bytes'] / aot.GIB:.1f} ({peak['program']}) of {peak['capacity'] / aot.GIB:.0f} | "
            f"{'yes' if peak['fits'] else '**no**' + (': ' + row.fix if row.fix else '')} | {est['step_seconds']:.1f} | "
            f"{est['rollout_tokens_per_s_per_chip']:,.0f} | {100 * est['mfu']:.0f}% | {r['compile_seconds']:.0f} |")
    lines += ["", "Each row's command (`python experiments/tpu_plan.py table --list` prints them):", ""]
    lines += [f"{ROWS.index(row)}. `python experiments/tpu_plan.py {' '.join(row.argv())}`" for row, _ in results]
    return "\n".join(lines)


def write_table(text: str) -> None:
    with open(DOC, encoding="utf-8") as f:
        doc = f.read()
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"{DOC}: the markers {BEGIN} / {END} are missing")
    head, rest = doc.split(BEGIN, 1)
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])


def table_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description="compile every row and write the table in docs/tpu.md")
    ap.add_argument("--jobs", type=int, default=1, help="rows compiled at once (each one process)")
    ap.add_argument("--rows", default=None, help="comma-separated row indices (default: all)")
    ap.add_argument("--list", action="store_true", help="print each row's command and exit")
    ap.add_argument("--summarize-only", action="store_true", help="rebuild the table from the saved reports")
    args = ap.parse_args(argv)
    rows = [ROWS[int(i)] for i in args.rows.split(",")] if args.rows else ROWS
    if args.list:
        for row in rows:
            print(ROWS.index(row), "python experiments/tpu_plan.py " + " ".join(row.argv()))
        return
    if args.summarize_only:
        results = [(row, _saved(row)) for row in ROWS if os.path.exists(os.path.join(OUT, f"{row.name}.json"))]
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(zip(rows, pool.map(run_row, rows)))  # each the saved report, or its error
    write_table(table(results))
    print(table(results))


def _saved(row: Row) -> dict:
    with open(os.path.join(OUT, f"{row.name}.json"), encoding="utf-8") as f:
        return json.load(f)


@for_people
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["table"]:
        return table_main(argv[1:])
    args, cfg = parse_args(argv, description=__doc__, get_config=get_config)
    if not args.compile_only:
        raise SystemExit("tpu_plan only compiles: add --compile-only --topology T (or run `table`)")
    if args.prompt_len is None:
        args.prompt_len = PROMPT_LEN
    return aot.compile_only(args, cfg)


if __name__ == "__main__":
    main()
