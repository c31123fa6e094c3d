"""Config: overrides, validation errors naming the field, round trip, docs/configuration.md documents every field."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grpo_jax.config import TrainConfig, config_reference, from_dict, inert_settings, override, to_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_override_parses_values_and_round_trips():
    cfg = override(TrainConfig(), ["loss.eps_high=0.28", "sampling.group_size=4", "dynamic.enabled=true",
                                   'task.options=[["digits", 2]]', "model.preset=tiny"])
    assert cfg.loss.eps_high == 0.28 and cfg.sampling.group_size == 4 and cfg.dynamic.enabled is True
    assert cfg.task.options == (("digits", 2),) and cfg.model.preset == "tiny"
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg


@pytest.mark.parametrize("items", [
    ["task.options.tokenizer_path=models/tiny x", "task.options.digits=2"],  # one key at a time
    ['task.options={"tokenizer_path": "models/tiny x", "digits": 2}'],  # a JSON object
    ['task.options=[["tokenizer_path", "models/tiny x"], ["digits", 2]]'],  # [key, value] pairs, as stored
    ['task.options=[["tokenizer_path", "old"], ["digits", 5]]', "task.options.tokenizer_path=models/tiny x",
     "task.options.digits=2"],  # a key given again replaces its value in place
])
def test_task_options_take_dotted_keys_objects_and_pairs_and_store_pairs(items):
    cfg = override(TrainConfig(), items)
    assert cfg.task.options == (("tokenizer_path", "models/tiny x"), ("digits", 2))
    assert to_dict(cfg)["task"]["options"] == [["tokenizer_path", "models/tiny x"], ["digits", 2]]  # config.json
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg
    assert override(cfg, ["task.options.digits=3"]).task.options == (("tokenizer_path", "models/tiny x"), ("digits", 3))


@pytest.mark.parametrize("item, words", [
    ("task.options=tokenizer_path", r"task\.options \(TaskConfig\.options\): must be an object such as "
                                    r"\{\"tokenizer_path\": \"\.\.\.\"\} or a list of \[key, value\] pairs.*got "
                                    r"'tokenizer_path' \(str\)"),
    ('task.options=[["digits"]]', r"task\.options \(TaskConfig\.options\): .*\('digits',\) is not a \[key, value\]"),
    ('task.options=[["digits", 2], ["digits", 3]]', r"task\.options \(TaskConfig\.options\): keys \['digits'\] are "
                                                    r"given more than once"),
    ('task.options={"": 3}', r"key '' is not a non-empty string"),
    ("task.options.digits.x=3", r"override 'task\.options\.digits\.x': task\.options takes one key after it, as "
                                r"task\.options\.KEY=VALUE"),
    ("task.options.=3", r"task\.options takes one key after it"),
])
def test_a_bad_task_options_spelling_names_the_field_and_the_spellings(item, words):
    with pytest.raises(ValueError, match=words):
        override(TrainConfig(), [item])


def test_task_options_given_in_python_as_a_dict_are_stored_as_pairs():
    from grpo_jax.config import TaskConfig

    assert TaskConfig(options={"digits": 2, "op": "-"}).options == (("digits", 2), ("op", "-"))


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


def test_config_reference_documents_every_config_field():
    reference = open(os.path.join(ROOT, "docs", "configuration.md")).read()
    missing = [key for key, _, _ in config_reference() if f"`{key}`" not in reference]
    assert not missing, f"docs/configuration.md lacks {missing}: regenerate with python -m grpo_jax.config"
    assert all(comment for _, _, comment in config_reference()), "every config field needs a comment"


@pytest.mark.parametrize("item, words", [
    # wrong types: the dotted key, the field and what it accepts (these were bare TypeErrors)
    ("steps=abc", r"steps \(TrainConfig\.steps\): must be an integer, got 'abc' \(str\)"),
    ("sampling.temperature=hot", r"sampling\.temperature \(SamplingConfig\.temperature\): must be a number, got 'hot'"),
    ("steps=2.5", r"steps \(TrainConfig\.steps\): must be an integer, got 2\.5"),
    ("checkpoint.every=1.5", r"checkpoint\.every \(CheckpointConfig\.every\): must be an integer"),
    ("loss.eps_high=wide", r"loss\.eps_high \(LossConfig\.eps_high\): must be a number or null"),
    ("logging.progress=1", r"logging\.progress \(LoggingConfig\.progress\): must be true or false"),
    ("sampling=3", r"sampling: must be a JSON object of SamplingConfig fields \(group_size, "),
    # rewards.specs: not a list, entries not objects, unknown keys, no name (a ValueError from deep in train.py)
    ("rewards.specs=math",
     r"rewards\.specs \(RewardsConfig\.specs\): must be a list.*\"name\", \"weight\", \"kwargs\""),
    ('rewards.specs={"name": "math"}', r"rewards\.specs \(RewardsConfig\.specs\): must be a list"),
    ('rewards.specs=["math"]', r"RewardsConfig\.specs\[0\]: must be an object with keys name, weight, kwargs"),
    ('rewards.specs=[{"name": "math"}, {"nme": "format"}]',
     r"RewardsConfig\.specs\[1\]: unknown keys \['nme'\]; accepted: name, weight, kwargs, version, label"),
    ('rewards.specs=[{"weight": 1.0}]', r"RewardsConfig\.specs\[0\]: needs a reward name under 'name'"),
    ('rewards.specs=[{"name": "math", "weight": "x"}]', r"RewardsConfig\.specs\[0\]: 'weight' must be a finite number"),
    ('rewards.specs=[{"name": "math", "kwargs": 3}]', r"RewardsConfig\.specs\[0\]: 'kwargs' must be an object"),
    # values accepted silently before
    ("checkpoint.every=-5", r"CheckpointConfig\.every: must be >= 0 \(N = every N steps, 0 = only at the end\)"),
    ("checkpoint.keep_last=0", r"CheckpointConfig\.keep_last: must be >= 1"),
    ("logging.eval_every=-1", r"LoggingConfig\.eval_every: must be >= 0"),
    ("sampling.group_size=1", r"SamplingConfig\.group_size: must be >= 2, got 1: .*every advantage is 0"),
    ("seed=-1", r"TrainConfig\.seed: must be >= 0"),
])
def test_bad_values_name_the_key_and_what_is_accepted(item, words):
    with pytest.raises(ValueError, match=words):
        override(TrainConfig(), [item])


def test_integer_fields_take_integral_numbers_and_string_fields_take_the_text():
    cfg = override(TrainConfig(), ["steps=3.0", "checkpoint.every=1e1", "task.train_path=2024", "model.preset=tiny"])
    assert cfg.steps == 3 and type(cfg.steps) is int and cfg.checkpoint.every == 10
    assert cfg.task.train_path == "2024"
    assert override(TrainConfig(), ["loss.eps_high=null", "sampling.temperature=1"]).sampling.temperature == 1
    with pytest.raises(ValueError, match=r"TrainConfig\.steps: must be an integer, got 2\.5"):
        TrainConfig(steps=2.5)  # built in Python, not through override / from_dict


def test_registry_follows_the_listed_order_and_refuses_a_mismatch():
    # What losses, adapters (and the import-time checks built on it) rely on: a registry built from a
    # config list has its order, and a name missing on either side fails when the module is imported.
    from grpo_jax.config import registry

    assert list(registry("thing", ("b", "a"), {"a": 1, "b": 2})) == ["b", "a"]
    with pytest.raises(ValueError, match=r"^thing names differ .*: not implemented \['c'\], not listed \[\]"):
        registry("thing", ("a", "c"), {"a": 1})
    with pytest.raises(ValueError, match=r"not implemented \[\], not listed \['x'\]"):
        registry("thing", ("a",), {"a": 1, "x": 2})


@pytest.mark.parametrize("names, module", [("POLICY_LOSSES", "grpo_jax.losses"),
                                           ("ROW_FORMATS", "grpo_jax.tasks.adapters"),
                                           ("REWARD_SPEC_FIELDS", "grpo_jax.rewards.registry")])
def test_a_config_name_without_an_implementation_fails_the_import(names, module):
    # The lists live in grpo_jax.config only; the module implementing them checks itself against them at import.
    code = f"import grpo_jax.config as c; c.{names} += ('extra',); import {module}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode != 0 and "ValueError" in out.stderr and "'extra'" in out.stderr, out.stderr[-2000:]


def test_reward_spec_errors_from_the_registry_name_the_entry():
    from grpo_jax.tasks import get_task
    from grpo_jax.build import reward_specs

    cfg = override(TrainConfig(), ['rewards.specs=[{"name": "math"}, {"name": "maths", "weight": 2}]'])
    with pytest.raises(ValueError, match=r'rewards\.specs\[1\] = \{"name": "maths", "weight": 2\}: unknown reward '
                                         r"'maths'; known rewards: .*math"):
        reward_specs(cfg, get_task("arithmetic"))
    gated = override(TrainConfig(), ['rewards.specs=[{"name": "math"}, {"name": "format", "when": "correct"}]'])
    with pytest.raises(ValueError, match=r"rewards\.specs: reward dimension 'format': when='correct' must name"):
        reward_specs(gated, get_task("arithmetic"))  # at config time, not at the first step


@pytest.mark.parametrize("text, words", [
    ('{"steps": 3,\n "seed": }', r"bad\.json:2:10: invalid JSON \(Expecting value\)"),
    ("[1, 2]", r"bad\.json: TrainConfig: must be a JSON object of TrainConfig fields"),
    ('{"steps": "many"}', r"bad\.json: steps \(TrainConfig\.steps\): must be an integer"),
    ('{"sampling": {"temprature": 1}}', r"bad\.json: sampling: SamplingConfig: unknown fields \['temprature'\]"),
    ('{"monitor": {"rules": [{"metric": "kl", "kind": "above", "treshold": 1}]}}',
     r"bad\.json: MonitorConfig\.rules\[0\]: rule 'kl': unknown key\(s\) \['treshold'\]; AlarmRule's fields"),
])
def test_config_file_errors_name_the_file(tmp_path, text, words):
    from grpo_jax.cli import parse_args

    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(ValueError, match=words):
        parse_args(["--config", str(tmp_path / "bad.json")])
    with pytest.raises(ValueError, match=r"--config .*nothing\.json: cannot read"):
        parse_args(["--config", str(tmp_path / "nothing.json")])


def test_inert_settings_name_what_acts_on_nothing():
    base = TrainConfig()  # 32 prompts x G 8 x 16 new tokens = 4096 tokens at most in one update
    assert base.prompts_per_step * base.sampling.group_size * base.sampling.max_new_tokens == 4096
    assert inert_settings(base) == []
    # clip-higher on-policy (mu = minibatches = 1) clips nothing; a second epoch or minibatch makes it act
    (note,) = inert_settings(override(base, ["loss.eps_high=0.28"]))
    assert note.startswith("loss.eps_high = 0.28 (clip-higher) clips nothing")
    assert inert_settings(override(base, ["loss.eps_high=0.28", "mu=2"])) == []
    assert inert_settings(override(base, ["loss.eps_high=0.28", "minibatches=2"])) == []
    # KL-Cov at the paper's ratio: on-policy, and floor(2e-4 * 4096) = 0 -> one token
    on_policy, one_token = inert_settings(override(base, ["loss.policy_loss=kl_cov"]))
    assert "kl_cov" in on_policy and "loss.kl_cov_ratio = 0.0002 selects one token" in one_token
    assert inert_settings(override(base, ["loss.policy_loss=kl_cov", "loss.kl_cov_ratio=0.05", "mu=2"])) == []
    # Clip-Cov acts on-policy (it detaches tokens); only its count can be one: floor(r * 4096) >= 2 iff r >= 2/4096
    (note,) = inert_settings(override(base, ["loss.policy_loss=clip_cov", f"loss.clip_cov_ratio={1.9 / 4096}"]))
    assert note.startswith("loss.clip_cov_ratio = ")
    assert inert_settings(override(base, ["loss.policy_loss=clip_cov", f"loss.clip_cov_ratio={2 / 4096}"])) == []
    # with two minibatches an update has half the tokens
    assert inert_settings(override(base, ["loss.policy_loss=clip_cov", f"loss.clip_cov_ratio={3 / 4096}",
                                          "minibatches=2"]))


def test_building_a_config_imports_no_jax():
    """config validates against models.config's lists without importing jax (models loads its names lazily),
    so building or checking a config never waits on the code that reads it."""
    code = ("import sys, grpo_jax.config as c; c.override(c.TrainConfig(), ['model.remat=full', 'lora.rank=4']); "
            "print(sorted(m for m in ('jax', 'numpy', 'models.transformer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
