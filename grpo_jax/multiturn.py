"""Multi-turn rollouts: the policy calls a Python tool mid-answer and decoding goes on after its output.

    rollout, convs = sample_with_tools(cfg, params, prompt_tokens, prompt_mask, key=key, group_size=G,
                                       max_new_tokens=T, tool=ToolConfig(), tokenizer=tok, pool=pool)

The decode is `sampler.sample`'s (same prefill, logit processing and per-row keys) with three additions:

1. **A row pauses when it closes a call.** After each token the policy draws, the jitted loop compares the row's
   last tokens with the token ids of `tool.call_close`; on a match the row *waits*: it writes nothing (its cache
   slots are masked out) while the other rows keep decoding.
2. **The host answers between segments.** The loop runs in segments: one ends when every row has ended or waits,
   or when a row has waited `resume_every` steps (so a call waits at most that long for rows still decoding,
   never for the whole batch). Between segments the host reads each waiting row's text since its last tool
   output, confirms the call (`tools.call_at_end`: a marker inside a string literal is code, and the row just
   goes on), runs the calls of all waiting rows together in the sandbox (`tools.run_calls`), and gives each row
   its output's token ids as *forced* tokens.
3. **Forced tokens are fed, not drawn.** A row with forced tokens pending feeds them one per step through the
   same loop (writing the KV cache as a prefill would, at the row's own positions) with `policy_mask` False,
   logprob and entropy 0; then it samples again from the logits after the output. No separate prefill, no
   cache copy, no whole-batch stall: the other rows draw their tokens in the same steps.

Positions and randomness follow the row's own token count n, not the loop's step: row (b, g) draws its n-th token
with `fold_in(row_key, n)` at RoPE position prompt_length + n. A row's tokens, logprobs and tool calls therefore do
not depend on when other rows paused, and a trainer forward over prompt + completion (contiguous, no gaps) sees
exactly the positions the sampler used; the masked slots of a waiting row are invisible to attention.

Caps: `max_new_tokens` counts every completion token, the policy's and the tool's (an output longer than the row's
room is cut, and the row ends truncated); `tool.max_turns` calls run per row, and a row that closes one call more
ends there (its call is kept, not run). The KV cache has P + max_new_tokens + (max_turns + 1) * resume_every slots,
the most a row can use (its tokens, plus at most `resume_every` waiting steps per call); a row still going when the
slots run out (it kept closing markers inside string literals) ends truncated.

What the record holds: the `Rollout` (every token, the tool's included, so a trainer forward sees the whole
conversation) and one `tools.Conversation` per row: its segments in order, model text and tool output with the
call's code and status, why it ended, and its `ToolStats`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import sampler, tools
from grpo_jax.config import ToolConfig
from grpo_jax.rewards.sandbox import SandboxPool
from models.config import ModelConfig
from models.keys import as_typed_key
from models.rope import rope_positions


@flax.struct.dataclass
class TurnState:
    """The multi-turn decode's carry for R = B*G rows; T = max_new_tokens, F = forced tokens a row can hold (T)."""

    s: jax.Array  # [] int32 steps taken (cache slots written after the prompt)
    n: jax.Array  # [R] int32 tokens in the row so far (the policy's and the tool's)
    done: jax.Array  # [R] bool: the row has ended (EOS, the token cap, or ended by the host)
    waiting: jax.Array  # [R] bool: the row closed a call and waits for the host
    logits: jax.Array  # [R, V] float32 logits of the row's next token
    cache: dict  # the KV cache, P + slots wide
    tokens: jax.Array  # [R, T] int32, pad_id past n
    logprobs: jax.Array  # [R, T] float32 log p(token) under the distribution sampled from; 0 on forced tokens
    entropies: jax.Array  # [R, T] float32 entropy of that distribution; 0 on forced tokens
    policy_entropies: jax.Array  # [R, T] float32 entropy of softmax(logits) at T = 1; 0 on forced tokens
    temperatures: jax.Array  # [R, T] float32 temperature each token was drawn at
    policy: jax.Array  # [R, T] bool: the policy drew the token (False: forced)
    forced: jax.Array  # [R, F] int32 tool output ids to feed
    forced_i: jax.Array  # [R] int32 forced tokens already fed
    forced_n: jax.Array  # [R] int32 forced tokens given


