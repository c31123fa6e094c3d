"""Ctrl-C (SIGINT) and SIGTERM (what a preemption sends) during training: `caught()` turns them into a flag
that the training loop reads between steps, so the run stops after the step it is in, with a checkpoint, instead
of dying mid-step and losing the steps since the last periodic checkpoint. `exit_interrupted` then ends the
launcher with one line and the shell's code for the signal (128 + its number: 130, 143).

Only the process's main thread may set signal handlers: elsewhere (and when the caller disables it, e.g. a
multi-process run, where one process stopping alone would leave the others waiting) `caught()` changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """What the handlers received: `signal` is the first signal's name ("SIGINT", "SIGTERM"), None until one."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def receive(self, signum: int, frame=None) -> None:
        """The handler: the first signal asks the loop to stop; a repeat is said and ignored, so that a second
        Ctrl-C cannot cut the checkpoint being written (kill -9 still ends the process at once)."""
        name = signal.Signals(signum).name
        if self.signal is None:
            self.signal = name
            return
        print(f"{name} again: still finishing the current step and saving its checkpoint, then the run stops "
              "(kill -9 stops it now, losing the steps since the last checkpoint)", file=sys.stderr, flush=True)


@contextlib.contextmanager
def caught(*, enabled: bool = True) -> Iterator[Stop]:
    """Within the block SIGINT and SIGTERM set the yielded `Stop` instead of ending the process; the handlers
    that were there before are put back at its end (tests and libraries run the trainer in-process). A signal
    the process ignores (SIG_IGN: e.g. Ctrl-C for a job a script started with `&`) stays ignored."""
    stop = Stop()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(s, stop.receive)
        yield stop
    finally:
        for s, handler in previous.items():  # None: a handler not set from Python; the default is the nearest
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def exit_code(name: str) -> int:
    """The shell's exit status of a process ended by the signal `name`: 128 + its number (SIGINT 130, SIGTERM 143)."""
    return 128 + signal.Signals[name].value


def interrupted_line(name: str, *, step: int, steps: int, run: str = "", again: str = "the same command with --resume"
                     ) -> str:
    """What a run (`run`: words naming it, for a command that trains several) stopped by `name` at `step` (of
    `steps`) left, and what `again` (the command that continues it) does with it: one line."""
    if step == 0:
        return (f"{run or 'the run'} was interrupted by {name} before its first step: nothing to save; "
                f"{again.removesuffix(' with --resume')} starts it again at step 0")
    then = (f"continues from step {step} to {steps}" if step < steps else
            "trains nothing more and writes what the stop skipped (checkpoint.export_hf's export)")
    return f"interrupted by {name} at step {step}{' of ' + run if run else ''}: checkpoint saved; {again} {then}"


def exit_interrupted(name: str, *, step: int, steps: int, **words: str) -> None:
    """End a launcher whose run a signal stopped: print `interrupted_line` (`words`: its `run` and `again`),
    exit with `exit_code(name)`."""
    print(interrupted_line(name, step=step, steps=steps, **words), file=sys.stderr, flush=True)
    sys.exit(exit_code(name))
