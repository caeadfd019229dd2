"""Eval noise in held-out pass@1: how much of a score's variance is training randomness (seeds) and how
much is the held-out set and the sampling of completions (Hochlehnert et al. 2025, "A sober look at
progress in language model reasoning", arXiv 2504.07086: many reported RL gains are within this noise).

Setting: S seeds x M held-out problems shared by all seeds, n samples per cell, c[s, m] correct;
p[s, m] = c / n. Model p_sm = mu + a_s + b_m + (ab)_sm, c ~ Binomial(n, p_sm): sigma2_a between seeds,
sigma2_b between problems, sigma2_ab their interaction; completion sampling adds p(1 - p)/n per cell.

- `variance_components`: two-way ANOVA without replication on the S x M table,
      MS_S = M sum_s (p_s - p)^2 / (S - 1),  MS_M = S sum_m (p_m - p)^2 / (M - 1),
      MS_E = sum (p_sm - p_s - p_m + p)^2 / ((S - 1)(M - 1)),  v = mean c (n - c) / (n^2 (n - 1)),
      sigma2_a = (MS_S - MS_E) / M,  sigma2_b = (MS_M - MS_E) / S,  sigma2_ab = MS_E - v  (each >= 0);
  Var(seed score), problems fixed = sigma2_a + (sigma2_ab + v) / M (between-seed + eval sampling);
  Var(grand mean), new seeds and problems = sigma2_a / S + sigma2_b / M + (sigma2_ab + v) / (S M).
- `two_way_bootstrap`: Owen (2007), "The pigeonhole bootstrap", Ann. Appl. Stat. 1(2): seeds and
  problems resampled independently with replacement; the statistic is the mean of p[I][:, J]. Cells
  are not resampled again (their noise is already in p). `bootstrap_variance` is its closed form.
- `paired_problem_difference`: two arms on the same seeds and problems, the same I and J for both.
  With `resample_seeds=False` (both functions) only problems are resampled: the held-out set's share of
  the uncertainty with the trained models held fixed, valid at any seed count.
- `sampling_sd`: sd of an S-seed mean over M problems from the sampling of completions alone,
  sqrt(v / (S M)); a difference of two arms is "within eval noise" when |diff| < 1.96 sqrt(sd_a^2 + sd_b^2)
  (another sampling seed could produce it) or the problems-only interval covers 0 (another draw of held-out
  problems could).
Below about five seeds the bootstrap's seed part is low by (S - 1)/S: prefer a t interval over the
seed scores and use the bootstrap for the problem dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ablate.analysis.stats import CI, REPS, Interval, percentile_ci

Z = 1.96  # two-sided 95% normal quantile of the eval-noise verdict


def variance_components(c, n: int) -> dict:
    """c: (S, M) correct counts out of n samples per cell (n >= 2)."""
    c = np.asarray(c, dtype=float)
    S, M = c.shape
    p = c / n
    ps, pm, pbar = p.mean(1), p.mean(0), p.mean()
    ms_s = M * ((ps - pbar) ** 2).sum() / (S - 1)
    ms_m = S * ((pm - pbar) ** 2).sum() / (M - 1)
    ms_e = ((p - ps[:, None] - pm[None, :] + pbar) ** 2).sum() / ((S - 1) * (M - 1))
    v = float((c * (n - c) / (n ** 2 * (n - 1))).mean())
    a, b, ab = max(0.0, (ms_s - ms_e) / M), max(0.0, (ms_m - ms_e) / S), max(0.0, ms_e - v)
    var_seed = a + (ab + v) / M
    return {"S": S, "M": M, "MS_S": ms_s, "MS_M": ms_m, "MS_E": ms_e, "v": v, "sigma2_a": a, "sigma2_b": b, "sigma2_ab": ab,
            "var_seed_score": var_seed, "between_seed_share": a / var_seed if var_seed > 0 else np.nan,
            "sampling_share": v / M / var_seed if var_seed > 0 else np.nan,
            "var_mean": a / S + b / M + (ab + v) / (S * M)}


def bootstrap_variance(p) -> dict:
    """Closed-form variance of the grand mean under resampling seeds, problems, or both (two-way)."""
    p = np.asarray(p, dtype=float)
    S, M = p.shape
    r, c = p.mean(1) - p.mean(), p.mean(0) - p.mean()
    e = p - p.mean(1, keepdims=True) - p.mean(0, keepdims=True) + p.mean()
    seeds, problems, resid = (r ** 2).mean() / S, (c ** 2).mean() / M, (e ** 2).mean() / (S * M)
    return {"seeds": float(seeds), "problems": float(problems), "residual": float(resid),
            "two_way": float(seeds + problems + resid)}


def two_way_draws(S: int, M: int, reps: int = REPS, seed: int = 0, resample_seeds: bool = True):
    """(reps, S) seed indices and (reps, M) problem indices, drawn independently with replacement (seed
    indices 0..S-1 in every replicate when not `resample_seeds`)."""
    rng = np.random.default_rng(seed)
    si, pj = rng.integers(0, S, (reps, S)), rng.integers(0, M, (reps, M))
    return (si if resample_seeds else np.broadcast_to(np.arange(S), (reps, S))), pj


def _boot_means(p: np.ndarray, si: np.ndarray, pj: np.ndarray) -> np.ndarray:
    """(reps,) means of p[si_r][:, pj_r]: p[si] is (reps, S, M), its columns then picked by pj (reps, M)."""
    return np.take_along_axis(p[si], pj[:, None, :], axis=2).mean(axis=(1, 2))


def two_way_bootstrap(p, reps: int = REPS, ci: float = CI, seed: int = 0,
                      resample_seeds: bool = True) -> tuple[Interval, np.ndarray]:
    """Grand mean of the (S, M) table p with the two-way bootstrap percentile interval; also the draws."""
    p = np.asarray(p, dtype=float)
    si, pj = two_way_draws(*p.shape, reps, seed, resample_seeds)
    boot = _boot_means(p, si, pj)
    return Interval(float(p.mean()), *percentile_ci(boot, ci), p.shape[0]), boot


def paired_problem_difference(pa, pb, reps: int = REPS, ci: float = CI, seed: int = 0,
                              resample_seeds: bool = True) -> Interval:
    """Mean of pa - pb for two arms on the same seeds (rows) and problems (columns): the same seed and
    problem indices in every replicate, so what the arms share cancels."""
    pa, pb = np.asarray(pa, dtype=float), np.asarray(pb, dtype=float)
    if pa.shape != pb.shape:
        raise ValueError(f"paired tables need equal shapes, got {pa.shape} and {pb.shape}")
    iv, _ = two_way_bootstrap(pa - pb, reps, ci, seed, resample_seeds)
    return Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=True)


def within_eval_noise(diff: float, components: dict, z: float = 1.96) -> bool:
    """True when a difference between two models' scores on the same M problems is within what the
    sampling of completions alone produces: |diff| < z sqrt(2 v / M) (each score carries v / M)."""
    return bool(abs(diff) < z * np.sqrt(2 * components["v"] / components["M"]))


def sampling_sd(v: float, S: int, M: int) -> float:
    """sd of the mean of S seed scores over M problems from the sampling of completions alone."""
    return float(np.sqrt(v / (S * M)))


# --- from run folders to the report ---------------------------------------------------------------------

@dataclass
class CountTable:
    """One arm's final held-out counts: c[s, m] correct of n samples, seed s (row) x problem m (column)."""
    seeds: list
    problems: list
    c: np.ndarray   # (S, M)
    n: int          # samples per cell (eval.n_samples x eval.repeats)

    @property
    def p(self) -> np.ndarray:  # (S, M)
        return self.c / self.n

    def select(self, seeds: list, problems: list) -> np.ndarray:
        """p restricted to `seeds` (rows) and `problems` (columns), in that order."""
        si, pj = [self.seeds.index(s) for s in seeds], [self.problems.index(q) for q in problems]
        return self.p[np.ix_(si, pj)]