def cache_slots(max_new_tokens: int, tool: ToolConfig, resume_every: int) -> int:
    """Cache slots after the prompt: a row's tokens plus at most `resume_every` waiting steps for each of its
    calls (max_turns run, one more that ends it)."""
    return max_new_tokens + (tool.max_turns + 1) * resume_every


@functools.partial(jax.jit, static_argnames=("cfg", "top_k", "top_p", "eos_ids", "close_ids", "pad_id",
                                             "token_temperature", "resume_every"), donate_argnums=(2,))
def _segment(cfg: ModelConfig, params, state: TurnState, start_pos_R, keys_R, temperature, *, top_k: int,
             top_p: float, eos_ids: tuple, close_ids: tuple, pad_id: int, token_temperature: tuple,
             resume_every: int) -> TurnState:
    """Decode until every row has ended or waits, a row has waited `resume_every` steps, or the cache is full."""
    r, t_max = state.tokens.shape
    width = state.cache["mask"].shape[1]
    if cfg.tie_embeddings:  # as sampler._decode: a row-major copy of the tied head for the per-step matmul
        params = dict(params, lm_head=params["embed"].T)
        cfg = cfg.replace(tie_embeddings=False)
    eos = jnp.asarray(eos_ids if eos_ids else (-1,), jnp.int32)
    close = jnp.asarray(close_ids, jnp.int32)
    rows = jnp.arange(r)
    s0 = state.s

    def row_temperatures(logits):
        if not token_temperature:
            return jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (r,))
        floor, boost, t_hi = token_temperature
        return sampler.per_token_temperature(logits, base_temperature=temperature, entropy_floor=floor,
                                             boost=boost, max_temperature=t_hi)

    def body(s: TurnState) -> TurnState:
        feeding = (s.forced_i < s.forced_n) & ~s.done
        writes = ~s.done & (~s.waiting | feeding)
        draws = writes & ~feeding
        step_keys = jax.vmap(jax.random.fold_in)(keys_R, s.n)
        temp_R = row_temperatures(s.logits)
        greedy = (temp_R <= 0)[:, None]
        dist = sampler.process_logits(s.logits, temperature=temp_R[:, None], top_k=top_k, top_p=top_p)
        sampled = jnp.where(greedy[:, 0], sampler.argmax_last(s.logits),
                            sampler.sample_categorical(step_keys, dist)).astype(jnp.int32)
        lp, ent = sampler.logprobs_and_entropy(jnp.where(greedy, s.logits.astype(jnp.float32), dist), sampled)
        policy_ent = models.token_entropy(s.logits.astype(jnp.float32))
        forced_tok = s.forced[rows, jnp.minimum(s.forced_i, s.forced.shape[1] - 1)]
        token = jnp.where(feeding, forced_tok, jnp.where(draws, sampled, pad_id)).astype(jnp.int32)
        pos = rope_positions(cfg, (start_pos_R + s.n)[:, None])
        logits, cache = models.forward(cfg, params, token[:, None], pos, attn_mask=writes[:, None], cache=s.cache)
        at = jnp.minimum(s.n, t_max - 1)

        def put(buf, value):
            return buf.at[rows, at].set(jnp.where(writes, value, buf[rows, at]))

        tokens = put(s.tokens, token)
        n = s.n + writes
        # the row's last len(close) tokens (clipped at its start; a shorter row cannot match a longer marker)
        window = n[:, None] - len(close_ids) + jnp.arange(len(close_ids))[None, :]
        tail = tokens[rows[:, None], jnp.clip(window, 0, t_max - 1)]
        closes = draws & jnp.all((tail == close[None, :]) & (window >= 0), axis=-1)
        done = s.done | (draws & jnp.isin(token, eos)) | (writes & (n >= t_max))
        return TurnState(
            s=s.s + 1, n=n, done=done, waiting=(s.waiting & ~feeding) | (closes & ~done),
            logits=jnp.where(writes[:, None], logits[:, 0], s.logits), cache=cache, tokens=tokens,
            logprobs=put(s.logprobs, jnp.where(draws, lp, 0.0)), entropies=put(s.entropies, jnp.where(draws, ent, 0.0)),
            policy_entropies=put(s.policy_entropies, jnp.where(draws, policy_ent, 0.0)),
            temperatures=put(s.temperatures, temp_R), policy=put(s.policy, draws), forced=s.forced,
            forced_i=s.forced_i + feeding, forced_n=s.forced_n)

    def cond(s: TurnState):
        idle = s.done | (s.waiting & (s.forced_i >= s.forced_n))
        stalled = jnp.any(s.waiting & (s.forced_i >= s.forced_n)) & (s.s - s0 >= resume_every)
        return (s.cache["end_index"] < width) & ~jnp.all(idle) & ~stalled

    return jax.lax.while_loop(cond, body, state)


