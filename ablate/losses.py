"""The policy-loss registry at its public address: `ablate.losses.POLICY_LOSSES[name](logp, old_logp,
advantages, mask, *, agg, max_len, **params) -> (loss, stats)`, with `ppo_clip` equal to `policy_loss`.
The implementation (and every other loss component) lives in ablate/rl/losses.py."""

from ablate.rl.losses import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, policy_loss

__all__ = ["AGGREGATIONS", "KL_ESTIMATORS", "POLICY_LOSSES", "policy_loss"]
