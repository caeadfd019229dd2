"""Every registry entry obeys the shared contract: shapes, finiteness, dead groups, masking, offsets."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from ablate.rl.advantages import BASELINES, SCALES, compute_advantages
from ablate.rl.corrections import IS_CORRECTIONS, mismatch_metrics
from ablate.rl.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    RATIO_LEVELS,
    LossParams,
    importance_ratio,
    ppo_clip,
)

GROUP_BASELINES = ("group_mean", "leave_one_out")
P, G, N, T = 3, 4, 6, 5


def _rewards(seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 2, (P, G), generator=g).double()
    r[0] = 1.0  # one dead group (all correct)
    r[1] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # one live group
    return r


# --- advantages --------------------------------------------------------------------------------

@pytest.mark.parametrize("baseline,scale", list(itertools.product(BASELINES, SCALES)))
@pytest.mark.parametrize("ddof", [0, 1])
def test_every_estimator_shape_and_finite(baseline, scale, ddof):
    r = _rewards()
    a = compute_advantages(r, baseline=baseline, scale=scale, ddof=ddof, greedy_rewards=torch.rand(P).double())
    assert a.shape == (P, G) and a.is_floating_point() and torch.isfinite(a).all()
    # registry entries have the common signatures
    b = BASELINES[baseline](r, torch.zeros(P).double())
    assert b.shape == (P, G)
    assert SCALES[scale](r - b, r, ddof, 1e-6).shape == (P, G)


@pytest.mark.parametrize("baseline,scale", list(itertools.product(GROUP_BASELINES, SCALES)))
@pytest.mark.parametrize("ddof", [0, 1])
def test_dead_group_has_zero_advantage(baseline, scale, ddof):
    r = _rewards()
    r[2] = 0.0  # a dead all-wrong group as well
    a = compute_advantages(r, baseline=baseline, scale=scale, ddof=ddof)
    assert_close(a[0], torch.zeros(G, dtype=r.dtype), atol=0, rtol=0)
    assert_close(a[2], torch.zeros(G, dtype=r.dtype), atol=0, rtol=0)
    assert a[1].abs().min() > 0  # the live group still carries signal


reward_grid = st.integers(1, 4).flatmap(lambda p: st.integers(2, 6).flatmap(lambda g: st.tuples(
    st.lists(st.lists(st.floats(-5, 5, allow_nan=False), min_size=g, max_size=g), min_size=p, max_size=p),
    st.lists(st.floats(-50, 50, allow_nan=False), min_size=p, max_size=p),
)))


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("ddof", [0, 1])
@settings(max_examples=50, deadline=None)
@given(data=reward_grid)
def test_group_baselines_invariant_to_per_prompt_offset(scale, ddof, data):
    rows, offsets = data
    r = torch.tensor(rows, dtype=torch.float64)
    c = torch.tensor(offsets, dtype=torch.float64)[:, None]
    for baseline in GROUP_BASELINES:
        a = compute_advantages(r, baseline=baseline, scale=scale, ddof=ddof)
        a_shift = compute_advantages(r + c, baseline=baseline, scale=scale, ddof=ddof)
        # rounding of r + c, amplified at most by 1/eps in near-dead groups, stays far below 1e-6
        assert_close(a_shift, a, atol=1e-6, rtol=1e-6)


def test_none_and_batch_mean_are_not_offset_invariant():
    r = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    c = torch.tensor([[0.0], [10.0]])  # prompt 2's reward model adds +10 to everything
    for baseline in ("none", "batch_mean"):
        a = compute_advantages(r, baseline=baseline, scale="none")
        a_shift = compute_advantages(r + c, baseline=baseline, scale="none")
        assert not torch.allclose(a, a_shift)
    # by hand: none -> the offset passes straight through; batch_mean -> shifts by c - mean(c) = -+5
    assert_close(compute_advantages(r + c, baseline="none", scale="none"),
                 torch.tensor([[1.0, 0.0], [11.0, 10.0]]), atol=0, rtol=0)
    assert_close(compute_advantages(r + c, baseline="batch_mean", scale="none"),
                 torch.tensor([[-4.5, -5.5], [5.5, 4.5]]), atol=1e-6, rtol=0)
    # while the group baselines give the same advantages with and without the offset
    for baseline in GROUP_BASELINES:
        assert_close(compute_advantages(r + c, baseline=baseline, scale="none"),
                     compute_advantages(r, baseline=baseline, scale="none"), atol=1e-6, rtol=0)


# --- KL estimators and aggregations ------------------------------------------------------------

@pytest.mark.parametrize("name", list(KL_ESTIMATORS))
def test_kl_estimator_contract(name):
    logp = torch.log_softmax(torch.randn(N, T, 11), -1)[..., 0]
    ref = torch.log_softmax(torch.randn(N, T, 11), -1)[..., 0]
    k = KL_ESTIMATORS[name](logp, ref)
    assert k.shape == (N, T) and torch.isfinite(k).all()
    assert_close(KL_ESTIMATORS[name](logp, logp), torch.zeros(N, T), atol=0, rtol=0)  # zero at ref
    if name in ("k2", "k3"):
        assert (k >= 0).all()


def _mask(seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(N, T, generator=g) < 0.6
    m[0] = False  # an empty completion (e.g. overlong-masked)
    m[1] = True
    return m


@pytest.mark.parametrize("name", list(AGGREGATIONS))
def test_aggregation_contract(name):
    m = _mask()
    v = torch.randn(N, T, dtype=torch.float64, requires_grad=True)
    out = AGGREGATIONS[name](v, m, T)
    assert out.dim() == 0 and torch.isfinite(out)
    garbage = torch.where(m, v.detach(), torch.full_like(v, 1e30))
    assert_close(AGGREGATIONS[name](garbage, m, T), out.detach(), atol=0, rtol=0)
    out.backward()
    assert (v.grad[~m] == 0).all()
    empty = AGGREGATIONS[name](v.detach(), torch.zeros_like(m), T)
    assert empty.item() == 0.0  # no counted token: 0, not NaN


# --- policy loss: every ratio level x aggregation x dual clip ----------------------------------

CASES = list(itertools.product(RATIO_LEVELS, AGGREGATIONS, [None, 3.0]))


def _loss_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
    logp = old + 0.5 * torch.randn(N, T, generator=g, dtype=torch.float64)
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    return logp, old, adv


def _loss_and_grad(logp, old, adv, m, level, agg, dual):
    logp = logp.clone().requires_grad_(True)
    loss, stats = ppo_clip(logp, old, adv, m, agg=agg, max_len=T,
                           params=LossParams(eps_low=0.2, eps_high=0.28, dual_clip=dual, ratio_level=level))
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad, stats


@pytest.mark.parametrize("level,agg,dual", CASES)
def test_policy_loss_contract(level, agg, dual):
    logp, old, adv = _loss_inputs()
    m = _mask()
    loss, grad, stats = _loss_and_grad(logp, old, adv, m, level, agg, dual)
    assert loss.dim() == 0 and torch.isfinite(loss) and torch.isfinite(grad).all()
    assert set(stats) >= {"clip_frac_low", "clip_frac_high", "ratio_mean", "ratio_max"}
    assert all(s.dim() == 0 and torch.isfinite(s) for s in stats.values())
    assert importance_ratio(logp, old, m, level).shape == (N, T)
    # nothing counted (every completion masked out): loss 0, stats 0, gradient 0 -- never NaN
    empty = torch.zeros_like(m)
    loss, grad, stats = _loss_and_grad(logp, old, adv, empty, level, agg, dual)
    assert loss.item() == 0.0 and (grad == 0).all()
    assert all(s.item() == 0.0 for s in stats.values())


@pytest.mark.parametrize("level,agg,dual", CASES)
def test_masked_tokens_never_change_loss_or_grad(level, agg, dual):
    logp, old, adv = _loss_inputs()
    m = _mask()
    g = torch.Generator().manual_seed(1)
    # finite garbage at masked positions, large enough to clip / overflow exp if it leaked in
    junk_logp = torch.where(m, logp, 80 * torch.randn(N, T, generator=g, dtype=torch.float64))
    junk_old = torch.where(m, old, -80 * torch.rand(N, T, generator=g, dtype=torch.float64))
    loss, grad, stats = _loss_and_grad(logp, old, adv, m, level, agg, dual)
    loss2, grad2, stats2 = _loss_and_grad(junk_logp, junk_old, adv, m, level, agg, dual)
    assert_close(loss2, loss, atol=0, rtol=0)
    assert_close(grad2, grad, atol=0, rtol=0)
    assert (grad[~m] == 0).all()
    for k in stats:
        assert_close(stats2[k], stats[k], atol=0, rtol=0)


@pytest.mark.parametrize("level,agg,dual", CASES)
def test_policy_loss_on_policy_equals_minus_advantage(level, agg, dual):
    # rho == 1 (first update epoch): nothing is clipped and the loss is agg(-A broadcast)
    _, old, adv = _loss_inputs()
    m = _mask()
    loss, _, stats = _loss_and_grad(old, old, adv, m, level, agg, dual)
    expected = AGGREGATIONS[agg](-adv[:, None].expand(N, T), m, T)
    assert_close(loss, expected, atol=1e-12, rtol=0)
    assert stats["clip_frac_low"].item() == 0.0 and stats["clip_frac_high"].item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx(1.0, abs=1e-12)


# --- IS corrections (behaviour -> old): every entry ---------------------------------------------

IS_PARAMS = {"cap": 2.0, "lo": 0.5, "hi": 2.0}  # every band contains 1


def _behav(old, seed=2, scale=0.4):
    g = torch.Generator().manual_seed(seed)
    return old + scale * torch.randn(N, T, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
def test_is_correction_contract(name):
    _, old, _ = _loss_inputs()
    m = _mask()
    for behav in (_behav(old), old + 80.0, old - 80.0):  # moderate and extreme log w: never NaN or inf
        w, keep, stats = IS_CORRECTIONS[name](old, behav, m, **IS_PARAMS)
        assert w.shape == (N, T) and keep.shape == (N, T) and keep.dtype == torch.bool
        assert torch.isfinite(w).all() and (w >= 0).all() and not w.requires_grad
        assert not (keep & ~m).any()                      # rejection only removes tokens
        assert (w[~m] == 1).all() and (w[m & ~keep] == 0).all()
        assert set(stats) == {"is_cap_frac"} and stats["is_cap_frac"].dim() == 0


@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
@pytest.mark.parametrize("level,agg", list(itertools.product(RATIO_LEVELS, AGGREGATIONS)))
def test_is_correction_on_policy_changes_nothing(name, level, agg):
    # behaviour == old (k = 0, identical numerics): w == 1, nothing rejected, loss and gradient unchanged
    logp, old, adv = _loss_inputs()
    m = _mask()
    w, keep, stats = IS_CORRECTIONS[name](old, old.clone(), m, **IS_PARAMS)
    assert (w == 1).all() and torch.equal(keep, m) and stats["is_cap_frac"].item() == 0.0
    loss, grad, _ = _loss_and_grad(logp, old, adv, m, level, agg, None)
    lp = logp.clone().requires_grad_(True)
    loss_w, _ = ppo_clip(lp, old, adv, keep, agg=agg, max_len=T,
                         params=LossParams(eps_low=0.2, eps_high=0.28, ratio_level=level), token_weight=w)
    (grad_w,) = torch.autograd.grad(loss_w, lp)
    assert_close(loss_w.detach(), loss, atol=0, rtol=0)
    assert_close(grad_w, grad, atol=0, rtol=0)
    out = mismatch_metrics(old, old.clone(), m, w, keep, torch.zeros(N))
    for k in ("kl_k1", "kl_k3", "chi2_token", "chi2_seq", "max_abs_prob_diff", "rejected_token_frac"):
        assert out[k].item() == 0.0, k
    assert out["ess_frac"].item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("name", list(IS_CORRECTIONS))
def test_is_correction_masked_positions_are_inert(name):
    _, old, _ = _loss_inputs()
    m = _mask()
    behav = _behav(old)
    g = torch.Generator().manual_seed(3)
    junk_old = torch.where(m, old, -80 * torch.rand(N, T, generator=g, dtype=torch.float64))
    junk_behav = torch.where(m, behav, 80 * torch.randn(N, T, generator=g, dtype=torch.float64))
    w, keep, stats = IS_CORRECTIONS[name](old, behav, m, **IS_PARAMS)
    w2, keep2, stats2 = IS_CORRECTIONS[name](junk_old, junk_behav, m, **IS_PARAMS)
    assert torch.equal(w, w2) and torch.equal(keep, keep2)
    assert_close(stats2["is_cap_frac"], stats["is_cap_frac"], atol=0, rtol=0)
    a = mismatch_metrics(old, behav, m, w, keep, torch.ones(N))
    b = mismatch_metrics(junk_old, junk_behav, m, w2, keep2, torch.ones(N))
    for k in a:
        assert_close(b[k], a[k], atol=0, rtol=0)

# --- the policy-loss registry: every entry x aggregation x ratio level (where it has one) ------------

import dataclasses  # noqa: E402
import inspect  # noqa: E402
import typing  # noqa: E402

from ablate.config import RATIO_LEVEL_LOSSES, PolicyLoss, RecipeConfig  # noqa: E402
from ablate.rl.losses import COV_SELECTIONS, POLICY_LOSSES, PolicyLossFn, SelectionFn  # noqa: E402

# one parameter set for every entry: each reads its own and ignores the others
PARAMS = LossParams(eps_low=0.2, eps_high=0.28, cispo_cap=1.5, gmpo_eps=0.4, clip_cov_ratio=0.2, clip_cov_lb=-10.0,
                    clip_cov_ub=10.0, kl_cov_frac=0.2, kl_cov_coef=1.0, delta=3.0)
BATCH_STATISTICS = {"clip_cov", "kl_cov"}  # covariance means over the batch passed in
LOSS_CASES = [(name, agg, level) for name in POLICY_LOSSES for agg in AGGREGATIONS
              for level in (RATIO_LEVELS if name in RATIO_LEVEL_LOSSES else ["token"])]


def _signature(protocol) -> inspect.Signature:
    sig = inspect.signature(protocol.__call__)
    return sig.replace(parameters=list(sig.parameters.values())[1:])  # without self


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_every_entry_has_the_one_signature(name):
    assert inspect.signature(POLICY_LOSSES[name]) == _signature(PolicyLossFn)
    if name in COV_SELECTIONS:
        assert inspect.signature(COV_SELECTIONS[name]) == _signature(SelectionFn)


def test_config_names_are_the_registry():
    assert list(typing.get_args(PolicyLoss)) == list(POLICY_LOSSES)
    assert set(COV_SELECTIONS) == BATCH_STATISTICS and set(RATIO_LEVEL_LOSSES) <= set(POLICY_LOSSES)


def test_loss_params_are_the_recipe_fields_with_their_defaults():
    recipe = RecipeConfig()
    for f in dataclasses.fields(LossParams):
        if f.name != "generator":
            assert getattr(LossParams(), f.name) == getattr(recipe, f.name), f.name


def test_ratio_level_losses_are_the_entries_that_read_it():
    # the config lets recipe.ratio_level='sequence' through for RATIO_LEVEL_LOSSES only: exactly the
    # entries whose loss changes with it (ratios away from 1, so the levels differ)
    logp, old, adv = _loss_inputs()
    m = _mask()
    for name in POLICY_LOSSES:
        token, sequence = (_call(name, logp, old, adv, m, "token_mean", level)[0] for level in RATIO_LEVELS)
        assert (name in RATIO_LEVEL_LOSSES) == (not torch.equal(token, sequence)), name


def _call(name, logp, old, adv, m, agg, level, token_weight=None, selected=None, **over):
    params = dataclasses.replace(PARAMS, ratio_level=level, generator=torch.Generator().manual_seed(0), **over)
    logp = logp.clone().requires_grad_(True)
    loss, stats = POLICY_LOSSES[name](logp, old, adv, m, agg=agg, max_len=T, params=params,
                                      token_weight=token_weight, selected=selected)
    (grad,) = torch.autograd.grad(loss, logp, allow_unused=False)
    return loss.detach(), grad, stats


@pytest.mark.parametrize("name,agg,level", LOSS_CASES)
def test_every_policy_loss_contract(name, agg, level):
    logp, old, adv = _loss_inputs()
    m = _mask()
    loss, grad, stats = _call(name, logp, old, adv, m, agg, level)
    assert loss.dim() == 0 and torch.isfinite(loss) and torch.isfinite(grad).all()
    assert {"ratio_mean", "ratio_max"} <= set(stats)
    assert all(s.dim() == 0 and torch.isfinite(s) and not s.requires_grad for s in stats.values())
    # nothing counted: loss 0, gradient 0, stats 0 -- never NaN
    loss, grad, stats = _call(name, logp, old, adv, torch.zeros_like(m), agg, level)
    assert loss.item() == 0.0 and (grad == 0).all()
    assert all(s.item() == 0.0 for s in stats.values())


@pytest.mark.parametrize("name,agg,level", LOSS_CASES)
def test_every_policy_loss_ignores_masked_positions(name, agg, level):
    logp, old, adv = _loss_inputs()
    m = _mask()
    g = torch.Generator().manual_seed(1)
    junk_logp = torch.where(m, logp, torch.full_like(logp, -torch.inf))  # -inf logp where masked
    junk_old = torch.where(m, old, -80 * torch.rand(N, T, generator=g, dtype=torch.float64))
    loss, grad, stats = _call(name, logp, old, adv, m, agg, level)
    loss2, grad2, stats2 = _call(name, junk_logp, junk_old, adv, m, agg, level)
    assert_close(loss2, loss, atol=0, rtol=0)
    assert_close(grad2, grad, atol=0, rtol=0)
    assert (grad[~m] == 0).all()
    for k in stats:
        assert_close(stats2[k], stats[k], atol=0, rtol=0)


@pytest.mark.parametrize("name,agg,level", [c for c in LOSS_CASES if c[0] != "raft"])
def test_every_policy_gradient_on_policy_is_reinforce(name, agg, level):
    # rho == 1 (first minibatch): every policy-gradient entry has the gradient of agg(-A * logp); GMPO
    # with its own per-sequence mean. Clip-Cov with an empty band drops nothing.
    _, old, adv = _loss_inputs()
    m = _mask()
    over = dict(clip_cov_lb=0.0, clip_cov_ub=0.0) if name == "clip_cov" else {}
    _, grad, _ = _call(name, old, old, adv, m, agg, level, **over)
    logp = old.clone().requires_grad_(True)
    ref = AGGREGATIONS["seq_mean_token_mean" if name == "gmpo" else agg](
        -adv[:, None] * torch.where(m, logp, torch.zeros_like(logp)), m, T)
    (expected,) = torch.autograd.grad(ref, logp)
    assert_close(grad, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name,agg,level", [c for c in LOSS_CASES if c[0] != "gmpo"])
def test_token_level_advantages_broadcast_like_per_completion(name, agg, level):
    logp, old, adv = _loss_inputs()
    m = _mask()
    a = _call(name, logp, old, adv, m, agg, level)
    b = _call(name, logp, old, adv[:, None].expand(N, T).clone(), m, agg, level)
    assert_close(b[0], a[0], atol=1e-12, rtol=0)
    assert_close(b[1], a[1], atol=1e-12, rtol=0)


def test_gmpo_rejects_token_level_advantages():
    logp, old, adv = _loss_inputs()
    with pytest.raises(ValueError, match="gmpo"):
        _call("gmpo", logp, old, adv[:, None].expand(N, T), _mask(), "token_mean", "token")


@pytest.mark.parametrize("name,agg,level", LOSS_CASES)
def test_dead_rows_get_no_gradient(name, agg, level):
    # A = 0 on rows 1 and 3: no gradient there, except KL-Cov's |log rho| penalty on selected tokens
    logp, old, adv = _loss_inputs()
    m = _mask()
    adv = adv.clone()
    adv[[1, 3]] = 0.0
    over = dict(kl_cov_frac=1e-9) if name == "kl_cov" else {}
    _, grad, _ = _call(name, logp, old, adv, m, agg, level, **over)
    if name == "kl_cov":
        assert int((grad[[1, 3]] != 0).sum()) <= 1  # one selected token at most
    else:
        assert (grad[[1, 3]] == 0).all()


def _denominator(name, agg, m):
    if name == "gmpo" or agg == "seq_mean_token_mean":
        return (m.sum(1) > 0).sum().clamp(min=1)
    return m.sum().clamp(min=1) if agg == "token_mean" else torch.tensor(m.shape[0])


@pytest.mark.parametrize("name,agg,level", [c for c in LOSS_CASES if c[0] not in BATCH_STATISTICS])
def test_row_split_rescaled_by_denominators_sums_to_the_batch_loss(name, agg, level):
    # what micro-batching relies on: each part's loss times (part denominator / batch denominator)
    logp, old, adv = _loss_inputs()
    m = _mask()
    full, grad, _ = _call(name, logp, old, adv, m, agg, level)
    total, grads = torch.zeros((), dtype=torch.float64), []
    for rows in (torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])):
        part, g, _ = _call(name, logp[rows], old[rows], adv[rows], m[rows], agg, level)
        w = _denominator(name, agg, m[rows]).double() / _denominator(name, agg, m).double()
        total, grads = total + w * part, grads + [w * g]
    assert_close(total, full, atol=1e-12, rtol=0)
    assert_close(torch.cat(grads), grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name,agg,level", [c for c in LOSS_CASES if c[0] != "gmpo"])
def test_every_token_level_loss_weights_its_tokens(name, agg, level):
    # weight 1 everywhere is no weight; weight 0 on a row leaves that row without gradient (the
    # denominators stay: the other rows' gradients are unchanged)
    logp, old, adv = _loss_inputs()
    m = _mask()
    loss, grad, _ = _call(name, logp, old, adv, m, agg, level)
    ones = _call(name, logp, old, adv, m, agg, level, token_weight=torch.ones(N, T, dtype=torch.float64))
    assert_close(ones[0], loss, atol=0, rtol=0) and assert_close(ones[1], grad, atol=0, rtol=0)
    row = int(grad.abs().sum(1).argmax())  # a row with gradient
    w = torch.ones(N, T, dtype=torch.float64)
    w[row] = 0.0
    _, grad_w, _ = _call(name, logp, old, adv, m, agg, level, token_weight=w)
    assert (grad_w[row] == 0).all() and grad[row].abs().sum() > 0
    if name not in BATCH_STATISTICS:  # (a selection reads the whole batch, weights or not)
        keep = torch.arange(N) != row
        assert_close(grad_w[keep], grad[keep], atol=1e-12, rtol=0)


def test_gmpo_refuses_token_weights():
    logp, old, adv = _loss_inputs()
    with pytest.raises(ValueError, match="sequence-level"):
        _call("gmpo", logp, old, adv, _mask(), "token_mean", "token", token_weight=torch.ones(N, T))


@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_selected_is_the_entrys_own_selection_or_ignored(name):
    # an entry with a batch-level selection given its own selection (made over the same batch) computes
    # what it computes alone; an entry without one ignores `selected`
    logp, old, adv = _loss_inputs()
    m = _mask()
    alone = _call(name, logp, old, adv, m, "token_mean", "token")
    if name in COV_SELECTIONS:
        params = dataclasses.replace(PARAMS, generator=torch.Generator().manual_seed(0))
        selected = COV_SELECTIONS[name](logp, old, adv, m, params)
        assert selected.any() and not (selected & ~m).any()
        nothing = _call(name, logp, old, adv, m, "token_mean", "token", selected=torch.zeros_like(m))
        assert not torch.equal(nothing[1], alone[1])  # the selection passed in is the one used
    else:
        selected = torch.rand(N, T, generator=torch.Generator().manual_seed(4)) < 0.5
    given = _call(name, logp, old, adv, m, "token_mean", "token", selected=selected)
    assert_close(given[0], alone[0], atol=0, rtol=0) and assert_close(given[1], alone[1], atol=0, rtol=0)
