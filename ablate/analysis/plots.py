"""Figures for the report (matplotlib, Agg backend): curves per arm (seeds as lines, or 95% bands from
MIN_BOOT_SEEDS seeds; per-step metrics smoothed; inside each metric's range), pass@k vs k, and an effect
forest plot. Each function returns a matplotlib Figure (curves_figure: with its caption and notes);
`to_base64` embeds one."""

from __future__ import annotations

import base64
import io
import math
import re
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from ablate.analysis.diagnostics import run_flags  # noqa: E402
from ablate.analysis.stats import MIN_BOOT_SEEDS, mean_band, t_band  # noqa: E402
from ablate.runs.metrics import metric_range  # noqa: E402

X_AXES = {"steps": ("step", "optimizer step"), "samples": ("counters/samples", "completions generated"),
          "tokens": ("counters/tokens", "completion tokens generated"), "wall": ("perf/wall_seconds", "wall seconds")}
PANELS = [("train/reward_mean", "train reward"), (None, "held-out"), ("train/entropy", "entropy (nats/token)"),
          ("train/dead_all_correct_frac", "dead groups: all correct"), ("train/dead_all_wrong_frac", "dead groups: all wrong"),
          ("train/kl", "KL to reference"), ("train/completion_len_mean", "response length (tokens)"),
          ("train/truncation_rate", "truncation rate"), ("train/clip_frac_low", "clip fraction low"),
          ("train/clip_frac_high", "clip fraction high"), ("eval/train_minus_heldout_reward", "train - held-out reward"),
          ("train/grad_norm", "grad norm")]
BINS = 120          # held-out evaluations on a counter / time axis: at most this many bins
SMOOTH_BINS = 30    # per-step metrics: drawn as means over about this many bins (steps: whole steps each)
RAW_BINS = 300      # ... with their unsmoothed mean, at up to this many points, faint behind
RATE = re.compile(r"pass@|maj@|acc|frac|(?<![a-z])rate")   # not perf/generate_seconds


def rate_scale(metric: str) -> float:
    """Rates in [0, 1] (pass@k, maj@k, accuracies, fractions) are drawn and reported in points (x100)."""
    return 100.0 if RATE.search(metric) else 1.0


def to_base64(fig, fmt: str = "png", dpi: int = 80) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _colors(arms: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")
    return {a: cmap(i % cmap.N) for i, a in enumerate(arms)}


# the arms' mean lines differ in dash as well as colour: arms that coincide stay visible on top of each other
DASHES = ["-", (0, (5, 2)), (0, (1, 1.2)), (0, (6, 2, 1, 2))]


def _xmap(study, x: str) -> pd.DataFrame:
    """run_id, step -> x value (for placing evaluations on a counter / time axis); step 0 is x = 0."""
    col = X_AXES[x][0]
    m = study.metrics
    if col not in m:
        raise ValueError(f"x axis {x!r} needs metric {col!r}, which these runs did not log")
    return m[["run_id", "step", col]].rename(columns={col: "_x"})


@dataclass(frozen=True)
class ArmCurve:
    """One arm's curve of one metric on P points: each run's value (NaN where it has none), the mean over
    runs and the 95% band (NaN: none drawn); `width`: the bin width in x units (0: evaluations as logged)."""
    x: np.ndarray      # [P]
    runs: np.ndarray   # [R, P]
    mean: np.ndarray   # [P]
    lo: np.ndarray     # [P]
    hi: np.ndarray     # [P]
    width: float = 0.0


def bin_edges(lo: float, hi: float, n: int, whole: bool) -> np.ndarray:
    """Edges of at most n bins covering [lo, hi]: equal widths, or (`whole`, x = steps) a whole number of
    steps each from step lo on, the last bin ending at step hi (it may be shorter)."""
    if whole:
        width = max(1, math.ceil((hi - lo + 1) / n))
        edges = lo - 0.5 + width * np.arange(math.ceil((hi - lo + 1) / width) + 1)
        return np.minimum(edges, hi + 0.5)
    return np.linspace(lo, hi + 1e-9 * max(1.0, abs(hi)), n + 1)


def _points(study, metric: str, x: str, run_ids) -> pd.DataFrame:
    """run_id, step, _x and the finite values of one metric over the given runs."""
    wide = study.evals if metric in study.evals.columns else study.metrics
    d = wide[["run_id", "step", metric]].dropna(subset=[metric])
    d = d[d["run_id"].isin(run_ids)]
    if x == "steps":
        return d.assign(_x=d["step"].astype(float))
    d = d.merge(_xmap(study, x), on=["run_id", "step"], how="left")
    d.loc[d["step"] == 0, "_x"] = d.loc[d["step"] == 0, "_x"].fillna(0.0)
    return d.dropna(subset=["_x"])


def arm_curves(study, metric: str, x: str, run_arm: pd.Series, arms: list[str], ci_method: str | None = "t",
               bins: int = BINS) -> dict[str, ArmCurve]:
    """{arm: ArmCurve} of one metric on a grid shared by all arms: held-out evaluations at their steps
    (x = steps), anything else as each run's means over `bins` bins of x (bin_edges; no more bins than a
    run has points). Band per point (ci_method "t": Student t, else the percentile bootstrap over runs;
    None: no band) only for arms with MIN_BOOT_SEEDS runs or more."""
    if metric not in study.metrics.columns and metric not in study.evals.columns:
        return {}
    d = _points(study, metric, x, run_arm.index)
    if d.empty:
        return {}
    xs = d["_x"].to_numpy(float)
    if metric in study.evals.columns and x == "steps":
        grid, width = np.sort(np.unique(xs)), 0.0
        pos = np.searchsorted(grid, xs)
    else:
        edges = bin_edges(xs.min(), xs.max(), min(bins, d.groupby("run_id", observed=True).size().max()), x == "steps")
        grid, width = (edges[:-1] + edges[1:]) / 2, float(edges[1] - edges[0])
        pos = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, len(grid) - 1)
    runs = list(run_arm.index)
    ridx = pd.Series(np.arange(len(runs)), index=runs)[d["run_id"].astype(str)].to_numpy()
    key = ridx * len(grid) + pos
    sums = np.bincount(key, d[metric].to_numpy(float), minlength=len(runs) * len(grid))
    cnt = np.bincount(key, minlength=len(runs) * len(grid))
    with np.errstate(invalid="ignore", divide="ignore"):
        Y = (sums / cnt).reshape(len(runs), len(grid))
    out = {}
    arm_arr = run_arm.to_numpy()
    for arm in arms:
        sub = Y[arm_arr == arm]
        if not len(sub):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if ci_method is not None and len(sub) >= MIN_BOOT_SEEDS:
                mu, lo, hi = t_band(sub) if ci_method == "t" else mean_band(sub)
            else:
                mu = np.nanmean(sub, axis=0)
                lo = hi = np.full_like(mu, np.nan)
        out[arm] = ArmCurve(grid, sub, mu, lo, hi, width)
    return out


