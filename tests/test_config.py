"""Config: overrides, validation errors naming the field, round trip, README documents every field."""

from __future__ import annotations

import os

import pytest

from grpo_jax.config import TrainConfig, config_reference, from_dict, override, to_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_override_parses_values_and_round_trips():
    cfg = override(TrainConfig(), ["loss.eps_high=0.28", "sampling.group_size=4", "dynamic.enabled=true",
                                   'task.options=[["digits", 2]]', "model.preset=tiny"])
    assert cfg.loss.eps_high == 0.28 and cfg.sampling.group_size == 4 and cfg.dynamic.enabled is True
    assert cfg.task.options == (("digits", 2),) and cfg.model.preset == "tiny"
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize("item, words", [
    ("loss.eps_hgh=0.3", "eps_hgh"),
    ("sampling.group_size=0", "group_size"),
    ("optim.schedule=linear", "schedule"),
    ("advantage.estimator=ppo", "estimator"),
    ("nosuch.x=1", "nosuch"),
    ("prompts_per_step", "key.path=value"),
    ("task.pass_rate_lo=1.5", "pass_rate_lo"),
])
def test_bad_values_name_the_field(item, words):
    with pytest.raises(ValueError, match=words):
        override(TrainConfig(), [item])


def test_readme_documents_every_config_field():
    readme = open(os.path.join(ROOT, "README.md")).read()
    missing = [key for key, _, _ in config_reference() if f"`{key}`" not in readme]
    assert not missing, f"README config reference lacks {missing}: regenerate with python -m grpo_jax.config"
    assert all(comment for _, _, comment in config_reference()), "every config field needs a comment"
