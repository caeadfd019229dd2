"""Recipe keys of the policy-loss registry, token selection, advantage shaping and reward controls:
config validation, the trainer glue (ablate/train/recipes.py) and short toy runs through the real loop."""

import pytest
import torch
from torch.testing import assert_close

import ablate.train.trainer as trainer
from ablate.config import ConfigError, load, parse
from ablate.rl.losses import POLICY_LOSSES
from ablate.runs.metrics import is_defined
from ablate.runs.store import RunStore
from ablate.train import recipes
from ablate.train.plan import plan_step


def toy(*overrides):
    return load("configs/toy.yaml", ["tracking.wandb.mode=disabled", *overrides])


def run(cfg, path):
    assert trainer.train(cfg, str(path), progress=False) == "completed"
    return RunStore(path)


# --- config ------------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,field", [
    ({"policy_loss": "gmpo", "ratio_level": "sequence"}, "recipe.ratio_level"),
    ({"policy_loss": "cispo", "dual_clip": 3.0}, "recipe.dual_clip"),
    ({"policy_loss": "delta", "delta": 1.1, "eps_high": 0.28}, "recipe.delta"),
    ({"cispo_cap": 0.0}, "recipe.cispo_cap"),
    ({"gmpo_eps": -0.1}, "recipe.gmpo_eps"),
    ({"tau_neg": 0.0}, "recipe.tau_neg"),
    ({"clip_cov_lb": 5.0, "clip_cov_ub": 1.0}, "recipe.clip_cov_lb"),
    ({"kl_cov_frac": 20.0}, "recipe.kl_cov_frac"),
    ({"policy_loss": "raft"}, "recipe.policy_loss='raft'"),
    ({"policy_loss": "gmpo", "token_selection": "top_entropy"}, "recipe.token_selection"),
    ({"entropy_quantile": 0.0}, "recipe.entropy_quantile"),
    ({"adv_clip": 0.0}, "recipe.adv_clip"),
    ({"pos_nll_coef": -1.0}, "recipe.pos_nll_coef"),
    ({"neg_adv_weight": -1.0}, "recipe.neg_adv_weight"),
])
def test_validate_rejects(recipe, field):
    with pytest.raises(ConfigError, match=field.replace("(", r"\(")):
        parse({"recipe": recipe})


def test_unknown_policy_loss_lists_allowed():
    with pytest.raises(ConfigError, match="allowed values: 'ppo_clip', 'cispo'"):
        parse({"recipe": {"policy_loss": "ppo2"}})
    with pytest.raises(ConfigError, match="'verifier', 'random', 'inverted'"):
        parse({"task": {"reward_mode": "oracle"}})


def test_valid_recipes_parse():
    parse({"recipe": {"policy_loss": "delta", "delta": 4.0, "eps_high": 0.28}})
    parse({"recipe": {"policy_loss": "raft", "baseline": "none", "scale": "none"}})
    parse({"recipe": {"policy_loss": "cispo", "ratio_level": "sequence", "token_selection": "top_entropy"}})


# --- glue ----------------------------------------------------------------------------------------

def test_step_generator_depends_on_seed_and_step_only():
    draw = lambda s, t: torch.randperm(100, generator=recipes.step_generator(s, t))  # noqa: E731
    assert torch.equal(draw(0, 3), draw(0, 3))
    assert not torch.equal(draw(0, 3), draw(0, 4)) and not torch.equal(draw(0, 3), draw(1, 3))


def test_shape_advantages_hand_example():
    adv = torch.tensor([2.0, -3.0, 0.0, 0.5])
    assert torch.equal(recipes.shape_advantages(adv, pos_weight=1.0, neg_weight=1.0, clip=None), adv)
    assert_close(recipes.shape_advantages(adv, pos_weight=0.5, neg_weight=2.0, clip=2.5),
                 torch.tensor([1.0, -2.5, 0.0, 0.25]), atol=0, rtol=0)
    shape = plan_step(parse({"recipe": {"pos_adv_weight": 0.5, "neg_adv_weight": 2.0, "adv_clip": 2.5}}), 1)
    assert_close(shape.shape_advantages(adv), torch.tensor([1.0, -2.5, 0.0, 0.25]), atol=0, rtol=0)


def test_token_weight_is_the_selection_times_the_is_weights():
    selected = torch.tensor([[True, False], [True, True]])
    w = torch.tensor([[0.5, 2.0], [1.0, 0.25]], requires_grad=True)
    assert recipes.token_weight(None, None) is None and recipes.token_weight(selected, None) is selected
    assert_close(recipes.token_weight(None, w), w.detach()) and not recipes.token_weight(None, w).requires_grad
    assert_close(recipes.token_weight(selected, w), torch.tensor([[0.5, 0.0], [1.0, 0.25]]), atol=0, rtol=0)


