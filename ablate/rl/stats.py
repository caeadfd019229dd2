"""Small statistics shared by the trainer and the evaluation: masked moments, pass@k, group health.

Pure functions on tensors / Python numbers; nothing here touches a model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over positions where mask is true (over `dim`, or over everything).

    An empty selection gives 0, not NaN: a batch with no completion tokens must not poison the logs.
    Masked-out entries are replaced (not multiplied) by 0, so inf/garbage there cannot leak in.
    """
    m = mask.bool()
    x = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return x.sum() / m.sum().clamp(min=1)
    return x.sum(dim) / m.sum(dim).clamp(min=1)


def masked_std(x: Tensor, mask: Tensor, ddof: int = 0) -> Tensor:
    """Std of x over all positions where mask is true (scalar); 0 when fewer than ddof+1 entries."""
    m = mask.bool()
    mu = masked_mean(x, m)
    sq = torch.where(m, (x - mu) ** 2, torch.zeros((), dtype=x.dtype, device=x.device))
    n = m.sum()
    var = sq.sum() / (n - ddof).clamp(min=1)
    return var.sqrt()


# --- pass@k ---------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021, "Evaluating LLMs Trained on Code"): 1 - C(n-c,k)/C(n,k).

    n samples drawn, c of them correct. Uses the product form
        C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)
    which never forms huge binomials (stable for n in the thousands).
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if int(v) != v or v < 0:
            raise ValueError(f"pass_at_k: {name} must be a non-negative integer, got {v!r}")
    n, c, k = int(n), int(c), int(k)
    if k < 1:
        raise ValueError(f"pass_at_k: k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} > n={n}; draw at least k samples")
    if c > n:
        raise ValueError(f"pass_at_k: c={c} > n={n}")
    if n - c < k:  # every size-k subset contains a correct sample
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def mean_pass_at_k(n_correct: Sequence[int] | Tensor, n: int, k: int) -> float:
    """pass@k averaged over problems; n_correct[j] = correct samples of problem j (n drawn each)."""
    counts = n_correct.tolist() if isinstance(n_correct, Tensor) else list(n_correct)
    if not counts:
        raise ValueError("mean_pass_at_k: no problems given")
    return sum(pass_at_k(n, int(c), k) for c in counts) / len(counts)


# --- majority vote (maj@k) -------------------------------------------------------------------------

def majority_correct(answers: Sequence, correct: Sequence[bool]) -> bool:
    """Is the plurality answer correct? answers[j] is sample j's extracted answer (None = no answer,
    never voted for), correct[j] its verifier outcome. Ties go to the answer seen first. No answer -> False."""
    votes: dict = {}
    for a, ok in zip(answers, correct):
        if a is not None:
            n, first_ok = votes.get(a, (0, bool(ok)))
            votes[a] = (n + 1, first_ok)
    if not votes:
        return False
    best = max(votes.values(), key=lambda v: v[0])  # max keeps the first of equal counts
    return best[1]


def mean_maj_at_k(answers: Sequence[Sequence], correct: Sequence[Sequence[bool]], k: int) -> float:
    """maj@k averaged over problems: the majority vote over each problem's first k samples."""
    if not answers:
        raise ValueError("mean_maj_at_k: no problems given")
    return sum(majority_correct(a[:k], c[:k]) for a, c in zip(answers, correct)) / len(answers)


# --- group health ---------------------------------------------------------------------------------

def group_stats(rewards: Tensor, correct: Tensor) -> dict[str, float]:
    """Per-step group diagnostics from raw rewards [P,G] and verifier correctness [P,G] (bool).

    Keys (all shares are over the P groups unless said otherwise):
      dead_frac              groups whose G raw rewards are all exactly equal (zero gradient under any
                             group baseline); computed before any normalisation. With G = 1 "dead" is
                             not applicable: the three dead_* keys are NaN (not 1.0).
      dead_all_correct_frac  dead groups whose G completions are all correct.
      dead_all_wrong_frac    dead groups whose G completions are all wrong.
      all_correct_frac       groups that are all correct (dead or not, e.g. format reward differs).
      all_wrong_frac         groups that are all wrong.
      solve_rate             share of the P*G completions that are correct.
      reward_mean            mean of the P*G rewards.
      reward_std             population std (ddof=0) of the P*G rewards.
      group_std_mean         mean over groups of the population std of the group's rewards.
    """
    if rewards.dim() != 2 or rewards.shape != correct.shape:
        raise ValueError(f"group_stats: expected rewards and correct of the same shape [P,G], "
                         f"got {tuple(rewards.shape)} and {tuple(correct.shape)}")
    r = rewards.detach().double()
    ok = correct.bool()
    dead = r.amax(1) == r.amin(1)  # exact: a tolerance would hide tiny but real reward differences
    all_correct, all_wrong = ok.all(1), (~ok).all(1)
    na = r.shape[1] == 1  # one completion per prompt: no group, nothing can be dead
    return {
        "dead_frac": math.nan if na else dead.double().mean().item(),
        "dead_all_correct_frac": math.nan if na else (dead & all_correct).double().mean().item(),
        "dead_all_wrong_frac": math.nan if na else (dead & all_wrong).double().mean().item(),
        "all_correct_frac": all_correct.double().mean().item(),
        "all_wrong_frac": all_wrong.double().mean().item(),
        "solve_rate": ok.double().mean().item(),
        "reward_mean": r.mean().item(),
        "reward_std": r.std(correction=0).item(),
        "group_std_mean": r.std(1, correction=0).mean().item(),
    }
