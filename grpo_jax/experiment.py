"""One experiment run, as the default-experiment-style launchers do it: build the Trainer from the launcher's
`get_config()`, supervise a warm start on the task's solutions (stopped on validation accuracy), run GRPO,
then write report.md / report.json with the run's figures, the launcher's targets, the segments of an
interrupted and resumed run and the plots.

    def main(argv=None):
        return experiment.run(argv, doc=__doc__, get_config=get_config, spec=SPEC, clock=Clock.process())

`Spec` says what differs between launchers: the title, the default output folder, the warm start's
settings, the task-specific figures and the targets checked. The report covers the whole run, not one
process: the warm start's figures come from the segment that made it and the wall time is the sum over
the segments (`runfolder.run_segments`), each one listed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

from grpo_jax import aot, interrupts, monitor, runfolder, runlog
from grpo_jax.cli import for_people, out_dir, parse_args
from grpo_jax.sft import warm_start
from grpo_jax.train import Trainer, open_trainer

Targets = Callable[[dict], list[tuple[str, bool]]]


@dataclasses.dataclass(frozen=True)
class Clock:
    """When the run started: `perf` for durations, `wall` (epoch seconds) for the segment record."""

    perf: float
    wall: float

    @staticmethod
    def process() -> Clock:
        """This process's start (Linux: /proc), so wall_seconds counts the imports (seconds of jax) as the
        user's own clock does; where /proc is missing, now."""
        now_perf, now_wall = time.perf_counter(), time.time()
        try:
            with open("/proc/self/stat") as f:  # field 22: start time in clock ticks after boot
                ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/stat") as f:
                boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        except (OSError, ValueError, IndexError, StopIteration):
            return Clock(now_perf, now_wall)
        started = min(now_wall, boot + ticks / os.sysconf("SC_CLK_TCK"))
        return Clock(now_perf - (now_wall - started), started)


@dataclasses.dataclass(frozen=True)
class Spec:
    """What a launcher adds to a run: see the module docstring."""

    title: str  # the report's title
    default_out: str  # --out when the flag is left at its default
    sft: Callable[[bool], dict]  # smoke -> warm-start settings (`sft.warm_start` keywords plus n_valid)
    targets: Targets  # summary -> [(the check as text, whether it holds)]
    figures: Callable[[list[dict], list[dict]], dict] = lambda evals, train: {}  # task-specific report figures
    problem_figures: Callable[[list[dict]], dict] = lambda rows: {}  # figures of the held-out problems themselves
    caveat: str = ""  # a report section under that heading when not empty


@for_people
def run(argv, *, doc: str, get_config, spec: Spec, clock: Clock) -> dict:
    """Parse the command line, warm-start (a fresh run) and train, then report; returns the summary. The run
    folder stays locked until the report is written (`runlock`); another run there exits with an error naming
    it, a run paused by an alarm exits with `monitor.PAUSE_EXIT_CODE` after its report, and a run stopped by
    SIGINT / SIGTERM (checkpointed at the step reached) with 128 + the signal's number after its report."""
    args, cfg = parse_args(argv, description=doc, get_config=get_config, default_out=spec.default_out)
    if args.compile_only:
        return aot.compile_only(args, cfg)
    out = out_dir(args, spec.default_out)
    last_write = runfolder.last_write_time(out)  # when an earlier, interrupted process stopped (read before rewriting)
    trainer = open_trainer(cfg, out, resume=args.resume, quiet=args.quiet, rollback_to=args.rollback_to)
    hold = trainer.lock.again() if trainer.lock is not None else None  # the trainer's is released by run()
    try:
        summary, ended = _train_and_report(trainer, args, cfg, out, spec, clock, last_write)
    finally:
        if hold is not None:
            hold.release()
    if ended["paused"]:
        monitor.exit_paused(out, trainer.step)
    if ended["interrupted"]:
        interrupts.exit_interrupted(ended["interrupted"], step=trainer.step, steps=cfg.steps)
    return summary


def _train_and_report(trainer: Trainer, args, cfg, out: str, spec: Spec, clock: Clock,
                      last_write: float | None) -> tuple[dict, dict]:
    """The warm start (a fresh run), GRPO, then report.md / report.json; (summary, `Trainer.run`'s summary: how
    the run ended). A run stopped by a signal before its first GRPO step has no report to write."""
    first_step = trainer.step
    runfolder.open_segment(trainer.logger.out_dir, step=first_step, started_at=clock.wall, last_write=last_write,
                        warm_start=first_step == 0)
    sft = _warm_start(trainer, spec.sft(args.smoke), quiet=args.quiet) if first_step == 0 else {}
    ended = trainer.run()
    if trainer.logger.out_dir != out or (ended["interrupted"] and trainer.step == 0):  # process 0 writes the report
        return {"steps": trainer.step, "interrupted": ended["interrupted"]}, ended
    wall_now = time.perf_counter() - clock.perf  # the plots and report below are not counted
    rows = runlog.read_jsonl(os.path.join(out, "metrics.jsonl"))
    events = runlog.read_jsonl(trainer.logger.path("events"))
    segments = runfolder.run_segments(events)
    if not sft:
        warm = [e for e in runfolder.current_run(events) if e["kind"] == "warm_start"]
        sft = warm[-1] if warm else {}
    segments.append({"from_step": first_step, "to_step": trainer.step, "wall_seconds": wall_now,
                     "warm_start": first_step == 0, "interrupted": False, "signal": ended["interrupted"]})
    summary = summarize(rows, sft=sft, seed=cfg.seed, segments=segments, figures=spec.figures,
                        wall=sum(s["wall_seconds"] or 0.0 for s in segments if counted(s)))
    summary.update(spec.problem_figures(trainer.eval_rows), interrupted=ended["interrupted"])
    checks = spec.targets(summary)
    sections = [("Targets", "\n".join(f"- [{'x' if ok else ' '}] {text}" for text, ok in checks)),
                ("Segments (the first process, then each --resume)", segments_section(segments))]
    trainer.report(summary, title=spec.title, sections=sections + ([("Caveat", spec.caveat)] if spec.caveat else []))
    runfolder.close_segment(trainer.logger.out_dir, from_step=first_step, to_step=trainer.step, started_at=clock.wall,
                         wall_seconds=wall_now, warm_start=first_step == 0, signal=ended["interrupted"])
    for text, ok in checks:
        print(("PASS " if ok else "MISS ") + text)
    print(f"report: {os.path.join(out, 'report.md')}")
    return summary, ended