# --- toy runs through the real loop ------------------------------------------------------------

OFF_POLICY = ("recipe.minibatches=4", "steps=40", "eval.every=20")


@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES if n != "raft"])
def test_every_policy_loss_learns_on_the_toy(tmp_path, name):
    store = run(toy(f"recipe.policy_loss={name}", *OFF_POLICY), tmp_path)
    evals = [r["eval/pass@1_exact"] for r in store.read("evals")]
    assert evals[-1] > evals[0] + 0.2, evals
    names = {k for log in ("metrics", "evals") for r in store.read(log) for k in r if k != "step"}
    assert all(is_defined(n) for n in names), sorted(n for n in names if not is_defined(n))


def test_on_policy_every_loss_is_the_same_gradient(tmp_path):
    # one update per rollout: rho = 1, so cispo / sapo / gpg give PPO's gradient and the same run
    base = [r["eval/pass@1_exact"] for r in run(toy("steps=10", "eval.every=5"), tmp_path / "ppo").read("evals")]
    for name in ("cispo", "sapo", "gpg"):
        other = run(toy(f"recipe.policy_loss={name}", "steps=10", "eval.every=5"), tmp_path / name)
        assert [r["eval/pass@1_exact"] for r in other.read("evals")] == pytest.approx(base, abs=1e-6)


def test_raft_and_selection_and_shaping_learn(tmp_path):
    # top-entropy selection learns much more slowly on the toy (2 tokens per completion: only the
    # highest-entropy 20 % of them carry a gradient), so its bar is lower
    for i, (over, gain) in enumerate([(("recipe.policy_loss=raft", "recipe.baseline=none", "recipe.scale=none"), 0.2),
                                      (("recipe.token_selection=top_entropy",), 0.02),
                                      (("recipe.pos_nll_coef=0.1", "recipe.adv_clip=1.0", "recipe.neg_adv_weight=0.5"),
                                       0.2)]):
        evals = [r["eval/pass@1_exact"] for r in run(toy(*over, *OFF_POLICY), tmp_path / str(i)).read("evals")]
        assert evals[-1] > evals[0] + gain, (over, evals)


def test_reward_controls(tmp_path):
    final = {}
    for mode in ("verifier", "random", "inverted"):
        store = run(toy(f"task.reward_mode={mode}", "steps=40", "eval.every=0"), tmp_path / mode)
        final[mode] = store.read("evals")[-1]["eval/pass@1_exact"]
        start = store.read("evals")[0]["eval/pass@1_exact"]
    assert final["verifier"] > start + 0.2, final
    assert final["inverted"] < start  # trained away from the answer
    assert abs(final["random"] - start) < 0.1, final  # no signal: pass@1 drifts, does not climb


# --- REINFORCE++ and presets ------------------------------------------------------------------

def test_reinforce_pp_presets():
    from ablate.config import PRESETS

    rpp = parse({"preset": "reinforce_pp"}).recipe
    assert (rpp.baseline, rpp.scale, rpp.adv_whiten, rpp.kl_placement, rpp.kl_estimator) == (
        "none", "none", "token_returns", "reward", "k1")
    base = parse({"preset": "reinforce_pp_baseline"}).recipe
    assert (base.baseline, base.adv_whiten, base.kl_placement, base.kl_estimator) == ("group_mean", "token", "loss", "k2")
    for name in PRESETS:
        parse({"preset": name})  # every preset is a valid config on the default task
    with pytest.raises(ConfigError, match="token_returns"):
        parse({"recipe": {"adv_whiten": "token_returns"}})  # group baseline with raw returns


def test_token_level_advantages_through_the_loop(tmp_path):
    for i, whiten in enumerate(("token", "token_returns")):
        over = ["recipe.baseline=none", "recipe.scale=none"] if whiten == "token_returns" else []
        store = run(toy(f"recipe.adv_whiten={whiten}", *over, *OFF_POLICY), tmp_path / whiten)
        evals = [r["eval/pass@1_exact"] for r in store.read("evals")]
        assert evals[-1] > evals[0] + 0.2, (whiten, evals)


def test_group_size_one_reports_dead_groups_as_not_applicable(tmp_path):
    store = run(toy("recipe.group_size=1", "prompts_per_step=64", "recipe.baseline=none", "recipe.scale=none",
                    "recipe.adv_whiten=token", "steps=3", "eval.every=0"), tmp_path)
    rows = store.read("metrics")
    assert all(r["train/dead_group_frac"] != r["train/dead_group_frac"] for r in rows)  # NaN