def _values(study, metric: str, run_ids) -> np.ndarray:
    wide = study.evals if metric in study.evals.columns else study.metrics
    if metric not in wide.columns:
        return np.array([])
    v = wide.loc[wide["run_id"].isin(run_ids), metric].to_numpy(float)
    return v[np.isfinite(v)]


def flat_note(study, metric: str, title: str, run_ids, on_policy: bool = False) -> str | None:
    """One line of text instead of a panel for a metric that is not logged by these runs or has one value
    at every step of every run; None when it varies."""
    v = _values(study, metric, run_ids)
    if not len(v):
        return f"{title}: not logged by these runs"
    if v.min() != v.max():
        return None
    k = rate_scale(metric)
    when = "evaluation" if metric.startswith("eval/") else "step"
    why = " (on-policy: one update per rollout, so the ratio is 1 and nothing is clipped)" \
        if on_policy and metric.startswith("train/clip_frac") and v[0] == 0 else ""
    return f"{title}: {v[0] * k:g}{' points' if k != 1 else ''} at every {when} of every run{why}"


def _limits(metric: str, kl_estimators, k: float) -> tuple[float, float]:
    """The metric's range (ablate.runs.metrics) in display units, +-inf where unbounded."""
    lo, hi = metric_range(metric, kl_estimators)
    return (-np.inf if lo is None else lo * k), (np.inf if hi is None else hi * k)


class Curves(NamedTuple):
    fig: object           # the matplotlib Figure, None when no metric has a panel
    caption: str          # what the lines and bands are, the smoothing and its window
    notes: list           # one line per metric without a panel (flat_note, KL not measured)