def _initial_state(cache, logits_RxV, *, max_new_tokens: int, slots: int, pad_id: int, temperature) -> TurnState:
    r, t = logits_RxV.shape[0], max_new_tokens
    zeros = lambda: jnp.zeros((r, t), jnp.float32)  # noqa: E731  (distinct buffers: the state is donated)
    return TurnState(
        s=jnp.int32(0), n=jnp.zeros((r,), jnp.int32), done=jnp.zeros((r,), bool), waiting=jnp.zeros((r,), bool),
        logits=logits_RxV.astype(jnp.float32), cache=models.grow_cache(cache, cache["mask"].shape[1] + slots),
        tokens=jnp.full((r, t), pad_id, jnp.int32), logprobs=zeros(), entropies=zeros(), policy_entropies=zeros(),
        temperatures=jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (r, t)),
        policy=jnp.zeros((r, t), bool), forced=jnp.full((r, t), pad_id, jnp.int32),
        forced_i=jnp.zeros((r,), jnp.int32), forced_n=jnp.zeros((r,), jnp.int32))


# --------------------------------------------------------------------------------------------------
# the host loop
# --------------------------------------------------------------------------------------------------

def close_marker_ids(tokenizer, tool: ToolConfig) -> tuple[int, ...]:
    """The token ids the jitted loop watches for: `tool.call_close` as the tokenizer encodes it. One id with a
    tokenizer that has the marker as a token (the tool task's, or a chat template's special token); with a
    subword tokenizer the model may spell a marker in other pieces, and such a call is not seen."""
    ids = tuple(int(i) for i in tokenizer.encode(tool.call_close))
    if not ids:
        raise ValueError(f"tool.call_close {tool.call_close!r} encodes to no tokens")
    return ids


@dataclasses.dataclass
class _Row:
    """The host's record of one row: the calls it made (code, result) and where its unanswered text begins."""

    calls: list = dataclasses.field(default_factory=list)
    mark: int = 0  # token index after the last tool output
    stop: str | None = None  # set when the host ends the row ("max_turns")


def _answer_waiting(host: dict, rows: list[_Row], tokenizer, tool: ToolConfig, pool: SandboxPool):
    """Read, run and format the calls of the waiting rows: (rows to end, {row: forced ids}, rows to resume)."""
    t_max = host["tokens"].shape[1]
    end, resume, calls = [], [], {}
    for i in np.flatnonzero(host["waiting"] & ~host["done"]):
        text = tokenizer.decode(host["tokens"][i, rows[i].mark: host["n"][i]], stop_at_eos=False, skip_special=False)
        code = tools.call_at_end(text, tool)
        if code is None:  # the marker closed a string literal inside the code, not the call: the row goes on
            resume.append(i)
        elif len(rows[i].calls) >= tool.max_turns:
            rows[i].stop = "max_turns"
            end.append(i)
        else:
            calls[i] = code
    forced = {}
    if tool.share_identical:  # each distinct code runs once; its sandbox seconds are counted on its first row
        ran = dict(zip(unique := list(dict.fromkeys(calls.values())), tools.run_calls(unique, tool, pool)))
        first = {code: i for i, code in reversed(list(calls.items()))}
        results = [ran[c] if first[c] == i else dataclasses.replace(ran[c], seconds=0.0) for i, c in calls.items()]
    else:
        results = tools.run_calls(list(calls.values()), tool, pool)
    for i, result in zip(calls, results):
        ids = [int(x) for x in tokenizer.encode(result.text)][: t_max - int(host["n"][i])]
        rows[i].calls.append((calls[i], result))
        rows[i].mark = int(host["n"][i]) + len(ids)
        forced[i] = ids
    return end, forced, resume


