"""The RLVR chapter's toy reproduction (reproductions/rlvr_chapter_toy) at reduced size.

An independent numpy implementation of the chapter's protocol is written here. At full size (4 methods x
offset on/off x 6 seeds x 250 steps, a few seconds) it gives the published table to 3 decimals; the
harness (`task.toy_instance=chapter` through the normal trainer, via the reproduction's runner) then has
to follow it step by step, on fewer runs: the same dead-group share at every step, and the same exact
pass@1 after every step up to float64 rounding. The full harness table: README.md of the reproduction.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import crash_training_at

from ablate.config import ConfigError, load
from ablate.runs.store import RunStore
from ablate.tasks.toy import build_policy, build_task, chapter_instance
from ablate.train.optim import NormalizedSGD
from ablate.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("chapter_run", ROOT / "reproductions/rlvr_chapter_toy/run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)


# --- the chapter's protocol in numpy, float64 ---------------------------------------------------------

def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def instance():
    rng0 = np.random.default_rng(0)
    a, b = rng0.integers(0, 10, 64), rng0.integers(0, 10, 64)
    L1, L2 = rng0.normal(size=(64, 10)), rng0.normal(size=(64, 10, 10))
    skill = rng0.uniform(-0.5, 3.5, 64)
    tens, ones = (a + b) // 10, (a + b) % 10
    for i in range(64):
        L1[i, tens[i]] += skill[i]
        L2[i, tens[i], ones[i]] += skill[i]
    return a, b, L1, L2, tens, ones, rng0.normal(0, 1, 64)


A_, B_, L1_, L2_, TENS, ONES, OFFSET = instance()


def pass1(L1, L2):  # [64]
    i = np.arange(64)
    return softmax(L1)[i, TENS] * softmax(L2[i, TENS])[i, ONES]


def advantages(method, r):  # r [16, 8]
    G = r.shape[1]
    if method == "REINFORCE":
        return r
    if method == "batch mean":
        return r - r.mean()
    if method == "RLOO":
        return r - (r.sum(1, keepdims=True) - r) / (G - 1)
    return (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)


def reference(method, offset, seed, steps=250):
    """(curve [steps+1] mean pass@1, dead [steps] dead-group share) of one chapter run."""
    rng = np.random.default_rng(seed)
    L1, L2 = L1_.copy(), L2_.copy()
    curve, dead = [pass1(L1, L2).mean()], []
    for _ in range(steps):
        x = np.repeat(rng.integers(0, 64, 16), 8)
        N, rows = len(x), np.arange(len(x))
        p1 = softmax(L1[x])
        t1 = np.argmax(np.cumsum(p1, 1) > rng.random((N, 1)), 1)
        p2 = softmax(L2[x, t1])
        t2 = np.argmax(np.cumsum(p2, 1) > rng.random((N, 1)), 1)
        r = ((t1 == TENS[x]) & (t2 == ONES[x])).astype(float)
        dead.append((r.reshape(16, 8).std(1) == 0).mean())
        if offset:
            r = r + OFFSET[x]
        adv = advantages(method, r.reshape(16, 8)).ravel()
        g1, g2 = np.zeros_like(L1), np.zeros_like(L2)
        d1, d2 = -p1, -p2
        d1[rows, t1] += 1
        d2[rows, t2] += 1
        np.add.at(g1, x, adv[:, None] * d1 / N)
        np.add.at(g2, (x, t1), adv[:, None] * d2 / N)
        norm = np.sqrt((g1 ** 2).sum() + (g2 ** 2).sum())
        if norm > 1e-8:
            L1, L2 = L1 + g1 / norm, L2 + g2 / norm
        curve.append(pass1(L1, L2).mean())
    return np.array(curve), np.array(dead)


# --- tests --------------------------------------------------------------------------------------------

def test_the_task_holds_the_published_instance():
    inst = chapter_instance(0)
    for name, ours in (("a", A_), ("b", B_), ("first", L1_), ("second", L2_), ("offset", OFFSET)):
        assert np.array_equal(inst[name], ours), name
    t = build_task(load("configs/toy.yaml", ["task.toy_instance=chapter", "task.reward_offset=true"]).task)
    policy = build_policy(t)
    assert policy.first.dtype == policy.second.dtype == torch.float64
    assert np.array_equal(policy.first.detach().numpy(), L1_)
    # torch's and numpy's softmax round differently in the last bit
    assert np.abs(np.array(policy.pass1_per_prompt(t.problems("heldout"))) - pass1(L1_, L2_)).max() < 1e-15
    assert [t.offset[p.id] for p in t.problems("train")] == OFFSET.tolist()


def test_reference_gives_the_published_table():
    """The published numbers need the full protocol; the numpy reference runs it in seconds."""
    p = pass1(L1_, L2_)
    assert (round(p.mean(), 3), (p < 0.05).mean(), round((p > 0.5).mean(), 2)) == (0.175, 0.5, 0.11)
    assert round((p ** 8 + (1 - p) ** 8).mean(), 2) == 0.52
    published = {"REINFORCE": (0.910, 0.617), "batch mean": (0.797, 0.603), "RLOO": (0.843, 0.843),
                 "GRPO": (0.851, 0.851)}
    for method, (raw, off) in published.items():
        runs = [[reference(method, o, s) for s in range(6)] for o in (False, True)]
        assert round(np.mean([c[-1] for c, _ in runs[0]]), 3) == raw, method
        assert round(np.mean([c[-1] for c, _ in runs[1]]), 3) == off, method
        if method in ("RLOO", "GRPO"):
            assert max(np.abs(a[0] - b[0]).max() for a, b in zip(*runs)) < 1e-14
        if method == "GRPO":
            dead = np.array([d for _, d in runs[0]])
            assert (round(dead[:, :10].mean(), 2), round(dead[:, -10:].mean(), 2)) == (0.49, 0.79)


def test_initial_stats_and_entropy_check_match_published():
    measured = {**run.initial_stats(), **run.entropy_check()}
    assert all(run.matches(name, value) for name, value in measured.items()), measured
    assert measured["entropy check: actual change"] == pytest.approx(-0.002730, abs=5e-7)
    assert measured["entropy check: -eta Cov(log pi, A)"] == pytest.approx(-0.002733, abs=5e-7)


SHORT = 60  # steps of the REINFORCE and batch-mean runs


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """Raw and offset runs through the trainer, as the reproduction's runner trains them: GRPO at seeds
    0-1 and RLOO at seed 0 x 250 steps, REINFORCE and batch mean at seed 0 x 60 steps. With the offset,
    RLOO seed 0 meets steps whose 16 groups are all dead (235, 237): its advantages are then rounding
    noise, and only the chapter's no-step rule (optim.min_grad_norm=1e-8) keeps it on the reference."""
    out = tmp_path_factory.mktemp("chapter")
    stores = {**run.train_runs(out, ["GRPO"], [0, 1], 250), **run.train_runs(out, ["RLOO"], [0], 250)}
    stores.update({(m, o, s, SHORT): v for (m, o, s), v in
                   run.train_runs(out, ["REINFORCE", "batch mean"], [0], SHORT).items()})
    return stores


