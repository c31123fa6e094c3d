"""Named configs: the default experiment (3-digit addition, `experiments/arithmetic.py`) and what the studies
built on it share (`experiments/reward_collapse.py`, `entropy_collapse.py`, `bf16_gap.py`).

    from grpo_jax import presets
    cfg = presets.arithmetic()                  # the default experiment's TrainConfig
    cfg = presets.arithmetic(smoke=True)        # its seconds-long variant (what the tests run)
    warm = presets.sft(smoke=False)             # its supervised warm start (a fresh dict: SFT or SFT_SMOKE)
    cfg = presets.study(steps=200, eval_every=50)  # the default experiment as a study's arms start from it
    cfg = presets.countdown()                   # Countdown: several solution paths per problem

Each function returns a new config; change one with `grpo_jax.config.override(cfg, ["key=value", ...])`.
"""

from __future__ import annotations

from grpo_jax.config import TrainConfig, override

# The supervised warm start before GRPO: `grpo_jax.sft.warm_start` keywords, plus n_valid (the validation rows
# it is stopped on). Stopped at 30% validation accuracy: a weak baseline that GRPO then improves
# (docs/measurements.md §2).
SFT = dict(target_accuracy=0.30, max_steps=3000, batch_size=128, lr=1e-3, eval_every=25, n_valid=300)
SFT_SMOKE = dict(target_accuracy=0.30, max_steps=4, batch_size=16, lr=1e-3, eval_every=2, n_valid=16)


def arithmetic(smoke: bool = False) -> TrainConfig:
    """The default experiment: a from-scratch model (width 128, 2 layers) learns 3-digit addition with GRPO
    after the warm start `SFT`; 32 prompts x G=8, temperature 1, lr 1e-4, beta 0, reward = correct + 0.1 x
    format, DAPO dynamic sampling (64 prompts drawn per step, the 32 groups whose rewards differ used), 1,000
    steps, 500 held-out problems (docs/measurements.md §2). smoke: seconds; 2 steps of 4 prompts x G=4 on a
    width-32 one-layer model, 16 held-out problems."""
    cfg = override(TrainConfig(), [
        "steps=1000", "prompts_per_step=32", "sampling.group_size=8", "sampling.max_new_tokens=14",
        "model.preset=tiny", "model.d_model=128", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=4",
        "model.head_dim=32", "model.mlp_dim=384", "optim.lr=1e-4", "loss.beta=0.0", "task.name=arithmetic",
        "task.n_train=20000", "task.n_eval=500", "logging.eval_every=100", "checkpoint.every=100",
        "dynamic.enabled=true", "dynamic.oversample=2.0", "dynamic.max_rounds=1",
    ])
    return shrink(cfg) if smoke else cfg


def tool_arithmetic(smoke: bool = False) -> TrainConfig:
    """The default experiment's model on 3-digit multiplication (task `tool_arithmetic`), 48 new tokens (a call, its
    output and the answer take about 40); the tool stays off here (`tool.enabled`), so one config serves both arms of
    experiments/tool_use.py, which sets the steps and a fixed-length warm start. `SFT`'s stop at 30% validation
    accuracy does not fit this task: its validation decodes in one turn, where a warm start solves no 3-digit
    product in its head (0% from 100 to 500 steps), so it would run all 3000 steps. smoke: as `arithmetic`'s."""
    return override(arithmetic(smoke), ["task.name=tool_arithmetic", "sampling.max_new_tokens=48"])


# A seconds-long variant of any config: 2 steps of 4 prompts x G=4 on a width-32 one-layer model, 16 held-out rows
SMOKE = ("steps=2", "prompts_per_step=4", "sampling.group_size=4", "task.n_train=200", "task.n_eval=16",
         "logging.eval_every=1", "checkpoint.every=1", "model.d_model=32", "model.mlp_dim=64", "model.n_layers=1")


def shrink(cfg: TrainConfig) -> TrainConfig:
    """`cfg` at smoke scale (SMOKE): what `--smoke` means for a config without a preset of its own."""
    return override(cfg, list(SMOKE))


def sft(smoke: bool = False) -> dict:
    """The warm start's settings (a copy of SFT_SMOKE with smoke, else of SFT)."""
    return dict(SFT_SMOKE if smoke else SFT)


