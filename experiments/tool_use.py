"""Tool use: does GRPO with a Python tool beat GRPO without one, on a task where the tool pays?

    python experiments/tool_use.py --jobs 2      # the pre-registered arms and seeds
    python experiments/tool_use.py --smoke       # seconds; what the tests run

A stopped study resumes with the same command (finished runs kept, a stopped run from its newest checkpoint).

Task: 3-digit multiplication (`tasks.tool_arithmetic`, "123*456="), which the default experiment's model (width 128,
2 layers) rarely gets right in its head, and which `<python>print(123*456)</python>` answers exactly. Each seed's
supervised warm start (WARM_STEPS steps, the same for every arm: shared, kept on disk) shows the call on about half
of its draws (the task's two solutions), so the starting policy sometimes calls and sometimes answers in its head.

Arms (experiments/results/tool_use/PREREGISTERED.md):
- `tool`: GRPO with the tool on (`tool.enabled=true`): a row that closes a call pauses, the call runs in the
  sandbox and its output is fed back as tokens the loss skips; held-out accuracy is measured with the tool.
- `no_tool`: the same GRPO with no tool: one-turn decoding, a call is never answered (the policy must compute
  the product itself); held-out accuracy without the tool.
- `null`: `no_tool` with only its rollout key changed (the noise floor of the comparison).

Primary: held-out greedy accuracy at the end (`accuracy_final`, N_EVAL problems per seed, each arm evaluated the
way it trained), `tool` against `no_tool`, paired over the pre-registered seeds: the paired t-interval, Holm over
the table, TOST at +-SESOI, beside the `null` arm's noise floor; and the acceptance test: `tool` ahead on each seed.
Also reported over the GRPO steps: the tool-call rate, calls per row, the share of calls that fail, the held-out
accuracy with the tool and, for the `tool` arm, without it (the same policy decoded in one turn).
"""

from __future__ import annotations


from grpo_jax import presets
from grpo_jax.cli import for_people
from grpo_jax.config import TrainConfig, override
from grpo_jax.reporting import plot_curves, write_study
from grpo_jax.study import Arm, compare_seeds, launch, publish

STEPS = 60
PROMPTS = 16
LR = 3e-4
EVAL_EVERY = 20
N_EVAL = 500
CHECKPOINT_EVERY = 20
WARM_STEPS = 400
# a fixed-length warm start: its validation (in one turn, no tool) never reaches a target above 1, so every arm of a
# seed starts from the same WARM_STEPS steps whatever its own evaluation would say
WARM = dict(target_accuracy=1.01, max_steps=WARM_STEPS, batch_size=128, lr=1e-3, eval_every=WARM_STEPS, n_valid=100)
WARM_SMOKE = dict(target_accuracy=1.01, max_steps=4, batch_size=16, lr=1e-3, eval_every=4, n_valid=8)
SESOI = 0.05  # 5 points of held-out accuracy
SEEDS = (1201, 1202, 1203)  # fixed in PREREGISTERED.md before any of them ran
TOOL = ("tool.enabled=true",)
ARMS = {"tool": Arm(TOOL), "no_tool": Arm(()), "null": Arm(("sampling.key_offset=1",))}
ARCHIVE_KEYS = ("eval/", "tool/", "reward/math/mean")
# What differs from PREREGISTERED.md, printed in results.md: the confirmatory runs trained with the pre-registration
# commit's code; results.md is written by --summarize-only at a later commit whose `summarize` finds the training
# steps by a key the archived per-run files keep, so experiments/recompute.py can rebuild every column from them.
DEVIATIONS = ("Deviation from the pre-registration: the runs trained with its commit's code (5d60d5a); this table "
              "was written by --summarize-only at a later commit (results.json), whose summarize finds the training "
              "steps by `reward/math/mean` (kept in the archived per-run files) instead of `loss` (not kept): the "
              "same steps, the same figures.")


def get_config(smoke: bool = False) -> TrainConfig:
    """python experiments/tool_use.py [--smoke] [--jobs N] [--arms A,B] [--seeds S,T] [--set KEY=VALUE ...]"""
    cfg = override(presets.tool_arithmetic(smoke), [
        # the baseline's groups mostly score 0 (no gradient), a collapse that is part of what is compared: warn only
        "dynamic.enabled=false", "tool.share_identical=true", "logging.tensorboard=false", "monitor.collapse_action=warn",
        *([] if smoke else [f"steps={STEPS}", f"prompts_per_step={PROMPTS}", f"optim.lr={LR}",
                            f"logging.eval_every={EVAL_EVERY}", f"task.n_eval={N_EVAL}",
                            f"checkpoint.every={CHECKPOINT_EVERY}"]),
    ])
    return cfg


