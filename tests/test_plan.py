"""The step plan (ablate/train/plan.py): the recipe is read once, in one module per field, and the loop
follows the plan; what the plan resolves each toggle to."""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from ablate.config import AdvWhiten, RecipeConfig, parse
from ablate.rl import losses
from ablate.rl.corrections import IS_CORRECTIONS
from ablate.train import recipes
from ablate.train.plan import plan_step

PKG = Path(__file__).resolve().parents[1] / "ablate"
FIELDS = {f.name for f in dataclasses.fields(RecipeConfig)}
# modules that describe the recipe without running it: its own validation, and the W&B run tags
DESCRIBE = {"config.py", "runs/tracking.py"}
# the loop and everything it calls per step: not one recipe read, not even `.recipe`
LOOP = {"train/trainer.py", "train/update.py", "train/critic.py", "train/offpolicy.py", "train/recipes.py",
        "train/evaluation.py", "train/episodes.py"}


def recipe_reads(source: str) -> Counter:
    """Attribute reads of RecipeConfig fields: `x.recipe.field`, and `name.field` where `name` holds a recipe
    in its function (assigned from `x.recipe`, or a parameter annotated RecipeConfig)."""
    tree, reads, seen = ast.parse(source), Counter(), set()

    def read(node) -> None:
        if id(node) not in seen and isinstance(node, ast.Attribute) and node.attr in FIELDS \
                and isinstance(node.ctx, ast.Load):
            seen.add(id(node))
            reads[node.attr] += 1

    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        names = {a.arg for a in fn.args.args + fn.args.kwonlyargs
                 if a.annotation is not None and "RecipeConfig" in ast.unparse(a.annotation)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets, values = node.targets[0], node.value
                pairs = zip(targets.elts, values.elts) if isinstance(targets, ast.Tuple) and \
                    isinstance(values, ast.Tuple) else [(targets, values)]
                names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and isinstance(v, ast.Attribute)
                          and v.attr == "recipe"}
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                read(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "recipe":
            read(node)
    return reads


def modules():
    for path in sorted(PKG.rglob("*.py")):
        yield str(path.relative_to(PKG)), path.read_text()


def test_the_reader_finds_recipe_reads():
    src = ("def f(cfg, r: RecipeConfig):\n    q, n = cfg.recipe, 3\n    return q.kl_coef + r.eps_low + "
           "cfg.recipe.eps_high + cfg.optim.lr + n\n")
    assert recipe_reads(src) == Counter({"kl_coef": 1, "eps_low": 1, "eps_high": 1})


def test_every_recipe_field_is_read_in_exactly_one_module():
    readers = defaultdict(set)
    for name, source in modules():
        if name not in DESCRIBE:
            for field in recipe_reads(source):
                readers[field].add(name)
    assert set(readers) == FIELDS, f"never read: {sorted(FIELDS - set(readers))}"  # every toggle does something
    several = {f: sorted(m) for f, m in readers.items() if len(m) > 1}
    assert not several, f"read in more than one module: {several}"
    # the step's toggles are the plan's; the data policy's state and the schedules read their own
    assert {m for ms in readers.values() for m in ms} == {"train/plan.py", "train/data.py", "rl/schedules.py"}


def test_the_loop_follows_the_plan_and_reads_no_recipe():
    for name, source in modules():
        if name in LOOP:
            tree = ast.parse(source)
            recipe = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "recipe"]
            typed = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "RecipeConfig"]
            assert not recipe and not typed and not recipe_reads(source), (name, recipe, typed)


# --- what the plan resolves ---------------------------------------------------------------------------

def plan(step=1, **recipe):
    return plan_step(parse({"recipe": recipe}), step)


@pytest.mark.parametrize("recipe,old_pass,anchor,entropies", [
    ({}, False, False, False),                                   # on-policy: the update's first forward is pi_old
    ({"update_epochs": 2}, True, True, False),                   # the ratio leaves 1
    ({"minibatches": 2}, True, True, False),
    ({"kl_coef": 0.05, "kl_placement": "reward"}, True, True, False),  # KL in the reward reads pi_old
    ({"kl_coef": 0.05, "kl_placement": "loss"}, False, False, False),
    ({"is_correction": "tis"}, True, False, False),              # behaviour vs old weights
    ({"token_selection": "top_entropy"}, True, False, True),     # the old pass's entropies choose
])
def test_the_passes_before_the_update(recipe, old_pass, anchor, entropies):
    p = plan(**recipe)
    assert (p.old_pass, p.anchor_on_old, p.old_entropies) == (old_pass, anchor, entropies)


def test_the_kl_term():
    assert plan().kl is None and plan(kl_coef=0.0, kl_placement="reward").kl is None  # no reference at all
    kl = plan(kl_coef=0.05, kl_estimator="k2", kl_placement="reward", kl_target=0.1, ref_reset_every=3).kl
    assert (kl.coef, kl.in_reward, kl.target, kl.reset_every) == (0.05, True, 0.1, 3)
    assert kl.estimator is losses.KL_ESTIMATORS["k2"] and not plan(kl_coef=0.05).kl.in_reward


