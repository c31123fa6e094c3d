"""Multi-turn rollouts (`grpo_jax.multiturn`): rows pause when they close a tool call, the host runs the call in the
sandbox and feeds the output back as tokens the policy did not draw, and decoding goes on.

A tiny model is first supervised to say fixed conversations (a call, two calls, no call, a close marker inside a
string literal, a failing call), so greedy rollouts follow them and each test knows what must come out: the
model's text up to each call is memorised, the tool's output is whatever the sandbox printed, and the model's text
after it is memorised again. With the tool's tags as single tokens and, separately, spelled out character by
character (a close marker of several tokens)."""

from __future__ import annotations

import string

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import models
from grpo_jax import multiturn, sampler, sft, tools
from grpo_jax.config import ToolConfig
from grpo_jax.experience import full_sequences
from grpo_jax.rewards.sandbox import SandboxPool
from grpo_jax.tokenizer import TAGS, TASK_ALPHABET, CharTokenizer
from models.rope import rope_positions
from tests.tolerance import EPS64, logprob_tol

TOOL = ToolConfig()
TOOL_TAGS = (TOOL.call_open, TOOL.call_close, TOOL.output_open, TOOL.output_close)
ALPHABET = TASK_ALPHABET + string.ascii_uppercase + '\n"<>_'


def out(body: str) -> str:
    return tools.format_output(body, TOOL)


# prompt -> the conversation the model is taught; tool segments are what the sandbox will print
SCRIPT = {
    "2*3=": ["<python>print(2*3)</python>", out("6"), "<answer>6</answer>"],
    "7+1=": ["<answer>8</answer>"],
    "9*9=": ["<python>print(9*9)</python>", out("81"), "<python>print(81+1)</python>", out("82"), "<answer>82</answer>"],
    "5-5=": ['<python>print("</python>")</python>', out("</python>"), "<answer>0</answer>"],
    "1/0=": ["<python>print(1/0)</python>", out("ZeroDivisionError: division by zero (line 1)"), "<answer>0</answer>"],
}
T = 112


def _tokenizer(atomic: bool) -> CharTokenizer:
    return CharTokenizer(ALPHABET, TAGS + TOOL_TAGS) if atomic else CharTokenizer(ALPHABET, TAGS)


def _prompts(tok) -> tuple[np.ndarray, np.ndarray]:
    rows = [tok.encode(p) for p in SCRIPT]
    width = 8
    toks, mask = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width), bool)
    for i, ids in enumerate(rows):
        toks[i, width - len(ids):], mask[i, width - len(ids):] = ids, True
    return toks, mask


def _teach(atomic: bool):
    """(cfg, params, tokenizer): a tiny model supervised on SCRIPT until it says every conversation greedily."""
    tok = _tokenizer(atomic)
    cfg = models.tiny(vocab_size=tok.vocab_size, d_model=64, n_layers=2)
    params = models.init_params(cfg, jax.random.key(0))
    prompts, pmask = _prompts(tok)
    comp, cmask = np.zeros((len(SCRIPT), T), np.int32), np.zeros((len(SCRIPT), T), bool)
    for i, parts in enumerate(SCRIPT.values()):
        ids = tok.encode("".join(parts)) + [tok.eos_id]
        comp[i, : len(ids)], cmask[i, : len(ids)] = ids, True
    opt = optax.adam(3e-3)
    step, state = sft.make_sft_step(cfg, opt, T), opt.init(params)
    tokens, attn = jnp.concatenate([prompts, comp], 1), jnp.concatenate([pmask, cmask], 1)
    for _ in range(400):
        params, state, loss = step(params, state, tokens, attn, jnp.asarray(cmask))
    return cfg, params, tok


@pytest.fixture(scope="module")
def taught():
    """The tool's tags as single tokens (the tool task's tokenizer): the loop watches one id."""
    return _teach(True)


@pytest.fixture(scope="module")
def taught_spelled():
    """The tags spelled out one character a token: the loop matches the close marker's 9 ids."""
    return _teach(False)


def _sample(taught, *, group_size=1, temperature=0.0, key=1, tool=TOOL, max_new_tokens=T, resume_every=8):
    cfg, params, tok = taught
    prompts, pmask = _prompts(tok)
    with SandboxPool(2) as pool:
        return multiturn.sample_with_tools(
            cfg, params, prompts, pmask, key=jax.random.key(key), group_size=group_size, max_new_tokens=max_new_tokens,
            tool=tool, tokenizer=tok, pool=pool, temperature=temperature, eos_ids=(tok.eos_id,), pad_id=tok.pad_id,
            resume_every=resume_every)


