"""PPO with a learned critic: GAE, the clipped value loss and explained variance against hand-computed
numbers, then the `ppo` preset through the real loop (toy: learns, G = 1, resumes identically, execution-
independent; tiny LM: a few steps)."""

import pytest
import torch
from conftest import crash_training_at
from torch.testing import assert_close

import ablate.train.trainer as trainer
from ablate.config import ConfigError, load, parse
from ablate.rl.advantages import gae, outcome_token_rewards, whiten
from ablate.rl.values import explained_variance, value_loss
from ablate.runs.metrics import is_defined
from ablate.runs.store import RunStore

f64 = torch.float64


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread (the CPU is shared), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def toy(*overrides):
    return load("configs/toy.yaml", ["tracking.wandb.mode=disabled", "preset=ppo", "recipe.kl_coef=0",
                                     "recipe.critic_lr=0.1", *overrides])


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


def strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


# --- the math, hand-computed -------------------------------------------------------------------------

def test_gae_worked_example():
    r = torch.tensor([[0.0, 0.0, 1.0]], dtype=f64)
    v = torch.tensor([[0.5, 0.6, 0.8]], dtype=f64)
    m = torch.ones(1, 3, dtype=torch.bool)
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.95)
    assert_close(adv, torch.tensor([[0.4705, 0.3900, 0.2000]], dtype=f64), atol=1e-4, rtol=0)
    assert_close(ret, torch.tensor([[0.9705, 0.9900, 1.0000]], dtype=f64), atol=1e-4, rtol=0)
    adv1, _ = gae(r, v, m, gamma=1.0, lam=1.0)  # lambda = 1: Monte-Carlo return - V
    assert_close(adv1, torch.tensor([[0.5, 0.4, 0.2]], dtype=f64), atol=1e-12, rtol=0)
    assert_close(whiten(adv, m, ddof=1, eps=0.0), torch.tensor([[0.8424, 0.2628, -1.1052]], dtype=f64),
                 atol=1e-4, rtol=0)


def test_gae_carries_across_masked_tokens_and_padding():
    """A masked token inside a row (tool output) takes no TD step; padding after the end is ignored."""
    r = torch.tensor([[0.0, 7.0, 0.0, 1.0, 5.0]], dtype=f64)  # garbage rewards at masked positions
    v = torch.tensor([[0.5, 9.0, 0.6, 0.8, 3.0]], dtype=f64)
    m = torch.tensor([[1, 0, 1, 1, 0]], dtype=torch.bool)
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.95)
    assert_close(adv[m], torch.tensor([0.4705, 0.3900, 0.2000], dtype=f64), atol=1e-4, rtol=0)
    assert_close(ret[m], torch.tensor([0.9705, 0.9900, 1.0000], dtype=f64), atol=1e-4, rtol=0)
    assert (adv[~m] == 0).all() and (ret[~m] == 0).all()
    # gamma < 1 discounts the bootstrap: delta_2 = 1 - 0.8, delta_1 = 0.9 * 0.8 - 0.6, delta_0 = 0.9 * 0.6 - 0.5
    adv_g, _ = gae(r, v, m, gamma=0.9, lam=1.0)
    d = [0.9 * 0.6 - 0.5, 0.9 * 0.8 - 0.6, 0.2]
    expect = [d[0] + 0.9 * (d[1] + 0.9 * d[2]), d[1] + 0.9 * d[2], d[2]]
    assert_close(adv_g[m], torch.tensor(expect, dtype=f64), atol=1e-12, rtol=0)