@pytest.mark.parametrize("name", list(losses.POLICY_LOSSES))
def test_the_loss_entry_and_its_parameters(name):
    r = {"policy_loss": name, "cispo_cap": 3.0, "gmpo_eps": 0.3, "clip_cov_lb": 0.5, "kl_cov_coef": 2.0,
         "eps_high": 0.28, "loss_agg": "token_mean", "entropy_coef": 0.01, "pos_nll_coef": 0.1, "max_new_tokens": 7}
    r |= {"baseline": "none", "scale": "none"} if name == "raft" else {}
    p = plan(**r)
    assert p.loss.fn is losses.POLICY_LOSSES[name] and p.loss.selection is losses.COV_SELECTIONS.get(name)
    recipe = parse({"recipe": r}).recipe
    for f in dataclasses.fields(losses.LossParams):
        if f.name != "generator":
            assert getattr(p.loss.params, f.name) == getattr(recipe, f.name), f.name
    assert (p.loss.agg, p.loss.max_len, p.loss.entropy_coef, p.loss.nll_coef) == ("token_mean", 7, 0.01, 0.1)


def test_clip_covs_draw_is_seeded_by_seed_and_step():
    def draw(seed, step):
        return torch.randperm(50, generator=plan_step(parse({"seed": seed}), step).loss.params.generator)
    assert torch.equal(draw(0, 3), draw(0, 3)) and torch.equal(draw(0, 3), torch.randperm(
        50, generator=recipes.step_generator(0, 3)))
    assert not torch.equal(draw(0, 3), draw(0, 4)) and not torch.equal(draw(0, 3), draw(1, 3))


def test_sampling():
    s = plan(3, dynamic_sampling=True, max_gen_rounds=4, format_weight=0.5, format_anneal_steps=4,
             overlong="soft_penalty", overlong_buffer=2, overlong_factor=0.5, baseline="greedy").sampling
    assert (s.live_groups_only, s.rounds, s.format_weight, s.scores_format) == (True, 4, 0.125, True)
    assert s.overlong_penalty == (2, 0.5) and s.greedy_baseline
    s = plan(max_gen_rounds=4).sampling  # without dynamic sampling one round, whatever max_gen_rounds says
    assert (s.live_groups_only, s.rounds, s.scores_format, s.overlong_penalty, s.greedy_baseline) == (
        False, 1, False, None, False)
    assert plan(overlong="mask").drop_truncated and not plan(overlong="soft_penalty").drop_truncated


def test_advantage_functions():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    loo = plan(baseline="leave_one_out", scale="none").advantages(rewards)
    assert torch.allclose(loo[0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3], dtype=torch.float64))
    assert plan(adv_whiten="gae", baseline="none", scale="none").token_advantages is None  # the critic's
    assert plan(adv_whiten="gae", baseline="none", scale="none").critic.lr == parse({}).optim.lr
    assert plan(adv_whiten="gae", baseline="none", scale="none", critic_lr=1e-3).critic.lr == 1e-3
    assert plan().critic is None
    assert set(recipes.TOKEN_ADVANTAGES) | {"gae"} == set(typing.get_args(AdvWhiten))  # 'gae': the critic
    adv, mask = torch.tensor([1.0, -1.0]), torch.ones(2, 3)
    assert plan().token_advantages(adv, rewards, None, 0.0, mask) is adv
    whitened = plan(adv_whiten="token").token_advantages(adv, rewards, None, 0.0, mask)
    assert whitened.shape == (2, 3) and abs(float(whitened.mean())) < 1e-6


@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
def test_the_is_correction_is_the_entry_with_its_band(name):
    band = {"is_lo": 0.8, "is_hi": 1.25} if name in ("icepop", "seq_geo_mask") else {}
    p = plan(is_correction=name, is_cap=1.5, **band)
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    behav, mask = old + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64), torch.ones(3, 4)
    got = p.is_correction(old, behav, mask)
    want = IS_CORRECTIONS[name](old, behav, mask, cap=1.5, lo=band.get("is_lo"), hi=band.get("is_hi"))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert p.is_weighted == (name != "none")


def test_multi_turn_toggles():
    """recipe.mask_env_tokens and recipe.credit (multi-turn episodes): whether the environment's replies enter
    the loss, and turn-level credit bound with the advantage estimator's settings (docs/environments.md)."""
    env = {"task": {"name": "env", "environment": "calculator"}}
    assert not plan().env_tokens_in_loss and plan_step(parse({**env, "recipe": {"mask_env_tokens": False}}),
                                                       1).env_tokens_in_loss
    assert plan().turn_credit is None  # episode credit: the row's advantage, as for a single turn
    p = plan_step(parse({**env, "recipe": {"credit": "turn", "baseline": "group_mean", "scale": "group",
                                           "std_ddof": 0, "std_eps": 1e-12}}), 1)
    # the worked example (docs/environments.md): episode 1 pays 0.1 for a failed call, then succeeds; episode 2
    # fails in one turn. Returns G_11 = 0.9, G_12 = 1.0, G_21 = 0; mean 0.45, std 0.45
    adv = p.turn_credit(torch.tensor([[0.9, 0.0]], dtype=torch.float64),
                        torch.tensor([[-0.1, 1.0], [0.0, 0.0]], dtype=torch.float64),
                        torch.tensor([[0, 0, 1], [0, 0, 0]]))
    assert torch.allclose(adv, torch.tensor([[1.0, 1.0, 0.55 / 0.45], [-1.0, -1.0, -1.0]], dtype=torch.float64),
                          atol=1e-9)
