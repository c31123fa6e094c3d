"""The host side of one GRPO step: data rows -> scored group rollouts -> advantages -> the update's Batch.

Read one step top to bottom here, then `update.py` (the pure jitted update) and `losses.py`:

    exp, dyn = collect(actor, params, draw, key, n_prompts=B, weights=w_K, dynamic=cfg.dynamic,
                       advantage=cfg.advantage, temperature=t)
    adv_BxG, diag = advantages_and_diagnostics(exp, w_K, cfg=cfg.advantage)
    batch = make_batch(exp, adv_BxG, mesh)                  # -> train_step(state, batch, key, entropy_coef)

`Experience` is the one record a step passes along: the data rows, the `Rollout` (which carries its
prompts, left-aligned once by the sampler), the reward matrix R[B, G, K] (never pre-summed: the weights
meet the rewards once, inside the advantage estimator, which returns the weighted totals the diagnostics
read), the decoded completions with their reward reasons, and each token's kind (reasoning, answer,
other). Nothing here passes tuples by position.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import advantages as adv_lib
from grpo_jax import data as data_lib
from grpo_jax import diagnostics, multiturn, sampler, sharding, tools
from grpo_jax import rewards as rewards_lib
from grpo_jax.config import AdvantageConfig, DynamicSamplingConfig, SamplingConfig, ToolConfig
from grpo_jax.control import GroupBuffer
from grpo_jax.rewards.base import ERROR_REASONS, NOT_APPLICABLE
from grpo_jax.rewards.format import SEGMENT_KINDS, assistant_turn, segment_kinds, split_response, think_prefilled
from models.config import ModelConfig

Row = dict[str, Any]

# [K] per-dimension diagnostics logged as "reward/<dim>/<stat>"; [B, ...] per-group arrays are not logged
PER_DIM_METRICS = ("reward/mean", "reward/within_group_mean", "reward/within_group_var",
                   "reward/zero_var_frac_per_dim", "reward/adv_corr", "reward/adv_corr_within")
# Histograms logged as a list of bin fractions in metrics.jsonl and as a TensorBoard histogram: the sampled
# distribution's entropy, and the policy's own (T = 1) over all tokens and per kind of token
HISTOGRAMS = {f"{p}/hist": f"{p}/hist_edges"
              for p in ("entropy", "entropy_t1", *(f"entropy_t1/{kind}" for kind in SEGMENT_KINDS))}


@flax.struct.dataclass
class Batch:
    """N = B*G rows of prompt + completion (L = P + T): what the update needs and nothing else. Every field
    is required (no defaults), so a Batch built without one fails at construction, not inside jit."""

    tokens: jax.Array  # [N, L] int32, prompts left-padded to the bucket width P
    attn_mask: jax.Array  # [N, L] bool
    loss_mask: jax.Array  # [N, T] bool: completion tokens the policy sampled, up to and including EOS
    old_logp: jax.Array  # [N, T] float32 logprobs under the sampling policy
    advantages: jax.Array  # [N] float32
    temperatures: jax.Array  # [N, T] float32 temperature each token was sampled at (logits are divided by it)


@dataclasses.dataclass(frozen=True)
class Actor:
    """Everything that turns data rows into scored rollouts except the params: the model's shape, the
    tokenizer, the reward dimensions and the sampling settings."""

    model_cfg: ModelConfig
    tokenizer: Any  # grpo_jax.tokenizer.Tokenizer (or the HF adapter): encode_batch, decode, eos_id, pad_id
    specs: tuple  # rewards_lib.RewardSpec per dimension, in column order of R
    sampling: SamplingConfig
    mesh: Any = None  # the rollout mesh: prompts split over its data x fsdp axes (None: wherever params live)
    # the most prompt tokens fed to the model (data.prompt_token_limit: sampling.max_prompt_tokens, or the model's
    # positions - max_new_tokens); a longer prompt is cut as sampling.long_prompts says. None = no limit
    prompt_limit: int | None = None
    tool: ToolConfig | None = None  # a tool the policy may call (multi-turn rollouts); None: one turn

    @property
    def dims(self) -> list[str]:
        return rewards_lib.dimension_names(self.specs)


@dataclasses.dataclass(frozen=True)
class Experience:
    """One step's scored groups: B prompts x G completions."""

    rows: tuple  # [B] data rows
    rollout: sampler.Rollout  # [B, G, ...] completions, with their prompts [B, P]
    rewards: np.ndarray  # [B, G, K] float32 per-dimension rewards (never pre-summed; the weights apply in advantages)
    texts: tuple  # [B*G] decoded completions, row-major over (b, g)
    reasons: tuple  # [B*G] {dimension: the reward's info["reason"]}, row-major like texts
    token_kinds: np.ndarray  # [B, G, T] int8 SEGMENT_KINDS code of each completion token (`token_kinds`)
    # the first failure of each (dimension, error kind) among this process's rows (`reward_failures`)
    errors: tuple = ()
    # [B*G] with a tool: each completion's turns ((role, text), ...), "model" or "tool" (`tool_turns`); else ()
    turns: tuple = ()


