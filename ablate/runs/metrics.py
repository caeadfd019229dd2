"""Every logged metric, defined once. `docs/metrics.md` is rendered from this table
(`python -m ablate.runs.metrics > docs/metrics.md`; a test keeps the two in step).

Per-token quantities are means over completion tokens (mask 1); "groups" are the G completions of one
prompt. Per-step metrics go to metrics.jsonl, evaluation metrics to evals.jsonl.
"""

from __future__ import annotations

import re

STEP_METRICS: dict[str, str] = {
    "train/reward_mean": "mean total reward of the step's completions (after format, overlong and KL-in-reward terms)",
    "train/reward_std": "std (ddof=0) of the total reward over the step's completions",
    "train/reward_correct_mean": "mean training-verifier score (the gameable one when `task.gameable`)",
    "train/reward_format_mean": "mean format score (1 if the completion has the expected structure)",
    "train/format_weight": "weight of the format score in the reward at this step (`recipe.format_weight`, falling linearly to 0 at step `recipe.format_anneal_steps` when that is > 0)",
    "train/reward_overlong_mean": "mean overlong soft penalty added to the reward (0 unless `recipe.overlong=soft_penalty`)",
    "train/reward_kl_mean": "mean KL penalty subtracted from the reward (0 unless `recipe.kl_placement=reward`)",
    "train/dead_group_frac": "share of groups whose G rewards are all equal (no gradient), before any normalisation (NaN when recipe.group_size = 1: not applicable)",
    "train/dead_all_correct_frac": "share of groups whose G completions are all correct (NaN when recipe.group_size = 1: not applicable)",
    "train/dead_all_wrong_frac": "share of groups whose G completions are all wrong (NaN when recipe.group_size = 1: not applicable)",
    "train/gen_rounds": "generation rounds used this step (> 1 only with dynamic sampling)",
    "train/live_groups": "groups trained on this step (dynamic sampling drops dead ones)",
    "train/nonzero_adv_token_frac": "share of completion tokens whose advantage is non-zero",
    "train/adv_mean": "mean advantage over completions",
    "train/adv_std": "std (ddof=0) of the advantage over completions",
    "train/entropy": "per-token entropy (nats) of the full next-token distribution at sampling temperature",
    "train/kl": "per-token KL to the reference with `recipe.kl_estimator` (0 when KL is off)",
    "train/clip_frac_low": "share of tokens with ratio < 1 - eps_low and negative advantage (clipped)",
    "train/clip_frac_high": "share of tokens with ratio > 1 + eps_high and positive advantage (clipped)",
    "train/clip_frac": "share of tokens whose clipped term was the active one (low + high)",
    "train/dual_clip_frac": "share of negative-advantage tokens capped by the dual clip c (0 when `recipe.dual_clip` is null)",
    "train/ratio_mean": "mean importance ratio pi/pi_old over tokens",
    "train/ratio_max": "max importance ratio over tokens",
    "train/completion_len_mean": "mean completion length in tokens (EOS included)",
    "train/completion_len_max": "max completion length in tokens",
    "train/truncation_rate": "share of completions that hit `recipe.max_new_tokens` without EOS",
    "train/loss": "total loss (mean over the step's minibatch updates)",
    "train/loss_policy": "clipped surrogate policy loss",
    "train/loss_kl": "KL term before the coefficient, aggregated like the policy loss (measured whenever KL is on; added to the loss only with `recipe.kl_placement=loss`)",
    "train/loss_entropy": "mean entropy over the counted tokens, aggregated like the policy loss (the entropy bonus before its coefficient; with `recipe.token_selection=top_entropy` the bonus uses the kept tokens only)",
    "train/grad_norm": "global gradient norm before clipping (mean over minibatch updates)",
    "train/lr": "learning rate of the step",
    # online data policy (`recipe.data_policy`)
    "data/pool_size": "training prompts still in the pool (all but those retired by `no_positive_resampling`)",
    "data/retired_frac": "share of training prompts retired so far (pass rate >= `recipe.retire_threshold`)",
    "data/sampled_pass_rate_mean": "mean strict pass rate of the groups of the prompts sampled this step (all generation rounds, groups dropped from the update included)",
    # step schedules (`recipe.temperature`, `recipe.max_new_tokens`: a number or a schedule)
    "train/temperature": "sampling temperature of the step (the value of `recipe.temperature` at this step)",
    "train/max_new_tokens": "completion length limit of the step (the value of `recipe.max_new_tokens` at this step)",
    # task mixtures (`task.name: mixture`), one per task label, e.g. train/arithmetic/reward_correct_mean
    "train/{task}/reward_correct_mean": "mean training-verifier score of this step's groups of one task of a mixture",
    "train/{task}/dead_group_frac": "share of this step's groups of one task whose G training-verifier scores are all equal",
    "counters/samples": "completions generated so far (x-axis for sample-matched comparisons)",
    "counters/tokens": "completion tokens generated so far (x-axis for compute-matched comparisons)",
    "perf/wall_seconds": "seconds since the run (or its resumed part) started, cumulative across resumes",
    "perf/step_seconds": "wall seconds of this step",
    "perf/generate_seconds": "seconds spent sampling this step",
    "perf/reward_seconds": "seconds spent verifying this step",
    "perf/logprob_seconds": "seconds spent on behaviour/reference log-probs this step",
    "perf/update_seconds": "seconds spent on forward/backward/optimizer this step",
    "perf/gen_tokens_per_s": "generated completion tokens per second of sampling",
    "perf/train_tokens_per_s": "completion tokens per second of update (all epochs)",
    # off-policy (docs/offpolicy.md): behaviour policy (sampled the tokens) vs old policy (the trainer's
    # recompute at the update step), over the tokens the loss counts before IS rejection; w = pi_old / pi_behav
    # per token, W = prod_t w per completion; computed by ablate/rl/corrections.py::mismatch_metrics
    "offpolicy/kl_k1": "mean(behav_logp - old_logp): k1 estimate of KL(pi_behav || pi_old); can be negative",
    "offpolicy/kl_k3": "mean(w - 1 - log w) >= 0: k3 estimate of KL(pi_behav || pi_old)",
    "offpolicy/chi2_token": "mean(w^2) - 1: chi-square(pi_old || pi_behav) per token, the variance of the token IS weights",
    "offpolicy/chi2_seq": "mean over completions of W^2, minus 1: the variance of the sequence IS weights",
    "offpolicy/ess_frac": "Kish effective sample size of the raw token weights over the number of tokens, (sum w)^2 / (n sum w^2)",
    "offpolicy/ess_frac_seq": "Kish effective sample size of the raw sequence weights W over the number of completions",
    "offpolicy/ess_frac_corrected": "Kish effective sample size share of the weights actually applied (`recipe.is_correction`), over the kept tokens",
    "offpolicy/weight_mean": "mean raw token weight w",
    "offpolicy/weight_max": "max raw token weight w",
    "offpolicy/is_cap_frac": "share of tokens whose weight the correction truncated at `recipe.is_cap` (tis: w > C; seq_tis: tokens of rows with W > C)",
    "offpolicy/rejected_token_frac": "share of tokens the correction removed from the loss mask (mis, icepop, seq_mis, seq_geo_mask)",
    "offpolicy/rejected_seq_frac": "share of completions with no token left in the loss mask after the correction",
    "offpolicy/max_abs_prob_diff": "per completion the max over its tokens of |p_behav - p_old|, averaged over completions",
    "offpolicy/lag_mean": "mean over tokens of the optimiser steps between sampling and this update (min(step - 1, `recipe.staleness`))",
    "offpolicy/lag_max": "max over tokens of that lag",
}

