"""The report's Curves figure, read back from the matplotlib objects: every metric has a range and no band
or axis leaves it; seeds as lines below MIN_BOOT_SEEDS seeds, a band from there; per-step metrics smoothed
in bins (hand-computed), evaluations not; one line of text for a metric that is constant or not logged."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.collections import PolyCollection

from ablate.analysis import load_study, plots
from ablate.analysis.design import arm_order
from ablate.analysis.load import Study
from ablate.analysis.stats import MIN_BOOT_SEEDS
from ablate.analysis.synthetic import write_sweep
from ablate.rl.losses import KL_ESTIMATORS
from ablate.runs import metrics as M

CLIP_NOTE = ("clip fraction low: 0 points at every step of every run (on-policy: one update per rollout, so the "
             "ratio is 1 and nothing is clipped)")


def test_every_metric_in_the_table_has_a_range():
    assert set(M.RANGES) == set(M.STEP_METRICS) | set(M.EVAL_METRICS)
    for name, (lo, hi) in M.RANGES.items():
        assert lo is None or hi is None or lo < hi, name
    for name in M.RANGES:                     # what the report draws in points is a share in [0, 1]
        if plots.rate_scale(name) != 1:
            assert M.RANGES[name] == M.SHARE, name
    assert M.metric_range("eval/pass@16") == M.metric_range("eval/code/pass@1") == (0.0, 1.0)
    assert M.metric_range("train/arithmetic/dead_group_frac") == (0.0, 1.0)
    assert M.metric_range("offpolicy/kl_k1") == (None, None) and M.metric_range("offpolicy/kl_k3") == (0.0, None)
    assert M.metric_range("not/a_metric") == (None, None)
    assert M.is_defined("eval/maj@4") and not M.is_defined("eval/pass@k") and not M.is_defined("train/a/b/loss")


def test_kl_range_follows_the_estimator():
    assert set(M.KL_NONNEGATIVE) == set(KL_ESTIMATORS)
    g = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(4096, generator=g) * 3, -torch.rand(4096, generator=g) * 3
    for name, fn in KL_ESTIMATORS.items():      # the table's claim, checked on the estimators themselves
        assert bool((fn(logp, ref) >= 0).all()) == M.KL_NONNEGATIVE[name], name
    for m in M.KL_ESTIMATE:
        assert M.metric_range(m) == (None, None)
        assert M.metric_range(m, ["k3", "k2"]) == (0.0, None)
        assert M.metric_range(m, ["k3", "k1"]) == (None, None)


def test_bin_edges_by_hand():
    assert np.array_equal(plots.bin_edges(1, 150, 30, whole=True), np.arange(0.5, 151, 5))
    assert np.array_equal(plots.bin_edges(1, 10, 3, whole=True), [0.5, 4.5, 8.5, 10.5])   # last bin: 2 steps
    assert np.array_equal(plots.bin_edges(1, 20, 30, whole=True), np.arange(0.5, 21))     # one step a bin
    assert np.allclose(plots.bin_edges(0.0, 90.0, 3, whole=False), [0, 30, 60, 90])


def _study(metrics: pd.DataFrame, evals: pd.DataFrame, arm: dict) -> tuple[Study, pd.Series]:
    runs = pd.DataFrame({"run_id": list(arm), "arm": list(arm.values())})
    return Study(runs, metrics, evals), pd.Series(arm)


def test_smoothing_in_bins_by_hand_and_evaluations_as_logged():
    steps = np.arange(1, 11)
    y1, y2 = steps.astype(float), 2.0 * steps ** 2
    y2[5] = np.nan                                                   # r2 did not log step 6
    metrics = pd.DataFrame({"run_id": ["r1"] * 10 + ["r2"] * 10, "step": np.tile(steps, 2),
                            "train/entropy": np.concatenate([y1, y2])})
    evals = pd.DataFrame({"run_id": ["r1"] * 3 + ["r2"] * 3, "step": [0, 5, 10] * 2,
                          "eval/pass@1": [0.1, 0.2, 0.3, 0.2, 0.6, 0.5]})
    study, run_arm = _study(metrics, evals, {"r1": "a", "r2": "a"})
    c = plots.arm_curves(study, "train/entropy", "steps", run_arm, ["a"], "t", bins=3)["a"]
    # bins of ceil(10 / 3) = 4 steps: 1-4, 5-8, 9-10; r2's second bin is steps 5, 7, 8 (2 * (25 + 49 + 64) / 3)
    assert np.allclose(c.x, [2.5, 6.5, 9.5]) and c.width == 4
    assert np.allclose(c.runs, [[2.5, 6.5, 9.5], [15.0, 92.0, 181.0]])
    assert np.allclose(c.mean, [8.75, 49.25, 95.25]) and np.isnan(c.lo).all()       # 2 runs: no band
    e = plots.arm_curves(study, "eval/pass@1", "steps", run_arm, ["a"], "t", bins=3)["a"]
    assert np.allclose(e.x, [0, 5, 10]) and np.allclose(e.mean, [0.15, 0.4, 0.4]) and e.width == 0

    fig = plots.curves_figure(study, "eval/pass@1", "steps", run_arm, ["a"]).fig
    axes = {ax.get_gid(): ax for ax in fig.axes if ax.get_gid()}
    mean = [ln for ln in axes["eval/pass@1"].lines if ln.get_gid() == "mean"]
    assert len(mean) == 1 and np.allclose(mean[0].get_ydata(), [15, 40, 40])      # points, not smoothed
    ent = {ln.get_gid(): ln for ln in axes["train/entropy"].lines}
    assert np.allclose(ent["raw"].get_xdata(), steps) and np.isclose(ent["raw"].get_ydata()[0], (1 + 2) / 2)
    assert np.allclose(ent["mean"].get_ydata(), np.nanmean(np.c_[y1, y2], axis=1))  # 10 steps: 10 bins of 1


def _arms_figure(tmp_path, seeds: int):
    root = tmp_path / f"s{seeds}"
    write_sweep(root, {"recipe.scale": ["group", "none"]}, seeds=range(seeds), steps=60, eval_every=20,
                samples=False)
    study = load_study(root)
    run_arm = study.runs.set_index("run_id")["arm"]
    return plots.curves_figure(study, "eval/pass@1", "steps", run_arm, arm_order(study.runs))


@pytest.mark.parametrize("seeds", [MIN_BOOT_SEEDS - 1, MIN_BOOT_SEEDS])
def test_seeds_as_lines_below_the_threshold_and_a_band_from_it(tmp_path, seeds):
    curves = _arms_figure(tmp_path, seeds)
    lines = seeds < MIN_BOOT_SEEDS
    panels = [ax for ax in curves.fig.axes if ax.get_gid()]
    assert len(panels) >= 9
    for ax in panels:
        gids = [ln.get_gid() for ln in ax.lines]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection) and c.get_gid() == "band"]
        assert gids.count("mean") == 2, ax.get_gid()
        assert gids.count("seed") == (2 * seeds if lines else 0), ax.get_gid()
        # the synthetic runs' truncation rate and length are the same in every seed: a band of width 0
        assert len(bands) == (0 if lines else 2), ax.get_gid()
    labels = [t.get_text() for t in curves.fig.legends[0].get_texts()]
    assert labels == [f"scale={s} ({seeds} seeds: {'lines' if lines else '95% band'})" for s in ("group", "none")]
    assert ("Thin lines: its individual seeds" in curves.caption) == lines
    assert ("Shaded: 95% Student t band over seeds" in curves.caption) == (not lines)
    assert "means over bins of 2 steps" in curves.caption               # 60 steps in 30 bins


def _write_run(d, seed: int, scale: str, kl_coef: float, epochs: int, rng, steps: int = 40):
    """A run whose shares, lengths, entropy and KL sit at their bounds in some seeds and away in others."""
    d.mkdir(parents=True)
    cfg = {"run_id": d.name, "seed": seed, "steps": steps, "task": {"name": "synthetic"},
           "recipe": {"scale": scale, "kl_coef": kl_coef, "kl_estimator": "k3", "update_epochs": epochs}}
    (d / "config.yaml").write_text(json.dumps(cfg))
    far = seed % 2                          # odd seeds away from the bound, even seeds on it
    with open(d / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            u = rng.uniform(0.5, 1.0)
            row = {"step": s, "train/reward_mean": rng.normal(0.5, 0.5), "train/entropy": far * 0.5 * u,
                   "train/dead_all_correct_frac": far * 0.4 * u, "train/dead_all_wrong_frac": 1 - far * 0.4 * u,
                   "train/kl": kl_coef * far * 5 * u, "train/completion_len_mean": 1 + far * 30 * u,
                   "train/truncation_rate": 1 - far * 0.5 * u, "train/clip_frac_low": 0.0, "train/grad_norm": 1.0}
            f.write(json.dumps(row) + "\n")
    with open(d / "evals.jsonl", "w") as f:
        for s in range(0, steps + 1, 10):
            f.write(json.dumps({"step": s, "eval/pass@1": 0.9 if far else 0.02 * s / steps}) + "\n")
    (d / "status.json").write_text(json.dumps({"state": "completed", "step": steps}))


def _bound_study(tmp_path, seeds: int, epochs: int = 1):
    rng = np.random.default_rng(seeds)
    for scale in ("group", "none"):
        for kl in (0.04, 0.0):
            for s in range(seeds):
                _write_run(tmp_path / f"{scale}-{kl}-s{s}", s, scale, kl, epochs, rng)
    study = load_study(tmp_path)
    run_arm = study.runs.set_index("run_id")["arm"]
    return study, run_arm, arm_order(study.runs)


@pytest.mark.parametrize("seeds", [2, MIN_BOOT_SEEDS])
def test_no_band_or_axis_leaves_the_metrics_range(tmp_path, seeds):
    study, run_arm, arms = _bound_study(tmp_path, seeds)
    curves = plots.curves_figure(study, "eval/pass@1", "steps", run_arm, arms)
    panels = {ax.get_gid(): ax for ax in curves.fig.axes if ax.get_gid()}
    bounded = {"train/entropy", "train/dead_all_correct_frac", "train/dead_all_wrong_frac", "train/kl",
               "train/completion_len_mean", "train/truncation_rate", "eval/pass@1"}
    assert bounded <= set(panels)
    n_bands = 0
    for m, ax in panels.items():
        k = plots.rate_scale(m)
        lo, hi = M.metric_range(m, ["k3"])
        lo, hi = (-np.inf if lo is None else lo * k), (np.inf if hi is None else hi * k)
        y0, y1 = ax.get_ylim()
        assert lo <= y0 < y1 <= hi, (m, ax.get_ylim())
        ys = [ln.get_ydata() for ln in ax.lines]
        for c in ax.collections:
            if c.get_gid() == "band":
                n_bands += 1
                ys += [p.vertices[:, 1] for p in c.get_paths()]
        y = np.concatenate(ys)
        assert (y >= lo - 1e-9).all() and (y <= hi + 1e-9).all(), m
    if seeds >= MIN_BOOT_SEEDS:
        assert n_bands > 0
        # the test bites: unclipped, the t band of a share crosses 0 and of a length / entropy goes negative
        for m in ("train/dead_all_correct_frac", "train/entropy", "train/completion_len_mean"):
            c = plots.arm_curves(study, m, "steps", run_arm, arms, "t", plots.SMOOTH_BINS)[arms[0]]
            assert np.nanmin(c.lo) < 0, m
        c = plots.arm_curves(study, "train/truncation_rate", "steps", run_arm, arms, "t", plots.SMOOTH_BINS)[arms[0]]
        assert np.nanmax(c.hi) > 1
    else:
        assert n_bands == 0


def test_constant_or_missing_metric_is_one_line_of_text(tmp_path):
    study, run_arm, arms = _bound_study(tmp_path, 2)
    curves = plots.curves_figure(study, "eval/pass@1", "steps", run_arm, arms)
    panels = {ax.get_gid() for ax in curves.fig.axes if ax.get_gid()}
    assert not panels & {"train/clip_frac_low", "train/clip_frac_high", "train/grad_norm",
                         "eval/train_minus_heldout_reward"}
    off = "; ".join(a for a in arms if a.endswith("kl_coef=0.0"))
    assert curves.notes == [
        f"KL to reference: not measured for {off} (recipe.kl_coef 0: no reference model)",
        CLIP_NOTE,
        "clip fraction high: not logged by these runs",
        "train - held-out reward: not logged by these runs",
        "grad norm: 1 at every step of every run",
    ]
    kl = [ax for ax in curves.fig.axes if ax.get_gid() == "train/kl"][0]      # only the arms that measure KL
    assert sum(ln.get_gid() == "mean" for ln in kl.lines) == 2
    # with off-policy updates a clip fraction of 0 is news, not explained away
    study, run_arm, arms = _bound_study(tmp_path / "epochs", 2, epochs=2)
    notes = plots.curves_figure(study, "eval/pass@1", "steps", run_arm, arms).notes
    assert "clip fraction low: 0 points at every step of every run" in notes and CLIP_NOTE not in notes