def summarize(rows: list[dict]) -> dict:
    """One run's held-out figures at the start and the end, and its tool use over the last steps."""
    evals = [r for r in rows if "eval/accuracy" in r]
    train = [r for r in rows if "reward/math/mean" in r]  # the training steps (a key the archived files keep)
    out = {}
    for when, ev in (("start", evals[0]), ("final", evals[-1])):
        out[f"accuracy_{when}"] = ev["eval/accuracy"]
        out[f"no_tool_accuracy_{when}"] = ev.get("eval/no_tool/accuracy", ev["eval/accuracy"])
        out[f"call_rate_{when}"] = ev.get("eval/tool/call_rate", 0.0)
    last = train[-10:]
    for key, name in (("tool/call_rate", "train_call_rate"), ("tool/calls_per_row", "train_calls_per_row"),
                      ("tool/error_rate", "train_error_rate")):
        out[name] = sum(r.get(key, 0.0) for r in last) / max(len(last), 1)
    return out


@for_people
def main(argv=None) -> dict:
    run = launch(argv, doc=__doc__, get_config=get_config, arms=ARMS, default_out="runs/tool_use",
                 summarize=summarize, warm=WARM, smoke_warm=WARM_SMOKE, warm_seed_default=-1, default_seeds=SEEDS)
    cfg, out, arms, study = run.cfg, run.out, run.arms, run.study
    primary = compare_seeds(study["results"], baseline="no_tool", metric="accuracy_final", null="null",
                            arms=[a for a in arms if a == "tool"], sesoi=SESOI)
    base = {r["seed"]: r["accuracy_final"] for r in study["results"].get("no_tool", [])}
    ahead = {r["seed"]: r["accuracy_final"] > base[r["seed"]] for r in study["results"].get("tool", [])
             if r["seed"] in base}
    study["tool_ahead_on_each_seed"] = ahead
    study["verdict"] = {a: e["decision"] for a, e in primary["arms"].items()}
    study["settings"] = {"steps": cfg.steps, "prompts_per_step": cfg.prompts_per_step, "lr": cfg.optim.lr,
                         "warm_steps": WARM_STEPS if not run.args.smoke else WARM_SMOKE["max_steps"], "sesoi": SESOI,
                         "n_eval": cfg.task.n_eval, "max_new_tokens": cfg.sampling.max_new_tokens}
    plots = [plot_curves(out, arms, "eval/accuracy", "held-out greedy accuracy (each arm as it trained)", "accuracy"),
             plot_curves(out, arms, "eval/no_tool/accuracy", "held-out accuracy without the tool", "no_tool_accuracy"),
             plot_curves(out, arms, "tool/call_rate", "share of rollouts that call the tool", "call_rate"),
             plot_curves(out, arms, "tool/error_rate", "share of calls that fail", "error_rate")]
    notes = (f"3-digit multiplication; each seed's warm start ({study['settings']['warm_steps']} supervised steps) "
             f"shared by its arms; {cfg.steps} GRPO steps of {cfg.prompts_per_step} prompts x "
             f"{cfg.sampling.group_size} at lr {cfg.optim.lr}; {cfg.task.n_eval} held-out problems per seed.\n\n"
             "Primary: accuracy_final, `tool` against `no_tool`: "
             + (", ".join(f"{a} {d}" for a, d in study["verdict"].items()) or "no comparison")
             + "; `tool` ahead on each seed: "
             + (", ".join(f"{s} {'yes' if v else 'NO'}" for s, v in ahead.items()) or "no seed") + "."
             + ("" if run.args.smoke else "\n\n" + DEVIATIONS))
    columns = ["accuracy_start", "accuracy_final", "no_tool_accuracy_start", "no_tool_accuracy_final",
               "call_rate_start", "call_rate_final", "train_call_rate", "train_calls_per_row", "train_error_rate"]
    write_study(out, study, title="Tool use: GRPO with a Python tool against GRPO without", columns=columns,
                plots=plots, notes=notes, seed_comparisons=[primary],
                seed_columns=["accuracy_final", "no_tool_accuracy_final", "call_rate_final"])
    publish(out, arms, study["seeds"], metric_keys=ARCHIVE_KEYS)
    return study


if __name__ == "__main__":
    main()
