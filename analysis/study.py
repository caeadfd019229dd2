"""A study in Python: the steps behind `ablate report`, for the questions a report does not ask.

    python analysis/study.py runs/quickstart [more sweeps or run folders] [--metric eval/pass@1] [--out analysis/out]

1. Load every run folder (whatever its state) and see which toggles varied.
2. One final score per run -> each arm's mean with a 95% CI over seeds, and the factorial effects.
3. A compute-matched comparison: the same statistics at an equal budget of generated tokens (an arm
   that writes longer answers spends more compute per step, so equal steps can flatter it).
4. Figures (PNG): every seed's final score per arm with the arm's CI, and the metric against tokens.

Rates (pass@k, accuracies, fractions) are printed and drawn in points (x100), as in `ablate report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ablate.analysis import effects, load_study  # noqa: E402
from ablate.analysis.plots import rate_scale  # noqa: E402

POINT_COLS = ["mean", "mean_lo", "mean_hi", "diff", "diff_lo", "diff_hi", "estimate", "lo", "hi"]


def in_points(table: pd.DataFrame, k: float) -> pd.DataFrame:
    """The estimate and interval columns of a table x k (100 for a rate: points)."""
    return table.assign(**{c: table[c] * k for c in POINT_COLS if c in table})


def eval_vs_tokens(study, metric: str) -> pd.DataFrame:
    """run_id, step, metric, counters/tokens (generated so far) for every held-out evaluation."""
    tokens = study.metrics[["run_id", "step", "counters/tokens"]]
    curve = study.evals[["run_id", "step", metric]].merge(tokens, on=["run_id", "step"], how="left")
    curve.loc[curve["step"] == 0, "counters/tokens"] = 0.0          # the step-0 evaluation: no tokens yet
    return curve.dropna()


def at_token_budget(study, scores: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, float]:
    """Each run's `metric` interpolated at the largest token count every included run reached."""
    curve = eval_vs_tokens(study, metric)
    used = scores[scores["included"]]
    budget = float(curve[curve["run_id"].isin(used["run_id"])].groupby("run_id", observed=True)["counters/tokens"].max().min())
    at = {rid: np.interp(budget, g["counters/tokens"], g[metric]) for rid, g in curve.groupby("run_id", observed=True)}
    return scores.assign(value=scores["run_id"].map(at).astype(float)), budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--metric", default="eval/pass@1")
    ap.add_argument("--out", type=Path, default=Path("analysis/out"))
    args = ap.parse_args()

    study = load_study(*args.runs)
    k = rate_scale(args.metric)
    unit = " (points)" if k != 1 else ""
    print(f"{len(study.runs)} runs:", study.runs["state"].value_counts().to_dict())
    print("varied:", {f.name: f.levels for f in study.factors})

    scores = effects.final_scores(study, args.metric)
    arms = in_points(effects.compare_arms(scores), k)
    print(f"\nfinal {args.metric}{unit} per arm (95% CI over seeds):")
    print(arms[["arm", "n", "mean", "mean_lo", "mean_hi", "diff", "diff_lo", "diff_hi"]].round(2).to_string(index=False))
    if study.factors:
        eff = in_points(effects.factorial_effects(scores, study.factors), k)
        print(f"\nfactorial effects:{' in points' if k != 1 else ''}")
        print(eff[["term", "estimate", "lo", "hi", "significant", "paired"]].round(2).to_string(index=False))

    matched, budget = at_token_budget(study, scores, args.metric)
    m_arms = in_points(effects.compare_arms(matched), k)
    print(f"\nat an equal budget of {budget:,.0f} generated tokens per run{unit}:")
    print(m_arms[["arm", "n", "mean", "diff", "diff_lo", "diff_hi"]].round(2).to_string(index=False))

    args.out.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    used = scores[scores["included"]]
    for i, r in enumerate(arms.itertuples()):
        seeds = used.loc[used["arm"] == r.arm, "value"] * k
        left.scatter(np.full(len(seeds), i) + np.linspace(-0.12, 0.12, len(seeds)), seeds, s=14, alpha=0.6)
        left.errorbar(i + 0.3, r.mean, yerr=[[r.mean - r.mean_lo], [r.mean_hi - r.mean]], fmt="o", color="k", capsize=4)
    left.set_xticks(range(len(arms)), arms["arm"], rotation=20, ha="right", fontsize=8)
    left.set_ylabel(f"final {args.metric}{unit}")
    left.set_title("every seed, and the arm mean with its 95% CI")
    curve = eval_vs_tokens(study, args.metric).merge(used[["run_id", "arm"]], on="run_id")
    for arm, g in curve.groupby("arm", sort=False):
        mean = g.groupby("step")[[args.metric, "counters/tokens"]].mean()
        right.plot(mean["counters/tokens"], mean[args.metric] * k, marker=".", label=arm)
    right.axvline(budget, color="grey", ls="--", lw=1, label="equal-token budget")
    right.set_xlabel("generated tokens")
    right.set_ylabel(args.metric + unit)
    right.set_title("held-out metric against compute (mean over seeds)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "study.png", dpi=110)
    print(f"\nfigure: {args.out / 'study.png'}")


if __name__ == "__main__":
    main()