def test_new_metrics_by_hand():
    from ablate.rl.losses import policy_diagnostics

    old = torch.tensor([[0.2, 0.5, 0.4, 1.0], [0.1, 0.5, 0.25, 0.1]], dtype=torch.float64).log()
    new = torch.tensor([[0.3, 0.5, 0.28, 1.0], [0.13, 0.3, 0.275, 0.5]], dtype=torch.float64).log()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    h = torch.tensor([[0.10, 0.30, 2.00, 9.0], [0.05, 0.20, 1.50, 0.90]], dtype=torch.float64)
    d = policy_diagnostics(new, old, torch.tensor([1.0, -0.5], dtype=torch.float64), mask, h)
    assert d["policy/entropy_adv_cov"].item() == pytest.approx(0.0920, abs=1e-4)  # with logp
    rho = torch.tensor([1.5, 1.0, 0.7, 1.3, 0.6, 1.1, 5.0], dtype=torch.float64)
    assert d["ppo_kl"].item() == pytest.approx(float((rho - 1 - rho.log()).mean()), abs=1e-12)
    assert d["high_entropy_token_frac"].item() == pytest.approx(3 / 7)  # 2.0, 1.5, 0.9 > 0.672


def test_toy_logs_maj_at_k_and_new_metrics(tmp_path):
    store = run(toy("steps=3", "eval.every=0"), tmp_path)
    ev, m = store.read("evals")[-1], store.read("metrics")[-1]
    assert 0 <= ev["eval/maj@1"] <= 1 and ev["eval/maj@1"] == pytest.approx(ev["eval/pass@1"], abs=0.2)
    assert ev["eval/maj@8"] >= 0 and {"policy/entropy_adv_cov", "train/ppo_kl", "train/adv_abs_max",
                                      "train/terminated_len_mean", "train/high_entropy_token_frac"} <= set(m)
    assert m["train/ppo_kl"] == 0.0  # one on-policy update per rollout


# --- regularisation dynamics: adaptive KL and reference resets -----------------------------------

def test_adaptive_kl_worked_example():
    beta, out = 0.05, []
    for kl in (0.02, 0.08, 0.15, 0.40):
        beta = recipes.adaptive_kl_coef(beta, kl, target=0.1, horizon=10000, n_samples=512)
        out.append(beta)
    assert out == pytest.approx([0.049488, 0.048981, 0.049483, 0.049990], abs=1e-6)
    # the paper's K_beta = 0.1 per update is horizon = n_samples * 10
    assert recipes.adaptive_kl_coef(0.05, 0.02, 0.1, 5120, 512) == pytest.approx(0.049, abs=1e-9)


def test_regularisation_keys_validated():
    with pytest.raises(ConfigError, match="recipe.ref_reset_every"):
        parse({"recipe": {"ref_reset_every": 5, "kl_coef": 0.0}})
    with pytest.raises(ConfigError, match="recipe.kl_target"):
        parse({"recipe": {"kl_target": 0.1, "kl_coef": 0.0}})


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    return tiny_model_dir


def lm(model_dir, steps, **recipe):
    return parse({"model": {"path": model_dir}, "seed": 1,  # seed 0: all groups dead early under the row noise
                  "tracking": {"wandb": {"mode": "disabled"}},
                  "task": {"num_train": 64, "num_heldout": 8, "digits": [1], "operators": ["+"], "gameable": True},
                  "prompts_per_step": 4, "steps": steps, "checkpoint_every": 0,
                  "eval": {"every": 0, "n_samples": 2, "ks": [1, 2]},
                  "recipe": {"group_size": 4, "max_new_tokens": 6, "kl_coef": 0.04, **recipe}})


def test_reference_reset_restarts_the_kl(tiny_lm, tmp_path):
    rows = run(lm(tiny_lm, 4, ref_reset_every=2), tmp_path).read("metrics")
    assert [r["kl/ref_resets"] for r in rows] == [0, 1, 1, 2]
    assert [r["kl/steps_since_reset"] for r in rows] == [1, 0, 1, 0]
    assert rows[1]["train/kl"] > 0  # the policy moved away from the base model after step 1
    assert abs(rows[2]["train/kl"]) < 1e-6  # right after the reset: reference = policy at the first minibatch


def test_adaptive_kl_moves_the_coefficient(tiny_lm, tmp_path):
    rows = run(lm(tiny_lm, 3, kl_target=1e-6, kl_horizon=16), tmp_path).read("metrics")
    coefs = [r["kl/coef"] for r in rows]
    assert coefs[0] == 0.04
    # KL above the target after step 1: the coefficient grows by at most 1 + 0.2 * 16 / 16 per step
    assert coefs[2] > coefs[1] and coefs[2] <= coefs[1] * 1.2 + 1e-12