def curves_figure(study, metric: str, x: str, run_arm: pd.Series, arms: list[str], ncols: int = 3,
                  ci_method: str = "t") -> Curves:
    """Per panel and arm: the mean over seeds (thick); each seed (thin) below MIN_BOOT_SEEDS seeds, else the
    95% band; per-step metrics as means over SMOOTH_BINS bins with the mean over RAW_BINS faint behind,
    held-out evaluations as logged. Bands and y axes stay inside the metric's range."""
    flags = run_flags(study.runs).set_index("run_id").reindex(run_arm.index)
    est = study.runs.set_index("run_id")["recipe.kl_estimator"].reindex(run_arm.index) \
        if "recipe.kl_estimator" in study.runs else pd.Series(np.nan, index=run_arm.index)
    kl_estimators = tuple(est) if est.notna().all() else ()
    seeds = run_arm.value_counts()
    panels, notes = [], []
    for m, title in [(metric if m is None else m, f"held-out {metric}" if m is None else t) for m, t in PANELS]:
        use = run_arm
        if m == "train/kl":
            use = run_arm[flags["kl_on"].fillna(False).astype(bool)]
            off = [a for a in arms if a in set(run_arm) and a not in set(use)]
            if off:
                notes.append(f"{title}: not measured for {'; '.join(off)} (recipe.kl_coef 0: no reference model)")
            if use.empty:
                continue
        note = flat_note(study, m, title, use.index, on_policy=not flags["off_policy"].fillna(False).any())
        if note:
            notes.append(note)
        else:
            panels.append((m, title, use))
    if not panels:
        return Curves(None, "", notes)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 2.9 * nrows), squeeze=False)
    colors = _colors(arms)
    dashes = {a: DASHES[i % len(DASHES)] for i, a in enumerate(arms)}
    smooth_width = None
    for ax, (m, title, use) in zip(axes.flat, panels):
        k, is_eval = rate_scale(m), m in study.evals.columns
        lo_r, hi_r = _limits(m, kl_estimators, k)
        ax.set_gid(m)
        if not is_eval:
            for arm, c in arm_curves(study, m, x, use, arms, None, RAW_BINS).items():
                ax.plot(c.x, c.mean * k, color=colors[arm], lw=0.6, alpha=0.25, gid="raw")
        for arm, c in arm_curves(study, m, x, use, arms, ci_method, BINS if is_eval else SMOOTH_BINS).items():
            if not is_eval and smooth_width is None:
                smooth_width = c.width
            if seeds[arm] < MIN_BOOT_SEEDS:
                for row in c.runs:
                    ok = np.isfinite(row)
                    ax.plot(c.x[ok], row[ok] * k, color=colors[arm], lw=0.8, alpha=0.55, gid="seed")
            band = np.isfinite(c.lo) & np.isfinite(c.hi)
            if band.any():
                ax.fill_between(c.x[band], np.clip(c.lo[band] * k, lo_r, hi_r), np.clip(c.hi[band] * k, lo_r, hi_r),
                                color=colors[arm], alpha=0.14, lw=0, gid="band")
            ok = np.isfinite(c.mean)
            ax.plot(c.x[ok], c.mean[ok] * k, color=colors[arm], lw=1.8, ls=dashes[arm], gid="mean",
                    marker="o" if is_eval and ok.sum() < 30 else None, ms=3)
        y0, y1 = ax.get_ylim()
        ax.set_ylim(max(y0, lo_r), min(y1, hi_r))
        ax.set_title(title + (" (points)" if k != 1 else ""), fontsize=10)
        ax.set_xlabel(X_AXES[x][1], fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    drawn = [a for a in arms if a in seeds.index]
    handles = [Line2D([], [], color=colors[a], lw=1.8, ls=dashes[a],
                      label=f"{a} ({seeds[a]} seeds: {'lines' if seeds[a] < MIN_BOOT_SEEDS else '95% band'})")
               for a in drawn]
    rows = -(-len(handles) // 3)
    fig.legend(handles=handles, loc="upper center", ncol=min(3, len(handles)), fontsize=9, bbox_to_anchor=(0.5, 1.0),
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.3 * rows + 0.1) / fig.get_figheight()))
    return Curves(fig, curves_caption(x, [seeds[a] for a in drawn], ci_method, smooth_width), notes)


def curves_caption(x: str, seeds: list[int], ci_method: str, smooth_width: float | None) -> str:
    """What the Curves figure shows: lines or bands (by seeds per arm) and the smoothing with its window."""
    out = ["Thick line: each arm's mean over its seeds (the runs used in the statistics)."]
    if min(seeds) < MIN_BOOT_SEEDS:
        out.append(f"Thin lines: its individual seeds, for arms with fewer than {MIN_BOOT_SEEDS} seeds (no band "
                   f"below {MIN_BOOT_SEEDS} seeds, the report's threshold for intervals).")
    if max(seeds) >= MIN_BOOT_SEEDS:
        band = "Student t" if ci_method == "t" else "percentile bootstrap"
        out.append(f"Shaded: 95% {band} band over seeds, for arms with {MIN_BOOT_SEEDS} seeds or more.")
    if smooth_width is not None:
        unit = X_AXES[x][1] if x != "steps" else "step" if smooth_width == 1 else "steps"
        window = f"bins of {smooth_width:,.0f} {unit}" if x == "steps" else f"bins of {smooth_width:,.4g} {unit}"
        out.append(f"Per-step training metrics: means over {window}, the unsmoothed mean faint behind; "
                   "held-out evaluations as measured, not smoothed.")
    out.append("Bands and axes stay inside each metric's range (shares and pass rates: 0-100 points).")
    return " ".join(out)


