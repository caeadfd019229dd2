"""Batch-level token selections (top-entropy, Clip-Cov, KL-Cov): fixed for the step, taken over the whole
batch, and independent of how a step is split into micro-batches; the entropy bonus follows the selection."""

import pytest
import torch

import ablate.train.trainer as trainer
from ablate.config import load, parse
from ablate.rl import losses
from ablate.runs.store import RunStore
from ablate.train.plan import plan_step
from ablate.train.update import update

f64 = torch.float64
# the shared test batch: N = 2, T = 4, row 0 has 3 tokens
OLD = torch.tensor([[0.20, 0.50, 0.40, 1.0], [0.10, 0.50, 0.25, 0.10]], dtype=f64).log()
NEW = torch.tensor([[0.30, 0.50, 0.28, 1.0], [0.13, 0.30, 0.275, 0.50]], dtype=f64).log()
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([1.0, -0.5], dtype=f64)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name,params", [
    ("kl_cov", dict(kl_cov_frac=2e-3, kl_cov_coef=1.0)),
    ("clip_cov", dict(eps_low=0.2, eps_high=0.2, clip_cov_ratio=2e-4, clip_cov_lb=0.5, clip_cov_ub=5.0)),
])
def test_cov_losses_split_by_rows_with_the_whole_batch_selection(name, params):
    """Each row alone as a micro-batch, its loss rescaled by its share of tokens (token mean): with the
    selection of the whole batch passed in, the sum is the one-pass loss; selecting per micro-batch
    (the loss's own fallback) picks a token in row 0 as well and is not."""
    params = losses.LossParams(**params)
    whole, _ = losses.POLICY_LOSSES[name](NEW, OLD, ADV, MASK, agg="token_mean", max_len=4, params=params)
    sel = losses.COV_SELECTIONS[name](NEW, OLD, ADV, MASK, params)
    assert sel.sum() == 1 and sel[1, 0]  # the worked example's token (1, 0)

    def split(selected):
        total = 0.0
        for i in range(2):
            m = MASK[i:i + 1]
            loss, _ = losses.POLICY_LOSSES[name](NEW[i:i + 1], OLD[i:i + 1], ADV[i:i + 1], m, agg="token_mean",
                                                 max_len=4, params=params,
                                                 selected=None if selected is None else selected[i:i + 1])
            total += loss * losses.micro_weight("token_mean", m, MASK, 4, f64)
        return float(total)

    assert split(sel) == pytest.approx(float(whole), abs=1e-12)
    if name == "kl_cov":
        assert split(None) != pytest.approx(float(whole), abs=1e-3)


def toy(*overrides):
    return load("configs/toy.yaml", ["tracking.wandb.mode=disabled", "recipe.minibatches=2", "recipe.update_epochs=2",
                                     "prompts_per_step=4", "steps=3", "eval.every=0", *overrides])


def metrics(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in RunStore(path).read("metrics")]


@pytest.mark.parametrize("arm", [
    ("recipe.token_selection=top_entropy", "recipe.entropy_coef=0.01"),
    ("recipe.policy_loss=kl_cov", "recipe.kl_cov_frac=0.05"),
    ("recipe.policy_loss=clip_cov", "recipe.clip_cov_ratio=0.05", "recipe.clip_cov_lb=-1.0"),
])
def test_selections_do_not_depend_on_micro_batches(tmp_path, arm):
    """3 tokens a row on the toy: a budget of 3 puts every completion in a micro-batch of its own."""
    whole, micro = (metrics(toy(*arm, f"compute.micro_batch_tokens={b}"), tmp_path / str(b)) for b in (0, 3))
    for a, b in zip(whole, micro):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
    if "kl_cov" in arm[0] or "clip_cov" in arm[0]:
        assert all(0 < r["train/cov_select_frac"] < 0.25 for r in whole)


def test_top_entropy_mask_is_fixed_for_the_step(tmp_path, monkeypatch):
    """One selection per step (from the step's first, old-policy forward over the whole rollout), however
    many epochs, minibatches and micro-batches the update takes."""
    calls = []
    real = losses.top_entropy_mask

    def counted(entropies, mask, quantile):
        calls.append(tuple(mask.shape))
        return real(entropies, mask, quantile)

    monkeypatch.setattr(losses, "top_entropy_mask", counted)
    metrics(toy("recipe.token_selection=top_entropy", "compute.micro_batch_tokens=6"), tmp_path)
    assert calls == [(32, 2)] * 3  # the whole rollout (4 prompts x 8), once per step


def _toy_update(selected, entropy_coef):
    """One update of a fresh toy policy with zero advantages: only the entropy bonus has a gradient."""
    from ablate.tasks.toy import ToyPolicy, ToyTask

    cfg = load("configs/toy.yaml", ["tracking.wandb.mode=disabled", "recipe.token_selection=top_entropy",
                                    f"recipe.entropy_coef={entropy_coef}", "optim.optimizer=sgd", "optim.lr=1.0"])
    task = ToyTask(cfg.task)
    policy = ToyPolicy(task)
    ro = policy.sample([p.prompt for p in task.problems("train")[:4]], 2, 1.0, 2)
    opt = torch.optim.SGD(policy.parameters(), lr=1.0)
    before = [p.detach().clone() for p in policy.parameters()]
    # as the loop passes them: the selection weights the loss and carries the entropy bonus
    update(policy, opt, plan_step(cfg, 1), ro, torch.zeros(8), ro.completion_mask, token_weight=selected,
           selected=selected)
    return sum(float((p.detach() - b).abs().sum()) for p, b in zip(policy.parameters(), before))


def test_entropy_bonus_only_on_the_selected_tokens():
    none, first = torch.zeros(8, 2, dtype=torch.bool), torch.zeros(8, 2, dtype=torch.bool)
    first[:, 0] = True
    assert _toy_update(none, 0.1) == 0.0  # nothing selected: no bonus, no step
    assert _toy_update(first, 0.1) > 0.0


def test_the_plan_selects_tokens_by_the_recipe():
    h = torch.tensor([[0.10, 0.30, 2.00, 9.0], [0.05, 0.20, 1.50, 0.90]])
    plain = plan_step(parse({}), 1)
    assert plain.select_tokens is None and not plain.old_entropies
    top = plan_step(parse({"recipe": {"token_selection": "top_entropy"}}), 1)
    assert top.old_entropies and top.old_pass  # the old pass's entropies choose
    assert top.select_tokens(h, MASK).equal(torch.tensor([[0, 0, 1, 0], [0, 0, 1, 0]], dtype=torch.bool))
