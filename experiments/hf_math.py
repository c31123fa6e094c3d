"""GRPO from a local Hugging Face checkpoint on a JSONL maths dataset (math + format rewards), on one CPU,
a GPU host or a TPU pod: the mesh and multi-host settings are ordinary config fields.

    python experiments/hf_math.py --set model.hf_path=/ckpt/Qwen2.5-0.5B-Instruct \\
        --set task.train_path=data/train.jsonl --set task.eval_path=data/test.jsonl --out runs/hf_math
    python experiments/hf_math.py --smoke          # builds a tiny random Qwen2 + tokenizer in a temp dir, 2 steps

Rows are {"prompt": ..., "answer": ...} (plus "solution" for a warm start). The tokenizer is read from the
checkpoint folder unless task.options gives another `tokenizer_path`. Nothing is fetched from a hub.

On a TPU pod slice (one process per host; run the same command on every host, e.g. via
`gcloud compute tpus tpu-vm ssh NAME --worker=all --command "..."`):

    python experiments/hf_math.py --set model.hf_path=/ckpt/qwen --set task.train_path=/data/train.jsonl \\
        --set mesh.num_processes=4 --set mesh.coordinator=HOST0:8476 --set mesh.process_id=$WORKER \\
        --set mesh.fsdp=4 --set mesh.tensor=4 --set model.param_dtype=bfloat16 --set model.dtype=bfloat16

(`mesh.data` defaults to the devices left after fsdp x tensor; on TPU pods `jax.distributed` can also find
the coordinator itself, so `mesh.coordinator` may stay empty there with num_processes set.)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from grpo_jax.config import TrainConfig, override  # noqa: E402


def get_config(smoke: bool = False) -> TrainConfig:
    return override(TrainConfig(), [
        "task.name=jsonl_math", "steps=200", "prompts_per_step=16", "sampling.group_size=8",
        "sampling.max_new_tokens=512", "optim.lr=1e-6", "loss.beta=0.04", "task.n_eval=200",
        "logging.eval_every=50", "checkpoint.every=50",
    ] + (["steps=2", "prompts_per_step=2", "sampling.group_size=2", "sampling.max_new_tokens=8",
          "task.n_eval=2", "logging.eval_every=1", "checkpoint.every=1", "optim.lr=1e-3"] if smoke else []))


def make_smoke_assets(folder: str) -> dict[str, str]:
    """A tiny random Qwen2 checkpoint with a word-level tokenizer, and train/test JSONL files."""
    import tokenizers
    import torch
    import transformers

    words = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", "<think>", "</think>", "<answer>", "</answer>", "+", "="]
    vocab = {w: i for i, w in enumerate(words + [str(i) for i in range(20)])}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="[BOS]",
                                               eos_token="[EOS]", unk_token="[UNK]")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                   eos_token_id=2, pad_token_id=0, bos_token_id=1)
    ckpt = os.path.join(folder, "ckpt")
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    paths = {"ckpt": ckpt}
    for split, pairs in (("train", [(a, b) for a in range(5) for b in range(5)]), ("test", [(1, 2), (3, 4)])):
        rows = [{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a, b in pairs]
        paths[split] = os.path.join(folder, f"{split}.jsonl")
        with open(paths[split], "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    return paths


def main(argv=None) -> dict:
    from grpo_jax.cli import parse_args
    from grpo_jax.train import Trainer

    args, cfg = parse_args(argv, description=__doc__, get_config=get_config)
    out = args.out if args.out != "runs/grpo" else "runs/hf_math"
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            p = make_smoke_assets(tmp)
            cfg = override(cfg, [f"model.hf_path={p['ckpt']}", f"task.train_path={p['train']}",
                                 f"task.eval_path={p['test']}"])
        if not cfg.model.hf_path or not cfg.task.train_path:
            raise SystemExit("hf_math needs --set model.hf_path=DIR and --set task.train_path=FILE (or --smoke)")
        if not dict(cfg.task.options).get("tokenizer_path"):
            options = dict(cfg.task.options, tokenizer_path=cfg.model.hf_path)
            cfg = override(cfg, ["task.options=" + json.dumps(sorted(options.items()))])
        trainer = Trainer(cfg, out, resume=args.resume, quiet=args.quiet)
        summary = trainer.run()
        trainer.report(summary, title="GRPO from a Hugging Face checkpoint on JSONL maths")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
