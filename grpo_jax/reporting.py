"""What people read of runs and studies: a run's PNG plots and report.md / report.json, and a study's tables,
plots and results.md / results.json (the figures come from the run folders' JSONL streams, `runlog`)."""

from __future__ import annotations

import functools
import json
import os
import urllib.parse
from typing import Any, Callable, Iterable

import numpy as np
from matplotlib.figure import Figure  # no pyplot: files only, and no global backend switch for the importer

from grpo_jax import stats
from grpo_jax.fileio import atomic_write, atomic_write_text
from grpo_jax.provenance import result_provenance
from grpo_jax.runlog import Row, is_number, plain, read_jsonl, text_writer


PER_PROBLEM = {"greedy": "greedy accuracy", "t1": "pass@1 at T = 1"}


# ---- a run's report ----------------------------------------------------------------------------------

def plot_run(rows: list[Row], out_dir: str) -> list[str]:
    """PNG plots of a run's metrics rows in ``out_dir/plots``; a plot whose metrics are absent is skipped.

    rewards (reward/<dim>/mean with a +-reward/<dim>/std band, reward/total), entropy (entropy/mean with
    p5-p95 and darker p25-p75 bands), groups (groups/reward_var_mean, groups/zero_var_frac on a twin axis),
    lengths (length/mean, min-max band, length/truncated_frac), format (format_rate), eval_accuracy
    (eval/accuracy, logged every few steps), entropy_by_kind (entropy_t1/<kind>/mean), pass_at_k
    (eval/t1/pass@k beside eval/accuracy), optim (kl, clip_frac_low, clip_frac_high, grad_norm, lr).
    """
    plot_dir = os.path.join(out_dir, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    for name, draw in _PLOTS:
        fig = Figure(figsize=(7, 4), layout="constrained")
        if draw(fig, rows):
            path = os.path.join(plot_dir, f"{name}.png")
            atomic_write(path, functools.partial(fig.savefig, format="png", dpi=100))
            paths.append(path)
    return paths


def write_report(out_dir: str, summary: dict, *, title: str, sections: Iterable[tuple[str, str]] = (),
                 plots: Iterable[str] = (), provenance: dict | None = None) -> tuple[str, str]:
    """report.md (title, table of the summary's scalars, sections, plots, the provenance's command and
    commit) and report.json (the summary, with the provenance under "provenance" when given)."""
    os.makedirs(out_dir, exist_ok=True)
    lines = [f"# {title}", ""]
    table = _flatten(plain(summary))
    if table:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {_cell(k)} | {_cell(_fmt(v))} |" for k, v in table.items()] + [""]
    for heading, body in sections:
        lines += [f"## {heading}", "", body.strip(), ""]
    if plots:
        lines += ["## Plots", ""]
        lines += [_image(p, out_dir) + "\n" for p in plots]
    if provenance:
        git = provenance.get("git", {})
        lines += ["## Provenance", "", f"`{provenance.get('command')}` at commit {git.get('commit')}"
                  f"{' (uncommitted changes)' if git.get('dirty') else ''}; the rest is in report.json.", ""]
    md_path, json_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.json")
    atomic_write(md_path, text_writer("\n".join(lines).rstrip() + "\n"))
    data = plain(summary) if provenance is None else {**plain(summary), "provenance": plain(provenance)}
    atomic_write(json_path, text_writer(json.dumps(data, sort_keys=True, indent=2) + "\n"))
    return md_path, json_path


# ---- plots ----------------------------------------------------------------------------------------------


def _aligned(rows: list[Row], *keys: str) -> tuple[np.ndarray, ...]:
    """(steps, values of keys[0], values of keys[1], ...) over the rows where every key is a number."""
    picked = [r for r in rows if all(is_number(r.get(k)) for k in keys)]
    return (np.array([r["step"] for r in picked], float),
            *(np.array([r[k] for r in picked], float) for k in keys))


def _has(rows: list[Row], key: str) -> bool:
    return any(is_number(r.get(key)) for r in rows)


def _finish(ax: Any, ylabel: str, title: str) -> None:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _plot_rewards(fig: Any, rows: list[Row]) -> bool:
    dims = sorted({k.split("/")[1] for r in rows for k in r
                   if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2})
    if not dims and not _has(rows, "reward/total"):
        return False
    ax = fig.add_subplot()
    for i, dim in enumerate(dims):
        ax.plot(*_aligned(rows, f"reward/{dim}/mean"), color=f"C{i}", label=dim)
        steps, mean, std = _aligned(rows, f"reward/{dim}/mean", f"reward/{dim}/std")
        ax.fill_between(steps, mean - std, mean + std, color=f"C{i}", alpha=0.2, lw=0)
    if _has(rows, "reward/total"):
        ax.plot(*_aligned(rows, "reward/total"), color="black", lw=2, label="total")
    _finish(ax, "reward", "reward per dimension")
    return True


def _plot_entropy(fig: Any, rows: list[Row]) -> bool:
    if not _has(rows, "entropy/mean"):
        return False
    ax = fig.add_subplot()
    for lo, hi, alpha in (("p5", "p95", 0.15), ("p25", "p75", 0.35)):
        steps, low, high = _aligned(rows, f"entropy/{lo}", f"entropy/{hi}")
        if len(steps):
            ax.fill_between(steps, low, high, color="C0", alpha=alpha, lw=0, label=f"{lo}-{hi}")
    ax.plot(*_aligned(rows, "entropy/mean"), color="C0", label="mean")
    _finish(ax, "entropy (nats/token)", "policy entropy")
    return True


def _plot_twin(fig: Any, rows: list[Row], *, left: str, right: str, title: str,
               band: tuple[str, str] | None = None) -> bool:
    """``left`` (with an optional min-max ``band``) on the left axis, ``right`` (a fraction) on a twin."""
    if not any(_has(rows, k) for k in (left, right, *(band or ()))):
        return False
    ax = fig.add_subplot()
    ax.plot(*_aligned(rows, left), color="C0", label=left)
    if band:
        steps, low, high = _aligned(rows, *band)
        ax.fill_between(steps, low, high, color="C0", alpha=0.2, lw=0, label=f"{band[0]}..{band[1]}")
    twin = ax.twinx()
    twin.plot(*_aligned(rows, right), color="C3", ls="--", label=right)
    twin.set_ylabel(right, color="C3")
    _finish(ax, left, title)
    handles = [*ax.get_legend_handles_labels()[0], *twin.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize="small")
    return True


def _plot_lines(fig: Any, rows: list[Row], *, keys: tuple[str, ...], title: str) -> bool:
    """One panel per present key, sharing the step axis (the keys may differ in scale)."""
    present = [k for k in keys if _has(rows, k)]
    if not present:
        return False
    fig.set_size_inches(7, 1 + 2 * len(present))
    axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, present):
        steps, values = _aligned(rows, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None)  # sparse series (eval) as points
        _finish(ax, key, title if ax is axes[0] else "")
    return True


