"""Build an ablation report: one self-contained HTML file (figures embedded as base64 PNG, no network)
plus a Markdown summary next to it.

    from ablate.analysis import build_report
    rep = build_report(["runs/clip_x_norm"], "reports/clip_x_norm.html", metric="eval/pass@1", x="tokens")

Sections: headline, setup, warnings, ranking, factorial effects, curves, pass@k, diagnostics, samples,
runs. docs/report.md explains every number.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis import diagnostics, effects, plots, render, stats
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
    setup: dict = field(default_factory=dict)
    scores: pd.DataFrame | None = None
    arms: pd.DataFrame | None = None
    effects: pd.DataFrame | None = None
    passk: pd.DataFrame | None = None
    diagnostics: pd.DataFrame | None = None
    warnings: list = field(default_factory=list)
    headline: list = field(default_factory=list)
    figures: dict = field(default_factory=dict)     # name -> base64 PNG
    samples: dict = field(default_factory=dict)     # arm -> list of sample rows
    runs: pd.DataFrame | None = None
    tasks: pd.DataFrame | None = None              # task mixtures: final per-task held-out pass@k per arm


def default_metric(study: Study) -> str:
    cols = list(study.evals.columns)
    for m in ("eval/pass@1", "eval/pass@1_exact", "eval/greedy_acc", "eval/reward_mean"):
        if m in cols:
            return m
    return "train/reward_mean"


def metric_scale(metric: str) -> tuple[float, str]:
    """Rates in [0, 1] are reported in points (x100)."""
    if re.search(r"pass@|acc|frac|rate", metric):
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


def passk_table(study: Study, scores: pd.DataFrame, reps: int, seed: int, method: str = "t") -> pd.DataFrame:
    ev = study.evals
    ks = sorted(int(c.split("@")[1]) for c in ev.columns if re.fullmatch(r"eval/pass@\d+", c))
    if not ks or ev.empty:
        return pd.DataFrame(columns=["arm", "k", "mean", "lo", "hi", "n"])
    rows = []
    base = ev[ev["step"] == 0]
    inc = scores[scores["included"]]
    last = ev.sort_values("step").groupby("run_id", observed=True).last()
    for k in ks:
        col = f"eval/pass@{k}"
        groups = [("base (step 0)", base[col].dropna().to_numpy())]
        groups += [(a, last.reindex(g["run_id"])[col].dropna().to_numpy()) for a, g in inc.groupby("arm", sort=False)]
        for arm, v in groups:
            if len(v):
                iv = stats.mean_ci(v, method, reps, seed=seed)
                rows.append({"arm": arm, "k": k, "mean": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n})
    return pd.DataFrame(rows)


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


def headline(eff: pd.DataFrame, arms: pd.DataFrame, scale: float, unit: str) -> list[str]:
    def fmt(est, lo, hi):
        if not np.isfinite(lo):
            return f"{est * scale:+.1f} {unit} [CI undefined]"
        return f"{est * scale:+.1f} {unit} [{lo * scale:.1f}, {hi * scale:.1f}]"

    lines = []
    if eff is not None and len(eff):
        for r in eff[eff["kind"] == "main"].itertuples():
            s = f"{r.factor} {r.vs} -> {r.level}: {fmt(r.estimate, r.lo, r.hi)}" + ("" if r.significant else " (n.s.)")
            inter = eff[(eff["kind"] == "interaction") & (((eff["factor"] == r.factor) & (eff["level"] == r.level))
                                                         | ((eff["factor2"] == r.factor) & (eff["level2"] == r.level)))]
            for q in inter.itertuples():
                other = q.factor2 if q.factor == r.factor else q.factor
                s += f"; interaction with {other}: " + (fmt(q.estimate, q.lo, q.hi) if q.significant else "n.s.")
            lines.append(s)
    elif arms is not None and len(arms) > 1:
        for r in arms[~arms["reference"]].itertuples():
            lines.append(f"{r.arm} vs {arms.iloc[0]['arm']}: {fmt(r.diff, r.diff_lo, r.diff_hi)}")
    return lines


def build_report(paths, out: str | Path | None = None, metric: str | None = None, x: str = "steps",
                 reps: int = stats.REPS, seed: int = 0, title: str | None = None, study: Study | None = None,
                 figures: bool = True, ci_method: str = "t") -> Report:
    """Analyse the runs under `paths` (or a loaded `study`) and, if `out` is given, write `out` (HTML)
    and `out` with suffix .md. Returns the Report (tables as DataFrames). `ci_method` sets the interval
    of means, differences and effects (ablate.analysis.stats.METHODS)."""
    if x not in plots.X_AXES:
        raise ValueError(f"x must be one of {', '.join(plots.X_AXES)}; got {x!r}")
    if ci_method not in stats.METHODS:
        raise ValueError(f"ci_method must be one of {', '.join(stats.METHODS)}; got {ci_method!r}")
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    study = study or load_study(*paths)
    if study.runs.empty:
        raise ValueError(f"no run folders (with a config.yaml) under {', '.join(map(str, paths))}")
    metric = metric or default_metric(study)
    if metric not in study.evals.columns and metric not in study.metrics.columns:
        raise ValueError(f"metric {metric!r} was not logged by these runs")
    scale, unit = metric_scale(metric)
    rep = Report(study, metric, x, scale, unit, ci_method)
    rep.scores = effects.final_scores(study, metric)
    rep.setup = setup_table(study, rep.scores)
    rep.arms = effects.compare_arms(rep.scores, reps, seed, method=ci_method)
    rep.effects = effects.factorial_effects(rep.scores, study.factors, reps, seed, method=ci_method) \
        if len(study.factors) > 1 or (study.factors and len(study.factors[0].levels) > 1) else None
    rep.passk = passk_table(study, rep.scores, reps, seed, ci_method)
    rep.tasks = task_table(study, rep.scores, reps, seed, ci_method)
    rep.diagnostics = diagnostics.arm_diagnostics(study)
    rep.warnings = effects.seed_warnings(rep.scores, rep.arms, rep.effects if rep.effects is not None else pd.DataFrame())
    rep.warnings += diagnostics.warnings_for(study, rep.scores, metric, rep.diagnostics, rep.passk)
    rep.headline = headline(rep.effects, rep.arms, scale, unit)
    rep.samples = arm_samples(study, rep.scores)
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
        rep.figures["curves"] = plots.to_base64(plots.curves_figure(study, metric, x, run_arm, arms))
        if len(rep.passk):
            rep.figures["passk"] = plots.to_base64(plots.passk_figure(rep.passk, arms))
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
    return json.dumps({"metric": rep.metric, "headline": rep.headline, "warnings": rep.warnings,
                       "arms": rep.arms.to_dict("records"),
                       "effects": [] if rep.effects is None else rep.effects.to_dict("records")}, default=str)
