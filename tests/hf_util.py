"""Helpers shared by tests that compare against transformers (PyTorch) models built with random weights."""

from __future__ import annotations

import numpy as np
import torch
import transformers

transformers.logging.set_verbosity_error()

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
# Qwen2-VL special tokens placed inside the tiny vocabulary.
VL_TOKENS = dict(vision_start_token_id=4, vision_end_token_id=7, image_token_id=5, video_token_id=6)


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Every parameter (norm weights and biases included) random, so no term of the forward is trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(1.0 + std * torch.randn(p.shape, generator=gen) if p.ndim == 1 and "norm" in _name(model, p)
                    else std * torch.randn(p.shape, generator=gen))
    return model.eval()


def _name(model, param) -> str:
    for n, p in model.named_parameters():
        if p is param:
            return n
    return ""


def build(arch: str, *, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny random transformers model of one supported architecture, float32, eval mode."""
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**{**TINY, **overrides})
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**{**TINY, "tie_word_embeddings": True, **overrides})
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":  # head_dim 32 > hidden / heads = 16 (as Qwen3's 128 > 1024 / 16), q/k norms
        cfg = transformers.Qwen3Config(**{**TINY, "head_dim": 32, "tie_word_embeddings": True, **overrides})
        model = transformers.Qwen3ForCausalLM(cfg)
    elif arch == "qwen2_vl":
        text = {**TINY, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                **overrides}
        cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(depth=1, embed_dim=32, hidden_size=64,
                                                                             num_heads=2), **VL_TOKENS)
        model = transformers.Qwen2VLForConditionalGeneration(cfg)
    else:
        raise ValueError(arch)
    return randomize(model, seed)


def hf_logits(model, tokens: np.ndarray, *, position_ids: np.ndarray | None = None,
              attention_mask: np.ndarray | None = None) -> np.ndarray:
    kwargs = {}
    if position_ids is not None:
        kwargs["position_ids"] = torch.as_tensor(np.asarray(position_ids), dtype=torch.long)
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.as_tensor(np.asarray(attention_mask), dtype=torch.long)
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(np.asarray(tokens), dtype=torch.long), **kwargs).logits.float().numpy()
