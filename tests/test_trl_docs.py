"""docs/trl.md's option table cannot rot: every setting in its "ours" column is a key of TrainConfig, and every
`key=value` in a row is accepted by `config.override` (all of a row's assignments together, as one command
line would give them); the TRL options a TRL user reaches for first each have a row."""

from __future__ import annotations

import os
import re

import pytest

from grpo_jax.config import TrainConfig, UserError, config_reference, override

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "trl.md")
TRL_OPTIONS = ("num_generations", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards",
               "mask_truncated_completions", "top_entropy_quantile", "importance_sampling_level", "reward_weights",
               "log_completions", "max_prompt_length", "max_completion_length", "temperature", "num_iterations",
               "steps_per_generation", "learning_rate", "per_device_train_batch_size", "sync_ref_model", "use_vllm")


def option_rows(text: str) -> list[tuple[str, str]]:
    """(TRL cell, ours cell) of each row of the page's option table (the one headed by TRL's GRPOConfig)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| TRL `GRPOConfig` | ours |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        rows.append((cells[0], cells[1]))
    return rows


def ours_settings(cell: str) -> tuple[list[str], list[str]]:
    """(bare keys, `key=value` assignments) written in backticks in an "ours" cell; "none" gives neither."""
    items = re.findall(r"`([^`]+)`", cell)
    return [i for i in items if "=" not in i], [i for i in items if "=" in i]


def test_the_ours_column_names_only_config_keys_and_valid_settings():
    rows = option_rows(open(PAGE, encoding="utf-8").read())
    keys = {key for key, _, _ in config_reference(TrainConfig())}
    assert len(rows) >= 40
    for trl, ours in rows:
        bare, assignments = ours_settings(ours)
        assert bare or assignments or ours == "none", f"{trl}: the ours cell names no key and is not 'none'"
        unknown = [k for k in bare + [a.split("=", 1)[0] for a in assignments] if k not in keys]
        assert not unknown, f"{trl}: {unknown} are not TrainConfig keys"
        try:
            override(TrainConfig(), assignments)
        except (UserError, ValueError, TypeError) as e:
            pytest.fail(f"{trl}: {assignments} are refused: {e}")


def test_each_common_trl_option_has_a_row():
    trl_cells = " ".join(trl for trl, _ in option_rows(open(PAGE, encoding="utf-8").read()))
    missing = [name for name in TRL_OPTIONS if f"`{name}" not in trl_cells]
    assert not missing, f"docs/trl.md has no row for TRL's {missing}"


def test_the_check_catches_a_wrong_key_and_a_wrong_value():
    """The parsing the tests above rely on: a misspelt key is not in the keys, a bad value is refused."""
    keys = {key for key, _, _ in config_reference(TrainConfig())}
    bare, assignments = ours_settings("`sampling.group_sise`, `loss.agg_mode=token-means`")
    assert bare == ["sampling.group_sise"] and bare[0] not in keys
    with pytest.raises((UserError, ValueError)):
        override(TrainConfig(), assignments)
