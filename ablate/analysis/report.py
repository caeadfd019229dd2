"""Build an ablation report: one self-contained HTML file (figures embedded as base64 PNG, no network)
plus a Markdown summary next to it.

    from ablate.analysis import build_report
    rep = build_report(["runs/clip_x_norm"], "reports/clip_x_norm.html", metric="eval/pass@1", x="tokens")

Sections: headline, setup, warnings, ranking, factorial effects, scores, eval noise, compute scaling,
curves, pass@k, diagnostics, samples, runs. docs/report.md explains every number.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis import diagnostics, effects, evalnoise, multiplicity, multitask, plots, render, stats
from ablate.analysis.design import arm_order
from ablate.analysis.load import Study, load_study

SETUP_KEYS = ("task.name", "model.path", "preset", "steps", "prompts_per_step", "recipe.group_size",
              "recipe.max_new_tokens", "optim.optimizer", "optim.lr", "eval.every", "eval.n_samples", "eval.ks")


@dataclass
class Report:
    study: Study
    metric: str
    x: str
    scale: float
    unit: str
    ci_method: str = "t"                            # interval of means, differences, effects
    adjust: str = "holm"                            # multiplicity adjustment of each table of contrasts
    mde_target: float | None = None                 # effect (metric units) for the seeds-needed column
    setup: dict = field(default_factory=dict)
    scores: pd.DataFrame | None = None
    arms: pd.DataFrame | None = None
    effects: pd.DataFrame | None = None
    passk: pd.DataFrame | None = None
    diagnostics: pd.DataFrame | None = None
    warnings: list = field(default_factory=list)
    headline: list = field(default_factory=list)   # the contrasts (effects, or arms vs the reference)
    base_lines: list = field(default_factory=list)  # change from the base model per arm (shown first)
    gain: pd.DataFrame | None = None                # the same as a table
    score: str = "final"                            # the per-run score the statistics use (effects.SCORES)
    last_k: int = 3                                 # evaluations averaged by the last_k score
    score_table: pd.DataFrame | None = None         # every score side by side
    fit_x: str | None = None                        # compute axis of the scaling fit (None: not fitted)
    scaling: pd.DataFrame | None = None             # per arm A, B, C_mid with CIs, extrapolation check
    figures: dict = field(default_factory=dict)     # name -> base64 PNG
    curves_caption: str = ""                        # what the Curves figure draws (plots.curves_caption)
    curves_notes: list = field(default_factory=list)  # one line per metric without a panel (constant, not logged)
    samples: dict = field(default_factory=dict)     # arm -> list of sample rows
    runs: pd.DataFrame | None = None
    tasks: pd.DataFrame | None = None              # task mixtures: final per-task held-out pass@k per arm
    multitask: pd.DataFrame | None = None          # task mixtures: mean, IQM, optimality gap over runs x tasks
    bands: list = field(default_factory=list)       # task.pass_rate_band: prompts kept, histograms (band_summaries)
    noise: pd.DataFrame | None = None              # eval noise per arm (ablate.analysis.evalnoise.noise_tables)
    noise_contrasts: pd.DataFrame | None = None    # per arm vs the reference, on the same held-out problems


def default_metric(study: Study) -> str:
    cols = list(study.evals.columns)
    for m in ("eval/pass@1", "eval/pass@1_exact", "eval/greedy_acc", "eval/reward_mean"):
        if m in cols:
            return m
    return "train/reward_mean"


def metric_scale(metric: str) -> tuple[float, str]:
    """Rates in [0, 1] are reported in points (x100)."""
    if plots.rate_scale(metric) != 1.0:
        return 100.0, f"{metric.split('/')[-1]} points"
    return 1.0, metric.split("/")[-1]


def setup_table(study: Study, scores: pd.DataFrame) -> dict:
    runs = study.runs
    varied = {f.name: {"keys": ", ".join(k for k in f.keys), "levels": f.levels, "reference": f.reference}
              for f in study.factors}
    varied_keys = {k for f in study.factors for k in f.keys}
    skip = {"run_id", "run_dir", "state", "error", "last_step", "planned_steps", "arm", "seed", "__arm__"}
    fixed = {k: runs[k].iloc[0] for k in runs.columns if k not in skip and k not in varied_keys
             and not k.startswith("level:") and runs[k].astype(str).nunique() == 1}
    seeds = sorted(runs["seed"].dropna().unique().tolist()) if "seed" in runs else []
    m = study.metrics
    budget = {}
    if len(m) and "counters/samples" in m:
        last = m.sort_values("step").groupby("run_id", observed=True).last()
        budget = {"samples per run (median)": float(last["counters/samples"].median()),
                  "tokens per run (median)": float(last.get("counters/tokens", pd.Series([np.nan])).median()),
                  "wall seconds per run (median)": float(last.get("perf/wall_seconds", pd.Series([np.nan])).median()),
                  "total wall hours": float(last.get("perf/wall_seconds", pd.Series([0.0])).sum() / 3600)}
    states = runs["state"].value_counts().to_dict()
    return {"varied": varied, "fixed": fixed, "key_fixed": {k: fixed[k] for k in SETUP_KEYS if k in fixed},
            "seeds": seeds, "runs": len(runs), "arms": runs["arm"].nunique(), "states": states, "budget": budget,
            "used_runs": int(scores["included"].sum())}


BASE_KEYS = ("seed", "model.path")  # with every task.* and eval.* key: runs sharing these share their step-0 eval


def base_evals(study: Study) -> pd.DataFrame:
    """The step-0 (base model) evaluations, one row per distinct observation: runs that share a seed, a
    base model and the task and evaluation settings evaluated the same model on the same draws, so their
    step-0 rows are averaged into one (counting them once per arm would be pseudo-replication)."""
    ev = study.evals
    base = ev[ev["step"] == 0]
    if base.empty:
        return base
    keys = [k for k in study.runs.columns if k in BASE_KEYS or k.startswith(("task.", "eval."))]
    info = study.runs[["run_id", *keys]].astype({k: str for k in keys})
    base = base.assign(run_id=base["run_id"].astype(str)).merge(info, on="run_id", how="left")
    cols = [c for c in ev.columns if c not in ("run_id", "step")]
    return base.groupby(keys, dropna=False, sort=False)[cols].mean().reset_index() if keys else base[cols]


def passk_table(study: Study, scores: pd.DataFrame, reps: int, seed: int, method: str = "t") -> pd.DataFrame:
    ev = study.evals
    ks = sorted(int(c.split("@")[1]) for c in ev.columns if re.fullmatch(r"eval/pass@\d+", c))
    if not ks or ev.empty:
        return pd.DataFrame(columns=["arm", "k", "mean", "lo", "hi", "n"])
    rows = []
    base = base_evals(study)
    inc = scores[scores["included"]]
    last = ev.sort_values("step").groupby("run_id", observed=True).last()
    for k in ks:
        col = f"eval/pass@{k}"
        groups = [("base (step 0)", base[col].dropna().to_numpy() if col in base else np.array([]))]
        groups += [(a, last.reindex(g["run_id"])[col].dropna().to_numpy()) for a, g in inc.groupby("arm", sort=False)]
        for arm, v in groups:
            if len(v):
                iv = stats.mean_ci(v, method, reps, seed=seed)
                rows.append({"arm": arm, "k": k, "mean": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n})
    return pd.DataFrame(rows)


def score_table(study: Study, metric: str, reps: int, seed: int, method: str = "t", k: int = effects.LAST_K):
    """Per arm and score (effects.SCORES: final, mean of the last k evaluations, area under the curve, max):
    mean with CI, and the difference to the reference arm (paired by seed when possible)."""
    rows = []
    for name in effects.SCORES:
        sc = effects.final_scores(study, metric, score=name, k=k)
        cells = effects._cells(sc)
        order = list(dict.fromkeys(sc["arm"]))
        for arm in order:
            v = cells.get(arm, pd.Series(dtype=float)).to_numpy(float)
            m = stats.mean_ci(v, method, reps, seed=seed)
            d = effects.contrast(cells, {arm: 1.0, order[0]: -1.0}, reps, seed, method=method) \
                if arm != order[0] else stats.Interval(np.nan, np.nan, np.nan)
            rows.append({"arm": arm, "score": name, "n": m.n, "mean": m.estimate, "lo": m.lo, "hi": m.hi,
                         "diff": d.estimate, "diff_lo": d.lo, "diff_hi": d.hi})
    return pd.DataFrame(rows)


def base_change(study: Study, scores: pd.DataFrame, metric: str, reps: int, seed: int, method: str = "t"):
    """Per arm: final score minus the same run's step-0 evaluation, over the arm's seeds (paired by run)."""
    if metric not in study.evals.columns:
        return pd.DataFrame(columns=["arm", "base", "final", "change", "lo", "hi", "n"])
    ev = study.evals
    at0 = ev[ev["step"] == 0].groupby("run_id", observed=True)[metric].first()
    inc = scores[scores["included"]].assign(base=lambda d: d["run_id"].map(at0).astype(float)).dropna(subset=["base"])
    rows = []
    for arm, g in inc.groupby("arm", sort=False):
        iv = stats.mean_ci((g["value"] - g["base"]).to_numpy(float), method, reps, seed=seed)
        rows.append({"arm": arm, "base": g["base"].mean(), "final": g["value"].mean(), "change": iv.estimate,
                     "lo": iv.lo, "hi": iv.hi, "n": iv.n})
    return pd.DataFrame(rows, columns=["arm", "base", "final", "change", "lo", "hi", "n"])


def base_lines(gain: pd.DataFrame, scale: float, unit: str) -> list[str]:
    out = []
    for r in gain.itertuples():
        ci = f"[{r.lo * scale:.1f}, {r.hi * scale:.1f}]" if np.isfinite(r.lo) else "[CI undefined]"
        out.append(f"{r.arm}: {r.change * scale:+.1f} {unit} {ci} over the base model "
                   f"({r.base * scale:.1f} -> {r.final * scale:.1f}, {r.n} seeds)")
    return out


def task_table(study: Study, scores: pd.DataFrame, reps: int, seed: int, method: str = "t") -> pd.DataFrame:
    """Task mixtures: final held-out `eval/<task>/pass@k` per task and arm (mean over the arm's runs, CI)."""
    ev = study.evals
    cols = sorted(c for c in ev.columns if re.fullmatch(r"eval/\w+/pass@\d+", c))
    if not cols or ev.empty:
        return pd.DataFrame(columns=["task", "arm", "k", "mean", "lo", "hi", "n"])
    inc = scores[scores["included"]]
    last = ev.sort_values("step").groupby("run_id", observed=True).last()
    rows = []
    for col in cols:
        task, k = col.split("/")[1], int(col.split("@")[1])
        for arm, g in inc.groupby("arm", sort=False):
            v = last.reindex(g["run_id"])[col].dropna().to_numpy()
            if len(v):
                iv = stats.mean_ci(v, method, reps, seed=seed)
                rows.append({"task": task, "arm": arm, "k": k, "mean": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n})
    return pd.DataFrame(rows)


def band_summaries(study: Study) -> list[dict]:
    """One entry per distinct `task.pass_rate_band` cache the runs read: the band, the arms, the cache
    file and (when it is found) ablate.train.difficulty.band_summary of its base-model pass rates."""
    from ablate.train.difficulty import band_cache_of, band_summary

    out: dict = {}
    for arm, d in zip(study.runs["arm"], study.data):
        band = (d.config.get("task") or {}).get("pass_rate_band")
        if not band:
            continue
        try:
            path = band_cache_of(d.config)
        except (KeyError, TypeError, ValueError):
            continue  # not a config ablate wrote
        e = out.setdefault((str(path), tuple(band)), {"band": list(band), "arms": [], "cache": str(path), "summary": None,
                                                      "n": d.config["eval"]["n_samples"]})
        if arm not in e["arms"]:
            e["arms"].append(arm)
    for e in out.values():
        p = Path(e["cache"])
        if p.exists():
            e["summary"] = band_summary(json.loads(p.read_text())["rates"], *e["band"])
    return list(out.values())


def arm_samples(study: Study, scores: pd.DataFrame, per_arm: int = 4) -> dict:
    """For each arm: sample completions from its first usable run, at its last logged step."""
    out = {}
    pick = scores.sort_values("included", ascending=False, kind="stable").drop_duplicates("arm")
    dirs = study.runs.set_index("run_id")["run_dir"]
    from ablate.runs.store import read_jsonl

    for r in pick.itertuples():
        rows = read_jsonl(Path(dirs[r.run_id]) / "samples.jsonl")
        if not rows:
            continue
        last = max(x.get("step", 0) for x in rows)
        at = [x for x in rows if x.get("step") == last]
        picked = [x for x in at if x.get("split") == "heldout"][:per_arm] + [x for x in at if x.get("split") == "train"][:per_arm]
        out[r.arm] = [{"run": r.run_id, "seed": r.seed, **x} for x in picked]
    return out


def headline(eff: pd.DataFrame, arms: pd.DataFrame, scale: float, unit: str, adjust: str = "none") -> list[str]:
    def fmt(est, lo, hi):
        if not np.isfinite(lo):
            return f"{est * scale:+.1f} {unit} [CI undefined]"
        return f"{est * scale:+.1f} {unit} [{lo * scale:.1f}, {hi * scale:.1f}]"

    def verdict(significant: bool, adj_significant: bool) -> str:
        if not significant:
            return " (n.s.)"
        return "" if adjust == "none" or adj_significant else f" (n.s. after {render.ADJUST_NAMES[adjust]})"

    lines = []
    if eff is not None and len(eff):
        for r in eff[eff["kind"] == "main"].itertuples():
            s = f"{r.factor} {r.vs} -> {r.level}: {fmt(r.estimate, r.lo, r.hi)}" + verdict(r.significant, r.adj_significant)
            inter = eff[(eff["kind"] == "interaction") & (((eff["factor"] == r.factor) & (eff["level"] == r.level))
                                                         | ((eff["factor2"] == r.factor) & (eff["level2"] == r.level)))]
            for q in inter.itertuples():
                other = q.factor2 if q.factor == r.factor else q.factor
                s += f"; interaction with {other}: " + (fmt(q.estimate, q.lo, q.hi) if q.significant else "n.s.")
            lines.append(s)
    elif arms is not None and len(arms) > 1:
        for r in arms[~arms["reference"]].itertuples():
            sig = np.isfinite(r.diff_lo) and (r.diff_lo > 0 or r.diff_hi < 0)
            lines.append(f"{r.arm} vs {arms.iloc[0]['arm']}: {fmt(r.diff, r.diff_lo, r.diff_hi)}"
                         + verdict(sig, r.adj_significant))
    return lines


def build_report(paths, out: str | Path | None = None, metric: str | None = None, x: str = "steps",
                 reps: int = stats.REPS, seed: int = 0, title: str | None = None, study: Study | None = None,
                 figures: bool = True, ci_method: str = "t", adjust: str = "holm", mde: float | None = None,
                 score: str = "final", last_k: int = effects.LAST_K, fit: str | None = None) -> Report:
    """Analyse the runs under `paths` (or a loaded `study`) and, if `out` is given, write `out` (HTML)
    and `out` with suffix .md. Returns the Report (tables as DataFrames). `ci_method` sets the interval
    of means, differences and effects (ablate.analysis.stats.METHODS); `adjust` the multiplicity
    adjustment (ablate.analysis.multiplicity.ADJUST) of each table of contrasts; `mde` an effect in
    the metric's units (0.02 = 2 points of a rate) for which the seeds needed are computed; `score`
    the per-run score (ablate.analysis.effects.SCORES; `last_k` evaluations for last_k); `fit` a
    compute axis (plots.X_AXES) for the compute-scaling fit of ablate.analysis.scaling (None: none)."""
    if x not in plots.X_AXES:
        raise ValueError(f"x must be one of {', '.join(plots.X_AXES)}; got {x!r}")
    if ci_method not in stats.METHODS:
        raise ValueError(f"ci_method must be one of {', '.join(stats.METHODS)}; got {ci_method!r}")
    if adjust not in multiplicity.ADJUST:
        raise ValueError(f"adjust must be one of {', '.join(multiplicity.ADJUST)}; got {adjust!r}")
    if fit is not None and fit not in plots.X_AXES:
        raise ValueError(f"fit must be one of {', '.join(plots.X_AXES)}; got {fit!r}")
    if score not in effects.SCORES:
        raise ValueError(f"score must be one of {', '.join(effects.SCORES)}; got {score!r}")
    if last_k < 1:
        raise ValueError(f"last_k must be >= 1; got {last_k}")
    if mde is not None and not mde > 0:
        raise ValueError(f"mde must be a positive effect in the metric's units; got {mde!r}")
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    study = study or load_study(*paths)
    if study.runs.empty:
        raise ValueError(f"no run folders (with a config.yaml) under {', '.join(map(str, paths))}")
    metric = metric or default_metric(study)
    if metric not in study.evals.columns and metric not in study.metrics.columns:
        raise ValueError(f"metric {metric!r} was not logged by these runs")
    scale, unit = metric_scale(metric)
    rep = Report(study, metric, x, scale, unit, ci_method, adjust, mde)
    rep.score, rep.last_k = score, last_k
    rep.scores = effects.final_scores(study, metric, score=score, k=last_k)
    rep.setup = setup_table(study, rep.scores)
    rep.arms = effects.compare_arms(rep.scores, reps, seed, method=ci_method, adjust=adjust, mde_target=mde)
    rep.effects = effects.factorial_effects(rep.scores, study.factors, reps, seed, method=ci_method, adjust=adjust,
                                            mde_target=mde) \
        if len(study.factors) > 1 or (study.factors and len(study.factors[0].levels) > 1) else None
    rep.passk = passk_table(study, rep.scores, reps, seed, ci_method)
    rep.tasks = task_table(study, rep.scores, reps, seed, ci_method)
    _, mats = multitask.task_matrices(study, rep.scores)
    rep.multitask = multitask.aggregate_table(mats, reps, seed) if mats else None
    rep.diagnostics = diagnostics.arm_diagnostics(study, metric)
    rep.score_table = score_table(study, metric, reps, seed, ci_method, last_k)
    rep.gain = base_change(study, rep.scores, metric, reps, seed, ci_method)
    rep.base_lines = base_lines(rep.gain, scale, unit)
    rep.warnings = effects.seed_warnings(rep.scores, rep.arms, rep.effects if rep.effects is not None else pd.DataFrame(),
                                         scale=scale, unit=unit)
    if score == "max":
        rep.warnings.append("the score is the max over training: the best of many noisy evaluations is biased upward "
                            "(selection on the held-out set); prefer final, last_k or auc")
    if ci_method != "t" and (rep.arms["n"] < stats.MIN_BOOT_SEEDS).any():
        rep.warnings.append(f"--ci {ci_method} is a bootstrap: with fewer than {stats.MIN_BOOT_SEEDS} seeds per arm it "
                            "resamples the few seeds as if they were all and comes out too narrow; use --ci t")
    rep.warnings += diagnostics.warnings_for(study, rep.scores, metric, rep.diagnostics, rep.passk)
    rep.noise, rep.noise_contrasts = evalnoise.noise_tables(study, rep.scores, reps, seed=seed)
    rep.warnings += evalnoise.noise_lines(rep.noise_contrasts)
    rep.headline = headline(rep.effects, rep.arms, scale, unit, adjust)
    rep.samples = arm_samples(study, rep.scores)
    rep.bands = band_summaries(study)
    inc = rep.scores[rep.scores["included"]]
    if fit is not None and metric in study.evals.columns and len(inc):
        from ablate.analysis import scaling

        rep.fit_x = fit
        bounds = (0.0, 1.0) if scale == 100 else (-np.inf, np.inf)
        rep.scaling, fits = scaling.scaling_table(study, metric, fit, inc.set_index("run_id")["arm"], bounds, seed=seed)
        if figures and fits:
            rep.figures["scaling"] = plots.to_base64(plots.scaling_figure(fits, arm_order(study.runs), plots.X_AXES[fit][1],
                                                                          scale, rep.unit))
    rep.runs = rep.scores.merge(study.runs[["run_id", "error"]], on="run_id", how="left")
    if len(study.stale):  # listed, never used: they belong to an earlier version of the sweep
        ids = list(study.stale["run_id"])
        rep.warnings.append(f"{len(ids)} stale run folder(s) not used: a sweep manifest keeps them from an earlier "
                            f"expansion of its spec (the spec was edited, or a newer ablate added a config field, "
                            f"which changes every run id): {', '.join(ids[:4])}{' ...' if len(ids) > 4 else ''}")
        stale = study.stale.assign(arm="–", value=np.nan, included=False, reason="stale: not in the current spec")
        rep.runs = pd.concat([rep.runs, stale[[c for c in rep.runs.columns if c in stale]]], ignore_index=True)
    if figures:
        arms = arm_order(study.runs)
        inc = rep.scores[rep.scores["included"]]
        use = inc if len(inc) else rep.scores
        run_arm = use.set_index("run_id")["arm"]
        curves = plots.curves_figure(study, metric, x, run_arm, arms, ci_method=ci_method)
        rep.curves_caption, rep.curves_notes = curves.caption, curves.notes
        if curves.fig is not None:
            rep.figures["curves"] = plots.to_base64(curves.fig)
        if len(rep.passk):
            pk = rep.passk.assign(mean=rep.passk["mean"] * 100, lo=rep.passk["lo"] * 100, hi=rep.passk["hi"] * 100)
            rep.figures["passk"] = plots.to_base64(plots.passk_figure(pk, arms, "pass@k (held-out, points)"))
        if any(e["summary"] for e in rep.bands):
            rep.figures["bands"] = plots.to_base64(plots.band_figure([e for e in rep.bands if e["summary"]]))
        if mats:
            rep.figures["profiles"] = plots.to_base64(plots.profile_figure(multitask.profiles(mats, reps=reps, seed=seed),
                                                                           arms))
        if rep.effects is not None and len(rep.effects):
            e = rep.effects.assign(estimate=rep.effects.estimate * scale, lo=rep.effects.lo * scale,
                                   hi=rep.effects.hi * scale)
            rep.figures["forest"] = plots.to_base64(plots.forest_figure(e, unit + " "))
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        name = title or f"Ablation report: {', '.join(Path(p).name for p in paths)}"
        meta = {"generated": time.strftime("%Y-%m-%d %H:%M"), "paths": [str(p) for p in paths]}
        out.write_text(render.html(rep, name, meta))
        out.with_suffix(".md").write_text(render.markdown(rep, name, meta))
    return rep


def report_json(rep: Report) -> str:
    """The report's tables as JSON (for scripts and CI)."""
    return json.dumps({"metric": rep.metric, "score": rep.score, "adjust": rep.adjust, "base_change": rep.base_lines,
                       "headline": rep.headline, "warnings": rep.warnings,
                       "arms": rep.arms.to_dict("records"),
                       "effects": [] if rep.effects is None else rep.effects.to_dict("records"),
                       "eval_noise": [] if rep.noise is None else rep.noise.to_dict("records"),
                       "eval_noise_contrasts": [] if rep.noise_contrasts is None else
                       rep.noise_contrasts.to_dict("records")}, default=str)
