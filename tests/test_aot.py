"""Compiling a run for a TPU topology on this CPU-only machine (grpo_jax.aot): every program compiles with
XLA's TPU compiler and reports its figures, the sharding rules really split the train state over fsdp (a rule
broken on purpose is caught), a run too big for the chip says so and exits non-zero, topology names resolve."""

from __future__ import annotations

import importlib.util

import pytest

from grpo_jax import aot, sharding
from grpo_jax.config import TrainConfig, UserError, override
from tests.launchers import load_launcher

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="the TPU compiler is not installed (pip install -e '.[tpu]'; CI installs it)")

# the default model (tiny preset at the arithmetic task's vocabulary), a small step, params split over 8 chips
SMALL = ["prompts_per_step=8", "sampling.group_size=4", "sampling.max_new_tokens=8", "mesh.fsdp=8"]


def _compile(overrides, *, only=None):
    return aot.compile_run(override(TrainConfig(), overrides), "v5e:2x4", prompt_len=16, only=only,
                           log=lambda *_: None)


def test_every_program_of_a_run_compiles_for_v5e_and_reports_its_figures():
    report = _compile(SMALL)
    assert report["chips"] == 8 and report["topology"] == "v5e:2x4"
    # params split over fsdp: the sampler runs as SPMD prefill + decode, not the per-device rollout program
    assert list(report["programs"]) == ["train_step", "logprobs", "prefill", "decode"]
    for name, f in report["programs"].items():
        assert "refused" not in f, name
        for key in ("argument_bytes", "output_bytes", "code_bytes", "total_bytes", "xla_flops", "compile_seconds"):
            assert f[key] > 0, (name, key, f[key])
        assert f["temp_bytes"] >= 0
    assert report["programs"]["train_step"]["temp_bytes"] > 0  # activations and gradients
    train = report["programs"]["train_step"]
    assert train["alias_bytes"] > 0  # the state is donated: its buffers are the outputs'
    assert train["collectives"]["all-gather"]["count"] > 0  # fsdp gathers the weights it multiplies with
    assert train["collectives"]["all-gather"]["bytes"] > 0
    assert report["peak"]["fits"] and 0 < report["peak"]["bytes"] < report["chip"]["hbm_bytes"]
    est = report["estimate"]
    assert est["label"].startswith("ESTIMATE")
    assert est["step_seconds"] > 0 and est["rollout_tokens_per_s_per_chip"] > 0 and 0 < est["mfu"] < 1
    text = aot.format_report(report)
    assert "fits" in text and "ESTIMATE" in text and "| decode |" in text


def _state_argument_bytes(overrides, monkeypatch=None) -> int:
    return _compile(overrides, only=("train_step",))["programs"]["train_step"]["argument_bytes"]


def _assert_fsdp_splits_the_state(sharded: int, replicated: int) -> None:
    """With fsdp=8 each chip holds an eighth of the params and both Adam moments; the batch and the norm vectors
    are the only arguments not split (a few KiB here), so the arguments shrink well past half."""
    assert sharded < replicated / 4, f"fsdp=8 arguments {sharded} B per chip, data-parallel {replicated} B"


def test_the_rules_split_the_train_state_over_fsdp():
    data_parallel = _state_argument_bytes(SMALL[:-1] + ["mesh.fsdp=1"])
    _assert_fsdp_splits_the_state(_state_argument_bytes(SMALL), data_parallel)


def test_a_sharding_rule_broken_on_purpose_is_caught(monkeypatch):
    """embed -> replicated (the rule dropped): the weights are whole on every chip and the check above fails."""
    data_parallel = _state_argument_bytes(SMALL[:-1] + ["mesh.fsdp=1"])
    monkeypatch.setitem(sharding.RULES, "embed", None)
    with pytest.raises(AssertionError, match="fsdp=8 arguments"):
        _assert_fsdp_splits_the_state(_state_argument_bytes(SMALL), data_parallel)


