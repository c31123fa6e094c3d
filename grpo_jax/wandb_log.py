"""Weights & Biases as a mirror of a run's log streams, for people whose dashboards live there.

The JSONL files stay the record (`runlog`: byte-identical metrics, resume, the report); this sink only copies
what `RunLogger` writes: each metrics and timings row's numbers, and each step's samples as a table. It is
on when `logging.wandb_project` is set and needs the optional extra (`pip install -e '.[wandb]'`);
`WANDB_MODE=offline` keeps everything on disk under `<out>/wandb/`.

Each start of a run (fresh, resumed, rolled back) is a W&B run of its own in the group named by the run
folder: a resumed segment logs from the step after its checkpoint, so its steps never go back within one
W&B run, and a rolled-back branch is not drawn over the steps it replaces.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from grpo_jax.config import UserError

SAMPLE_COLUMNS = ("step", "group", "prompt", "response", "advantage")  # then one column per reward dimension


def _wandb():
    try:
        import wandb  # an optional extra: imported only when a run asks for it
    except ImportError:
        raise UserError("logging.wandb_project is set but wandb is not installed: pip install -e '.[wandb]' "
                        "(or leave logging.wandb_project empty)") from None
    return wandb


class WandbSink:
    """One W&B run mirroring one start of a run folder: `log` (numbers of a row), `log_samples`, `close`."""

    def __init__(self, project: str, out_dir: str, *, config: dict[str, Any], start_step: int) -> None:
        folder = os.path.basename(os.path.abspath(out_dir))
        self._run = _wandb().init(project=project, dir=out_dir, group=folder, name=f"{folder}@{start_step}",
                                  config=config, job_type="grpo")

    def log(self, step: int, values: dict[str, Any]) -> None:
        """The row's numbers (histogram lists and text are left to the JSONL files) at `step`."""
        scalars = {k: v for k, v in values.items() if isinstance(v, numbers.Real) and not isinstance(v, bool)}
        if scalars:
            self._run.log(scalars, step=int(step))

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """A step's logged completions as one table: prompt (on a group's first row), response, advantage
        and each reward dimension's score."""
        if not samples:
            return
        dims = sorted({d for s in samples for d in s.get("rewards", {})})
        rows = [[int(step), s.get("group"), s.get("prompt", ""), s.get("response", ""), s.get("advantage")]
                + [s.get("rewards", {}).get(d) for d in dims] for s in samples]
        table = _wandb().Table(columns=[*SAMPLE_COLUMNS, *(f"reward/{d}" for d in dims)], data=rows)
        self._run.log({"samples": table}, step=int(step))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