def _warm_start(trainer: Trainer, settings: dict, *, quiet: bool) -> dict:
    """Supervise the fresh policy on the task's solutions (every valid one, drawn at random) until the
    validation accuracy target; install it as GRPO's start and log the figures. Returns them."""
    settings = dict(settings)
    valid = trainer.task.generate("valid", settings.pop("n_valid"), trainer.cfg.seed)
    params, sft = warm_start(trainer.actor, trainer.policy_params(), trainer.stream.rows, valid,
                             solution=trainer.task.solutions, seed=trainer.cfg.seed,
                             log=(lambda *_: None) if quiet else print, **settings)
    trainer.set_params(params)
    trainer.logger.event(0, "warm_start", **{k: v for k, v in sft.items() if k != "sft_curve"})
    return sft


def summarize(rows: list[dict], *, sft: dict, wall: float, seed: int, segments: list[dict] | None = None,
              figures: Callable[[list[dict], list[dict]], dict] = lambda evals, train: {}) -> dict:
    """The report's figures from the metrics stream (step 0 = after the warm start, before GRPO), plus
    `figures(evaluation rows, training rows)`.

    wall: seconds of the whole run, summed over `segments` (the first process and each --resume) when the
    run was interrupted and resumed; sft: the warm start's figures, from whichever segment made it."""
    evals = [r for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if "entropy/mean" in r]
    if not evals or not train:
        raise ValueError(f"the metrics stream has {len(train)} GRPO steps and {len(evals)} evaluations: the report "
                         "needs at least one of each (did the run take any step?)")
    return {
        "accuracy_sft": evals[0]["eval/accuracy"],
        "accuracy_final": evals[-1]["eval/accuracy"],
        "accuracy_best": max(r["eval/accuracy"] for r in evals),
        "format_rate_sft": evals[0].get("eval/format_rate"),
        "format_rate_final": evals[-1].get("eval/format_rate"),
        "entropy_first": train[0]["entropy/mean"],
        "entropy_final": train[-1]["entropy/mean"],
        "zero_variance_fraction_final": train[-1]["groups/zero_var_frac"],
        "length_mean_final": train[-1]["length/mean"],
        "steps": train[-1]["step"],
        "wall_seconds": wall,
        "seed": seed,
        "sft_steps": sft.get("sft_steps"),
        "sft_valid_accuracy": sft.get("sft_valid_accuracy"),
        "segments": [{k: seg.get(k) for k in ("from_step", "to_step", "wall_seconds", "warm_start", "interrupted",
                                              "signal")}
                     for seg in segments or []],
        **figures(evals, train),
    }


def counted(seg: dict) -> bool:
    """Whether a segment's time is part of the run's: it trained, warm-started or was cut short (its work was
    redone); a --resume of a finished run that only rewrites the report is listed but not counted."""
    return seg["to_step"] > seg["from_step"] or bool(seg.get("warm_start")) or bool(seg.get("interrupted"))


def summed_over(summary: dict) -> str:
    """" (summed over N segments)" when the run's wall time adds several processes, for a target's text."""
    n = sum(counted(seg) for seg in summary.get("segments") or [])
    return f" (summed over {n} segments)" if n > 1 else ""


def segments_section(segments: list[dict]) -> str:
    lines = ["| # | steps | wall seconds | warm start | ended |", "|---|---|---|---|---|"]
    for i, seg in enumerate(segments, 1):
        wall = "?" if seg.get("wall_seconds") is None else f"{seg['wall_seconds']:.0f}"
        if seg.get("interrupted"):
            wall += " (to its last write)"
        elif not counted(seg):
            wall += " (no step taken: not counted)"
        warm = "yes" if seg.get("warm_start") else "no"
        ended = "interrupted" if seg.get("interrupted") else f"by {seg['signal']}" if seg.get("signal") else "normally"
        lines.append(f"| {i} | {seg['from_step']} -> {seg['to_step']} | {wall} | {warm} | {ended} |")
    return "\n".join(lines)
