"""The command line every launcher shares (`python -m grpo_jax.train`, `experiments/*.py`): --out, --seed,
--smoke, --config, --set key=value ..., --resume, --rollback-to, and the studies' --seeds / --arms / --jobs /
--summarize-only, --debug.

Errors for people: `for_people(main)` runs a command-line main so that a mistake in the user's config, data
or folders (`user_error_types`) ends the process with one line, "error: <what and where; what to do>",
instead of a traceback after seconds of imports. `--debug` or GRPO_JAX_DEBUG=1 shows the full traceback;
any other exception (a bug) always does. The line says so, since a ValueError may also come from a bug."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from grpo_jax import runconfig
from grpo_jax.config import TrainConfig, UserError, override  # UserError: re-exported here

DEBUG_ENV = "GRPO_JAX_DEBUG"  # =1: tracebacks for user errors too (as --debug)


def user_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions a command line reports as one line: bad values (ValueError: config, data rows, rewards'
    inputs, HF checkpoints, and `UserError`, which grpo_jax.checkpoint.CheckpointError is too) and missing or
    unreadable files and folders (OSError)."""
    return (ValueError, OSError)


def debug_requested(argv: Sequence[str] | None = None, environ=None) -> bool:
    """Whether the user asked for tracebacks: --debug among the arguments (sys.argv's when argv is None) or
    GRPO_JAX_DEBUG set to anything but "", "0", "false" or "no"."""
    args = sys.argv[1:] if argv is None else list(argv)
    value = (os.environ if environ is None else environ).get(DEBUG_ENV, "")
    return "--debug" in args or value.strip().lower() not in ("", "0", "false", "no")


def add_debug_flag(ap: argparse.ArgumentParser) -> None:
    """--debug, read by `debug_requested`: every command line that `for_people` wraps takes it."""
    ap.add_argument("--debug", action="store_true",
                    help=f"show the full traceback of a config, data or folder error (also: {DEBUG_ENV}=1)")


def one_line(error: BaseException) -> str:
    """The error's message on one line (runs of whitespace, newlines included, become one space); an error
    without a message is named by its type, and an OSError of one file reads "FILE: reason" (not "[Errno 2]
    ...")."""
    text = " ".join(str(error).split())
    if isinstance(error, KeyError) and error.args:  # str(KeyError) is the quoted key
        text = " ".join(str(error.args[0]).split())
    if isinstance(error, OSError) and error.filename and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    return text or type(error).__name__


def for_people(main: Callable) -> Callable:
    """`main(argv=None)` that ends with SystemExit("error: <one line>") on a user error (`user_error_types`)
    unless debug is asked for (`debug_requested`); other exceptions propagate with their traceback. While it
    runs, warnings print as one line each (`one_line_warning`) unless debug is asked for."""

    @functools.wraps(main)
    def wrapped(argv=None, *args, **kwargs):
        debug, shown = debug_requested(argv), warnings.formatwarning
        if not debug:  # a warning is one line saying what happened, not where in the package it was raised
            warnings.formatwarning = one_line_warning
        try:
            return main(argv, *args, **kwargs)
        except user_error_types() as e:
            if debug:
                raise
            raise SystemExit(f"error: {one_line(e)} (--debug or {DEBUG_ENV}=1 shows the traceback)") from None
        finally:
            warnings.formatwarning = shown

    return wrapped


def one_line_warning(message, category, filename, lineno, line=None) -> str:
    """`warnings.formatwarning` for people: "warning: <the message on one line>" (--debug keeps Python's
    "file:line: Category: message" form)."""
    return f"warning: {one_line(message if isinstance(message, BaseException) else Warning(message))}\n"


def load_config(path: str) -> TrainConfig:
    """The TrainConfig in a config.json (as a run writes it); every error names the file (and line)."""
    return runconfig.load(path, named="--config ")


_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding this grpo_jax/


