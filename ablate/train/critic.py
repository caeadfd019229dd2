"""PPO's learned critic in the loop (`recipe.adv_whiten: gae`; Schulman et al. 2017, arXiv 1707.06347).

Per step, before the policy update (the critic and the policy updates are independent given the
rollout, so the order does not matter):

    V_old = critic(rollout)                       no grad, [N,T], the value of the prefix before token t
    r_it  = 1[t = last] R_i - beta kl_it          outcome reward, per-token KL when kl_placement='reward'
    A, R  = gae(r, V_old, gamma, lambda)          ablate/rl/advantages.py; A whitened over counted tokens
    fit V to R: update_epochs x minibatches AdamW steps of vf_coef * clipped value loss (rl/values.py)

The value model. For a language model: a separate copy of the policy's network (initialised from the
policy, as veRL, OpenRLHF and TRL's PPO do) with a scalar linear head on its final hidden states, read
at the positions of logp through the policy's own `features` (so micro-batches, the shared-prompt
forward, gradient checkpointing and LoRA work unchanged; under LoRA the copy trains its own adapters).
Not a head on the policy's trunk: a shared trunk saves a model copy but couples the two losses through
vf_coef (value gradients reshape the policy's features; Cobbe et al. 2020, Phasic Policy Gradient,
arXiv 2009.04416) and would put the critic inside the policy's update. The copy's lm-head is unused
(no extra memory with tied embeddings). For the toy: a table, one value per state, i.e. per (prompt,
position, prefix): v0[prompt] before the tens token, v1[prompt, tens] before the ones token.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

from ablate.config import RunConfig
from ablate.rl import losses
from ablate.rl.advantages import gae, outcome_token_rewards, whiten
from ablate.rl.sampling import Rollout
from ablate.rl.stats import masked_mean
from ablate.rl.values import explained_variance, value_loss
from ablate.train import distributed, execution
from ablate.train.models import load_weights, trained_weights
from ablate.train.plan import StepPlan
from ablate.train.recipes import step_generator


class ToyValues(nn.Module):
    """Tabular values of the toy's states: v0 [P] (prompt) and v1 [P, 10] (prompt, tens token), from 0."""

    def __init__(self, policy):
        super().__init__()
        self.index = policy.index
        P = policy.first.shape[0]
        self.v0 = nn.Parameter(torch.zeros(P, dtype=policy.first.dtype))
        self.v1 = nn.Parameter(torch.zeros(P, 10, dtype=policy.first.dtype))

    def forward(self, rollout: Rollout) -> Tensor:  # [N, 2]
        rows, tens = rollout.prompt_ids[:, 0], rollout.completion_ids[:, 0]
        return torch.stack([self.v0[rows], self.v1[rows, tens]], dim=1)

    def weights(self) -> dict:
        return self.state_dict()

    def load_weights(self, state: dict) -> None:
        self.load_state_dict(state)


class LMValues(nn.Module):
    """A copy of the policy's causal LM (`trunk`) and a scalar head on its final hidden states, [N, T]."""

    def __init__(self, policy):
        super().__init__()
        from ablate.train.rollout import LMPolicy

        self.trunk = copy.deepcopy(policy.module)
        self.scorer = LMPolicy(self.trunk, policy.tokenizer, policy.device, policy.autocast_dtype)
        hidden = self.trunk.config.get_text_config().hidden_size
        # fp32 head, zero init (V = 0 at the start); skip_init: no draw from the global RNG, so the run's
        # sampling stream (and its step-0 evaluation) is the one every other arm of the seed sees
        self.head = nn.utils.skip_init(nn.Linear, hidden, 1, device=policy.device)
        with torch.no_grad():
            self.head.weight.zero_()
            self.head.bias.zero_()

    def forward(self, rollout: Rollout) -> Tensor:
        h = self.scorer.features(rollout)  # [n, T, H]
        with torch.autocast(h.device.type, enabled=False):
            v = self.head(h.float()).squeeze(-1)  # [n, T]
        return torch.where(rollout.completion_mask.bool(), v, torch.zeros((), dtype=v.dtype, device=v.device))

    def weights(self) -> dict:  # the trunk as the policy's checkpoint holds it (adapters only under LoRA)
        return {"trunk": trained_weights(self.trunk), "head": self.head.state_dict()}

    def load_weights(self, state: dict) -> None:
        load_weights(self.trunk, state["trunk"])
        self.head.load_state_dict(state["head"])


