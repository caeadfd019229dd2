"""Training-health diagnostics per arm and the warnings a report raises (rules of thumb from
DESIGN.md section 6). Thresholds are module constants so a study can tune them."""

from __future__ import annotations

import numpy as np
import pandas as pd

ENTROPY_DROP = 0.6        # entropy below 60% of its start ...
EARLY = 0.2               # ... within the first 20% of the steps: "entropy collapse"
KL_HIGH = 0.5             # per-token KL above this: too far from the reference
KL_CLIMB = 1.5            # final KL > 1.5 x KL at mid-run (and > 0.01): still climbing
DEAD_HIGH = 0.8           # most groups carry no gradient
TRUNC_HIGH = 0.1          # share of completions truncated
HACK_DROP = 0.02          # held-out falls by this much from its peak while train reward rises


def _seg(y: np.ndarray, a: float, b: float) -> float:
    """Mean of the finite values of y between fractions a and b of its length."""
    n = len(y)
    part = y[int(a * n): max(int(b * n), int(a * n) + 1)]
    part = part[np.isfinite(part)]
    return float(part.mean()) if len(part) else np.nan


def run_diagnostics(study) -> pd.DataFrame:
    """One row per run that logged steps: entropy start / early / end, KL max / mid / end, dead-group
    shares (all-correct, all-wrong) over the last quarter, truncation, clip fractions, length."""
    rows = []
    m = study.metrics
    for rid, g in m.groupby("run_id", observed=True, sort=False):
        g = g.sort_values("step")

        def col(name):
            return g[name].to_numpy(float) if name in g else np.full(len(g), np.nan)

        ent, kl = col("train/entropy"), col("train/kl")
        rows.append({
            "run_id": rid,
            "entropy_start": _seg(ent, 0, 0.02), "entropy_early": _seg(ent, EARLY - 0.02, EARLY + 0.02),
            "entropy_end": _seg(ent, 0.9, 1.0),
            "kl_max": float(np.nanmax(kl)) if np.isfinite(kl).any() else np.nan,
            "kl_mid": _seg(kl, 0.45, 0.55), "kl_end": _seg(kl, 0.9, 1.0),
            "dead_all_correct": _seg(col("train/dead_all_correct_frac"), 0.75, 1.0),
            "dead_all_wrong": _seg(col("train/dead_all_wrong_frac"), 0.75, 1.0),
            "dead": _seg(col("train/dead_group_frac"), 0.75, 1.0),
            "truncation": _seg(col("train/truncation_rate"), 0.75, 1.0),
            "clip_low": _seg(col("train/clip_frac_low"), 0, 1), "clip_high": _seg(col("train/clip_frac_high"), 0, 1),
            "len_start": _seg(col("train/completion_len_mean"), 0, 0.05),
            "len_end": _seg(col("train/completion_len_mean"), 0.9, 1.0),
            "reward_start": _seg(col("train/reward_mean"), 0, 0.05),
            "reward_end": _seg(col("train/reward_mean"), 0.9, 1.0),
            "format_max": float(np.nanmax(col("train/reward_format_mean")))
            if np.isfinite(col("train/reward_format_mean")).any() else np.nan,
            # behaviour -> old mismatch (docs/offpolicy.md), means over the run; only where it was logged
            **({"offpolicy_kl_k3": _seg(col("offpolicy/kl_k3"), 0, 1), "offpolicy_ess": _seg(col("offpolicy/ess_frac"), 0, 1),
                "offpolicy_cap": _seg(col("offpolicy/is_cap_frac"), 0, 1),
                "offpolicy_rejected": _seg(col("offpolicy/rejected_token_frac"), 0, 1)}
               if "offpolicy/kl_k3" in g else {}),
        })
    return pd.DataFrame(rows)


def arm_diagnostics(study) -> pd.DataFrame:
    d = run_diagnostics(study)
    if d.empty:
        return d
    d = d.merge(study.runs[["run_id", "arm"]], on="run_id")
    order = list(dict.fromkeys(study.runs["arm"]))
    out = d.drop(columns="run_id").groupby("arm", sort=False).mean(numeric_only=True)
    return out.reindex([a for a in order if a in out.index]).reset_index()