def count_tables(problems: pd.DataFrame, scores: pd.DataFrame) -> dict[str, CountTable]:
    """Per arm (design order), the table of its runs used in the statistics, over the problems all of them
    evaluated (`problems`: ablate.analysis.load.eval_problems). An arm whose runs differ in n is left out."""
    inc = scores[scores["included"]]
    seed_of, arm_of = dict(zip(inc["run_id"].astype(str), inc["seed"])), dict(zip(inc["run_id"].astype(str), inc["arm"]))
    df = problems.assign(run_id=problems["run_id"].astype(str))
    df = df[df["run_id"].isin(arm_of)]
    out = {}
    for arm in dict.fromkeys(inc["arm"]):
        g = df[df["run_id"].map(arm_of) == arm]
        if g.empty or g["n"].nunique() != 1:
            continue
        wide = g.pivot_table(index="run_id", columns="problem", values="correct", aggfunc="first", sort=False).dropna(axis=1)
        wide = wide.loc[sorted(wide.index, key=lambda r: seed_of[r])]
        if wide.shape[1]:
            out[arm] = CountTable([seed_of[r] for r in wide.index], list(wide.columns), wide.to_numpy(float),
                                  int(g["n"].iloc[0]))
    return out


def arm_noise(t: CountTable, reps: int = REPS, ci: float = CI, seed: int = 0) -> dict:
    """One arm: mean, two-way and problems-only intervals, and Var(seed score) split into its parts."""
    S, M = t.c.shape
    iv, _ = two_way_bootstrap(t.p, reps, ci, seed)
    pv, _ = two_way_bootstrap(t.p, reps, ci, seed, resample_seeds=False)
    row = {"S": S, "M": M, "n": t.n, "mean": iv.estimate, "lo": iv.lo if S > 1 else np.nan, "hi": iv.hi if S > 1 else np.nan,
           "p_lo": pv.lo, "p_hi": pv.hi, "sd_seed": np.nan, "sd_eval": np.nan, "sd_sampling": np.nan,
           "share_seed": np.nan, "share_sampling": np.nan, "v": np.nan}
    if S >= 2 and M >= 2 and t.n >= 2:
        vc = variance_components(t.c, t.n)
        row.update(sd_seed=np.sqrt(vc["sigma2_a"]), sd_eval=np.sqrt((vc["sigma2_ab"] + vc["v"]) / M),
                   sd_sampling=np.sqrt(vc["v"] / M), share_seed=vc["between_seed_share"],
                   share_sampling=vc["sampling_share"], v=vc["v"])
    elif t.n >= 2:  # one seed: the sampling noise is still measured within cells
        row["v"] = float((t.c * (t.n - t.c) / (t.n ** 2 * (t.n - 1))).mean())
    return row