def passk_figure(table: pd.DataFrame, arms: list[str], ylabel: str = "pass@k (held-out)"):
    """table: arm, k, mean, lo, hi (the base model as arm 'base (step 0)')."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    colors = _colors(arms)
    for arm, g in table.groupby("arm", sort=False):
        g = g.sort_values("k")
        base = arm.startswith("base")
        c = "black" if base else colors.get(arm)
        ax.errorbar(g["k"], g["mean"], yerr=[g["mean"] - g["lo"].fillna(g["mean"]), g["hi"].fillna(g["mean"]) - g["mean"]],
                    color=c, marker="o", ms=4, capsize=3, lw=1.4, ls="--" if base else "-", label=arm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def forest_figure(effects: pd.DataFrame, unit: str = ""):
    """Effects with their CIs; significant (CI excludes 0) in colour, the rest grey."""
    e = effects.iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(e) + 1.2))
    y = np.arange(len(e))
    for i, r in enumerate(e.itertuples()):
        c = ("tab:blue" if r.estimate > 0 else "tab:red") if r.significant else "grey"
        lo = r.lo if np.isfinite(r.lo) else r.estimate
        hi = r.hi if np.isfinite(r.hi) else r.estimate
        ax.errorbar([r.estimate], [i], xerr=[[r.estimate - lo], [hi - r.estimate]], fmt="o" if r.kind == "main" else "s",
                    color=c, capsize=4, ms=6)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels(e["term"], fontsize=9)
    ax.set_xlabel(f"effect {unit}(95% CI)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def scaling_figure(fits: dict, arms: list[str], xlabel: str, scale: float = 1.0, unit: str = ""):
    """Per arm: mean over seeds at each evaluation (dots), the fitted sigmoid (line) and the fit on the
    first part only, extrapolated (dashed), after ablate.analysis.scaling."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = _colors(arms)
    for arm, (res, ex, curves) in fits.items():
        c = colors.get(arm)
        pts = pd.DataFrame({"x": np.concatenate([a for a, _ in curves]), "y": np.concatenate([b for _, b in curves])})
        mean = pts.groupby("x")["y"].mean()
        ax.plot(mean.index, mean.to_numpy() * scale, "o", ms=3, color=c, alpha=0.6)
        grid = np.linspace(max(pts["x"].min(), 1e-9), pts["x"].max(), 200)
        if res.fit.ok:
            ax.plot(grid, res.fit(grid) * scale, color=c, lw=1.5, label=f"{arm}: A {res.fit.A * scale:.1f}")
        if ex["fit"].ok:
            ax.plot(grid, ex["fit"](grid) * scale, color=c, lw=1, ls="--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(unit)
    ax.set_title("R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); dashed: fit on the first half, extrapolated", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def profile_figure(profs: dict, arms: list[str]):
    """Performance profiles (rliable): per arm, the share of run x task scores above tau, with the
    stratified-bootstrap band (drawn from MIN_BOOT_SEEDS runs per arm only)."""
    fig, ax = plt.subplots(figsize=(6, 3.8))
    colors = _colors(arms)
    for arm, (taus, point, lo, hi, n) in profs.items():
        c = colors.get(arm)
        ax.plot(taus * 100, point, color=c, lw=1.5, label=f"{arm} ({n} runs)")
        if n >= MIN_BOOT_SEEDS:
            ax.fill_between(taus * 100, lo, hi, color=c, alpha=0.2)
    ax.set_xlabel("held-out pass@1 threshold tau (points)")
    ax.set_ylabel("share of run x task scores > tau")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def band_figure(bands: list[dict]):
    """Per `task.pass_rate_band`: the histogram of the base model's per-prompt pass rates over every
    training prompt (grey) and over the prompts the band keeps (colour); dashed lines at the band."""
    fig, axes = plt.subplots(1, len(bands), figsize=(5.5 * len(bands), 3.4), squeeze=False)
    edges = np.linspace(0, 1, 11)
    for ax, e in zip(axes[0], bands):
        s = e["summary"]
        ax.bar(edges[:-1], s["before"], width=0.1, align="edge", color="lightgrey", edgecolor="grey",
               label=f"all {s['total']:,} prompts")
        ax.bar(edges[:-1], s["after"], width=0.1, align="edge", color="tab:blue", alpha=0.8,
               label=f"kept {s['kept']:,}")
        for b in e["band"]:
            ax.axvline(b, color="black", ls="--", lw=1)
        ax.set_xlabel("base-model pass rate of the prompt")
        ax.set_ylabel("training prompts")
        ax.set_title(f"task.pass_rate_band {e['band']}: {', '.join(e['arms'])}", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