def _resumed(state: TurnState, end, forced: dict, resume, pad_id: int) -> TurnState:
    """The state with the host's answers in: ended rows done, answered rows given their output to feed (their
    earlier output all fed), the rest resumed; a row still feeding an earlier output keeps feeding it."""
    done, waiting = np.array(state.done), np.array(state.waiting)
    buf, fed, count = np.array(state.forced), np.array(state.forced_i), np.array(state.forced_n)
    for i, ids in forced.items():
        buf[i], fed[i], count[i] = pad_id, 0, len(ids)
        buf[i, : len(ids)] = ids
    done[list(end)] = True
    waiting[list(forced) + list(resume)] = False
    return state.replace(done=jnp.asarray(done), waiting=jnp.asarray(waiting), forced=jnp.asarray(buf),
                         forced_i=jnp.asarray(fed), forced_n=jnp.asarray(count))


def spans(policy_T: np.ndarray, n: int) -> list[tuple[bool, int, int]]:
    """The runs of a row's first n tokens: (drawn by the policy?, start, end), in order."""
    out, at = [], 0
    while at < n:
        kind, end = bool(policy_T[at]), at
        while end < n and bool(policy_T[end]) == kind:
            end += 1
        out.append((kind, at, end))
        at = end
    return out


def turns(tokenizer, ids_N: np.ndarray, policy_N: np.ndarray) -> tuple[tuple[str, str], ...]:
    """A completion's turns in order: ("model", text) for each run of tokens the policy drew, ("tool", text) for
    each run of a tool's output (decoded whole: markers kept, an EOS id inside an output not cutting it)."""
    return tuple(("model", tokenizer.decode(ids_N[a:b])) if drawn else
                 ("tool", tokenizer.decode(ids_N[a:b], stop_at_eos=False, skip_special=False))
                 for drawn, a, b in spans(policy_N, len(ids_N)))


def conversations(tokenizer, tokens_RxT: np.ndarray, policy_RxT: np.ndarray, lengths_R: np.ndarray,
                  rows: Sequence[_Row], stops: Sequence[str]) -> list[tools.Conversation]:
    """Each row's conversation from its tokens: the runs of policy tokens as model segments, the runs of forced
    tokens as tool segments (with their call's code and status, in call order)."""
    out = []
    for i, row in enumerate(rows):
        conv, calls, n = tools.Conversation(stop=stops[i]), iter(row.calls), int(lengths_R[i])
        for role, text in turns(tokenizer, tokens_RxT[i, :n], policy_RxT[i, :n]):
            if role == "model":
                conv.segments.append({"role": role, "text": text})
            else:
                code, result = next(calls)
                conv.stats = conv.stats.add(result)
                conv.segments.append({"role": role, "code": code, "status": result.status, "text": text})
        for code, result in calls:  # a call whose output did not fit at all still ran
            conv.stats = conv.stats.add(result)
        out.append(conv)
    return out