def study(smoke: bool = False, *, steps: int, eval_every: int, smoke_steps: int = 2) -> TrainConfig:
    """`arithmetic(smoke)` as a study's arms run it: `steps` GRPO steps (`smoke_steps` with smoke), a held-out
    evaluation every `eval_every` steps (every step with smoke), no checkpoints and no TensorBoard (a study
    trains many runs and writes its own comparison plots)."""
    return override(arithmetic(smoke), [
        f"steps={smoke_steps if smoke else steps}", f"logging.eval_every={1 if smoke else eval_every}",
        "checkpoint.every=0", "logging.tensorboard=false",
    ])


def collapse_study(smoke: bool = False, *, steps: int, eval_every: int, smoke_steps: int = 2) -> TrainConfig:
    """`study(...)` for the collapse studies: the collapse alarms warn instead of pausing the run
    (`monitor.collapse_action=warn`), since the collapse is what these studies measure."""
    return override(study(smoke, steps=steps, eval_every=eval_every, smoke_steps=smoke_steps),
                    ["monitor.collapse_action=warn"])


# Countdown's warm start: stopped on greedy validation accuracy like the default experiment's, on solver traces
# drawn at random among each problem's solutions (so the starting policy spreads over them).
COUNTDOWN_SFT = dict(target_accuracy=0.30, max_steps=4000, batch_size=128, lr=1e-3, eval_every=50, n_valid=300)
COUNTDOWN_SFT_SMOKE = dict(target_accuracy=0.30, max_steps=4, batch_size=16, lr=1e-3, eval_every=2, n_valid=16)


def countdown(smoke: bool = False) -> TrainConfig:
    """Countdown (`grpo_jax.tasks.countdown`) with 3 numbers in 1..50, a target in 1..100 and at least two
    distinct solutions per problem (3.1 solver traces per problem on average, reasoning ~17 tokens): the default
    experiment's model with room for the ~31-token completions (40 new tokens), lr 2e-4, 400 steps, 2,000
    held-out problems, and an evaluation that sees both collapses: 16 samples at T = 1 per held-out problem
    (pass@1..16, distinct correct solutions) at the start and the end. The task's own default, 4 numbers (13.6
    solutions per problem), did not warm-start past ~22% greedy accuracy at this model size
    (docs/measurements.md). smoke: seconds, as `arithmetic(smoke=True)`."""
    cfg = override(arithmetic(), [
        "task.name=countdown", 'task.options=[["n_numbers", 3], ["max_number", 50], ["min_solutions", 2]]',
        "sampling.max_new_tokens=40",
        "task.n_eval=2000", "logging.eval_samples=16", "steps=400", "optim.lr=2e-4", "logging.eval_every=50",
    ])
    if smoke:
        cfg = override(cfg, ["steps=2", "prompts_per_step=4", "sampling.group_size=4", "task.n_train=200",
                             "task.n_eval=8", "logging.eval_every=1", "logging.eval_samples=4", "checkpoint.every=1",
                             "model.d_model=32", "model.mlp_dim=64", "model.n_layers=1"])
    return cfg


def countdown_study(smoke: bool = False, *, steps: int, eval_every: int, n_eval: int, eval_samples: int,
                    checkpoint_every: int = 50) -> TrainConfig:
    """`countdown(smoke)` as a collapse study's arms run it: `steps` GRPO steps, a held-out evaluation of `n_eval`
    problems every `eval_every` steps (`eval_samples` samples at T = 1 at the start and the end), a checkpoint
    every `checkpoint_every` steps (the newest kept: a stopped study resumes from it), no TensorBoard, and the
    collapse alarms warning instead of pausing (the collapse is what the studies measure). smoke: as
    `countdown(smoke=True)` with 3 steps."""
    if smoke:
        return override(countdown(True), ["steps=3", "logging.tensorboard=false", "monitor.collapse_action=warn",
                                          "checkpoint.keep_last=1"])
    return override(countdown(), [
        f"steps={steps}", f"logging.eval_every={eval_every}", f"task.n_eval={n_eval}",
        f"logging.eval_samples={eval_samples}", f"checkpoint.every={checkpoint_every}", "checkpoint.keep_last=1",
        "logging.tensorboard=false", "monitor.collapse_action=warn",
    ])


def countdown_sft(smoke: bool = False) -> dict:
    """Countdown's warm-start settings (a copy of COUNTDOWN_SFT_SMOKE with smoke, else of COUNTDOWN_SFT)."""
    return dict(COUNTDOWN_SFT_SMOKE if smoke else COUNTDOWN_SFT)