def _plot_overlay(fig: Any, rows: list[Row], *, keys: tuple[str, ...], title: str, ylabel: str) -> bool:
    """The present keys as lines on one axis (the same quantity measured several ways)."""
    present = [k for k in keys if _has(rows, k)]
    if not present:
        return False
    ax = fig.subplots()
    for key in present:
        steps, values = _aligned(rows, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
    _finish(ax, ylabel, title)
    ax.legend(fontsize="small")
    return True


_PLOTS: tuple[tuple[str, Callable[[Any, list[Row]], bool]], ...] = (
    ("rewards", _plot_rewards),
    ("entropy", _plot_entropy),
    ("groups", functools.partial(_plot_twin, left="groups/reward_var_mean", right="groups/zero_var_frac",
                                 title="group reward variance")),
    ("lengths", functools.partial(_plot_twin, left="length/mean", right="length/truncated_frac",
                                  band=("length/min", "length/max"), title="response length")),
    ("format", functools.partial(_plot_lines, keys=("format_rate",), title="format compliance")),
    ("eval_accuracy", functools.partial(_plot_lines, keys=("eval/accuracy",), title="held-out accuracy")),
    ("entropy_by_kind", functools.partial(
        _plot_overlay, keys=("entropy_t1/mean", "entropy_t1/reasoning/mean", "entropy_t1/answer/mean",
                             "entropy_t1/other/mean"), title="policy entropy at T = 1, by kind of token",
        ylabel="mean entropy (nats)")),
    ("pass_at_k", functools.partial(
        _plot_overlay, keys=("eval/accuracy", *(f"eval/t1/pass@{k}" for k in (1, 2, 4, 8, 16, 32))),
        title="held-out pass@k at T = 1 (unbiased) and greedy accuracy", ylabel="fraction of problems")),
    ("optim", functools.partial(_plot_lines, title="optimisation",
                                keys=("kl", "clip_frac_low", "clip_frac_high", "grad_norm", "lr"))),
    ("gap", functools.partial(_plot_lines, title="sampler-trainer gap",
                              keys=("gap/abs_logp", "gap/kl", "gap/ratio_max", "gap/token_out_frac", "is_weight"))),
)


# ---- report ---------------------------------------------------------------------------------------------


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Scalar entries of a nested dict, keys joined with "/"; lists are left to report.json."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
    return out


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _image(path: str, out_dir: str) -> str:
    rel = os.path.relpath(path, out_dir).replace(os.sep, "/")
    return f"![{os.path.splitext(os.path.basename(path))[0]}]({urllib.parse.quote(rel)})"




# ---- a study's tables and plots -----------------------------------------------------------------------

def seed_comparison_table(comparison: dict, scale: float = 100.0) -> str:
    """Markdown: `compare_seeds` as a table, differences x `scale` (100: points); with its tests (a sesoi given),
    the Holm-adjusted p-values, the equivalence test and the decision instead of the Bonferroni interval."""
    if "sesoi" in comparison:
        return _decision_table(comparison, scale)
    c = comparison
    head = (f"`{c['metric']}`, arm - {c['baseline']}, x{scale:g}, paired t-interval over seeds at {100 * c['level']:g}% "
            f"and at the Bonferroni level {100 * c['adjusted_level']:.2f}% ({c['family']} comparisons)")
    lines = [head + _floor_note(c, scale), "",
             "| arm | seeds | difference [95% CI] | Bonferroni CI | per seed | verdict |", "|---|---|---|---|---|---|"]
    for arm, e in c["arms"].items():
        adjusted = f"[{scale * e['adjusted']['low']:.1f}, {scale * e['adjusted']['high']:.1f}]"
        lines.append(f"| {arm} | {len(e['seed_list'])} | {stats.format_ci(e['diff'], scale)} | {adjusted} | "
                     f"{_per_seed(e, scale)} | {e['verdict'] or 'no floor'} |")
    return "\n".join(lines)


def _floor_note(c: dict, scale: float) -> str:
    """A seed comparison's noise floor, as its table's head ends."""
    floor = c["noise_floor"]
    return (f"; noise floor (null - {c['baseline']}: {stats.format_ci(floor, scale)}) {scale * floor['floor']:.1f}"
            if floor else "; no null arm")


def _per_seed(entry: dict, scale: float) -> str:
    return ", ".join(f"{scale * d:+.1f}" for d in entry["diff"]["per_seed"])


def _decision_table(c: dict, scale: float) -> str:
    head = (f"`{c['metric']}`, arm - {c['baseline']}, x{scale:g}, paired t over seeds, {100 * c['level']:g}% interval; "
            f"p two-sided, Holm over the {c['holm_family']} arms of this table; equivalence (TOST) at "
            f"+-{scale * c['sesoi']:g}")
    lines = [head + _floor_note(c, scale), "",
             "| arm | seeds | difference [95% CI] | p | Holm p | TOST p | per seed | decision |",
             "|---|---|---|---|---|---|---|---|"]
    for arm, e in c["arms"].items():
        lines.append(f"| {arm} | {len(e['seed_list'])} | {stats.format_ci(e['diff'], scale)} | "
                     f"{e['test']['p_value']:.3g} | {e['holm_p']:.3g} | {e['tost']['p_value']:.3g} | "
                     f"{_per_seed(e, scale)} | {e['decision']} |")
    return "\n".join(lines)


def comparison_table(comparison: dict) -> str:
    """Markdown: each arm's difference to the baseline in points with its 95% CI, McNemar p per seed and the
    verdict against the noise floor."""
    if not comparison:
        return "No per-problem results (problems.jsonl) to compare."
    floor = comparison["noise_floor"]
    head = (f"{PER_PROBLEM[comparison['metric']]}, arm - {comparison['baseline']}, points, paired bootstrap 95% CI "
            f"over {len(comparison['seeds'])} seeds x held-out problems")
    lines = [head + (f"; noise floor (null arm) {100 * floor['floor']:.1f} points" if floor else "; no null arm"),
             "", "| arm | difference [95% CI] | McNemar p per seed | verdict |", "|---|---|---|---|"]
    for arm, e in comparison["arms"].items():
        p = ", ".join(f"{m['p_value']:.3g}" for m in e.get("mcnemar", [])) or "-"
        lines.append(f"| {arm} | {stats.format_ci(e['diff'])} | {p} | {e['verdict'] or 'no floor'} |")
    return "\n".join(lines)


def _num(v: float) -> str:
    """3 decimals, or 3 significant digits under 0.01 (a gap of 1.7e-3 or 1e-7 is not 0.002 or 0.000)."""
    return f"{v:.3f}" if v == 0 or not np.isfinite(v) or abs(v) >= 1e-2 else f"{v:.2e}"


def table(results: dict, columns: list[str]) -> str:
    """Markdown table: one row per arm, mean +- std over seeds of each column."""
    lines = ["| arm | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for arm, runs in results.items():
        cells = []
        for c in columns:
            v = np.array([r[c] for r in runs], float)
            cells.append(f"{_num(np.nanmean(v))} +- {_num(np.nanstd(v))}" if len(v) > 1 else _num(v[0]))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_curves(out: str, arms, key: str, ylabel: str, name: str, *, log: bool = False) -> str:
    """One line per arm of a metric against the step: the mean over seeds, with a band of +- one std
    (log: a log axis, with the geometric mean and a band of x/÷ the geometric std: entropies span decades).
    Arms past the tenth get dashed lines: the colour cycle has ten colours."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for i, arm in enumerate(arms):
        curves = []
        arm_dir = os.path.join(out, arm)
        for seed_dir in sorted(os.listdir(arm_dir)) if os.path.isdir(arm_dir) else []:
            path = os.path.join(arm_dir, seed_dir, "metrics.jsonl")
            if os.path.exists(path):
                curves.append([(r["step"], r[key]) for r in read_jsonl(path) if isinstance(r.get(key), (int, float))])
        n = min((len(c) for c in curves), default=0)
        if n:
            steps = [s for s, _ in curves[0][:n]]
            values = np.array([[v for _, v in c[:n]] for c in curves], float)
            if log:
                logs = np.log(np.maximum(values, 1e-12))
                mean, lo, hi = (np.exp(logs.mean(0) + k * logs.std(0)) for k in (0, -1, 1))
            else:
                mean, std = values.mean(axis=0), values.std(axis=0)
                lo, hi = mean - std, mean + std
            (line,) = ax.plot(steps, mean, label=arm, linestyle="-" if i < 10 else "--")
            if len(curves) > 1:
                ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    return _save_plot(fig, ax, out, name)


def _save_plot(fig: Figure, ax, out: str, name: str) -> str:
    """A study plot's grid and legend, written to <out>/plots/<name>.png; returns the path."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    path = os.path.join(out, "plots", f"{name}.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def pass_at_k_curves(run_dir: str) -> dict[int, dict[int, float]]:
    """{step: {k: held-out pass@k}} of each evaluation of a run that sampled at T = 1 (problems.jsonl rows with
    `t1_correct`, the correct count of `samples` completions per problem), for k = 1, 2, 4, ... and the
    sample count itself, by the unbiased estimator (`stats.pass_at_k_curve`)."""
    path = os.path.join(run_dir, "problems.jsonl")
    out = {}
    for r in read_jsonl(path) if os.path.exists(path) else []:
        if "t1_correct" in r:
            n = int(r["samples"])
            ks = sorted({2 ** i for i in range(n.bit_length()) if 2 ** i <= n} | {n})
            out[int(r["step"])] = stats.pass_at_k_curve(n, np.asarray(r["t1_correct"]), ks)
    return out


def plot_pass_at_k(out: str, arms, seeds, name: str = "pass_at_k") -> str:
    """pass@k at T = 1 against k (log axis), the mean over `seeds`: one dashed line for the start (the first
    sampled evaluation of the first arm that has one: the arms of a seed share their warm start and held-out
    rows) and one solid line per arm at its last sampled evaluation. Seeds without both are left out."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()

    def draw(curves: list[dict[int, float]], label: str, **style) -> None:
        ks = sorted(curves[0])
        ax.plot(ks, [np.mean([c[k] for c in curves]) for k in ks], marker="o", markersize=3,
                label=f"{label} ({len(curves)} seeds)", **style)

    start_drawn = False
    for arm in arms:
        per_seed = [pass_at_k_curves(os.path.join(out, arm, f"seed{s}")) for s in seeds]
        per_seed = [c for c in per_seed if len(c) >= 2]
        if not per_seed:
            continue
        if not start_drawn:
            draw([c[min(c)] for c in per_seed], "start (warm start)", linestyle="--", color="black")
            start_drawn = True
        draw([c[max(c)] for c in per_seed], arm, linestyle="-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (samples per problem at T = 1)")
    ax.set_ylabel("held-out pass@k")
    return _save_plot(fig, ax, out, name)


def seed_table(results: dict, columns: list[str]) -> str:
    """Markdown table: one row per (arm, seed) with the raw figures (what the per-seed verdicts compare)."""
    lines = ["| arm | seed | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for arm, runs in results.items():
        for r in runs:
            cells = [_num(r[c]) if isinstance(r.get(c), float) else str(r.get(c)) for c in columns]
            lines.append(f"| {arm} | {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_study(out: str, study: dict, *, title: str, columns: list[str], plots: list[str], notes: str,
                seed_columns: list[str] = (), comparison: dict | None = None,
                seed_comparisons: list[dict] = ()) -> None:
    """results.md (notes, mean +- std over seeds per arm, the comparisons, the per-seed figures of
    `seed_columns`, plots) and results.json, which carries the provenance of the process writing it (commit and
    dirty state, source digest, packages, command, machine: `provenance.result_provenance`). `comparison`:
    `compare_arms` (per problem); `seed_comparisons`: `compare_seeds` results (per seed)."""
    study = {**study, "provenance": result_provenance()}
    md = [f"# {title}", "", notes, "", table(study["results"], columns), ""]
    for c in seed_comparisons:
        md += [seed_comparison_table(c), ""]
    if seed_comparisons:
        study["seed_comparisons"] = list(seed_comparisons)
    if comparison is not None:
        study["comparison"] = comparison
        md += [comparison_table(comparison), ""]
    if seed_columns:
        md += ["Per seed:", "", seed_table(study["results"], list(seed_columns)), ""]
    md += [f"![{os.path.basename(p)}](plots/{os.path.basename(p)})" for p in plots]
    atomic_write_text(os.path.join(out, "results.md"), "\n".join(md) + "\n")
    atomic_write_text(os.path.join(out, "results.json"), json.dumps(study, indent=2, sort_keys=True, default=float))