# --------------------------------------------------------------------------------------------------
# rollout and scoring
# --------------------------------------------------------------------------------------------------

def prompt_arrays(actor: Actor, rows: Sequence[Row]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [B, P], mask bool [B, P]) of the rows' prompts as the model is fed them: left-padded, and
    cut to the actor's prompt limit (`data.encode_prompts`)."""
    return data_lib.encode_prompts(actor.tokenizer, rows, limit=actor.prompt_limit,
                                   long_prompts=actor.sampling.long_prompts)


def rollout(actor: Actor, params, rows: Sequence[Row], key: jax.Array, *, group_size: int,
            temperature: float) -> sampler.Rollout:
    """G completions per row's prompt at `temperature` (0 = greedy; the per-token temperature applies only
    when sampling). With a rollout mesh the prompts are split over its data axes, so each device decodes
    its own groups (`sampler.sample` picks shard_map or SPMD from where params live); when B does not
    divide by the data ways, the last prompt is repeated to fill the shards and its copies are dropped
    (row (b, g)'s randomness depends only on b and g, so the kept rows are those of an unpadded run)."""
    s, tok = actor.sampling, actor.tokenizer
    tokens, mask = prompt_arrays(actor, rows)
    token_temp = (s.token_entropy_floor, s.token_boost, s.token_max_temperature) if s.token_entropy_floor else None
    if actor.tool is not None:  # rows pause for calls; decoded under plain jit, wherever params live
        with rewards_lib.sandbox.SandboxPool(actor.tool.workers) as pool:
            return multiturn.sample_with_tools(
                actor.model_cfg, params, tokens, mask, key=key, group_size=group_size, max_new_tokens=s.max_new_tokens,
                tool=actor.tool, tokenizer=tok, pool=pool, temperature=jnp.float32(temperature), top_k=s.top_k,
                top_p=s.top_p, eos_ids=(tok.eos_id,), pad_id=tok.pad_id,
                token_temperature=token_temp if temperature > 0 else None, resume_every=actor.tool.resume_every)[0]
    if actor.mesh is not None:
        tokens, mask = sharding.shard_rows(actor.mesh, tokens, mask)
        params = sharding.on_mesh(params, actor.mesh)  # a separate rollout mesh: resharded onto it
    with contextlib.nullcontext() if actor.mesh is None else jax.sharding.use_abstract_mesh(actor.mesh.abstract_mesh):
        ro = sampler.sample(actor.model_cfg, params, tokens, mask, key=key, group_size=group_size,
                            max_new_tokens=s.max_new_tokens, temperature=jnp.float32(temperature), top_k=s.top_k,
                            top_p=s.top_p, eos_ids=(tok.eos_id,), pad_id=tok.pad_id,
                            token_temperature=token_temp if temperature > 0 else None)
    if not ro.tokens.is_fully_addressable:
        # Several processes: gather the rollout to every host once, here, and do the step's host-side work
        # (dropping padding, picking groups, the batch) on local arrays. Eager ops on arrays that span
        # processes each launch a small cross-process program; with many in flight, two processes hung
        # waiting on each other in `select_groups` (seen with 2 processes x 2 CPU devices and gloo).
        ro = jax.tree.map(sharding.to_host, ro)
    return ro if ro.tokens.shape[0] == len(rows) else jax.tree.map(lambda x: x[: len(rows)], ro)