# policy-loss registry (`recipe.policy_loss`): each is logged only by the losses that define it
STEP_METRICS.update({
    "train/cispo_cap_frac": "cispo: share of tokens whose importance ratio exceeds `recipe.cispo_cap` (weight capped)",
    "train/soft_gate_mean": "sapo: mean gradient weight 4*sigmoid*(1 - sigmoid) of the soft gate over tokens (1 on-policy)",
    "train/cov_select_frac": "clip_cov / kl_cov: share of tokens selected by covariance (loss zeroed / penalised)",
    "train/sft_token_frac": "raft: share of tokens in positive-advantage (rewarded) completions, the SFT targets",
})

# entropy mechanism and update-size diagnostics (Cui et al. 2025; Wang et al. 2025)
STEP_METRICS.update({
    "policy/entropy_adv_cov": "mean over tokens of (logp - mean logp)(A - mean A), logp of the update's forward (Cui et al. 2025): > 0 means entropy is expected to fall; mean over the step's minibatch updates",
    "train/high_entropy_token_frac": "share of tokens whose entropy exceeds 0.672 nats (the 80th percentile Wang et al. 2025 report for Qwen3; a fixed yardstick)",
    "train/ppo_kl": "k3 estimate of KL(pi_old || pi_theta) per token on the sampled tokens (0 on-policy), mean over minibatch updates",
    "train/adv_abs_max": "max |advantage| over completions (first token's for token-level advantages)",
    "kl/coef": "KL coefficient used this step (`recipe.kl_coef`, adapted towards `recipe.kl_target` when set; absent when KL is off)",
    "kl/ref_resets": "reference resets so far (`recipe.ref_reset_every` > 0 only)",
    "kl/steps_since_reset": "steps since the last reference reset (0 right after one; `recipe.ref_reset_every` > 0 only)",
    "train/terminated_len_mean": "mean length of the completions that ended with EOS (NaN if every completion was truncated)",
})

