"""The report's figures (matplotlib, Agg): training curves, held-out scores, selection maps.

Every figure that shows a reward or a score draws the base model's value as a dashed
reference line, so a reader sees at once whether training moved anything.
"""
from __future__ import annotations

import math
from pathlib import Path

from margrpo.stats import mean_std

# Two panels per row: large enough to read a noisy 90-step curve.
PANEL_W, PANEL_H, COLUMNS = 5.6, 3.4, 2
BASE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 2.0}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int = 100) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _plt().close(fig)
    return path


def _band(seeds: dict[int, list[dict]], key: str) -> tuple[list, list[float], list[float]]:
    """(steps, mean over seeds, std over seeds) of `key` at every step some seed logs it."""
    steps = sorted({r["step"] for h in seeds.values() for r in h if r.get(key) is not None})
    stats = [mean_std([r[key] for h in seeds.values() for r in h if r["step"] == s and r.get(key) is not None])
             for s in steps]
    return steps, [x[0] for x in stats], [x[1] for x in stats]


# Training reward against the judge: what the policy is optimised for, what its own
# detector says about GenEval correctness, and what the evaluation judge says.
JUDGE_KEYS = ("reward/mean", "judge/proxy_correct", "judge/correct")


def judge_figure(curves: dict[str, dict[int, list[dict]]], path: Path,
                 keys: tuple[str, ...] = JUDGE_KEYS) -> Path | None:
    """One panel per method with a line per key (mean over seeds, band +- 1 std over
    seeds). Only methods that log every key get a panel; None when none does."""
    plt = _plt()
    methods = [m for m, seeds in curves.items()
               if all(any(r.get(k) is not None for h in seeds.values() for r in h) for k in keys)]
    if not methods:
        return None
    fig, axes = _panels(plt, len(methods))
    for ax, method in zip(axes.flat, methods):
        for key in keys:
            _band_line(ax, *_band(curves[method], key), key)
        _finish_panel(ax, method)
    return _save_panels(fig, axes, len(methods), path)


def _panels(plt, n: int):
    """A figure of n panels, COLUMNS per row; axes as a 2-D array."""
    rows, cols = math.ceil(n / COLUMNS), min(COLUMNS, n)
    return plt.subplots(rows, cols, figsize=(PANEL_W * cols, PANEL_H * rows), squeeze=False)


def _band_line(ax, steps, mean, sd, label: str) -> None:
    """A mean line with a band of +- 1 std."""
    ax.plot(steps, mean, label=label)
    ax.fill_between(steps, [a - b for a, b in zip(mean, sd)], [a + b for a, b in zip(mean, sd)], alpha=0.2)