def score(actor: Actor, rows: Sequence[Row], ro: sampler.Rollout) -> Experience:
    """The rollout scored: R [B, G, K], the decoded completions [B*G] and each completion's reward reasons
    [B*G] {dimension: info["reason"]}, as an Experience. Each process scores the groups that live on its
    devices (`sharding.process_rows` of the rollout mesh) and R and the reasons are gathered after, so an
    expensive reward (sandboxed code) is not run by every host on every row; the completions are decoded on
    every host."""
    return start_scoring(actor, rows, ro).result()


class Scoring:
    """A rollout being scored (`start_scoring`): `result()` waits for the rewards that run elsewhere (sandboxed,
    threaded) and gathers -> the Experience; every process calls it at the same point (the gather is a
    collective). `close()` abandons it."""

    def __init__(self, finish: Callable[[], Experience], close: Callable[[], None]) -> None:
        self._finish, self.close = finish, close

    def result(self) -> Experience:
        return self._finish()


def start_scoring(actor: Actor, rows: Sequence[Row], ro: sampler.Rollout) -> Scoring:
    """`score`, begun: the completions decoded, the inline rewards and the token kinds computed; the rewards
    that wait (`rewards.registry.threads`) or run sandboxed go on while the caller does other host work."""
    toks, lengths = sharding.to_host(ro.tokens), sharding.to_host(ro.lengths)
    b, g, _ = toks.shape
    texts = [actor.tokenizer.decode(toks[i, j, : lengths[i, j]]) for i in range(b) for j in range(g)]
    owned = sharding.process_rows(actor.mesh, b)
    mine = owned[jax.process_index()] if len(owned) > 1 else owned[0]
    samples = [dict(rows[i], response_length=int(lengths[i, j]), completion_ids=toks[i, j, : lengths[i, j]].tolist())
               for i in mine for j in range(g)]
    shape = (len(mine), g, len(actor.specs))
    # a process may hold no rows (fewer groups than processes) but still joins the gather; with a tool the rewards
    # read the policy's own tokens (a program printing an answer tag must not answer for the policy)
    policy = sharding.to_host(ro.policy_mask) if ro.tool_stats is not None else None
    scored = texts if policy is None else policy_texts(actor.tokenizer, toks, lengths, policy)
    mine_texts = [scored[i * g + j] for i in mine for j in range(g)]
    scoring = rewards_lib.start_evaluate(actor.specs, mine_texts, samples) if len(mine) else None
    kinds = token_kinds(actor.tokenizer, toks, lengths, prefilled=[think_prefilled(r) for r in rows])

    def finish() -> Experience:
        r, codes = np.zeros(shape, np.float32), np.zeros((*shape, REASON_BYTES), np.uint8)
        errors: tuple = ()
        if scoring is not None:
            r_flat, infos = scoring.result()
            r, codes = r_flat.reshape(shape), reason_codes(infos["per_response"], actor.dims).reshape(codes.shape)
            errors = reward_failures(infos["per_response"], actor.specs)
        codes = sharding.gather_rows(codes, owned, b).reshape(b * g, len(actor.specs), REASON_BYTES)
        return Experience(rows=tuple(rows), rollout=ro, rewards=sharding.gather_rows(r, owned, b),
                          texts=tuple(texts), reasons=tuple(reasons_from_codes(codes, actor.dims)), token_kinds=kinds,
                          errors=errors,
                          turns=() if policy is None else tool_turns(actor.tokenizer, toks, lengths, policy))

    return Scoring(finish, scoring.close if scoring is not None else lambda: None)


def policy_texts(tokenizer, tokens_BxGxT: np.ndarray, lengths_BxG: np.ndarray, policy_BxGxT: np.ndarray) -> list[str]:
    """[B*G] each completion's text without the tokens the policy did not draw (a tool's outputs), row-major."""
    b, g, _ = tokens_BxGxT.shape
    return [tokenizer.decode(tokens_BxGxT[i, j, : lengths_BxG[i, j]][policy_BxGxT[i, j, : lengths_BxG[i, j]]])
            for i in range(b) for j in range(g)]


def reward_failures(per_response: Sequence[dict], specs: Sequence[rewards_lib.RewardSpec]) -> tuple[dict, ...]:
    """The first row of each (dimension, error kind) on which a reward failed (`rewards.base.ERROR_REASONS`):
    {"dimension", "reward", "kind", "error", "where"}, in row order, for the trainer to report once."""
    seen: dict[tuple[str, str], dict] = {}
    for info in per_response:
        for spec in specs:
            d = info[spec.dimension]
            if d.get("reason") in ERROR_REASONS and (spec.dimension, d.get("error_kind")) not in seen:
                seen[spec.dimension, d.get("error_kind")] = {
                    "dimension": spec.dimension, "reward": spec.name, "kind": str(d.get("error_kind")),
                    "error": str(d.get("error", "")), "where": d.get("where")}
    return tuple(seen.values())


