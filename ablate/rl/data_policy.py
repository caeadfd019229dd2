"""Online data policies: which training prompts the next step samples, from their pass rates so far.

Each policy is a pure function with one signature,

    select(pool: Pool, k: int, params: Params) -> (k prompt indices, new stream position)

and `observe(pool, indices, pass_rates, params) -> Pool` folds a step's results into the state, the same
for every policy. All randomness comes from `np.random.default_rng([seed, ...])` keyed by the state's
draw counter, so two runs with the same seed, policy and state draw the same prompts (common random
numbers). `uniform` and `zero_variance_filter` never look at pass rates: their stream depends on the seed
only, so runs that differ in recipe toggles see the same prompts in the same order (paired design). The
adaptive policies diverge exactly as the runs' pass rates do.

- `uniform`: the seeded epoch stream (a fresh permutation per epoch; what the trainer always did).
- `zero_variance_filter`: the uniform stream; groups whose G rewards are all equal are dropped from the
  update without resampling (Khatri et al. 2025, "The Art of Scaling RL Compute for LLMs" (ScaleRL),
  arXiv:2510.13913).
- `no_positive_resampling`: the uniform stream, skipping retired prompts; a prompt whose latest group
  pass rate reaches `retire_threshold` (0.9 in ScaleRL) leaves the pool for all later epochs (ScaleRL).
- `prioritized`: k distinct prompts drawn with p(i) proportional to (1 - s_i) + smoothing, where s_i is
  the estimated pass rate (prioritized replay, Schaul et al. 2016, arXiv:1511.05952, applied to prompts).
- `curriculum`: easy to hard: prompts ranked by s_i (highest first), k drawn uniformly from the easiest
  fraction of the pool, which grows linearly from `curriculum_start` to 1 over the run (Bengio et al.
  2009, "Curriculum Learning"; pacing as in Hacohen & Weinshall 2019, arXiv:1904.03626).

s_i is the pass rate of prompt i's most recent group, and `prior` (0.5) for a prompt never sampled.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Params:
    seed: int                    # the run seed
    total: int                   # prompts the run will sample in all (steps * prompts_per_step)
    retire_threshold: float = 0.9
    priority_smoothing: float = 0.1
    curriculum_start: float = 0.25
    prior: float = 0.5


@dataclass(frozen=True)
class Pool:
    """The policy's state; plain lists, so it goes into a checkpoint as is."""

    position: int        # prompts taken from the seeded epoch stream so far
    draws: int           # select() calls so far (keys the random draws of the adaptive policies)
    rate: list           # [n] pass rate of each prompt's latest group; nan = never sampled
    retired: list        # [n] bool, retired for good (no_positive_resampling)

    @staticmethod
    def new(n: int) -> Pool:
        return Pool(0, 0, [math.nan] * n, [False] * n)


@functools.lru_cache(maxsize=8)
def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The seeded permutation of epoch `epoch` (the trainer's historical prompt order), [n], read-only."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    order.flags.writeable = False
    return order


def estimate(pool: Pool, prior: float) -> np.ndarray:
    """s_i, [n]: latest group pass rate, `prior` where never sampled."""
    rate = np.asarray(pool.rate, dtype=float)
    return np.where(np.isnan(rate), prior, rate)


def _stream(pool: Pool, k: int, params: Params, skip: list) -> tuple[list[int], int]:
    """The next k prompts of the epoch stream not in `skip` (any, if all are), and the new position."""
    n = len(pool.rate)
    if all(skip):
        skip = [False] * n
    out, pos = [], pool.position
    while len(out) < k:
        epoch, i = divmod(pos, n)
        idx = int(epoch_order(n, params.seed, epoch)[i])
        if not skip[idx]:
            out.append(idx)
        pos += 1
    return out, pos


def select_uniform(pool: Pool, k: int, params: Params) -> tuple[list[int], int]:
    return _stream(pool, k, params, [False] * len(pool.rate))


def select_unretired(pool: Pool, k: int, params: Params) -> tuple[list[int], int]:
    return _stream(pool, k, params, pool.retired)


def priorities(pool: Pool, params: Params) -> np.ndarray:
    """p(i) proportional to 1 - s_i + smoothing, [n]."""
    w = 1.0 - estimate(pool, params.prior) + params.priority_smoothing   # [n], > 0
    return w / w.sum()


def select_prioritized(pool: Pool, k: int, params: Params) -> tuple[list[int], int]:
    p = priorities(pool, params)
    rng = np.random.default_rng([params.seed, 1, pool.draws])
    idx = rng.choice(len(p), size=k, replace=k > len(p), p=p)
    return [int(i) for i in idx], pool.position + k


def curriculum_size(n: int, k: int, position: int, params: Params) -> int:
    """How many of the easiest prompts are eligible: linear from curriculum_start * n to n."""
    progress = min(1.0, position / max(params.total, 1))
    frac = params.curriculum_start + (1.0 - params.curriculum_start) * progress
    return min(n, max(k, math.ceil(frac * n)))


def select_curriculum(pool: Pool, k: int, params: Params) -> tuple[list[int], int]:
    n = len(pool.rate)
    s = estimate(pool, params.prior)
    order = epoch_order(n, params.seed, 0)                  # ties broken by the seeded order
    ranked = order[np.argsort(-s[order], kind="stable")]    # easiest (highest s) first
    eligible = ranked[:curriculum_size(n, k, pool.position, params)]
    rng = np.random.default_rng([params.seed, 2, pool.draws])
    return [int(i) for i in rng.choice(eligible, size=k, replace=k > len(eligible))], pool.position + k


# name -> select(pool, k, params) -> (k prompt indices, new stream position)
DATA_POLICIES: dict[str, Callable[[Pool, int, Params], tuple[list[int], int]]] = {
    "uniform": select_uniform,
    "zero_variance_filter": select_uniform,
    "no_positive_resampling": select_unretired,
    "prioritized": select_prioritized,
    "curriculum": select_curriculum,
}
DROPS_DEAD_GROUPS = {"zero_variance_filter"}  # filter the update; no resampling
RETIRES = {"no_positive_resampling"}


def advance(pool: Pool, policy: str, k: int, params: Params) -> tuple[list[int], Pool]:
    """Take k prompts: the policy's selection and the state after it."""
    idx, position = DATA_POLICIES[policy](pool, k, params)
    return idx, replace(pool, position=position, draws=pool.draws + 1)


def observe(pool: Pool, policy: str, indices: list[int], pass_rates: list[float], params: Params) -> Pool:
    """Record each sampled prompt's group pass rate; retire those at or above the threshold (if retiring)."""
    rate, retired = list(pool.rate), list(pool.retired)
    for i, s in zip(indices, pass_rates):
        rate[i] = float(s)
        if policy in RETIRES and s >= params.retire_threshold:
            retired[i] = True
    return replace(pool, rate=rate, retired=retired)
