"""Training-health diagnostics per arm and the warnings a report raises (practitioners' rules of thumb
for RLVR runs). Thresholds are module constants so a study can tune them.

Health checks (`RULES`): each a pure function of one arm's diagnostics row (a pd.Series of
`arm_diagnostics`) returning a warning or None:
- clip_range: clip fraction (low + high) outside CLIP_LOW-CLIP_HIGH when updates are off-policy
  (update_epochs or minibatches > 1; on-policy the ratio is 1 and nothing can clip): ~0 means the
  trust region is inactive, ~1 that updates fight the clip.
- adv_std_low: advantage std below ADV_STD_LOW late in training: almost every group is dead.
- kl_spike: a step whose KL exceeds SPIKE_KL x the median of the previous WINDOW steps.
- kl_zero: KL to the reference identically 0 although recipe.kl_coef > 0 (the reference is the policy).
- grad_spike: a step whose grad norm exceeds SPIKE_GRAD x the median of the previous WINDOW steps.
- length_without_accuracy: response length up by LEN_RISE (relative) while the held-out metric
  moves less than FLAT_HELDOUT: length bias or overlong noise.
- format_never: the format reward is weighted (recipe.format_weight > 0) but never above 0. With
  weight 0 the format reward is not measured (train/reward_format_mean is a placeholder 0), so
  nothing is said about it.
- env_errors / episodes_truncated / tools_abandoned (multi-turn episodes): the environment failed in some
  step; more than TRUNC_HIGH of the episodes end truncated late in training; tool calls per episode fall
  below a fifth of their start.
"""

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
CLIP_LOW, CLIP_HIGH = 0.1, 0.5   # healthy clip fraction when updates are off-policy
ADV_STD_LOW = 0.1         # advantage std below this (last quarter): nearly every group dead
WINDOW = 10               # spike: a value above factor x the median of the previous WINDOW steps
SPIKE_KL = 3.0
SPIKE_GRAD = 5.0
KL_FLOOR = 0.01           # KL spikes below this absolute level are ignored
LEN_RISE = 0.2            # response length up by 20% ...
FLAT_HELDOUT = 0.01       # ... while the held-out metric moves less than this (1 point of a rate)


def jump(y: np.ndarray, window: int = WINDOW) -> float:
    """Largest y[t] / median(y[t - window:t]) over the steps with a full window (NaN when too short or
    the medians are 0)."""
    y = np.asarray(y, dtype=float)
    if len(y) <= window:
        return np.nan
    prev = np.median(np.lib.stride_tricks.sliding_window_view(y[:-1], window), axis=-1)   # (len - window,)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(prev > 0, y[window:] / prev, np.nan)
    return float(np.nanmax(r)) if np.isfinite(r).any() else np.nan


def _cfg(runs: pd.DataFrame, key: str, default: float) -> pd.Series:
    col = runs[key] if key in runs else pd.Series(default, index=runs.index)
    return pd.to_numeric(col, errors="coerce").fillna(default)


def run_flags(runs: pd.DataFrame) -> pd.DataFrame:
    """run_id, kl_on, off_policy, format_on from each run's config (RunConfig defaults where absent)."""
    return pd.DataFrame({"run_id": runs["run_id"], "kl_on": kl_measured(runs),
                         "off_policy": (_cfg(runs, "recipe.update_epochs", 1) > 1) | (_cfg(runs, "recipe.minibatches", 1) > 1),
                         "format_on": _cfg(runs, "recipe.format_weight", 0.0) > 0})


def _seg(y: np.ndarray, a: float, b: float) -> float:
    """Mean of the finite values of y between fractions a and b of its length."""
    n = len(y)
    part = y[int(a * n): max(int(b * n), int(a * n) + 1)]
    part = part[np.isfinite(part)]
    return float(part.mean()) if len(part) else np.nan


