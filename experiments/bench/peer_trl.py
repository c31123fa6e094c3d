"""TRL's GRPOTrainer on the benchmark work, timed per step: the peer figure `bench_train.py --trl` prints
beside ours (the step-time comparison of docs/measurements.md §1). Needs `pip install -e '.[peers]'` (trl,
torch).

    python experiments/bench/peer_trl.py           # on its own: 2 warm-up + 5 timed steps

Same work as bench_train: a tiny Qwen2 (vocab 512, hidden 256, MLP 688, 4 layers, 8/2 heads, tied, random
init, seed 0, float32), 8 prompts x G=8 (per-device batch 64 completions), 16-token prompts, exactly 128
new tokens (`min_new_tokens` suppresses EOS), temperature 1, beta 0.04 (a frozen reference model), one
update per rollout (num_iterations 1, no gradient accumulation), torch on `threads` CPU threads. The
tokenizer is a 512-entry word-level one (3 specials, then "t3" .. "t511") so prompts are exactly 16 tokens; the reward is
a constant-time function of the completion's text, so scoring costs nothing measurable.

Per step: wall time between the Trainer's step callbacks (rollout, scoring, reference and policy forward,
loss backward, optimizer), and the parts spent in `generate` and in the reference model's forward
(timed by wrapping those two calls).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np


def build_tokenizer(vocab_size: int):
    """A word-level fast tokenizer: ids 0, 1, 2 = <pad>, <eos>, <unk>, then "t3" .. "t{V-1}", one word per id
    (special names that no word contains: added tokens are matched inside words before splitting)."""
    # here, not at the top: `run` sets HF_HUB_OFFLINE first, and huggingface_hub reads it once, on import
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def run(*, prompts: int = 8, group: int = 8, prompt_len: int = 16, new_tokens: int = 128, beta: float = 0.04,
        warmup: int = 2, repeats: int = 5, threads: int = 2) -> dict:
    """Median seconds per TRL GRPO step and its generate / reference-forward parts."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # everything is local; never reach for the hub
    # after HF_HUB_OFFLINE (huggingface_hub reads it on import); trl, torch, datasets: the optional `peers` extra
    import torch
    import transformers
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf_cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
                                      rope_theta=1e6, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    model = transformers.Qwen2ForCausalLM(hf_cfg)
    tokenizer = build_tokenizer(hf_cfg.vocab_size)
    steps = warmup + repeats
    rng = np.random.RandomState(0)
    texts = [" ".join(f"t{i}" for i in rng.randint(3, 512, prompt_len)) for _ in range(prompts * steps)]
    assert all(len(tokenizer(t, add_special_tokens=False)["input_ids"]) == prompt_len for t in texts[:4])

    def reward(completions, **_):
        return [float(len(c) % 7) for c in completions]

    marks: dict[str, list[float]] = {"step": [], "generate": [], "reference": []}

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            marks[name].append(time.perf_counter() - t0)
            return out
        return wrapper

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()
            self.counts = {k: len(v) for k, v in marks.items()}

        def on_step_end(self, *_, **__):
            marks["step"].append(time.perf_counter() - self.t0)
            for k in ("generate", "reference"):  # one entry per step: the sum of that step's calls
                calls = marks[k][self.counts[k]:]
                del marks[k][self.counts[k]:]
                marks[k].append(sum(calls))

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(f"{tmp}/model")  # TRL builds its reference model from a path: give it ours
        tokenizer.save_pretrained(f"{tmp}/model")
        args = GRPOConfig(output_dir=f"{tmp}/out", model_init_kwargs={"dtype": torch.float32}, per_device_train_batch_size=prompts * group, num_generations=group,
                          max_completion_length=new_tokens, generation_kwargs={"min_new_tokens": new_tokens},
                          temperature=1.0, top_k=0, top_p=1.0, beta=beta, num_iterations=1, max_steps=steps,
                          learning_rate=1e-5, use_cpu=True, bf16=False, report_to=[], logging_steps=1,
                          save_strategy="no", dataloader_num_workers=0, shuffle_dataset=False, seed=0)
        trainer = GRPOTrainer(model=f"{tmp}/model", reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": texts}), processing_class=tokenizer,
                              callbacks=[StepTimer()])
        trainer.model.generate = timed("generate", trainer.model.generate)
        if trainer.ref_model is None:
            raise RuntimeError("TRL built no reference model: beta must be > 0 for this comparison")
        trainer.ref_model.forward = timed("reference", trainer.ref_model.forward)
        trainer.train()
    if len(marks["step"]) != steps:
        raise RuntimeError(f"expected {steps} TRL steps, timed {len(marks['step'])}")
    out = {k: statistics.median(v[warmup:]) for k, v in marks.items()}
    out["update"] = out["step"] - out["generate"] - out["reference"]
    return out


def main() -> None:
    r = run()
    print(f"TRL GRPOTrainer, median of 5 steps: step {r['step']:.3f} s = generate {r['generate']:.3f} + reference "
          f"forward {r['reference']:.3f} + the rest (policy forward, loss, backward, optimizer) {r['update']:.3f}")


if __name__ == "__main__":
    main()