# PPO's learned critic (`recipe.adv_whiten: gae`, ablate/train/critic.py); V_old = the critic's values of the
# rollout before this step's fit, R = GAE returns (A + V_old), both over the tokens the loss counts
STEP_METRICS.update({
    "critic/value_loss": "clipped value loss 1/2 max((V - R)^2, (V_clip - R)^2), token mean, before `recipe.vf_coef`; mean over the step's critic minibatch updates",
    "critic/clipfrac": "share of tokens whose clipped value term (V_clip = V_old +- `recipe.value_clip`) is the larger one, mean over critic minibatch updates",
    "critic/explained_variance": "1 - Var(R - V_old) / Var(R) over tokens (1 perfect, 0 a constant, < 0 worse; NaN when the returns do not vary)",
    "critic/value_mean": "mean V_old over tokens",
    "critic/return_mean": "mean GAE return R over tokens",
    "critic/grad_norm": "global gradient norm of the value model before clipping (`optim.grad_clip`), mean over critic minibatch updates",
})

# multi-turn episodes (`task.name: env`, docs/environments.md): per step, over the step's episodes
STEP_METRICS.update({
    "episode/turns": "mean policy turns per episode",
    "episode/tool_calls": "mean tool calls per episode (turns whose environment step reported `tool_call`)",
    "episode/tool_errors": "mean failed tool calls per episode (environment steps that reported `tool_error`)",
    "episode/env_errors": "share of episodes ended by an environment error (a raise, a timeout after `task.episode.env_timeout_s`, or a reply of the wrong types; reward 0)",
    "episode/env_token_frac": "environment tokens over all completion tokens (policy and environment) of the step",
    "episode/end_done": "share of episodes the environment ended (`done`)",
    "episode/end_max_turns": "share of episodes truncated after `task.episode.max_turns` turns",
    "episode/end_budget": "share of episodes truncated by the token budget `recipe.max_new_tokens`",
    "episode/policy_tokens_per_turn": "policy tokens over policy turns, over the step's episodes",
})