def checkout_mismatch(script: str) -> str | None:
    """Why a launcher must not run, or None: `script` lies in a checkout with its own grpo_jax/ while the
    grpo_jax imported is another (an editable install of a different folder), so the run would train with the
    other checkout's code and record that checkout's commit. A worktree of a pre-registration commit run with
    the main checkout installed is the case this catches. A script outside any checkout is never refused."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(script)))
    if not os.path.isdir(os.path.join(root, "grpo_jax")) or os.path.samefile(root, _CHECKOUT):
        return None
    return (f"{script} belongs to the checkout {root}, but grpo_jax is imported from {_CHECKOUT}: the run "
            f"would train with that other checkout's code. Run it as PYTHONPATH={root} python ...")


DEFAULT_OUT = "runs/grpo"


def out_dir(args, default: str = DEFAULT_OUT) -> str:
    """The run folder: --out when given, else `default` (a launcher's own), with "-smoke" after it for --smoke so
    that a smoke run never lands in (or is refused by) the folder of the real one."""
    if args.out != DEFAULT_OUT:
        return args.out
    return f"{default}-smoke" if args.smoke else default


def parse_args(argv=None, *, description: str = "", get_config=None, default_out: str = DEFAULT_OUT):
    """The CLI every experiment shares: --out, --seed, --smoke, --set key=value ..., --resume, --config, --debug.

    get_config(smoke: bool) -> TrainConfig supplies the experiment's defaults (TrainConfig() if None);
    default_out: the launcher's run folder when --out is not given (`out_dir`). --resume and --rollback-to
    start from the run's own config instead (`continued_config`)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="run directory (metrics, checkpoints, report; the launcher's "
                    "own by default, with -smoke after it for --smoke)")
    ap.add_argument("--seed", type=int, default=None, help="run seed (overrides the config's)")
    ap.add_argument("--smoke", action="store_true", help="a seconds-long variant (used by the tests)")
    ap.add_argument("--config", default=None, help="a config.json written by an earlier run")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. --set loss.eps_high=0.28 (repeatable)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in --out")
    ap.add_argument("--rollback-to", type=int, default=None, metavar="STEP",
                    help="restart from the kept checkpoint at STEP (with --set overrides); the run log marks the "
                         "branch and the abandoned checkpoints/logs are archived under --out/branches/")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    add_debug_flag(ap)
    ap.add_argument("--seeds", default=None, metavar="S1,S2,...",
                    help="studies only: the seeds to train (default: --seed and the next two)")
    ap.add_argument("--warm-seed", type=int, default=None, metavar="W",
                    help="studies only: the seed of the one supervised warm start shared by every seed and arm (seeds "
                         "then vary the RL alone; default: --seed's value); -1: one warm start per seed")
    ap.add_argument("--arms", default=None, metavar="A1,A2,...", help="studies only: the arms to train (default: all)")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="studies only: cut the runs (arm, seed) into N near-equal shares, each trained by processes "
                         "pinned to one CPU core (core k mod the cores this process may use; logs in --out/jobs/), "
                         "then summarize them all; 1 (default): one process on every core")
    ap.add_argument("--summarize-only", action="store_true",
                    help="studies only: rebuild results.md / results.json / plots from the runs already in --out "
                         "(e.g. after training seeds in separate processes with --seeds)")
    aot = ap.add_argument_group("compile for a TPU topology instead of training (grpo_jax.aot; "
                                "pip install -e '.[tpu]')")
    aot.add_argument("--compile-only", action="store_true",
                     help="compile every program of the run for --topology on this machine and report per chip")
    aot.add_argument("--topology", default=None, metavar="T", help="a TPU slice: v5e:2x4, v5p:4x4x4 or v5e-64 (chips)")
    aot.add_argument("--prompt-len", type=int, default=None, metavar="P",
                     help="prompt bucket width compiled for (default: a generated task's longest, else 256)")
    aot.add_argument("--programs", default=None, metavar="A,B", help="compile only these programs (train_step, "
                     "logprobs, lora_merge, to_rollout_mesh, prefill, decode, rollout)")
    aot.add_argument("--report", default=None, metavar="FILE", help="also write the report as JSON to FILE")
    args = ap.parse_args(argv)
    if args.topology and not args.compile_only:
        raise UserError("--topology is read only with --compile-only")
    script = getattr(sys.modules.get(getattr(get_config, "__module__", "")), "__file__", None)
    if script and (why := checkout_mismatch(script)):
        raise UserError(why)
    cfg = get_config(smoke=args.smoke) if get_config else TrainConfig()
    if args.config:
        cfg = load_config(args.config)
    if args.resume or args.rollback_to is not None:
        return args, continued_config(args, cfg, out_dir(args, default_out))
    return args, override(cfg, _assignments(args))


def _assignments(args) -> list[str]:
    """--set's assignments, then --seed's."""
    return args.overrides + ([f"seed={args.seed}"] if args.seed is not None else [])


def continued_config(args, cfg: TrainConfig, out: str) -> TrainConfig:
    """The config a --resume or --rollback-to in `out` trains with: the run's own (`runconfig.current`: its
    config.json with the changes of earlier resumes) with --set and --seed applied, so that a setting of the
    first run is kept unless named again; --config, when given, replaces the run's own as the start. Each
    key that changes is printed on stderr ("--resume: key: old -> new"; the run folder records them), and a
    change the checkpoints cannot take is refused naming the key. A folder with no config.json (nothing to
    continue) takes `cfg`, the launcher's, as a fresh run does."""
    saved = runconfig.current(out)
    if saved is None:
        return override(cfg, _assignments(args))
    new = override(cfg if args.config else saved[0], _assignments(args))
    flag = "--resume" if args.rollback_to is None else f"--rollback-to {args.rollback_to}"
    found = runconfig.changes(saved[0], new)
    runconfig.refuse_critical(found, flag=flag, out_dir=out)
    for change in found:
        print(f"{flag}: {runconfig.change_line(change)}", file=sys.stderr, flush=True)
    return new