def contrast_noise(a: CountTable, ref: CountTable, va: float, vr: float, reps: int = REPS, ci: float = CI,
                   seed: int = 0) -> dict | None:
    """Arm a minus the reference on the problems both evaluated: paired by seed where they share two or
    more seeds (two-way and problems-only intervals), else their seed means compared problem by problem
    (problems-only); per-problem wins and losses; the completion-sampling sd of the difference and the verdict."""
    probs = [q for q in a.problems if q in set(ref.problems)]
    if not probs:
        return None
    seeds = [s for s in a.seeds if s in ref.seeds]
    paired = len(seeds) >= 2
    pa = a.select(seeds, probs) if paired else a.select(a.seeds, probs).mean(0, keepdims=True)
    pr = ref.select(seeds, probs) if paired else ref.select(ref.seeds, probs).mean(0, keepdims=True)
    d = paired_problem_difference(pa, pr, reps, ci, seed) if paired else None
    dp = paired_problem_difference(pa, pr, reps, ci, seed, resample_seeds=False)
    per = (pa - pr).mean(0)  # (M,) seed-averaged difference per problem
    M, (Sa, Sr) = len(probs), ((len(seeds),) * 2 if paired else (len(a.seeds), len(ref.seeds)))
    noise = float(np.hypot(sampling_sd(va, Sa, M), sampling_sd(vr, Sr, M))) if np.isfinite(va + vr) else np.nan
    if np.isfinite(noise) and abs(dp.estimate) < Z * noise:
        verdict = "within eval noise (completion sampling)"
    elif dp.lo <= 0 <= dp.hi:
        verdict = "within eval noise (held-out problems)"
    else:
        verdict = "beyond eval noise"
    return {"S": len(seeds) if paired else np.nan, "M": M, "paired": paired, "diff": dp.estimate,
            "lo": d.lo if d else np.nan, "hi": d.hi if d else np.nan, "p_lo": dp.lo, "p_hi": dp.hi,
            "better": int((per > 0).sum()), "worse": int((per < 0).sum()), "tied": int((per == 0).sum()),
            "noise_sd": noise, "verdict": verdict}


def noise_tables(study, scores: pd.DataFrame, reps: int = REPS, ci: float = CI, seed: int = 0):
    """The report's eval-noise section from the runs' final per-problem counts: (per arm, per arm vs the
    reference arm); both empty when no run wrote eval_problems.jsonl."""
    from ablate.analysis.load import eval_problems

    tables = count_tables(eval_problems(study), scores)
    arms = pd.DataFrame([{"arm": arm, **arm_noise(t, reps, ci, seed)} for arm, t in tables.items()])
    rows, order = [], list(dict.fromkeys(scores["arm"]))
    if order and order[0] in tables:
        ref, v = order[0], dict(zip(arms["arm"], arms["v"]))
        for arm, t in tables.items():
            r = contrast_noise(t, tables[ref], v[arm], v[ref], reps, ci, seed) if arm != ref else None
            if r is not None:
                rows.append({"arm": arm, "reference": ref, **r})
    return arms, pd.DataFrame(rows)


def noise_lines(contrasts: pd.DataFrame, scale: float = 100.0) -> list[str]:
    """The sentences a report gives for each difference within eval noise."""
    out = []
    for r in contrasts.itertuples():
        if r.verdict.startswith("within"):
            out.append(f"{r.arm} vs {r.reference}: {r.diff * scale:+.1f} points of held-out pass@1 on the same "
                       f"{r.M} problems is {r.verdict}: completion sampling alone moves it by +-{Z * r.noise_sd * scale:.1f}"
                       f", the held-out problems alone give [{r.p_lo * scale:.1f}, {r.p_hi * scale:.1f}]")
    return out