EVAL_METRICS: dict[str, str] = {
    "eval/pass@{k}": "unbiased pass@k on held-out problems (n samples each at `eval.temperature`), mean over problems",
    "eval/maj@{k}": "held-out majority vote: share of problems whose most frequent extracted answer among the first k samples is correct (tasks without answer extraction vote on the verifier outcome: all correct samples count as one answer, each distinct wrong text as another)",
    "eval/{task}/pass@{k}": "unbiased pass@k on the held-out problems of one task of a mixture (task label, e.g. `code`, `reasoning_gym_chain_sum`)",
    "eval/pass@1_exact": "exact pass@1 of the tabular toy policy (product of correct-token probabilities)",
    "eval/greedy_acc": "share of held-out problems solved by the greedy decode",
    "eval/reward_mean": "mean strict-verifier reward of held-out samples",
    "eval/train_minus_heldout_reward": "mean `train/reward_correct_mean` over the steps since the previous evaluation minus `eval/reward_mean` (reward-hacking / overfitting signal; absent before training)",
    "eval/completion_len_mean": "mean completion length of held-out samples",
    "eval/frac_never_solved": "share of held-out problems with 0 of n samples correct",
    "eval/frac_always_solved": "share of held-out problems with n of n samples correct",
}


# --- ranges ----------------------------------------------------------------------------------------
# (low, high) of every metric above in its logged units, None where unbounded; the report clips curve bands
# and axes to it (shares are drawn in points, x100). Derived from the definitions; verifier scores are in
# [0, 1] by the Task contract (ablate/tasks/base.py), so every reward without the format, overlong and KL
# terms is too; the total reward, losses and advantages are unbounded.
SHARE, NONNEG, ANY = (0.0, 1.0), (0.0, None), (None, None)
RANGES: dict[str, tuple[float | None, float | None]] = {
    **dict.fromkeys([  # shares, pass rates, verifier scores and the soft gate 4 s (1 - s)
        "train/reward_correct_mean", "train/reward_format_mean", "train/dead_group_frac", "train/dead_all_correct_frac",
        "train/dead_all_wrong_frac", "train/nonzero_adv_token_frac", "train/clip_frac_low", "train/clip_frac_high",
        "train/clip_frac", "train/dual_clip_frac", "train/truncation_rate", "data/retired_frac",
        "data/sampled_pass_rate_mean", "train/{task}/reward_correct_mean", "train/{task}/dead_group_frac",
        "offpolicy/ess_frac", "offpolicy/ess_frac_seq", "offpolicy/ess_frac_corrected", "offpolicy/is_cap_frac",
        "offpolicy/rejected_token_frac", "offpolicy/rejected_seq_frac", "offpolicy/max_abs_prob_diff",
        "train/cispo_cap_frac", "train/soft_gate_mean", "train/cov_select_frac", "train/sft_token_frac",
        "train/high_entropy_token_frac", "critic/clipfrac", "eval/pass@{k}", "eval/maj@{k}", "eval/{task}/pass@{k}",
        "eval/pass@1_exact", "eval/greedy_acc", "eval/reward_mean", "eval/frac_never_solved",
        "eval/frac_always_solved"], SHARE),
    **dict.fromkeys([  # stds, norms, entropies, lengths, counts, times, weights, k3 estimates, squared losses
        "train/reward_std", "train/format_weight", "train/live_groups", "train/adv_std", "train/entropy",
        "train/ratio_mean", "train/ratio_max", "train/completion_len_mean", "train/completion_len_max",
        "train/loss_entropy", "train/grad_norm", "train/lr", "data/pool_size", "train/temperature",
        "train/max_new_tokens", "counters/samples", "counters/tokens", "perf/wall_seconds", "perf/step_seconds",
        "perf/generate_seconds", "perf/reward_seconds", "perf/logprob_seconds", "perf/update_seconds",
        "perf/gen_tokens_per_s", "perf/train_tokens_per_s", "offpolicy/kl_k3", "offpolicy/weight_mean",
        "offpolicy/weight_max", "offpolicy/lag_mean", "offpolicy/lag_max", "train/ppo_kl", "train/adv_abs_max",
        "kl/coef", "kl/ref_resets", "kl/steps_since_reset", "train/terminated_len_mean", "critic/value_loss",
        "critic/grad_norm", "eval/completion_len_mean"], NONNEG),
    **dict.fromkeys([  # signed: total reward, losses, advantages, covariances, values, a k1 estimate
        "train/reward_mean", "train/adv_mean", "train/loss", "train/loss_policy", "offpolicy/kl_k1",
        "policy/entropy_adv_cov", "critic/value_mean", "critic/return_mean"], ANY),
    # KL to the reference with `recipe.kl_estimator` (the KL-in-reward term is kl_coef >= 0 times it): k1 can
    # be negative, k2 and k3 cannot; metric_range narrows these to >= 0 when the estimators are known
    **dict.fromkeys(["train/kl", "train/loss_kl", "train/reward_kl_mean"], ANY),
    "train/reward_overlong_mean": (None, 0.0),             # DAPO's soft penalty, in [-overlong_factor, 0]
    "train/gen_rounds": (1.0, None),
    "offpolicy/chi2_token": (-1.0, None),                  # mean(w^2) - 1 with w >= 0
    "offpolicy/chi2_seq": (-1.0, None),
    "critic/explained_variance": (None, 1.0),
    "eval/train_minus_heldout_reward": (-1.0, 1.0),        # a difference of two verifier means in [0, 1]
    **dict.fromkeys([  # multi-turn episodes: shares of episodes or tokens, and counts per episode or turn
        "episode/env_errors", "episode/env_token_frac", "episode/end_done", "episode/end_max_turns",
        "episode/end_budget"], SHARE),
    **dict.fromkeys(["episode/turns", "episode/tool_calls", "episode/tool_errors",
                     "episode/policy_tokens_per_turn"], NONNEG),
}
KL_ESTIMATE = ("train/kl", "train/loss_kl", "train/reward_kl_mean")
# `recipe.kl_estimator` (ablate/rl/losses.py::KL_ESTIMATORS) -> whether its every value is >= 0
KL_NONNEGATIVE = {"k1": False, "k2": True, "k3": True}