# a reward's info["reason"] is a short identifier ("multiple_answers", "timeout"); longer ones are cut here
REASON_BYTES = 48


def reason_codes(per_response: Sequence[dict], dims: Sequence[str]) -> np.ndarray:
    """[N, K, REASON_BYTES] uint8: each response's reason per dimension as zero-padded UTF-8, an array so that
    `sharding.gather_rows` puts every process's reasons in place as it does their rewards."""
    out = np.zeros((len(per_response), len(dims), REASON_BYTES), np.uint8)
    for i, info in enumerate(per_response):
        for k, d in enumerate(dims):
            raw = str(info[d].get("reason", "")).encode("utf-8")[:REASON_BYTES]
            out[i, k, : len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def reasons_from_codes(codes: np.ndarray, dims: Sequence[str]) -> list[dict[str, str]]:
    """The inverse of `reason_codes` (a character cut in half at the byte limit is dropped)."""
    return [{d: bytes(row[k]).rstrip(b"\0").decode("utf-8", "ignore") for k, d in enumerate(dims)} for row in codes]


def experience(actor: Actor, params, rows: Sequence[Row], key: jax.Array, *, temperature: float) -> Experience:
    """One rollout round of these rows, scored."""
    ro = rollout(actor, params, rows, key, group_size=actor.sampling.group_size, temperature=temperature)
    return score(actor, rows, ro)


def round_size(n_prompts: int, dynamic: DynamicSamplingConfig) -> int:
    """Prompts drawn by one rollout round: n_prompts, or ceil(oversample * n_prompts) with dynamic sampling."""
    return int(np.ceil(dynamic.oversample * n_prompts)) if dynamic.enabled else n_prompts


def collect(actor: Actor, params, draw: Callable[[int], list[Row]], key: jax.Array, *, n_prompts: int,
            weights: np.ndarray, dynamic: DynamicSamplingConfig, advantage: AdvantageConfig,
            temperature: float, first: Experience | tuple[Sequence[Row], sampler.Rollout] | None = None
            ) -> tuple[Experience, dict]:
    """One step's groups and the dynamic-sampling metrics ({} when off). `draw(n)` returns the next n
    training rows. With DAPO dynamic sampling, rounds of ceil(oversample * n_prompts) prompts are drawn
    until n_prompts informative groups (`informative_groups`) are found or max_rounds is reached
    (`control.GroupBuffer`). `first`: round 0's rows and their rollout, already dispatched by the caller
    (`rollout` of `round_size` rows drawn the same way, with the round's key `round_key(key, 0)`), scored here
    as the round would have been, or already scored (`score`: an Experience)."""

    def round_experience(r: int) -> Experience:
        if r == 0 and first is not None:
            return first if isinstance(first, Experience) else score(actor, first[0], first[1])
        return experience(actor, params, draw(round_size(n_prompts, dynamic)), round_key(key, r, dynamic),
                          temperature=temperature)

    if not dynamic.enabled:
        return round_experience(0), {}
    buffer, rounds = GroupBuffer(n_prompts, dynamic.max_rounds), []
    while not buffer.done:
        exp = round_experience(len(rounds))
        buffer.add(informative_groups(exp.rewards, weights, cfg=advantage))
        rounds.append(exp)
    rule = ("fused_dimensions_vary" if advantage.estimator in adv_lib.PER_DIMENSION
            else "pass_at_k_varies" if advantage.estimator == "passk" else "total_varies")
    metrics = {**buffer.metrics(), "dynamic/rule": rule}
    return select_groups(rounds, buffer.selection(), pad_id=actor.tokenizer.pad_id), metrics


def round_key(key: jax.Array, r: int, dynamic: DynamicSamplingConfig) -> jax.Array:
    """The sampling key of rollout round r of a step: the step's key itself without dynamic sampling, else
    fold_in(key, r)."""
    return jax.random.fold_in(key, r) if dynamic.enabled else key


@functools.partial(jax.jit, static_argnames="cfg")
def _zero_variance(rewards_BxGxK, weights_K, *, cfg):
    return adv_lib.compute_advantages(rewards_BxGxK, weights_K, cfg=cfg)[1]["zero_variance"]


def informative_groups(rewards_BxGxK: np.ndarray, weights_K: np.ndarray, *, cfg: AdvantageConfig) -> np.ndarray:
    """[B] bool: the group gives the configured estimator a learning signal, by the estimator's own
    zero-variance test. For the weighted-total estimators that is "the totals are not all equal" (DAPO);
    for gdpo / per_dim, "the fused per-dimension scores are not all equal", which keeps a group whose
    totals tie while its dimensions differ (GDPO's case: those are the groups it learns from)."""
    return ~np.asarray(_zero_variance(jnp.asarray(rewards_BxGxK), jnp.asarray(weights_K), cfg=cfg))


def select_groups(rounds: Sequence[Experience], selection: Sequence[tuple[int, int]], *, pad_id: int) -> Experience:
    """The chosen (round, group) pairs of several rounds as one Experience; prompts are left-padded to the
    widest round's bucket (left padding keeps them left-aligned)."""
    width = max(e.rollout.prompt_tokens.shape[1] for e in rounds)

    def pad_prompts(ro: sampler.Rollout) -> sampler.Rollout:
        pad = ((0, 0), (width - ro.prompt_tokens.shape[1], 0))
        return ro.replace(prompt_tokens=jnp.pad(ro.prompt_tokens, pad, constant_values=pad_id),
                          prompt_mask=jnp.pad(ro.prompt_mask, pad, constant_values=False))

    g = rounds[0].rollout.tokens.shape[1]
    picked = [(rounds[rnd], i) for rnd, i in selection]
    ros = [jax.tree.map(lambda x, i=i: x[i : i + 1], pad_prompts(e.rollout)) for e, i in picked]
    return Experience(
        rows=tuple(e.rows[i] for e, i in picked),
        rollout=jax.tree.map(lambda *xs: jnp.concatenate(xs), *ros),
        rewards=np.concatenate([e.rewards[i : i + 1] for e, i in picked]),
        texts=tuple(t for e, i in picked for t in e.texts[i * g : (i + 1) * g]),
        reasons=tuple(r for e, i in picked for r in e.reasons[i * g : (i + 1) * g]),
        token_kinds=np.concatenate([e.token_kinds[i : i + 1] for e, i in picked]),
        turns=tuple(t for e, i in picked for t in e.turns[i * g : (i + 1) * g]),
        errors=tuple({(x["dimension"], x["kind"]): x for e in reversed(rounds) for x in e.errors}.values()))


# --------------------------------------------------------------------------------------------------
# advantages, diagnostics, the batch
# --------------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnames="cfg")
def _advantages_and_diagnostics(rewards_BxGxK, weights_K, ro: sampler.Rollout, kinds_BxGxT, *, cfg):
    adv, aux = adv_lib.compute_advantages(rewards_BxGxK, weights_K, cfg=cfg)
    adv = jnp.where(jnp.isfinite(adv), adv, 0.0)
    diag = diagnostics.reward_diagnostics(rewards_BxGxK, aux["totals"], adv)
    diag["collapse/drowned_dims"] = diagnostics.drowned_dimensions(
        diag["reward/adv_corr_within"], diag["reward/zero_var_frac_per_dim"], weights_K)
    # entropies of the tokens the policy drew only (a tool's output has no sampling distribution); the lengths
    # below count every completion token, tool output included: they measure the sequence the model reads
    diag.update(diagnostics.entropy_diagnostics(ro.entropies, ro.policy_tokens))
    diag.update(diagnostics.entropy_by_kind(ro.policy_entropies, ro.policy_tokens, kinds_BxGxT, SEGMENT_KINDS))
    diag.update(diagnostics.length_diagnostics(ro.lengths.reshape(-1), ro.truncated.reshape(-1),
                                               max_len=ro.tokens.shape[-1]))
    return adv, diag


def advantages_and_diagnostics(exp: Experience, weights: np.ndarray, *, cfg: AdvantageConfig):
    """Advantages [B, G] (non-finite -> 0) and the collapse / entropy / length diagnostics, in one program."""
    return _advantages_and_diagnostics(jnp.asarray(exp.rewards), jnp.asarray(weights), exp.rollout,
                                       jnp.asarray(exp.token_kinds), cfg=cfg)


def full_sequences(ro: sampler.Rollout) -> tuple[jax.Array, jax.Array]:
    """Teacher-forcing inputs from a rollout's own (already aligned) prompts: ([B*G, P+T] tokens,
    [B*G, P+T] bool mask), row (b, g) at b * G + g."""
    g = ro.tokens.shape[1]
    comp = ro.tokens.reshape(-1, ro.tokens.shape[-1])
    comp_mask = ro.completion_mask.reshape(comp.shape).astype(bool)
    seq = jnp.concatenate([jnp.repeat(ro.prompt_tokens, g, 0), comp], axis=1)
    seq_mask = jnp.concatenate([jnp.repeat(ro.prompt_mask, g, 0), comp_mask], axis=1)
    return seq, seq_mask


def batch_from_rollout(ro: sampler.Rollout, advantages_BxG, *, mask_truncated: bool = False) -> Batch:
    """The update's rows (N = B*G) from a rollout and its advantages. mask_truncated: a completion that hit
    max_new_tokens without an EOS gets an empty loss mask, so it adds nothing to the loss, its gradient or
    the row count of the aggregation (TRL's `mask_truncated_completions`); it still counts in its group's
    advantage statistics, which were computed before. The loss mask is `Rollout.policy_tokens`: tokens the
    host inserted (a tool's output) stay in attn_mask, as context the policy's later tokens are conditioned on,
    but leave every per-token term of the update (loss, ratio and clipping, KL, entropy, the gap metrics)."""
    seq, seq_mask = full_sequences(ro)
    n = seq.shape[0]
    loss_mask = ro.policy_tokens.reshape(n, -1)
    if mask_truncated:
        loss_mask = loss_mask & ~jnp.asarray(ro.truncated).reshape(n, 1)
    return Batch(tokens=seq, attn_mask=seq_mask, loss_mask=loss_mask,
                 old_logp=ro.logprobs.reshape(n, -1), advantages=jnp.asarray(advantages_BxG).reshape(n),
                 temperatures=ro.temperatures.reshape(n, -1))


def make_batch(exp: Experience, advantages_BxG, mesh, *, mask_truncated: bool = False) -> Batch:
    """`batch_from_rollout` on the mesh: rows sharded over its data axes when they divide evenly, else
    replicated."""
    batch = batch_from_rollout(exp.rollout, advantages_BxG, mask_truncated=mask_truncated)
    split = batch.tokens.shape[0] % sharding.data_ways(mesh) == 0
    several = jax.process_count() > 1  # a mesh over processes takes host values (every process passes the same)

    def place(x):
        target = sharding.batch_sharding(mesh, x.ndim) if split else sharding.replicated(mesh)
        return jax.device_put(np.asarray(x) if several else x, target)

    return jax.tree.map(place, batch)


# --------------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------------

def flatten_metrics(metrics: dict, dims: Sequence[str]) -> tuple[dict, dict]:
    """(scalars, histograms): scalars as they are and the [K] vectors of PER_DIM_METRICS as
    "reward/<dim>/<stat>"; HISTOGRAMS as {name: (bin edges, bin fractions)} lists. Other arrays (per-group
    values) are dropped."""
    out, hists = {}, {}
    for name, value in metrics.items():
        v = sharding.to_host(value)
        if v.ndim == 0:
            out[name] = float(v)
        elif v.shape == (len(dims),) and name in PER_DIM_METRICS:
            stat = name.split("/", 1)[1]
            out.update({f"reward/{d}/{stat}": float(x) for d, x in zip(dims, v)})
        elif name in HISTOGRAMS:
            hists[name] = (sharding.to_host(metrics[HISTOGRAMS[name]]).tolist(), v.tolist())
    return out, hists


def host_metrics(exp: Experience, dims: Sequence[str]) -> dict[str, float]:
    """What the device diagnostics do not compute: batch-wide per-dimension std, the format rate, the
    n-gram repetition rate of the completions and the thinking segments' lengths."""
    r = exp.rewards
    out = {f"reward/{d}/std": float(np.nanstd(r[..., k])) for k, d in enumerate(dims)}
    if "format" in dims:
        out["format_rate"] = float(np.nanmean(r[..., list(dims).index("format")] >= 1.0))
    out["repetition/rate"] = repetition_rate(sharding.to_host(exp.rollout.tokens),
                                             sharding.to_host(exp.rollout.lengths))
    out.update(thinking_lengths(assistant_turns(exp.rows, exp.texts)))
    out.update(reason_counts(exp.reasons))
    out.update(failure_counts(exp.reasons, dims))
    if exp.rollout.tool_stats is not None:
        out.update(tools.tool_metrics(tool_stats(exp)))
    return out


def tool_stats(exp: Experience) -> list[tools.ToolStats]:
    """[B*G] each completion's tool use, from `Rollout.tool_stats` (row-major)."""
    table = sharding.to_host(exp.rollout.tool_stats).reshape(-1, len(sampler.TOOL_STATS))
    return [tools.ToolStats(*(int(x) for x in row[:-1]), float(row[-1])) for row in table]


def host_timings(exp: Experience) -> dict[str, float]:
    """The step's wall-clock figures that come with the experience: seconds in the tool's sandbox."""
    return tools.tool_timings(tool_stats(exp)) if exp.rollout.tool_stats is not None else {}


def failure_counts(reasons: Sequence[dict[str, str]], dims: Sequence[str]) -> dict[str, float]:
    """Per dimension, how many of the step's rows its reward failed on (`rewards/<dim>/errors`: the reasons in
    `rewards.base.ERROR_REASONS`) and did not apply to (`rewards/<dim>/not_applicable`), and the largest
    failed share of any dimension (`rewards/error_frac`, which the `reward_errors` alarm watches)."""
    n = max(len(reasons), 1)
    out: dict[str, float] = {}
    for d in dims:
        out[f"rewards/{d}/errors"] = float(sum(r.get(d) in ERROR_REASONS for r in reasons))
        out[f"rewards/{d}/not_applicable"] = float(sum(r.get(d) == NOT_APPLICABLE for r in reasons))
    out["rewards/error_frac"] = max((out[f"rewards/{d}/errors"] / n for d in dims), default=0.0)
    return out


def format_zero_warning(metrics: Mapping[str, float]) -> str | None:
    """The warning for a first step on which no completion passed the format reward (`format_rate` 0), naming
    the reason the format reward gave most often, or None. A zero format rate at the start is almost always a
    mismatch between the prompt and the structure the reward checks (a chat template that opens `<think>` in
    the prompt, tags named differently), not something training will fix; the logs alone hide it among the
    other metrics."""
    if "format_rate" not in metrics or metrics["format_rate"] > 0.0:
        return None
    prefix = "reason/format/"
    counts = {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and v > 0}
    total = sum(counts.values())
    why = max(sorted(counts), key=lambda r: counts[r]) if counts else "unknown"
    share = f", {int(counts[why])} of {int(total)} completions" if counts else ""
    return (f"format reward 0 for every completion of the first step (most common reason: {why}{share}): check "
            "that the prompt asks for the structure the format reward checks (a chat template that ends the prompt "
            "with <think> marks its rows think_prefilled; a row without that field must write <think> itself)")


def reason_counts(reasons: Sequence[dict[str, str]]) -> dict[str, float]:
    """"reason/<dim>/<reason>": how many of the step's completions each reward gave that reason (e.g.
    reason/math/multiple_answers); a reason absent from a step's row was given 0 times."""
    counts: dict[str, float] = {}
    for per_dim in reasons:
        for d, why in per_dim.items():
            counts[f"reason/{d}/{why}"] = counts.get(f"reason/{d}/{why}", 0.0) + 1.0
    return dict(sorted(counts.items()))


def logged_samples(exp: Experience, dims: Sequence[str], n: int, *, advantages_BxG) -> list[dict]:
    """The first n completions of a step (row-major over groups) as samples.jsonl rows: the group (its
    prompt's index in the step), the text, its reward per dimension, the advantage the update gave it and
    the reason each reward gave. The prompt (as the model was given it, chat template included) is on the
    group's first row only: the group's completions share it, and a prompt can be long."""
    g = len(exp.texts) // max(len(exp.rows), 1)
    r = exp.rewards.reshape(-1, len(dims))
    adv = np.asarray(advantages_BxG, np.float32).reshape(-1)
    rows = []
    for i in range(min(n, len(exp.texts))):
        prompt = {"prompt": exp.rows[i // g]["prompt"]} if i % g == 0 else {}
        rows.append({"group": i // g, **prompt, "response": exp.texts[i],
                     "rewards": {d: float(x) for d, x in zip(dims, r[i])}, "advantage": float(adv[i]),
                     "reasons": exp.reasons[i],
                     **({"turns": [{"role": r, "text": t} for r, t in exp.turns[i]]} if exp.turns else {})})
    return rows


def tool_turns(tokenizer, tokens_BxGxT: np.ndarray, lengths_BxG: np.ndarray, policy_BxGxT: np.ndarray) -> tuple:
    """[B*G] each completion as its turns in order, ((role, text), ...) with role "model" for a run of tokens the
    policy drew and "tool" for a run of a tool's output (row-major)."""
    b, g, _ = tokens_BxGxT.shape
    n = lengths_BxG
    return tuple(multiturn.turns(tokenizer, tokens_BxGxT[i, j, : n[i, j]], policy_BxGxT[i, j, : n[i, j]])
                 for i in range(b) for j in range(g))


def token_kinds(tokenizer, tokens_BxGxT: np.ndarray, lengths_BxG: np.ndarray,
                prefilled: Sequence[bool] | None = None) -> np.ndarray:
    """[B, G, T] int8: each completion token's `SEGMENT_KINDS` code (0 other, 1 reasoning, 2 answer), the
    kind of its first character in the concatenation of the tokens' own texts (`segment_kinds`); a token
    with no text (EOS, a special) and the padding after the end are "other". `prefilled[b]`: row b's
    prompt opened the think block, so its completions start inside the thinking."""
    pieces: dict[int, str] = {}

    def piece(i: int) -> str:
        if i not in pieces:
            pieces[i] = tokenizer.decode([i], stop_at_eos=False, skip_special=True)
        return pieces[i]

    out = np.zeros(tokens_BxGxT.shape, np.int8)
    flat, lengths = out.reshape(-1, out.shape[-1]), lengths_BxG.reshape(-1)
    for row, (ids, n) in enumerate(zip(tokens_BxGxT.reshape(-1, out.shape[-1]), lengths)):
        texts = [piece(int(i)) for i in ids[: int(n)]]
        opened = bool(prefilled[row // tokens_BxGxT.shape[1]]) if prefilled is not None else False
        kinds, at = segment_kinds("".join(texts), think_prefilled=opened), 0
        for t, text in enumerate(texts):
            flat[row, t] = kinds[at] if text else 0
            at += len(text)
    return out


def assistant_turns(rows: Sequence[Row], texts: Sequence[str]) -> list[str]:
    """Each completion (row-major [B*G] over the B rows) as the whole assistant turn the rewards read
    (`rewards.format.assistant_turn`: "<think>" in front where the row's prompt opened it). Without rows
    (nothing to say which prompt opened a think block) the texts are returned as they are."""
    if not rows:
        return list(texts)
    g = len(texts) // len(rows)
    return [assistant_turn(t, rows[i // g]) for i, t in enumerate(texts)]


def thinking_lengths(texts: Sequence[str]) -> dict[str, float]:
    """Length in characters of each completion's thinking segment (`rewards.format.split_response`: the
    text inside <think>...</think>, or after an unclosed <think>; 0 without think tags): think/chars_mean,
    think/chars_p10, think/chars_p50, think/chars_p90 (numpy's linear percentiles)."""
    n = np.array([len(split_response(t).thinking) for t in texts], np.float64)
    if not len(n):
        return {}
    p10, p50, p90 = np.percentile(n, [10, 50, 90])
    return {"think/chars_mean": float(n.mean()), "think/chars_p10": float(p10), "think/chars_p50": float(p50),
            "think/chars_p90": float(p90)}


def repetition_rate(tokens_BxGxT: np.ndarray, lengths_BxG: np.ndarray, n: int = 3) -> float:
    """Mean over completions of the fraction of repeated n-grams (1 - distinct / total); 0 if too short."""
    rates = []
    for row, length in zip(tokens_BxGxT.reshape(-1, tokens_BxGxT.shape[-1]), lengths_BxG.reshape(-1)):
        grams = [tuple(row[i : i + n]) for i in range(int(length) - n + 1)]
        rates.append(1.0 - len(set(grams)) / len(grams) if grams else 0.0)
    return float(np.mean(rates)) if rates else 0.0
