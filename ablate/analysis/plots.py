"""Figures for the report (matplotlib, Agg backend): curves per arm with 95% CI bands, pass@k vs k,
and an effect forest plot. Each function returns a matplotlib Figure; `to_base64` embeds one."""

from __future__ import annotations

import base64
import io
import re
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ablate.analysis.stats import MIN_BOOT_SEEDS, mean_band, t_band  # noqa: E402

X_AXES = {"steps": ("step", "optimizer step"), "samples": ("counters/samples", "completions generated"),
          "tokens": ("counters/tokens", "completion tokens generated"), "wall": ("perf/wall_seconds", "wall seconds")}
PANELS = [("train/reward_mean", "train reward"), (None, "held-out"), ("train/entropy", "entropy (nats/token)"),
          ("train/dead_all_correct_frac", "dead groups: all correct"), ("train/dead_all_wrong_frac", "dead groups: all wrong"),
          ("train/kl", "KL to reference"), ("train/completion_len_mean", "response length (tokens)"),
          ("train/truncation_rate", "truncation rate"), ("train/clip_frac_low", "clip fraction low"),
          ("train/clip_frac_high", "clip fraction high"), ("eval/train_minus_heldout_reward", "train - held-out reward"),
          ("train/grad_norm", "grad norm")]
BINS = 120
RATE = re.compile(r"pass@|acc|frac|rate")


def rate_scale(metric: str) -> float:
    """Rates in [0, 1] (pass@k, accuracies, fractions) are drawn and reported in points (x100)."""
    return 100.0 if RATE.search(metric) else 1.0


def to_base64(fig, fmt: str = "png", dpi: int = 80) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _colors(arms: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10" if len(arms) <= 10 else "tab20")
    return {a: cmap(i % cmap.N) for i, a in enumerate(arms)}


def _xmap(study, x: str) -> pd.DataFrame:
    """run_id, step -> x value (for placing evaluations on a counter / time axis); step 0 is x = 0."""
    col = X_AXES[x][0]
    m = study.metrics
    if col not in m:
        raise ValueError(f"x axis {x!r} needs metric {col!r}, which these runs did not log")
    return m[["run_id", "step", col]].rename(columns={col: "_x"})


def arm_curves(study, metric: str, x: str, run_arm: pd.Series, arms: list[str], ci_method: str = "percentile"):
    """{arm: (x grid, mean, lo, hi)} for one metric; runs are binned (train metrics) or placed at their
    evaluation steps (eval metrics) on a grid shared by all arms. Bands: Student t per point for
    ci_method "t", else the percentile bootstrap over runs (none with fewer than MIN_BOOT_SEEDS runs)."""
    is_eval = metric in study.evals.columns
    wide = study.evals if is_eval else study.metrics
    if metric not in wide.columns:
        return {}
    d = wide[["run_id", "step", metric]].dropna(subset=[metric])
    d = d[d["run_id"].isin(run_arm.index)]
    if x == "steps":
        d = d.assign(_x=d["step"].astype(float))
    else:
        xm = _xmap(study, x)
        d = d.merge(xm, on=["run_id", "step"], how="left")
        d.loc[d["step"] == 0, "_x"] = d.loc[d["step"] == 0, "_x"].fillna(0.0)
        d = d.dropna(subset=["_x"])
    if d.empty:
        return {}
    if is_eval and x == "steps":
        grid = np.sort(d["_x"].unique())
        pos = np.searchsorted(grid, d["_x"].to_numpy())
    else:
        lo, hi = float(d["_x"].min()), float(d["_x"].max())
        nb = min(BINS, d.groupby("run_id", observed=True).size().max())
        edges = np.linspace(lo, hi + 1e-9 * max(1.0, abs(hi)), nb + 1)
        grid = (edges[:-1] + edges[1:]) / 2
        pos = np.clip(np.searchsorted(edges, d["_x"].to_numpy(), side="right") - 1, 0, nb - 1)
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
        if len(sub):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                g, mu, lo, hi = grid, *(t_band(sub) if ci_method == "t" else mean_band(sub))
                if ci_method != "t" and len(sub) < MIN_BOOT_SEEDS:
                    lo, hi = np.full_like(mu, np.nan), np.full_like(mu, np.nan)
                out[arm] = (g, mu, lo, hi)
    return out


def curves_figure(study, metric: str, x: str, run_arm: pd.Series, arms: list[str], ncols: int = 3,
                  ci_method: str = "percentile"):
    panels = [(metric if m is None else m, f"held-out {metric}" if m is None else t) for m, t in PANELS]
    panels = [(m, t) for m, t in panels if m in study.metrics.columns or m in study.evals.columns]
    nrows = max(1, -(-len(panels) // ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 2.9 * nrows), squeeze=False)
    colors = _colors(arms)
    for ax, (m, title) in zip(axes.flat, panels):
        k = rate_scale(m)
        for arm, (g, mu, lo, hi) in arm_curves(study, m, x, run_arm, arms, ci_method).items():
            mu, lo, hi = mu * k, lo * k, hi * k
            ok = np.isfinite(mu)
            ax.plot(g[ok], mu[ok], color=colors[arm], lw=1.4, label=arm,
                    marker="o" if m.startswith("eval/") and ok.sum() < 30 else None, ms=3)
            band = ok & np.isfinite(lo) & np.isfinite(hi)
            ax.fill_between(g[band], lo[band], hi[band], color=colors[arm], alpha=0.2, lw=0)
        ax.set_title(title + (" (points)" if k != 1 else ""), fontsize=10)
        ax.set_xlabel(X_AXES[x][1], fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    rows = -(-len(labels) // 3) if labels else 0
    top = 1 - (0.3 * rows + 0.1) / fig.get_figheight()
    if handles:
        fig.legend(handles, labels, loc="upper center", ncol=min(3, len(labels)), fontsize=9,
                   bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, top))
    return fig


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