class Critic:
    """The value model, its optimiser, and the per-step GAE + value fit, as the step plan says."""

    def __init__(self, model: nn.Module, lr: float, weight_decay: float):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    @torch.no_grad()
    def values(self, rollout: Rollout, budget: int, chunk: int = 256) -> Tensor:
        """V_old [N, T] of the whole rollout, no grad, in micro-batches (as the old log-probs): each rank
        scores its share of the rows, all ranks get all of them."""
        N, T = rollout.completion_ids.shape
        rows = torch.arange(N)[distributed.split(N)]
        out = torch.zeros(len(rows), T, dtype=torch.float64, device=rollout.completion_ids.device)
        with distributed.failing_together():
            for idx, sub in execution.micro_batches(rollout, rows, budget, max_rows=chunk) if len(rows) else ():
                v = self.model(sub)
                out[(idx - rows[0]).to(out.device), :v.shape[1]] = v.double()
        return distributed.gather_rows(out)

    def step(self, plan: StepPlan, rollout: Rollout, task_rewards: Tensor, kl_tok: Tensor | None, kl_coef: float,
             loss_mask: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Token-level whitened GAE advantages [N, T] for the policy loss, after fitting the critic to the
        step's returns; and the step's critic/* metrics. task_rewards [B, G] (before KL), kl_tok [N, T]
        (KL in the reward, else None), loss_mask [N, T] the tokens the losses count."""
        c, m = plan.critic, loss_mask.bool()
        old_values = self.values(rollout, plan.micro_batch_tokens)  # [N, T]
        token_r = outcome_token_rewards(task_rewards.flatten().to(old_values), m, kl_tok, kl_coef)
        raw, returns = gae(token_r, old_values, m, c.gamma, c.lam)
        row = self.fit(plan, rollout, old_values, returns, m)
        row.update({"critic/explained_variance": float(explained_variance(returns, old_values, m)),
                    "critic/value_mean": float(masked_mean(old_values, m)),
                    "critic/return_mean": float(masked_mean(returns, m))})
        return whiten(raw, m, c.ddof, c.eps), row

    def fit(self, plan: StepPlan, rollout: Rollout, old_values: Tensor, returns: Tensor, loss_mask: Tensor
            ) -> dict[str, float]:
        """plan.epochs x plan.minibatches optimiser steps on the clipped value loss (token mean over each
        minibatch), accumulated over micro-batches exactly as the policy's update is; with several ranks
        split as it is too: each rank back-propagates its share of every minibatch's rows, weighted
        against the whole minibatch's tokens, and the ranks' gradients are summed before clipping."""
        c, N = plan.critic, len(rollout)
        gen = step_generator(plan.seed, plan.step)  # the critic's own minibatch order: the global RNG is untouched
        logs: dict[str, list[float]] = {}
        for _ in range(plan.epochs):
            for idx in torch.randperm(N, generator=gen).split(math.ceil(N / plan.minibatches)):
                self.optimizer.zero_grad(set_to_none=True)
                minibatch_mask, parts = loss_mask[idx], []
                mine = idx[distributed.split(len(idx))]  # this rank's rows (all of them at world size 1)
                micro = execution.micro_batches(rollout, mine, plan.micro_batch_tokens) if len(mine) else ()
                with distributed.failing_together():
                    for mb, sub in micro:
                        v = self.model(sub)  # [n, t]
                        t = v.shape[1]
                        mb = mb.to(loss_mask.device)
                        micro_mask = loss_mask[mb, :t]
                        loss, stats = value_loss(v, old_values[mb, :t], returns[mb, :t], micro_mask, value_clip=c.value_clip)
                        w = losses.micro_weight("token_mean", micro_mask, minibatch_mask, plan.loss.max_len,
                                                loss.dtype)
                        (c.vf_coef * loss * w).backward()
                        w_tok = micro_mask.sum() / minibatch_mask.sum().clamp(min=1)
                        parts.append((w, w_tok, {"value_loss": loss, **stats}))
                distributed.sum_gradients(self.params)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, plan.grad_clip or float("inf"))
                self.optimizer.step()
                row = {**distributed.reduce_stats(execution.combine_stats(parts, ("value_loss",))),
                       "grad_norm": grad_norm}
                for k, v in row.items():
                    logs.setdefault(k, []).append(float(v))
        return {f"critic/{k}": sum(v) / len(v) for k, v in logs.items()}

    def state_dict(self) -> dict:
        return {"weights": self.model.weights(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_weights(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])


def build_critic(cfg: RunConfig, plan: StepPlan, policy) -> Critic | None:
    """The critic when the plan has one (`recipe.adv_whiten == 'gae'`), else None."""
    if plan.critic is None:
        return None
    model = ToyValues(policy) if cfg.task.name == "toy_addition" else LMValues(policy)
    return Critic(model, plan.critic.lr, cfg.optim.weight_decay)


def critic_state(critic: Critic | None) -> dict:
    """The checkpoint entry of the critic: {} without one."""
    return {} if critic is None else {"critic": critic.state_dict()}
