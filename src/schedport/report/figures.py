"""The report's figures of ``portability.json``, drawn with matplotlib's Agg backend.

Each ``fig_*`` function reads the portability dict and returns the figure as an embedded PNG
(`png_data_uri`: a base64 ``data:`` URI, no file, no network), or None when there is nothing to
draw. Palettes are colour-blind safe: cividis for concordance, viridis for counts, Okabe-Ito (with
distinct markers and line styles) for categories (`schedport.report.style`).
"""

from __future__ import annotations

import base64
import io
from typing import Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from schedport.report.style import LINESTYLES, MARKERS, OKABE_ITO  # noqa: E402

__all__ = ["plt", "png_data_uri", "trivial_metrics", "trajectory_styles", "fig_tau_heatmap", "fig_headline_tau",
           "fig_metric_matrix", "fig_reversal_map", "fig_rank_trajectories", "fig_workload", "fig_spec_curve",
           "MAP_ROWS"]

MAP_ROWS = 20  # scheduler pairs shown in the reversal map


def png_data_uri(fig) -> str:
    """`fig` as a base64 PNG ``data:`` URI (96 dpi, tight box), for an ``<img>``; closes the figure."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _data_range(values, pad: float = 0.05, lo: float = -1.0, hi: float = 1.0) -> tuple[float, float]:
    """An axis range that fits the finite `values` with a margin, within [lo, hi]: a plot of data in
    0.45..0.85 is drawn over that span, not over all of -1..1."""
    v = [float(x) for x in values if x is not None and np.isfinite(x)]
    if not v:
        return lo, hi
    a, b = min(v), max(v)
    m = max(pad, 0.1 * (b - a))
    return max(lo, a - m), min(hi, b + m)


def _annotate(ax, mat: np.ndarray, fmt_s: str = "{:.2f}", fontsize: int = 7) -> None:
    for (i, j), v in np.ndenumerate(mat):
        if np.isfinite(v):
            ax.text(j, i, fmt_s.format(v), ha="center", va="center", fontsize=fontsize,
                    color="white" if v < 0.35 else "black")


def trivial_metrics(res: dict) -> list[str]:
    """Metrics the per-region heatmap leaves out: in every source pair and region their tau is
    undefined or rests on a near-constant ranking at 1.00 (e.g. n_rejected, where every scheduler
    rejects the same requests), so a row of them says nothing about portability."""
    items = res["concordance"]["sources"]
    out = []
    for m in res["parameters"]["metrics"]:
        rows = [d for d in items if d["metric"] == m]
        if all(d["tau"] is None or (d.get("tied") and d["tau"] >= 0.999) for d in rows):
            out.append(m)
    return out


def fig_tau_heatmap(res: dict) -> Optional[str]:
    """Cross-source Kendall tau by region (columns) x metric (rows), one panel per source pair;
    metrics without information (`trivial_metrics`) are left out and named in the title."""
    items = res["concordance"]["sources"]
    if not items:
        return None
    dropped = trivial_metrics(res)
    metrics = [m for m in res["parameters"]["metrics"] if m not in dropped]
    if not metrics:
        return None
    regions = [r["name"] for r in res["parameters"]["regions"]]
    pairs = list(dict.fromkeys((d["source_a"], d["source_b"]) for d in items))
    fig, axes = plt.subplots(1, len(pairs), figsize=(min(12.0, 2.2 + 3.4 * len(pairs)), 1.6 + 0.34 * len(metrics)),
                             squeeze=False)
    im = None
    for ax, (a, b) in zip(axes[0], pairs):
        mat = np.full((len(metrics), len(regions)), np.nan)
        tied = np.zeros(mat.shape, dtype=bool)
        for d in items:
            if (d["source_a"], d["source_b"]) == (a, b) and d["tau"] is not None and d["metric"] in metrics:
                mat[metrics.index(d["metric"]), regions.index(d["region"])] = d["tau"]
                tied[metrics.index(d["metric"]), regions.index(d["region"])] = bool(d.get("tied"))
        im = ax.imshow(mat, cmap="cividis", vmin=-1, vmax=1, aspect="auto")
        for (i, j), v in np.ndenumerate(mat):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}{'*' if tied[i, j] else ''}", ha="center", va="center", fontsize=8,
                        color="white" if v < 0.35 else "black")
        ax.set_xticks(range(len(regions)), regions, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(metrics)), metrics if ax is axes[0][0] else [""] * len(metrics), fontsize=8)
        ax.set_title(f"{a} vs {b}", fontsize=10)
    axes[0][0].set_ylabel("metric", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="Kendall tau-b (blank: undefined)")
    left_out = f"; left out, no information in any pair: {', '.join(dropped)}" if dropped else ""
    fig.suptitle("Cross-source rank agreement by load region (x, increasing) and metric\n(*: a mean-rank vector "
                 f"with 3 or fewer distinct values{left_out})", fontsize=10)
    return png_data_uri(fig)


def fig_headline_tau(res: dict) -> Optional[str]:
    """Cross-source tau (main-metric mean) per region, one line per source pair, with CIs."""
    rows = res["headline"]["cross_source"]["by_pair_region"]
    if not rows:
        return None
    regions = [r["name"] for r in res["parameters"]["regions"]]
    pairs = list(dict.fromkeys((d["source_a"], d["source_b"]) for d in rows))
    fig, ax = plt.subplots(figsize=(5.6, 3.0))
    x = np.arange(len(regions))
    for n, (a, b) in enumerate(pairs):
        v = np.full(len(regions), np.nan)
        lo, hi = v.copy(), v.copy()
        for d in rows:
            if (d["source_a"], d["source_b"]) == (a, b):
                i = regions.index(d["region"])
                v[i] = np.nan if d["value"] is None else d["value"]
                lo[i] = np.nan if d["ci_low"] is None else d["ci_low"]
                hi[i] = np.nan if d["ci_high"] is None else d["ci_high"]
        off = (n - (len(pairs) - 1) / 2) * 0.08
        col = OKABE_ITO[n % 8]
        ax.vlines(x + off, lo, hi, color=col, linewidth=1.2)  # the CI need not contain the estimate
        ax.plot(x + off, v, label=f"{a} vs {b}", color=col, marker=MARKERS[n % len(MARKERS)],
                linestyle=LINESTYLES[n % 4], linewidth=1.2, markersize=4)
    ax.set_xticks(x, regions, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(*_data_range([d.get(k) for d in rows for k in ("value", "ci_low", "ci_high")]))
    if ax.get_ylim()[0] < 0 < ax.get_ylim()[1]:
        ax.axhline(0, color="grey", linewidth=0.5)
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylabel("Kendall tau-b (mean of main metrics)", fontsize=8)
    ax.set_xlabel("load region (increasing)", fontsize=8)
    ax.set_title("Cross-source agreement per load region\n(line: estimate; bar: 95% basic bootstrap interval)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return png_data_uri(fig)


def fig_metric_matrix(res: dict, only: Optional[list] = None, title: str = "") -> Optional[str]:
    """Metric x metric Kendall tau (mean over source x region conditions)."""
    mm = res["metric_matrix"]
    metrics = mm["metrics"]
    if len(metrics) < 2:
        return None
    mat = np.array([[np.nan if v is None else v for v in row] for row in mm["tau"]], dtype=float)
    if only:
        ix = [metrics.index(m) for m in only if m in metrics]
        if len(ix) < 2:
            return None
        mat = mat[np.ix_(ix, ix)]
        metrics = [metrics[i] for i in ix]
    n = len(metrics)
    size = 1.8 + 0.36 * n
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    im = ax.imshow(mat, cmap="cividis", vmin=-1, vmax=1)
    if n <= 14:
        _annotate(ax, mat, fontsize=7 if n <= 8 else 6)
    ax.set_xticks(range(n), metrics, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(n), metrics, fontsize=7)
    fig.colorbar(im, ax=ax, shrink=0.8, label="mean Kendall tau-b")
    ax.set_title(title or "Metric x metric rank agreement (mean over conditions)", fontsize=9)
    return png_data_uri(fig)


def fig_reversal_map(res: dict) -> Optional[str]:
    """Where the study form's flips sit: its cross-source reversals on the main metrics, counted per
    scheduler pair (rows, the `MAP_ROWS` with the most) and region (columns), all source pairs and
    main metrics summed; each reversal counts once, in the region where it happens."""
    sf = res.get("study_form") or {}
    items = [it for e in sf.get("reversals") or [] for it in e.get("items") or []]
    if not items:
        return None
    regions = [r["name"] for r in res["parameters"]["regions"]]
    totals: dict = {}
    for it in items:
        totals[it["scheduler_pair"]] = totals.get(it["scheduler_pair"], 0) + 1
    ranked = sorted(totals, key=lambda p: (-totals[p], p))
    pairs = ranked[:MAP_ROWS]
    mat = np.zeros((len(pairs), len(regions)))
    for it in items:
        if it["scheduler_pair"] in totals and it["scheduler_pair"] in pairs:
            mat[pairs.index(it["scheduler_pair"]), regions.index(it["region"])] += 1
    fig, ax = plt.subplots(figsize=(2.4 + 0.62 * len(regions), 1.3 + 0.27 * len(pairs)))
    im = ax.imshow(mat, cmap="viridis", aspect="auto", vmin=0)
    for (i, j), v in np.ndenumerate(mat):
        if v:
            ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize=8,
                    color="black" if v > 0.6 * mat.max() else "white")
    ax.set_xticks(range(len(regions)), regions, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(pairs)), [f"{p} ({totals[p]})" for p in pairs], fontsize=8)
    ax.set_xlabel("load region (increasing)", fontsize=8)
    cb = fig.colorbar(im, ax=ax, shrink=0.6, label="flips")
    cb.locator = matplotlib.ticker.MaxNLocator(integer=True)
    cb.update_ticks()
    shown = f"top {len(pairs)} of {len(ranked)} scheduler pairs" if len(ranked) > len(pairs) else \
        f"all {len(ranked)} scheduler pairs"
    n_metrics = len(sf.get("reversals") or [])
    ax.set_title(f"Where the {len(items)} flips across sources sit\n({n_metrics} main metrics and every source "
                 f"pair summed; {shown})", fontsize=9)
    return png_data_uri(fig)


#: Okabe-Ito without its yellow, which is too light for a line on white.
LINE_COLOURS = tuple(c for c in OKABE_ITO if c != "#F0E442")


def trajectory_styles(res: dict) -> dict:
    """{scheduler: (colour, marker)} for the rank trajectories: the schedulers whose mean rank moves
    most across regions (range summed over sources and main metrics), one colour each, as many as
    there are colours; the others are drawn grey."""
    scheds = res["parameters"]["schedulers"]
    metrics = set(res["headline"]["main_metrics"])
    traj: dict = {}
    for d in res["rankings"]:
        if d["metric"] in metrics and d.get("mean_rank") is not None and np.isfinite(d["mean_rank"]):
            traj.setdefault((d["scheduler"], d["source"], d["metric"]), {})[d["region"]] = d["mean_rank"]
    moves = {sc: 0.0 for sc in scheds}
    for (sc, _, _), y in traj.items():
        if sc in moves and y:
            moves[sc] += max(y.values()) - min(y.values())
    shown = sorted(scheds, key=lambda sc: (-moves[sc], sc))[:len(LINE_COLOURS)]
    return {sc: (LINE_COLOURS[i], MARKERS[i]) for i, sc in enumerate(sorted(shown, key=scheds.index))}


def fig_rank_trajectories(res: dict) -> Optional[str]:
    """Mean rank of each scheduler across regions: one row per main metric, one column per source.
    The schedulers whose rank moves most (summed over the panels) get a colour and marker of their
    own, the same in every panel; the others are thin grey lines (their numbers are in the
    rankings tables), so no two coloured lines share a colour."""
    rk = res["rankings"]
    if not rk:
        return None
    regions = [r["name"] for r in res["parameters"]["regions"]]
    sources = res["parameters"]["sources"]
    scheds = res["parameters"]["schedulers"]
    metrics = res["headline"]["main_metrics"]
    K = len(scheds)
    table: dict = {}
    for d in rk:
        if d["metric"] in metrics:
            table[(d["source"], d["metric"], d["scheduler"], d["region"])] = d["mean_rank"]
    style = trajectory_styles(res)
    nr, nc = len(metrics), len(sources)
    fig, axes = plt.subplots(nr, nc, figsize=(3.3 * nc + 2.2, 2.0 * nr + 0.9), squeeze=False,
                             sharex=True, sharey=True)
    x = np.arange(len(regions))
    for mi, m in enumerate(metrics):
        for si, s in enumerate(sources):
            ax = axes[mi][si]
            for sc in scheds:
                y = [table.get((s, m, sc, r), np.nan) for r in regions]
                if sc in style:
                    col, mk = style[sc]
                    ax.plot(x, y, color=col, marker=mk, linewidth=1.5, markersize=4, label=sc, zorder=3)
                else:
                    ax.plot(x, y, color="#b8b8b8", linewidth=0.8, zorder=1,
                            label=f"the other {K - len(style)}" if sc == next(
                                (o for o in scheds if o not in style), None) else None)
            ax.set_ylim(K + 0.5, 0.5)
            if mi == 0:
                ax.set_title(s, fontsize=9)
            if si == 0:
                ax.set_ylabel(f"{m}\nmean rank (1 = best)", fontsize=7)
            if mi == nr - 1:
                ax.set_xticks(x, regions, rotation=35, ha="right", fontsize=7)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.25)
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="center left", bbox_to_anchor=(0.99, 0.5), fontsize=8,
               title="most moving\nschedulers")
    fig.suptitle("Rank trajectories across load regions (x: region, increasing load)", fontsize=10)
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.08, top=0.94, wspace=0.06, hspace=0.1)
    return png_data_uri(fig)


def fig_workload(res: dict) -> Optional[str]:
    """Per-source distributions (over windows) of lengths, rate and burstiness."""
    wl = res.get("workload") or {}
    if not wl.get("available"):
        return None
    rows = wl["windows"]
    stats_ = [s for s in ("input_mean", "output_mean", "input_p99", "output_p99", "rate_mean_rps", "dispersion")
              if s in wl.get("stats", [])]
    labels = {"input_mean": "mean input tokens", "output_mean": "mean output tokens",
              "input_p99": "p99 input tokens", "output_p99": "p99 output tokens",
              "rate_mean_rps": "mean rate (req/s, before scaling)", "dispersion": "index of dispersion"}
    if not stats_:
        return None
    sources = sorted({r["source"] for r in rows})
    fig, axes = plt.subplots(1, len(stats_), figsize=(2.6 * len(stats_), 3.0), squeeze=False)
    rng = np.random.default_rng(0)
    for ax, st in zip(axes[0], stats_):
        data = [[r[st] for r in rows if r["source"] == s and r.get(st) is not None] for s in sources]
        ax.boxplot([d if d else [np.nan] for d in data], showfliers=False, widths=0.5)
        for n, d in enumerate(data):
            ax.scatter(n + 1 + rng.uniform(-0.15, 0.15, len(d)), d, s=8, color=OKABE_ITO[n % 8],
                       marker=MARKERS[n % len(MARKERS)], alpha=0.8, zorder=3)
        ax.set_xticks(range(1, len(sources) + 1), sources, rotation=30, ha="right", fontsize=7)
        flat = [v for d in data for v in d]
        if flat and min(flat) > 0 and max(flat) / min(flat) > 50:
            ax.set_yscale("log")
        ax.set_title(labels[st], fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("per-window value", fontsize=8)
    fig.suptitle("Workload characterization per source (one point per window)", fontsize=10)
    fig.tight_layout()
    return png_data_uri(fig)



#: The study's number per claim for the specification curves (a band where it states a range).
STUDY_LINES = {"azure_bailian": (0.9, "near-perfect (0.9)"), "burstgpt_low": (0.55, "study: 0.55"),
               "reversals": (0.036, "study: 3.6%"), "metric_agreement": ((0.3, 0.7), "moderate: 0.3-0.7"),
               "best_changes": (0.681, "study: 68.1%")}
VERDICT_STYLE = {"holds": (OKABE_ITO[2], "o"), "does not hold": (OKABE_ITO[5], "x"),
                 "partly holds": (OKABE_ITO[4], "s"), "inconclusive": (OKABE_ITO[4], "s"),
                 "not comparable": ("#999999", ".")}


def fig_spec_curve(claim: dict) -> Optional[str]:
    """A claim's specification curve: its value under every distinct protocol, sorted, each point
    coloured (and marked) by the protocol's verdict, with the study's number as a line."""
    curve = claim.get("curve") or {}
    vals = [np.nan if v is None else float(v) for v in curve.get("value", [])]
    if not vals or not np.isfinite(vals).any():
        return None
    verdicts = curve["verdict"]
    x = np.arange(len(vals))
    fig, ax = plt.subplots(figsize=(4.6, 2.6))
    for v, (color, marker) in VERDICT_STYLE.items():
        sel = [i for i, d in enumerate(verdicts) if d == v]
        if sel:
            ax.scatter(x[sel], np.asarray(vals)[sel], s=6 if len(vals) > 500 else 14, color=color, marker=marker,
                       label=f"{v} ({len(sel)})", linewidths=0.8)
    line, label = STUDY_LINES.get(claim["id"], (None, ""))
    if isinstance(line, tuple):
        ax.axhspan(line[0], line[1], color="#cccccc", alpha=0.35, lw=0, label=label)
    elif line is not None:
        ax.axhline(line, color="black", lw=1, ls="--", label=label)
    ax.set_xlabel(f"protocols, sorted by value ({len(vals):,} distinct)")
    ax.set_ylabel("share" if claim["id"] in ("reversals", "best_changes") else "Kendall tau")
    ax.set_title(claim["id"], fontsize=9)
    ax.legend(fontsize=6, loc="best", markerscale=1.5)
    ax.tick_params(labelsize=7)
    return png_data_uri(fig)