def test_harness_follows_the_reference_step_by_step(harness):
    for key, store in harness.items():
        method, offset, seed, *steps = key
        curve, dead = reference(method, offset, seed, *steps)
        assert np.array_equal(run.dead(store), dead), key  # the same samples at every step
        assert np.abs(run.curve(store) - curve).max() < 1e-11, key


def test_harness_group_estimators_ignore_the_offset(harness):
    for m, seeds in (("GRPO", [0, 1]), ("RLOO", [0])):
        measured = run.measure(harness, [m], seeds)
        assert measured[f"max |curve(offset) - curve(raw)| {m}"] < 1e-14
        ref = np.mean([reference(m, False, s)[0][-1] for s in seeds])
        assert measured[f"final pass@1 {m}, raw"] == pytest.approx(ref, abs=1e-11)
    # the offset does move plain REINFORCE and the batch-mean baseline
    for m in ("REINFORCE", "batch mean"):
        raw, off = (run.curve(harness[m, o, 0, SHORT]) for o in (False, True))
        assert np.abs(raw - off).max() > 1e-3, m


def test_chapter_run_resumes_on_the_same_stream(tmp_path, monkeypatch):
    cfg = load("configs/toy.yaml", run.overrides("GRPO", True, 0, steps=30) + ["checkpoint_every=10"])
    crash_training_at(monkeypatch, cfg, tmp_path, step=15)
    assert train(cfg, str(tmp_path), progress=False) == "completed"
    assert np.abs(run.curve(RunStore(tmp_path)) - reference("GRPO", True, 0, 30)[0]).max() < 1e-12


def test_ablate_train_command_line_runs_the_chapter(tmp_path):
    args = [a for o in run.overrides("batch mean", True, 2, steps=10) for a in ("--set", o)]
    res = subprocess.run([sys.executable, "-c", "from ablate.cli.main import main; main()", "train",
                          str(ROOT / "configs/toy.yaml"), *args, "--quiet", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    curve, dead = reference("batch mean", True, 2, 10)
    store = RunStore(tmp_path / "r")
    assert np.array_equal(run.dead(store), dead)
    assert np.abs(run.curve(store) - curve).max() < 1e-13


def test_normalized_sgd_skips_a_step_below_min_norm():
    for min_norm, moved in ((0.0, True), (1e-8, False)):
        p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        p.grad = torch.tensor([1e-10, 0.0, 0.0], dtype=torch.float64)  # rounding noise, all groups dead
        NormalizedSGD([p], lr=1.0, min_norm=min_norm).step()
        assert bool(p.detach().abs().sum() > 0.5) is moved  # a full unit step along the noise, or none
    with pytest.raises(ConfigError, match="optim.min_grad_norm"):
        load("configs/quickstart.yaml", ["optim.min_grad_norm=1e-8"])


def test_toy_instance_needs_the_toy_task():
    with pytest.raises(ConfigError, match="task.toy_instance"):
        load("configs/quickstart.yaml", ["task.toy_instance=chapter"])
    with pytest.raises(ConfigError, match="'default', 'chapter'"):
        load("configs/toy.yaml", ["task.toy_instance=book"])