def test_gae_with_a_zero_critic_and_lambda_one_is_reinforce_pp():
    """Conformance with the REINFORCE++ estimator: V = 0, gamma = lambda = 1 gives the reward-to-go returns,
    and whitened, exactly REINFORCE++'s advantages (same token rewards, same whitening)."""
    from ablate.rl.advantages import reinforce_pp_advantages, token_returns

    g = torch.Generator().manual_seed(0)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    kl, R = torch.randn(4, 4, generator=g, dtype=f64), torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=f64)
    tr = outcome_token_rewards(R, m, kl, 0.1)
    adv, ret = gae(tr, torch.zeros(4, 4, dtype=f64), m, gamma=1.0, lam=1.0)
    assert_close(adv, token_returns(tr, m), atol=1e-12, rtol=0)
    assert_close(ret, adv, atol=0, rtol=0)
    assert_close(whiten(adv, m, ddof=0), reinforce_pp_advantages(R, m, kl, 0.1, ddof=0), atol=1e-12, rtol=0)


def test_outcome_token_rewards_put_the_reward_last_and_the_kl_everywhere():
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    kl = torch.tensor([[0.1, -0.05, 0.2, 9.0], [0.3, 0.0, 9.0, 9.0]], dtype=f64)
    tr = outcome_token_rewards(torch.tensor([1.0, 0.0], dtype=f64), m, kl, 0.1)
    assert_close(tr[m], torch.tensor([-0.01, 0.005, 0.98, -0.03, 0.0], dtype=f64), atol=1e-12, rtol=0)


def test_value_loss_worked_example():
    v_old = torch.tensor([[0.5, 0.6, 0.8]], dtype=f64)
    ret = torch.tensor([[0.9705, 0.9900, 1.0000]], dtype=f64)
    v = torch.tensor([[0.90, 0.70, 0.85]], dtype=f64, requires_grad=True)
    m = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = value_loss(v, v_old, ret, m, value_clip=0.2)
    assert loss.item() == pytest.approx(0.0300, abs=1e-4)
    assert stats["clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # token 0: the clipped term is in use and V_clip sits at its bound -> no gradient; the others (V - R) / 3
    assert_close(v.grad, torch.tensor([[0.0, (0.70 - 0.99) / 3, (0.85 - 1.0) / 3]], dtype=f64), atol=1e-12, rtol=0)
    plain, st = value_loss(v.detach(), v_old, ret, m, value_clip=None)
    assert plain.item() == pytest.approx((0.0050 + 0.0841 + 0.0225) / 6, abs=1e-4) and st["clipfrac"] == 0


def test_explained_variance_worked_example():
    ret = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    v = torch.tensor([[0.7, 0.2, 0.9, 0.4]])
    m = torch.ones(1, 4, dtype=torch.bool)
    assert explained_variance(ret, v, m).item() == pytest.approx(0.7100, abs=1e-4)
    assert explained_variance(ret, ret, m).item() == pytest.approx(1.0)
    assert explained_variance(torch.ones(1, 4), v, m).isnan()  # returns without variance: undefined


# --- config ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,field", [
    ({"adv_whiten": "gae"}, "recipe.adv_whiten='gae': the critic is the baseline"),
    ({"preset_": "ppo", "kl_placement": "loss"}, "kl_placement='reward'"),
    ({"preset_": "ppo", "value_clip": 0.0}, "recipe.value_clip"),
    ({"preset_": "ppo", "gae_lambda": 1.5}, "recipe.gae_lambda: 1.5 is not allowed; allowed: a number in \\[0, 1\\]"),
    ({"preset_": "ppo", "vf_coef": 0.0}, "recipe.vf_coef"),
    ({"preset_": "ppo", "critic_lr": -1.0}, "recipe.critic_lr"),
])
def test_validate_rejects(recipe, field):
    preset = recipe.pop("preset_", None)
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        parse({"preset": preset, "recipe": recipe})


def test_ppo_preset():
    r = parse({"preset": "ppo"}).recipe
    assert (r.adv_whiten, r.baseline, r.scale, r.kl_placement, r.gae_gamma, r.gae_lambda, r.minibatches) == (
        "gae", "none", "none", "reward", 1.0, 0.95, 4)


# --- through the loop --------------------------------------------------------------------------------