def _key(name: str) -> str | None:
    """The table entry that defines `name`: itself, or a template ({k}: an integer, {task}: a task label)."""
    if name in STEP_METRICS or name in EVAL_METRICS:
        return name
    for key in (*STEP_METRICS, *EVAL_METRICS):
        if "{" in key and re.fullmatch(re.escape(key).replace(r"\{k\}", r"\d+").replace(r"\{task\}", r"\w+"), name):
            return key
    return None


def is_defined(name: str) -> bool:
    """True if `name` is in one of the tables (pass@k matches any k)."""
    return _key(name) is not None


def metric_range(name: str, kl_estimators=()) -> tuple[float | None, float | None]:
    """(low, high) of a metric in its logged units, None where unbounded (an undefined name: both). A KL
    estimate (KL_ESTIMATE) is >= 0 when `kl_estimators`, the runs' `recipe.kl_estimator`s, are all k2 / k3."""
    key = _key(name)
    if key in KL_ESTIMATE and kl_estimators and all(KL_NONNEGATIVE.get(e, False) for e in kl_estimators):
        return NONNEG
    return RANGES.get(key, ANY)


def _range_text(name: str) -> str:
    lo, hi = RANGES[name]
    if name in KL_ESTIMATE:
        return "any (>= 0 with k2, k3)"
    if lo is None and hi is None:
        return "any"
    return f">= {lo:g}" if hi is None else f"<= {hi:g}" if lo is None else f"[{lo:g}, {hi:g}]"


def render_markdown() -> str:
    lines = ["# Metrics", "", "Generated from `ablate/runs/metrics.py`; do not edit by hand.", ""]
    for title, table in (("Per step (metrics.jsonl)", STEP_METRICS), ("Held-out evaluation (evals.jsonl)", EVAL_METRICS)):
        lines += [f"## {title}", "", "| metric | range | definition |", "|---|---|---|"]
        lines += [f"| `{name}` | {_range_text(name)} | {text} |" for name, text in table.items()]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown())