def sample_with_tools(cfg: ModelConfig, params, prompt_tokens, prompt_mask, *, key, group_size: int,
                      max_new_tokens: int, tool: ToolConfig, tokenizer, pool: SandboxPool, temperature=1.0,
                      top_k: int = 0, top_p: float = 1.0, eos_ids=(), pad_id: int = 0,
                      token_temperature: tuple[float, float, float] | None = None,
                      resume_every: int = 8) -> tuple[sampler.Rollout, list[tools.Conversation]]:
    """G completions per prompt, pausing rows for tool calls (module docstring): (the Rollout [B, G, ...], whose
    `policy_mask` is False on the tool's tokens, and the B*G conversations, row-major over (b, g)). Without a
    call it gives `sampler.sample`'s tokens for the same key."""
    sampler._check_args(prompt_tokens, prompt_mask, group_size, max_new_tokens, temperature, top_k, top_p)
    if isinstance(resume_every, bool) or not isinstance(resume_every, int) or resume_every < 1:
        raise ValueError(f"resume_every must be an int >= 1, got {resume_every!r}")
    key = as_typed_key(key)
    tokens, mask = sampler.prepare_prompts(prompt_tokens, prompt_mask, pad_id=pad_id)
    b = tokens.shape[0]
    cache, last_logits, lengths = sampler._prefill(cfg, params, tokens, mask, group_size=group_size,
                                                   max_new_tokens=max_new_tokens)
    keys = sampler.row_keys(key, jnp.arange(b, dtype=jnp.int32), group_size)
    state = _initial_state(cache, last_logits, max_new_tokens=max_new_tokens,
                           slots=cache_slots(max_new_tokens, tool, resume_every), pad_id=pad_id,
                           temperature=temperature)
    static = dict(top_k=int(top_k), top_p=float(top_p), eos_ids=tuple(int(e) for e in eos_ids),
                  close_ids=close_marker_ids(tokenizer, tool), pad_id=int(pad_id),
                  token_temperature=tuple(float(x) for x in token_temperature or ()), resume_every=resume_every)
    temp = jnp.asarray(temperature, jnp.float32)
    rows = [_Row() for _ in range(b * group_size)]
    width = state.cache["mask"].shape[1]
    while True:
        state = _segment(cfg, params, state, lengths, keys, temp, **static)
        host = jax.device_get({"n": state.n, "done": state.done, "waiting": state.waiting, "tokens": state.tokens,
                               "end_index": state.cache["end_index"]})
        if not np.any(host["waiting"] & ~host["done"]) and (np.all(host["done"]) or host["end_index"] >= width):
            break
        state = _resumed(state, *_answer_waiting(host, rows, tokenizer, tool, pool), pad_id=pad_id)
        if host["end_index"] >= width:
            break
    return _finish(state, rows, tokenizer, b, group_size, eos_ids, tokens, mask)


def _finish(state: TurnState, rows: list[_Row], tokenizer, b: int, group_size: int, eos_ids, prompt_tokens,
            prompt_mask) -> tuple[sampler.Rollout, list[tools.Conversation]]:
    """The Rollout and the conversations from the final state."""
    host = jax.device_get(state)
    t_max = host.tokens.shape[1]
    n = host.n.astype(np.int32)
    mask = np.arange(t_max)[None, :] < n[:, None]
    last = host.tokens[np.arange(len(n)), np.maximum(n - 1, 0)]
    ended_eos = (n > 0) & host.policy[np.arange(len(n)), np.maximum(n - 1, 0)] & np.isin(last, list(eos_ids) or [-1])
    stops = ["done" if ended_eos[i] else rows[i].stop or ("max_tokens" if n[i] >= t_max else "max_slots")
             for i in range(len(n))]
    convs = conversations(tokenizer, host.tokens, host.policy, n, rows, stops)
    out = {"tokens": host.tokens, "completion_mask": mask.astype(np.int32), "logprobs": host.logprobs * mask,
           "entropies": host.entropies * mask, "policy_entropies": host.policy_entropies * mask, "lengths": n,
           "truncated": ~ended_eos, "temperatures": host.temperatures, "policy_mask": host.policy | ~mask,
           "tool_stats": np.array([[getattr(c.stats, f) for f in sampler.TOOL_STATS] for c in convs], np.float32)}
    rows_ = {k: jnp.asarray(np.asarray(v).reshape((b, group_size) + np.asarray(v).shape[1:])) for k, v in out.items()}
    return sampler.Rollout(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask, **rows_), convs