def _finish_panel(ax, title: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _save_panels(fig, axes, n: int, path: Path) -> Path:
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    return _save(fig, path)


def plot_curves(curves: dict[str, dict[int, list[dict]]], keys: list[str], path: Path,
                reference: dict[str, tuple[float, str]] | None = None) -> Path | None:
    """One panel per metric key; one line per method (mean over seeds) with a band of
    +- 1 std over seeds. curves: method -> seed -> history rows; reference: key -> (value,
    label) of a horizontal line (the base model's value of that metric)."""
    plt = _plt()
    keys = [k for k in keys if any(k in r for seeds in curves.values() for h in seeds.values() for r in h)]
    if not keys:
        return None
    fig, axes = _panels(plt, len(keys))
    for ax, key in zip(axes.flat, keys):
        for method, seeds in curves.items():
            steps, m, sd = _band(seeds, key)
            if steps:
                _band_line(ax, steps, m, sd, method)
        if reference and key in reference:
            value, label = reference[key]
            ax.axhline(value, label=label, **BASE_STYLE)
        _finish_panel(ax, key)
    return _save_panels(fig, axes, len(keys), path)


def scores_figure(evals: dict[str, dict], path: Path, base: str = "base") -> Path | None:
    """Held-out score per GenEval tag and T2I category: a bar (mean +- std over replicates)
    per trained method, the base model as a dashed line across each group.
    evals: target -> metrics.json content ({'mean': {...}, 'std': {...}})."""
    plt = _plt()
    methods = [t for t in evals if t != base]
    keys = sorted({k for t in evals for k in evals[t]["mean"]},
                  key=lambda k: (not k.startswith("eval/geneval"), k.endswith(("overall", "/mean")), k))
    if not keys or not methods:
        return None
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(keys) + 1.2))
    for i, m in enumerate(methods):
        y = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(keys))]
        ax.barh(y, [evals[m]["mean"].get(k, float("nan")) for k in keys], height=width,
                xerr=[evals[m]["std"].get(k, 0.0) for k in keys], label=m, capsize=2,
                error_kw={"ecolor": "0.55", "elinewidth": 0.8})
    if base in evals:
        for j, k in enumerate(keys):
            if k in evals[base]["mean"]:
                ax.plot([evals[base]["mean"][k]] * 2, [j - 0.45, j + 0.45], label=base if j == 0 else None, **BASE_STYLE)
    ax.set_yticks(range(len(keys)), [k.removeprefix("eval/") for k in keys])
    ax.invert_yaxis()
    ax.set_xlabel("held-out score (mean ± std over replicates)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def selection_figure(examples: dict, out: Path, max_steps: int = 4) -> Path | None:
    """Images of the last rollout beside their per-token maps at a few AR steps (every
    [n, N] tensor of a step record, N = g*g tokens, drawn as a g x g heat map). A map that
    is the same everywhere (e.g. `selected` of a method without token selection) carries no
    information and gets no panel."""
    import torch

    plt = _plt()
    images, steps = examples.get("images"), examples.get("steps") or []
    if images is None or not steps:
        return None
    picked = steps[:: max(1, math.ceil(len(steps) / max_steps))][:max_steps]
    maps = [(s.get("ar_step", i), k, v) for i, s in enumerate(picked)
            for k, v in s.items() if torch.is_tensor(v) and v.ndim == 2 and v.min() != v.max()]
    if not maps:
        return None
    n = images.shape[0]
    fig, axes = plt.subplots(n, 1 + len(maps), figsize=(1.9 * (1 + len(maps)), 2.0 * n), squeeze=False)
    for i in range(n):
        axes[i][0].imshow(images[i].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
        axes[i][0].set_title((examples.get("prompts") or [""] * n)[i][:32], fontsize=7)
        for j, (step, key, v) in enumerate(maps, start=1):
            g = int(round(math.sqrt(v.shape[1])))
            axes[i][j].imshow(v[i].float().reshape(g, g).numpy(), cmap="viridis", interpolation="nearest")
            if i == 0:
                axes[i][j].set_title(f"AR step {step}\n{key}", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return _save(fig, out, dpi=90)


def interval_figure(panels: list[tuple[str, dict[str, list[tuple[float, float, float, float]]]]], path: Path,
                    ylabel: str) -> Path | None:
    """One panel per knob: a score against the knob's values, one line per series with its
    interval as error bars. panels: [(knob label, {series label: [(x, point, low, high)]})]."""
    plt = _plt()
    panels = [(title, lines) for title, lines in panels if lines]
    if not panels:
        return None
    fig, axes = _panels(plt, len(panels))
    for ax, (title, lines) in zip(axes.flat, panels):
        values = [p[0] for pts in lines.values() for p in pts]
        # series side by side at each x (2% of the x range apart), so equal points stay visible
        step = 0.02 * ((max(values) - min(values)) or 1.0)
        for i, (label, pts) in enumerate(lines.items()):
            pts = sorted(pts)
            xs = [p[0] + (i - (len(lines) - 1) / 2) * step for p in pts]
            ys = [p[1] for p in pts]
            err = [[y - p[2] for y, p in zip(ys, pts)], [p[3] - y for y, p in zip(ys, pts)]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save_panels(fig, axes, len(panels), path)


def forest_figure(panels: list[tuple[str, list[tuple[str, float, float, float, float]]]], path: Path) -> Path | None:
    """The report's first figure: one panel per group of differences, a row per difference
    with its point and 95% interval, a dashed line at 0 and a grey band of ±delta (the margin
    inside which a difference is negligible). panels: [(title, [(label, point, low, high,
    delta)])]; a row without an interval (one seed) draws its point alone."""
    plt = _plt()
    panels = [(title, rows) for title, rows in panels if rows]
    if not panels:
        return None
    heights = [max(1.6, 0.32 * len(rows) + 0.9) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9.5, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, rows) in zip(axes[:, 0], panels):
        y = list(range(len(rows)))[::-1]
        for yi, (_, point, low, high, delta) in zip(y, rows):
            ax.fill_betweenx([yi - 0.4, yi + 0.4], -delta, delta, color="0.85", linewidth=0)
            if math.isfinite(low) and math.isfinite(high):
                ax.plot([low, high], [yi, yi], color="C0", linewidth=2)
            ax.plot([point], [yi], "o", color="C0" if low > 0 else "C3" if high < -delta else "0.3")
        ax.axvline(0.0, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(y, [r[0] for r in rows], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)
