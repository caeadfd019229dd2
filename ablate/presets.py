"""The recipe presets: `preset: NAME` in a config fills `recipe` with NAME's values before the user's own keys
(ablate.config.parse). Each entry is a published recipe, cited, as plain recipe keys (docs/recipes.md).
Kept beside config.py, which imports it; it imports nothing of ablate."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # Shao et al. 2024, DeepSeekMath (GRPO): group mean/std, per-sequence token mean, KL k3 in the loss.
    "grpo": dict(baseline="group_mean", scale="group", loss_agg="seq_mean_token_mean",
                 eps_low=0.2, eps_high=0.2, kl_coef=0.04, kl_estimator="k3", kl_placement="loss"),
    # Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO): no std, no length normalisation.
    "dr_grpo": dict(baseline="group_mean", scale="none", loss_agg="seq_mean_token_sum_norm",
                    eps_low=0.2, eps_high=0.2, kl_coef=0.0),
    # Yu et al. 2025, DAPO: clip-higher, token-level loss, dynamic sampling, soft overlong penalty, no KL.
    "dapo": dict(baseline="group_mean", scale="group", loss_agg="token_mean", eps_low=0.2,
                 eps_high=0.28, kl_coef=0.0, dynamic_sampling=True, overlong="soft_penalty"),
    # Ahmadian et al. 2024, Back to Basics (RLOO): leave-one-out baseline, KL penalty in the reward.
    "rloo": dict(baseline="leave_one_out", scale="none", loss_agg="seq_mean_token_mean",
                 kl_coef=0.05, kl_estimator="k1", kl_placement="reward"),
    # Hu 2025, REINFORCE++ (arXiv 2501.03262): k1 KL per token in the reward, reward-to-go returns,
    # whitened over all tokens of the batch (no other baseline), token-level loss.
    "reinforce_pp": dict(baseline="none", scale="none", adv_whiten="token_returns", loss_agg="token_mean",
                         kl_coef=0.01, kl_estimator="k1", kl_placement="reward"),
    # Liu et al. 2025, Tricks or Traps? Part I (Lite PPO): group mean, batch std, token-level loss.
    "lite_ppo": dict(baseline="group_mean", scale="batch", loss_agg="token_mean", kl_coef=0.0),
    # REINFORCE++-baseline (Hu 2025; OpenRLHF's reinforce_baseline): group mean, then whitening over all
    # tokens of the batch (re-centred), KL k2 in the loss (coefficient of OpenRLHF's script).
    "reinforce_pp_baseline": dict(baseline="group_mean", scale="none", adv_whiten="token", loss_agg="token_mean",
                                  kl_coef=1e-5, kl_estimator="k2", kl_placement="loss"),
    # MiniMax 2025, MiniMax-M1 (arXiv 2506.13585): CISPO, token-level loss, no KL, with DAPO's dynamic
    # sampling; the IS-weight cap 5 is TRL's and SkyRL's value (the M1 value is not in the paper text).
    "cispo": dict(policy_loss="cispo", cispo_cap=5.0, baseline="group_mean", scale="group", loss_agg="token_mean",
                  kl_coef=0.0, dynamic_sampling=True),
    # Zheng et al. 2025, Group Sequence Policy Optimization (Qwen3, arXiv 2507.18071): sequence-level
    # ratio (length-normalised), clip range 3e-4 / 4e-4, group advantages, per-sequence mean, no KL.
    "gspo": dict(ratio_level="sequence", eps_low=3e-4, eps_high=4e-4, baseline="group_mean", scale="group",
                 loss_agg="seq_mean_token_mean", kl_coef=0.0),
    # Khatri et al. 2025, The Art of Scaling RL Compute for LLMs (ScaleRL, arXiv 2510.13786): CISPO
    # (cap 5), group mean with batch-level std, zero-variance filtering (dead groups dropped, not
    # resampled: one generation round), no KL. Its prompt-level loss average is not an aggregation
    # here: token_mean is the nearest; logits are always upcast to fp32 for log-probs.
    "scalerl": dict(policy_loss="cispo", cispo_cap=5.0, baseline="group_mean", scale="batch", loss_agg="token_mean",
                    dynamic_sampling=True, max_gen_rounds=1, kl_coef=0.0),
    # Schulman et al. 2017, PPO (arXiv 1707.06347), as RLHF trainers run it (Ouyang et al. 2022; TRL's PPO
    # defaults): a learned critic, GAE gamma 1 lambda 0.95 whitened over tokens, value clip 0.2, value-loss
    # coefficient 0.1, k1 KL per token in the reward, token-mean loss, 4 minibatches per rollout.
    "ppo": dict(baseline="none", scale="none", adv_whiten="gae", gae_gamma=1.0, gae_lambda=0.95, value_clip=0.2,
                vf_coef=0.1, loss_agg="token_mean", eps_low=0.2, eps_high=0.2, kl_coef=0.05, kl_estimator="k1",
                kl_placement="reward", minibatches=4),
    # Rejection-sampling fine-tuning (RAFT, Dong et al. 2023; Xiong et al. 2025): SFT on rewarded samples.
    "raft": dict(policy_loss="raft", baseline="none", scale="none", kl_coef=0.0),
}
