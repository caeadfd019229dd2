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
Below about five seeds the bootstrap's seed part is low by (S - 1)/S: prefer a t interval over the
seed scores and use the bootstrap for the problem dimension.
"""

from __future__ import annotations

import numpy as np

from ablate.analysis.stats import CI, REPS, Interval, percentile_ci


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


def two_way_draws(S: int, M: int, reps: int = REPS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(reps, S) seed indices and (reps, M) problem indices, drawn independently with replacement."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, S, (reps, S)), rng.integers(0, M, (reps, M))


def _boot_means(p: np.ndarray, si: np.ndarray, pj: np.ndarray) -> np.ndarray:
    """(reps,) means of p[si_r][:, pj_r]: p[si] is (reps, S, M), its columns then picked by pj (reps, M)."""
    return np.take_along_axis(p[si], pj[:, None, :], axis=2).mean(axis=(1, 2))


def two_way_bootstrap(p, reps: int = REPS, ci: float = CI, seed: int = 0) -> tuple[Interval, np.ndarray]:
    """Grand mean of the (S, M) table p with the two-way bootstrap percentile interval; also the draws."""
    p = np.asarray(p, dtype=float)
    si, pj = two_way_draws(*p.shape, reps, seed)
    boot = _boot_means(p, si, pj)
    return Interval(float(p.mean()), *percentile_ci(boot, ci), p.shape[0]), boot


def paired_problem_difference(pa, pb, reps: int = REPS, ci: float = CI, seed: int = 0) -> Interval:
    """Mean of pa - pb for two arms on the same seeds (rows) and problems (columns): the same seed and
    problem indices in every replicate, so what the arms share cancels."""
    pa, pb = np.asarray(pa, dtype=float), np.asarray(pb, dtype=float)
    if pa.shape != pb.shape:
        raise ValueError(f"paired tables need equal shapes, got {pa.shape} and {pb.shape}")
    iv, _ = two_way_bootstrap(pa - pb, reps, ci, seed)
    return Interval(iv.estimate, iv.lo, iv.hi, iv.n, paired=True)


def within_eval_noise(diff: float, components: dict, z: float = 1.96) -> bool:
    """True when a difference between two models' scores on the same M problems is within what the
    sampling of completions alone produces: |diff| < z sqrt(2 v / M) (each score carries v / M)."""
    return bool(abs(diff) < z * np.sqrt(2 * components["v"] / components["M"]))