def run_diagnostics(study, metric: str | None = None) -> pd.DataFrame:
    """One row per run that logged steps: entropy start / early / end, KL max / mid / end, dead-group
    shares (all-correct, all-wrong) over the last quarter, truncation, clip fractions, length, advantage
    std, KL and grad-norm jumps, and (with `metric`) the held-out metric at the first and last evaluation."""
    rows = []
    m = study.metrics
    held = {}
    if metric and metric in study.evals:
        ev = study.evals[["run_id", "step", metric]].dropna().sort_values("step")
        held = {rid: (g[metric].iloc[0], g[metric].iloc[-1]) for rid, g in ev.groupby("run_id", observed=True)}
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
            "adv_std_end": _seg(col("train/adv_std"), 0.75, 1.0),
            "kl_abs_max": float(np.nanmax(np.abs(kl))) if np.isfinite(kl).any() else np.nan,
            "kl_jump": jump(kl), "grad_jump": jump(col("train/grad_norm")),
            "heldout_start": held.get(rid, (np.nan, np.nan))[0], "heldout_end": held.get(rid, (np.nan, np.nan))[1],
            # behaviour -> old mismatch (docs/offpolicy.md), means over the run; only where it was logged
            **({"offpolicy_kl_k3": _seg(col("offpolicy/kl_k3"), 0, 1), "offpolicy_ess": _seg(col("offpolicy/ess_frac"), 0, 1),
                "offpolicy_cap": _seg(col("offpolicy/is_cap_frac"), 0, 1),
                "offpolicy_rejected": _seg(col("offpolicy/rejected_token_frac"), 0, 1)}
               if "offpolicy/kl_k3" in g else {}),
            # multi-turn episodes (docs/environments.md); only where they were logged
            **({"episode_turns": _seg(col("episode/turns"), 0, 1),
                "tool_calls_start": _seg(col("episode/tool_calls"), 0, 0.1),
                "tool_calls_end": _seg(col("episode/tool_calls"), 0.9, 1.0),
                "tool_errors": _seg(col("episode/tool_errors"), 0, 1),
                "env_token_frac": _seg(col("episode/env_token_frac"), 0, 1),
                "env_errors": float(np.nanmax(col("episode/env_errors"))),
                "episode_truncation": _seg(col("episode/end_max_turns") + col("episode/end_budget"), 0.75, 1.0)}
               if "episode/turns" in g else {}),
        })
    return pd.DataFrame(rows)


def kl_measured(runs: pd.DataFrame) -> pd.Series:
    """Per run: whether KL to a reference was measured (recipe.kl_coef > 0; with kl_coef 0 there is no
    reference model and the logged train/kl is a placeholder 0). A config without the key has the default, 0."""
    coef = pd.to_numeric(runs["recipe.kl_coef"], errors="coerce").fillna(0.0) if "recipe.kl_coef" in runs else \
        pd.Series(0.0, index=runs.index)
    return coef > 0


def arm_diagnostics(study, metric: str | None = None) -> pd.DataFrame:
    """run_diagnostics averaged per arm (jumps: the largest over the arm's runs); the flags of run_flags
    (true if any run of the arm has it); KL columns NaN where `kl_on` is False (no KL measured)."""
    d = run_diagnostics(study, metric)
    if d.empty:
        return d
    flags = run_flags(study.runs)
    d = d.merge(study.runs[["run_id", "arm"]], on="run_id").merge(flags.astype({c: float for c in flags.columns[1:]}),
                                                                 on="run_id")
    order = list(dict.fromkeys(study.runs["arm"]))
    g = d.drop(columns="run_id").groupby("arm", sort=False)
    out = g.mean(numeric_only=True)
    for c in ("kl_jump", "grad_jump", "kl_abs_max"):
        out[c] = g[c].max()
    out = out.reindex([a for a in order if a in out.index])
    for c in flags.columns[1:]:
        out[c] = out[c] > 0
    out.loc[~out["kl_on"], ["kl_max", "kl_mid", "kl_end", "kl_jump"]] = np.nan
    return out.reset_index()


# --- health checks: one arm row (pd.Series) -> a warning or None ---------------------------------------

def clip_range(r) -> str | None:
    clip = r.get("clip_low", np.nan) + r.get("clip_high", np.nan)
    if r.get("off_policy") and np.isfinite(clip) and not CLIP_LOW <= clip <= CLIP_HIGH:
        what = "the trust region is inactive" if clip < CLIP_LOW else "updates fight the clip"
        return (f"clip fraction {clip:.3g} in '{r['arm']}' is outside {CLIP_LOW}-{CLIP_HIGH} with off-policy updates "
                f"(update_epochs / minibatches > 1): {what}")
    return None


