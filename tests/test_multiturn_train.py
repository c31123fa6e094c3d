"""Training with the tool on (`tool.enabled`): a real run whose rows call the tool, killed with SIGKILL mid-run and
resumed, against the same run uninterrupted.

The tool's markers here are single characters a random tiny model writes often ("(" opens a call, ")" closes it),
so rows pause and the sandbox runs what is between (mostly a SyntaxError or NameError, sometimes a number) from
the first step on, without a warm start: every piece of the multi-turn path (waiting, confirming the call,
running it, feeding the output, masking it out of the loss) runs on every step."""

from __future__ import annotations

import json

import numpy as np

from grpo_jax.config import COLLAPSE_RULES
from grpo_jax.runlog import read_jsonl
from tests.test_train import SIGNAL, _assert_rows_have_signal, assert_same_final_state, run_straight_and_killed

TOOL = ("tool.enabled=true", "tool.call_open=(", "tool.call_close=)", "tool.output_open=?", "tool.output_close=!",
        "tool.max_turns=1", "sampling.max_new_tokens=32", "prompts_per_step=8", "sampling.group_size=8",
        "logging.samples_per_step=64")


def test_tool_run_killed_mid_run_resumes_byte_for_byte(tmp_path):
    """6 steps with a checkpoint every 2, killed once the checkpoint at 3 or later is on disk: metrics.jsonl and
    samples.jsonl (each completion's turns, the tool's output among them) are the same bytes, and the final params
    and optimizer state the same bits; the steps after the kill called the tool, and every step trained (grad_norm
    > 0, params moved). About 5% of a random model's rows call: with 64 rows a step, a step without a call has
    probability ~0.95^64 = 4%, three in a row ~5e-5."""
    steps = 6
    extra = (*SIGNAL, *TOOL, f"steps={steps}", "checkpoint.every=2")
    run_straight_and_killed(tmp_path, extra, steps=steps, kill_after=3)
    assert_same_final_state(tmp_path, extra, steps=steps)
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert (tmp_path / "straight" / name).read_bytes() == (tmp_path / "killed" / name).read_bytes(), name
    rows = _assert_rows_have_signal(tmp_path / "straight" / "metrics.jsonl")
    assert sum(r["tool/calls_per_row"] for r in rows[3:]) > 0, [r["tool/calls_per_row"] for r in rows]
    # the wall-clock time in the sandbox is a timing, not a metric (it differs between a run and its resume)
    assert "tool/seconds" not in rows[0]
    assert all(t["tool/seconds"] > 0 for t in read_jsonl(str(tmp_path / "straight" / "timings.jsonl")))
    # samples.jsonl: the whole conversation, and its turns; a tool turn is the output the host appended
    samples = read_jsonl(str(tmp_path / "straight" / "samples.jsonl"))
    tool_turns = [t for s in samples for t in s["turns"] if t["role"] == "tool"]
    assert tool_turns and all(t["text"].startswith("?") for t in tool_turns)
    assert all("".join(t["text"] for t in s["turns"]) == s["response"] for s in samples)
    # the tool's alarms are among the run's rules (and warn here: TINY sets monitor.collapse_action=warn)
    config = json.loads((tmp_path / "straight" / "config.json").read_text())
    assert config["tool"]["enabled"] is True
    assert {"tool_never_called", "tool_always_errors"} <= set(COLLAPSE_RULES)
    assert np.isfinite([r["loss"] for r in rows]).all()