def test_ppo_learns_on_the_toy_and_logs_defined_critic_metrics(tmp_path):
    store = run(toy("steps=30", "eval.every=30"), tmp_path)
    evals = [r["eval/pass@1_exact"] for r in store.read("evals")]
    assert evals[-1] > evals[0] + 0.3, evals
    rows = store.read("metrics")
    names = {k for r in rows for k in r}
    assert {"critic/value_loss", "critic/clipfrac", "critic/explained_variance", "critic/value_mean"} <= names
    assert all(is_defined(n) for n in names if n != "step")
    assert rows[0]["critic/value_mean"] == 0.0  # the table starts at 0
    assert rows[-1]["critic/explained_variance"] > 0.2  # the critic has learned something
    assert 0.3 < rows[-1]["critic/value_mean"] < 1.0


def test_ppo_with_one_completion_per_prompt(tmp_path):
    store = run(toy("recipe.group_size=1", "prompts_per_step=64", "steps=15", "eval.every=15"), tmp_path)
    evals = [r["eval/pass@1_exact"] for r in store.read("evals")]
    assert evals[-1] > evals[0] + 0.2, evals
    assert all(r["train/dead_group_frac"] != r["train/dead_group_frac"] for r in store.read("metrics"))  # NaN


def test_ppo_resumes_identically(tmp_path, monkeypatch):
    cfg = toy("steps=8", "checkpoint_every=4", "eval.every=4")
    whole = run(cfg, tmp_path / "whole")
    crash_training_at(monkeypatch, cfg, tmp_path / "resumed", step=6)
    resumed = run(cfg, tmp_path / "resumed")
    assert [r["step"] for r in resumed.read("metrics")] == list(range(1, 9))
    assert strip_timing(resumed.read("metrics")) == strip_timing(whole.read("metrics"))
    assert resumed.read("evals") == whole.read("evals")


def test_ppo_does_not_depend_on_micro_batches(tmp_path):
    """The critic's fit accumulates micro-batches like the policy's update: the same numbers."""
    rows = [strip_timing(run(toy("steps=3", "eval.every=0", f"compute.micro_batch_tokens={b}"),
                             tmp_path / str(b)).read("metrics")) for b in (0, 9)]
    for a, b in zip(*rows):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k


def test_ppo_on_the_tiny_model_runs_and_resumes(tmp_path, monkeypatch):
    """The value model is a copy of the policy with a scalar head; its weights and AdamW state are in the
    checkpoint, and a run resumed from it repeats the uninterrupted one."""
    def lm(preset, steps):
        return parse({"preset": preset, "tracking": {"wandb": {"mode": "disabled"}},
                      "task": {"num_train": 64, "num_heldout": 8, "digits": [1], "operators": ["+"]},
                      "prompts_per_step": 4, "steps": steps, "checkpoint_every": 2, "device": "cpu",
                      "eval": {"every": 0, "n_samples": 2, "ks": [1, 2]},
                      "recipe": {"group_size": 2, "max_new_tokens": 6, "minibatches": 2}})

    cfg = lm("ppo", 3)
    whole = run(cfg, tmp_path / "whole")
    grpo = run(lm("grpo", 1), tmp_path / "grpo")
    assert whole.read("evals")[0] == grpo.read("evals")[0]  # building the critic draws nothing: paired arms
    rows = whole.read("metrics")
    assert len(rows) == 3 and rows[0]["critic/value_mean"] == 0.0  # zero-initialised head
    assert rows[-1]["critic/value_mean"] != 0.0 and rows[-1]["train/reward_kl_mean"] != 0.0
    ckpt = whole.load_checkpoint()
    assert {"trunk", "head"} <= set(ckpt["critic"]["weights"]) and ckpt["critic"]["optimizer"]["state"]
    crash_training_at(monkeypatch, cfg, tmp_path / "resumed", step=3)
    resumed = run(cfg, tmp_path / "resumed")
    assert strip_timing(resumed.read("metrics")) == strip_timing(rows)