def adv_std_low(r) -> str | None:
    v = r.get("adv_std_end", np.nan)
    if np.isfinite(v) and v < ADV_STD_LOW:
        return f"advantage std {v:.3g} in '{r['arm']}' late in training (< {ADV_STD_LOW}): almost every group is dead"
    return None


def kl_spike(r) -> str | None:
    v = r.get("kl_jump", np.nan)
    if np.isfinite(v) and v > SPIKE_KL and r.get("kl_max", 0) > KL_FLOOR:
        return (f"KL spike in '{r['arm']}': a step at {v:.3g}x the median of the {WINDOW} before it "
                "(lr or clip range too aggressive?)")
    return None


def kl_zero(r) -> str | None:
    if r.get("kl_on") and r.get("kl_abs_max", np.nan) == 0:
        return f"KL to the reference is exactly 0 throughout in '{r['arm']}' although recipe.kl_coef > 0: is the " \
               "reference a copy that moves with the policy?"
    return None


def grad_spike(r) -> str | None:
    v = r.get("grad_jump", np.nan)
    if np.isfinite(v) and v > SPIKE_GRAD:
        return f"grad-norm spike in '{r['arm']}': a step at {v:.3g}x the median of the {WINDOW} before it"
    return None


def length_without_accuracy(r) -> str | None:
    a, b = r.get("len_start", np.nan), r.get("len_end", np.nan)
    h0, h1 = r.get("heldout_start", np.nan), r.get("heldout_end", np.nan)
    if np.isfinite([a, b, h0, h1]).all() and a > 0 and b > (1 + LEN_RISE) * a and abs(h1 - h0) < FLAT_HELDOUT:
        return (f"response length rises {a:.3g} -> {b:.3g} tokens in '{r['arm']}' while the held-out metric stays flat "
                f"({h0:.3g} -> {h1:.3g}): length bias or overlong noise?")
    return None


def format_never(r) -> str | None:
    if r.get("format_on") and r.get("format_max", np.nan) == 0:
        return f"the format reward is weighted in '{r['arm']}' but never above 0: is the format produced at all?"
    return None


def env_errors(r) -> str | None:
    v = r.get("env_errors", np.nan)
    if np.isfinite(v) and v > 0:
        return (f"the environment failed in '{r['arm']}' (up to {v:.0%} of a step's episodes: a raise, a timeout or "
                "a reply of the wrong types; those episodes scored 0)")
    return None


def episodes_truncated(r) -> str | None:
    v = r.get("episode_truncation", np.nan)
    if np.isfinite(v) and v > TRUNC_HIGH:
        return (f"{v:.0%} of episodes end by task.episode.max_turns or the token budget in '{r['arm']}' late in "
                "training: the outcome of a truncated episode is 0")
    return None


def tools_abandoned(r) -> str | None:
    a, b = r.get("tool_calls_start", np.nan), r.get("tool_calls_end", np.nan)
    if np.isfinite([a, b]).all() and a > 0 and b < 0.2 * a:
        return f"tool calls per episode fall {a:.3g} -> {b:.3g} in '{r['arm']}': the policy stopped using the tools"
    return None


RULES = {"clip_range": clip_range, "adv_std_low": adv_std_low, "kl_spike": kl_spike, "kl_zero": kl_zero,
         "grad_spike": grad_spike, "length_without_accuracy": length_without_accuracy, "format_never": format_never,
         "env_errors": env_errors, "episodes_truncated": episodes_truncated, "tools_abandoned": tools_abandoned}


def health_warnings(diag: pd.DataFrame) -> list[str]:
    """Every rule of RULES on every arm row."""
    return [w for _, r in diag.iterrows() for f in RULES.values() if (w := f(r))]


def warnings_for(study, scores: pd.DataFrame, metric: str, diag: pd.DataFrame, passk=None) -> list[str]:
    """Failed / incomplete runs, entropy collapse, KL growth, dead groups, truncation, flat reward, the
    health checks of RULES, reward hacking, pass@k narrowing."""
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
        if abs(r.reward_end - r.reward_start) < 0.01:
            out.append(f"train reward flat in '{r.arm}' ({r.reward_start:.3g} -> {r.reward_end:.3g}): read the samples "
                       "and the dead-group shares" + ("" if getattr(r, "format_on", False) else
                                                      " (the format reward is not measured: recipe.format_weight 0)"))
    out += health_warnings(diag)
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