def warnings_for(study, scores: pd.DataFrame, metric: str, diag: pd.DataFrame, passk=None) -> list[str]:
    """Failed / incomplete runs, entropy collapse, KL growth, dead groups, truncation, flat reward with
    no format, reward hacking, pass@k narrowing."""
    out = []
    for r in study.runs.itertuples():
        if r.state != "completed":
            err = str(r.error).strip().splitlines()[-1][:160] if isinstance(r.error, str) and r.error else ""
            out.append(f"run {r.run_id} ({r.arm}, seed {getattr(r, 'seed', '?')}) is {r.state} at step "
                       f"{r.last_step} of {r.planned_steps}" + (f": {err}" if err else "")
                       + " -- excluded from the statistics, shown in the run table")
    for r in diag.itertuples():
        if r.entropy_early < ENTROPY_DROP * r.entropy_start:
            out.append(f"entropy collapse in '{r.arm}': {r.entropy_start:.3g} -> {r.entropy_early:.3g} nats within "
                       f"the first {EARLY:.0%} of steps (predicts a plateau; try clip-higher, an entropy bonus)")
        if r.kl_max > KL_HIGH:
            out.append(f"KL to the reference reaches {r.kl_max:.3g} in '{r.arm}' (> {KL_HIGH}): lr / clip too aggressive?")
        elif r.kl_end > 0.01 and r.kl_end > KL_CLIMB * r.kl_mid:
            out.append(f"KL still climbing at the end in '{r.arm}' ({r.kl_mid:.3g} at mid-run -> {r.kl_end:.3g})")
        if r.dead > DEAD_HIGH:
            out.append(f"{r.dead:.0%} of groups are dead in '{r.arm}' late in training (all-correct "
                       f"{r.dead_all_correct:.0%}, all-wrong {r.dead_all_wrong:.0%}): the batch carries little gradient")
        if r.truncation > TRUNC_HIGH:
            out.append(f"{r.truncation:.0%} of completions truncated in '{r.arm}' late in training (overlong noise)")
        if abs(r.reward_end - r.reward_start) < 0.01 and r.format_max == 0:
            out.append(f"train reward flat in '{r.arm}' and the format reward never above 0: is the format produced?")
    out += hacking_warnings(study, metric)
    out += narrowing_warnings(passk)
    return out


def hacking_warnings(study, metric: str) -> list[str]:
    """Per arm (mean over runs): held-out `metric` falls from its peak by more than HACK_DROP while the
    train reward keeps rising over the same stretch."""
    ev, m = study.evals, study.metrics
    if metric not in ev or "train/reward_mean" not in m or ev.empty:
        return []
    arm_of = study.runs.set_index("run_id")["arm"]
    out = []
    held = ev.assign(arm=ev["run_id"].map(arm_of).astype(str)).groupby(["arm", "step"])[metric].mean()
    train = m.assign(arm=m["run_id"].map(arm_of).astype(str)).groupby(["arm", "step"])["train/reward_mean"].mean()
    for arm in held.index.get_level_values(0).unique():
        h = held[arm].dropna()
        if len(h) < 3:
            continue
        peak_step, peak, last = h.idxmax(), h.max(), h.iloc[-1]
        t = train[arm] if arm in train.index.get_level_values(0) else pd.Series(dtype=float)
        before = t[(t.index > peak_step - 5) & (t.index <= peak_step + 5)].mean()
        after = t[t.index > t.index.max() - max(5, len(t) // 10)].mean()
        if peak - last > HACK_DROP and after > before + 0.01:
            out.append(f"possible reward hacking in '{arm}': held-out {metric} falls {peak:.3g} -> {last:.3g} after "
                       f"step {peak_step} while train reward rises {before:.3g} -> {after:.3g}; read the samples")
    return out


def narrowing_warnings(passk) -> list[str]:
    """RL raised pass@1 but lowered pass@k at the largest k (sharpening at the cost of coverage), each
    beyond the arm's CI: rows of the report's pass@k table (arm, k, mean, lo, hi; 'base (step 0)')."""
    out = []
    if passk is None or not len(passk):
        return out
    kmax = passk["k"].max()
    base = passk[(passk["arm"] == "base (step 0)")].set_index("k")["mean"]
    for arm, g in passk[passk["arm"] != "base (step 0)"].groupby("arm", sort=False):
        g = g.set_index("k")
        if kmax > 1 and {1, kmax} <= set(g.index) & set(base.index) \
                and g.loc[1, "lo"] > base[1] and g.loc[kmax, "hi"] < base[kmax]:
            out.append(f"'{arm}': pass@1 up ({base[1]:.3g} -> {g.loc[1, 'mean']:.3g}) but pass@{kmax} down "
                       f"({base[kmax]:.3g} -> {g.loc[kmax, 'mean']:.3g}) versus the base model: RL narrowed the solutions")
    return out