@pytest.mark.parametrize("which", ["taught", "taught_spelled"])
def test_greedy_conversations_follow_the_script_with_the_sandbox_answering(which, request):
    """Each row says its memorised text, pauses at each closed call, gets what the sandbox printed (or the error
    line), and goes on; the marker inside a string literal does not end the call."""
    taught = request.getfixturevalue(which)
    ro, convs = _sample(taught)
    tok = taught[2]
    for i, (prompt, parts) in enumerate(SCRIPT.items()):
        got = [s["text"] for s in convs[i].segments]
        assert got == parts, (prompt, got)
        roles = [s["role"] for s in convs[i].segments]
        assert roles == ["tool" if p.startswith(TOOL.output_open) else "model" for p in parts]
        assert convs[i].stop == "done"
        # the tokens hold the whole conversation (the tool's output included), then EOS
        n = int(ro.lengths[i, 0])
        assert tok.decode(np.asarray(ro.tokens[i, 0, :n])) == "".join(parts)
        assert int(ro.tokens[i, 0, n - 1]) == tok.eos_id and not bool(ro.truncated[i, 0])
        # policy_mask is False exactly on the tool's tokens
        want = np.concatenate([np.full(len(tok.encode(p)), not p.startswith(TOOL.output_open)) for p in parts] + [[True]])
        np.testing.assert_array_equal(np.asarray(ro.policy_mask[i, 0, :n]), want)
        # the statistics: one entry per call
        calls = [s for s in convs[i].segments if s["role"] == "tool"]
        assert convs[i].stats.calls == len(calls) == int(ro.tool_stats[i, 0, 0])
    by_prompt = dict(zip(SCRIPT, convs))
    assert by_prompt["1/0="].stats.errors == 1 and by_prompt["1/0="].segments[1]["status"] == "error"
    assert by_prompt["9*9="].segments[3]["code"] == "print(81+1)"
    assert by_prompt["5-5="].segments[1]["code"] == 'print("</python>")'
    assert sum(c.stats.errors for c in convs) == 1


def test_logprobs_are_the_trainers_on_policy_tokens_and_zero_on_the_tools(taught):
    """At T = 1 the sampled rows (some calling, some not, pausing at different steps) have the logprobs a trainer's
    one forward over prompt + completion gives, on every token the policy drew; forced tokens carry 0."""
    cfg, params, tok = taught
    ro, convs = _sample(taught, group_size=3, temperature=1.0, key=7)
    assert sum(c.stats.calls for c in convs) >= 3  # rows did pause (the taught model calls at T = 1 too)
    seq, seq_mask = full_sequences(ro)
    p = ro.prompt_tokens.shape[1]
    pos = jnp.maximum(jnp.cumsum(seq_mask, axis=-1) - 1, 0)
    logits = models.forward(cfg, params, seq, rope_positions(cfg, pos), attn_mask=seq_mask)[0]
    logits = logits[:, p - 1: p - 1 + T].reshape(ro.tokens.shape + (cfg.vocab_size,))
    want = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), ro.tokens[..., None], -1)[..., 0]
    drawn = np.asarray(ro.policy_tokens)
    forced = np.asarray(ro.completion_mask).astype(bool) & ~np.asarray(ro.policy_mask)
    assert forced.any()
    # the sampler's cached decode (gaps where rows waited, masked out) against one full forward: float rounding only
    assert np.abs(np.asarray(ro.logprobs - want))[drawn].max() <= logprob_tol(np.asarray(logits)[drawn], cfg)
    assert np.all(np.asarray(ro.logprobs)[forced] == 0) and np.all(np.asarray(ro.entropies)[forced] == 0)


def test_a_row_does_not_depend_on_when_the_others_paused(taught):
    """Answering calls every step, every 8 steps or only once every row waits gives the same rows: a row's
    randomness and positions follow its own token count."""
    base, _ = _sample(taught, group_size=2, temperature=1.0, key=3, resume_every=8)
    for every in (1, 1000):
        other, _ = _sample(taught, group_size=2, temperature=1.0, key=3, resume_every=every)
        np.testing.assert_array_equal(np.asarray(other.tokens), np.asarray(base.tokens))
        np.testing.assert_array_equal(np.asarray(other.policy_mask), np.asarray(base.policy_mask))
        m = np.asarray(base.completion_mask).astype(bool)
        tol = logprob_tol(np.asarray(base.logprobs)[m][:, None], taught[0])
        assert np.abs(np.asarray(other.logprobs - base.logprobs))[m].max() <= tol


def test_without_calls_it_is_the_one_turn_sampler():
    """A model that never closes a call: the same tokens as `sampler.sample` for the same key."""
    tok = _tokenizer(False)  # the close marker is 9 character tokens: a random model never writes it
    cfg = models.tiny(vocab_size=tok.vocab_size)
    params = models.init_params(cfg, jax.random.key(2))
    prompts, pmask = _prompts(tok)
    kw = dict(key=jax.random.key(5), group_size=3, max_new_tokens=12, temperature=1.0, eos_ids=(tok.eos_id,),
              pad_id=tok.pad_id)
    one = sampler.sample(cfg, params, prompts, pmask, **kw)
    with SandboxPool(1) as pool:
        multi, convs = multiturn.sample_with_tools(cfg, params, prompts, pmask, tool=TOOL, tokenizer=tok, pool=pool, **kw)
    for name in ("tokens", "completion_mask", "lengths", "truncated"):
        np.testing.assert_array_equal(np.asarray(getattr(multi, name)), np.asarray(getattr(one, name)), err_msg=name)
    m = np.asarray(one.completion_mask).astype(bool)
    assert np.abs(np.asarray(multi.logprobs - one.logprobs))[m].max() <= logprob_tol(np.asarray(one.logprobs)[m][:, None], cfg)
    assert np.all(np.asarray(multi.policy_mask)) and all(c.stats.calls == 0 for c in convs)