def test_a_run_too_big_for_the_chip_does_not_fit_and_exits_nonzero(capsys):
    """8 layers of width 4096 with MLP 16384 in float32, replicated on every chip (data parallel): 1.6e9
    params x 4 bytes x 3 (weights and both Adam moments) = 19.4 GB of state on a 16 GiB v5e."""
    argv = ["--topology", "v5e:2x4", "--programs", "train_step", "--prompt-len", "16", "--quiet"]
    for s in ["prompts_per_step=8", "sampling.group_size=2", "sampling.max_new_tokens=8", "model.n_layers=8",
              "model.d_model=4096", "model.mlp_dim=16384"]:
        argv += ["--set", s]
    with pytest.raises(SystemExit) as exit_info:
        aot.main(argv)
    assert exit_info.value.code == aot.NOT_FIT_EXIT_CODE
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("does not fit: train_step needs") and "TPU v5e has 16.00 GiB" in err
    need = float(err.split("needs ")[1].split(" GiB")[0])
    assert need > 16.0


def test_a_launcher_compiles_its_own_config_with_compile_only(capsys):
    """experiments/arithmetic.py --compile-only: the default experiment's config (its model, its vocabulary,
    its prompt bucket), no training, no run folder."""
    summary = load_launcher("arithmetic").main(["--compile-only", "--topology", "v5e:2x4", "--programs",
                                                "logprobs", "--quiet", "--out", "/nonexistent/never-written"])
    assert list(summary["programs"]) == ["logprobs"]
    assert summary["work"]["prompts"] == 32 and summary["work"]["prompt_len"] >= 8
    assert "v5e:2x4 (8 chips of TPU v5e" in capsys.readouterr().out


@pytest.mark.parametrize("name,expected", [("v5e:2x4", ("v5e", "v5e:2x4")), ("v5e-64", ("v5e", "v5e:8x8")),
                                           ("v5e-256", ("v5e", "v5e:16x16")), ("v5p-64", ("v5p", "v5p:4x4x4")),
                                           ("v6e-64", ("v6e", "v6e:8x8")), ("v4-8", ("v4", "v4:2x2x2"))])
def test_topology_names(name, expected):
    assert aot.topology_name(name) == expected


@pytest.mark.parametrize("name", ["v9:2x2", "v5e", "v5e-48", "h100-8"])
def test_unknown_topology_names_are_refused_naming_the_flag(name):
    with pytest.raises(UserError, match="--topology"):
        aot.topology_name(name)


def test_collectives_are_read_from_the_compiled_hlo_with_their_bytes():
    hlo = "\n".join([
        "  %all-gather.1 = bf16[1024,896]{1,0:T(8,128)(2,1)} all-gather(%p.1), channel_id=1, dimensions={0}",
        "  %ar = (f32[16]{0}, f32[4,4]{1,0}) all-reduce(%a, %b), channel_id=2, to_apply=%add",
        "  %rs-start = f32[128]{0} reduce-scatter-start(%g), channel_id=3",  # only -start counted, not -done
        "  %rs-done = f32[128]{0} reduce-scatter-done(%rs-start)",
        "  %dot.1 = f32[8,8]{1,0} dot(%x, %y)",
    ])
    assert aot.collectives(hlo) == {"all-gather": {"count": 1, "bytes": 1024 * 896 * 2},
                                    "all-reduce": {"count": 1, "bytes": (16 + 16) * 4},
                                    "reduce-scatter": {"count": 1, "bytes": 128 * 4}}


def test_a_refusal_from_the_compiler_becomes_a_figure():
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
               "(85.09G) exceeds available HBM (15.75G).")
    f = aot.refused_figures(message, seconds=1.0)
    assert f["total_bytes"] == int(85.09 * 1024**3) and "HLO temporaries (85.09G)" in f["refused"]
    with pytest.raises(RuntimeError, match="TPU compiler failed"):
        aot.refused_figures("INVALID_ARGUMENT: something else", seconds=1.0)


def test_tensor_ways_that_do_not_divide_the_kv_heads_are_named():
    """The tiny model has 2 KV heads and 4 query heads: 4 rollout tensor ways replicate the KV cache."""
    from models.config import tiny
    cfg = override(TrainConfig(), ["mesh.rollout_data=-1", "mesh.rollout_tensor=4"])
    notes = aot.layout_notes(cfg, tiny())
    assert len(notes) == 1 and notes[0].startswith("mesh.rollout_tensor=4 does not divide the model's 2 KV heads")
    assert aot.layout_notes(override(TrainConfig(), ["mesh.rollout_data=-1", "mesh.rollout_tensor=2"]), tiny()) == []