def test_turn_cap_ends_the_row_at_the_call_past_it(taught):
    """max_turns = 1: the two-call row runs its first call; its second is kept (the policy wrote it) but not run,
    and the row ends there, truncated (no EOS)."""
    ro, convs = _sample(taught, tool=ToolConfig(max_turns=1))
    i = list(SCRIPT).index("9*9=")
    assert [s["text"] for s in convs[i].segments] == SCRIPT["9*9="][:3]
    assert convs[i].stop == "max_turns" and convs[i].stats.calls == 1 and bool(ro.truncated[i, 0])
    j = list(SCRIPT).index("2*3=")  # one call is within the cap
    assert convs[j].stop == "done" and [s["text"] for s in convs[j].segments] == SCRIPT["2*3="]


def test_token_cap_counts_the_tools_tokens(taught):
    """A row's cap counts the output's tokens too: with room for the call and 3 more tokens, the output is cut to 3
    and the row ends truncated."""
    tok = taught[2]
    call = len(tok.encode(SCRIPT["2*3="][0]))
    ro, convs = _sample(taught, max_new_tokens=call + 3)
    i = list(SCRIPT).index("2*3=")
    assert int(ro.lengths[i, 0]) == call + 3 and bool(ro.truncated[i, 0]) and convs[i].stop == "max_tokens"
    assert convs[i].segments[1]["text"] == tok.decode(tok.encode(SCRIPT["2*3="][1])[:3], stop_at_eos=False)
    assert not np.any(np.asarray(ro.policy_mask[i, 0, call: call + 3]))


def test_bad_arguments_are_named():
    tok = _tokenizer(True)
    cfg = models.tiny(vocab_size=tok.vocab_size)
    params = models.init_params(cfg, jax.random.key(0))
    prompts, pmask = _prompts(tok)
    with SandboxPool(1) as pool, pytest.raises(ValueError, match="resume_every"):
        multiturn.sample_with_tools(cfg, params, prompts, pmask, key=jax.random.key(0), group_size=1, max_new_tokens=4,
                                    tool=TOOL, tokenizer=tok, pool=pool, resume_every=0)
    with pytest.raises(ValueError, match="workers"):
        ToolConfig(workers=0)


def test_shared_identical_calls_run_once_and_give_the_same_rows(taught, monkeypatch):
    """tool.share_identical: the two greedy rows of a prompt write the same call; it runs once (per distinct code
    among the rows answered together) and both rows get its output, as when each ran its own; its sandbox seconds
    are counted once."""
    ran, results = [], []
    real = tools.run_calls

    def counted(codes, cfg, pool):
        ran.append(list(codes))
        results.extend(out := real(codes, cfg, pool))
        return out

    monkeypatch.setattr(tools, "run_calls", counted)
    alone, alone_convs = _sample(taught, group_size=2)
    each = sum(len(c) for c in ran)
    ran.clear()
    results.clear()
    shared, shared_convs = _sample(taught, group_size=2, tool=ToolConfig(share_identical=True))
    assert all(len(c) == len(set(c)) for c in ran) and sum(len(c) for c in ran) * 2 == each
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(alone.tokens))
    assert [c.segments for c in shared_convs] == [c.segments for c in alone_convs]
    # the rows' seconds add up to the runs' (each a float64 sum of the same k terms in another order: k roundings)
    total, want = sum(c.stats.seconds for c in shared_convs), sum(r.seconds for r in results)
    assert want > 0 and abs(total - want) <= 2 * len(results) * EPS64 * want


def test_chat_template_markers_of_a_hugging_face_tokenizer_are_watched_as_their_ids(tmp_path):
    """A Hugging Face tokenizer whose template has tool-call tags as added tokens (Qwen2.5's `<tool_call>`): the
    configured close marker is the one id the loop watches, and a marker it has no token for is watched as the
    ids it encodes to."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from grpo_jax.tokenizer import HFTokenizer

    vocab = {"[PAD]": 0, "[EOS]": 1, "[UNK]": 2, "print": 3, "done": 4}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", eos_token="[EOS]",
                                                unk_token="[UNK]")
    fast.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    fast.save_pretrained(tmp_path)
    tok = HFTokenizer(tmp_path)
    tags = ToolConfig(call_open="<tool_call>", call_close="</tool_call>", output_open="<tool_response>",
                      output_close="</tool_response>")
    assert multiturn.close_marker_ids(tok, tags) == (fast.convert_tokens_to_ids("</tool_call>"),)
    assert multiturn.close_marker_ids(tok, ToolConfig(call_close="done print")) == (4, 3)
