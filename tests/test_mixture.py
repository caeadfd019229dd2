"""Task mixtures: weights as pool shares, delegation to each task's verifier, per-task metrics (by hand),
and a real run whose evals and report split by task."""

import math

import pytest
import torch

from ablate.config import ConfigError, parse, to_dict
from ablate.runs.metrics import is_defined
from ablate.runs.store import RunStore
from ablate.tasks import make_task, task_labels
from ablate.tasks.mixture import per_task_eval, per_task_train, shares

MIX = {"name": "mixture", "num_train": 40,
       "mixture": [{"name": "arithmetic", "weight": 3, "num_heldout": 6, "digits": [1], "operators": ["+"]},
                   {"name": "reasoning_gym", "dataset": "chain_sum", "weight": 1, "num_heldout": 4,
                    "rg_config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}]}


def test_shares_by_hand():
    assert shares([3, 1], 40) == [30, 10]
    assert shares([1, 1, 1], 10) == [3, 3, 3]
    assert shares([100, 1], 10) == [10, 1]  # every task keeps at least one problem


def test_mixture_builds_delegates_and_round_trips():
    cfg = parse({"task": MIX})
    assert parse(to_dict(cfg)) == cfg
    task = make_task(cfg.task)
    train, heldout = task.problems("train"), task.problems("heldout")
    assert [task_labels(task, train).count(x) for x in ("arithmetic", "reasoning_gym_chain_sum")] == [30, 10]
    assert task_labels(task, heldout).count("arithmetic") == 6 and len(heldout) == 10
    assert not {p.id for p in train} & {p.id for p in heldout}
    arith, rg = train[0], train[-1]
    assert arith.id.startswith("arithmetic/") and rg.id.startswith("reasoning_gym_chain_sum/")
    assert task.score(arith, arith.answer) == 1.0 and task.score(rg, f"<answer>{rg.answer}</answer>") == 1.0
    assert task.score_many([arith, rg], ["-1", "<answer>x</answer>"]) == [0.0, 0.0]
    assert task_labels(make_task(parse({}).task), train) is None


@pytest.mark.parametrize("task, match", [
    ({"name": "mixture", "mixture": [{"name": "arithmetic"}]}, ">= 2 entries"),
    ({"name": "mixture", "mixture": [{"name": "arithmetic", "weight": -1}, {"name": "code"}]}, r"mixture\[0\].weight"),
    ({"name": "mixture", "mixture": [{"name": "arithmetic", "digits": [9]}, {"name": "code"}]},
     r"task.mixture\[0\].digits\[0\]: 9 is not allowed"),
    ({"name": "mixture", "mixture": [{"name": "mixture"}, {"name": "code"}]}, "no nested mixtures"),
    ({"name": "arithmetic", "mixture": [{"name": "code"}, {"name": "code"}]}, "only defined for task.name='mixture'"),
])
def test_bad_mixtures_are_config_errors(task, match):
    with pytest.raises(ConfigError, match=match):
        parse({"task": task})


def test_per_task_metrics_by_hand():
    # task a: counts 1 and 0 of n=2 -> pass@1 (0.5 + 0) / 2 = 0.25; task b: 2 of 2 -> 1.0
    assert per_task_eval(["a", "a", "b"], [1, 0, 2], 2, [1]) == {"eval/a/pass@1": 0.25, "eval/b/pass@1": 1.0}
    correct = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert per_task_train(["a", "a", "b"], correct) == {
        "train/a/reward_correct_mean": 0.75, "train/a/dead_group_frac": 0.5,
        "train/b/reward_correct_mean": 0.0, "train/b/dead_group_frac": 1.0}
    assert per_task_eval(None, [1], 2, [1]) == {} and per_task_train(None, correct) == {}


def test_mixture_run_logs_and_reports_per_task(tmp_path):
    from ablate.analysis.report import build_report
    from ablate.train.trainer import train

    cfg = parse({"model": {"path": "models/tiny-arith"}, "device": "cpu", "task": MIX, "prompts_per_step": 4,
                 "steps": 2, "checkpoint_every": 0, "eval": {"every": 0, "n_samples": 2, "ks": [1, 2]},
                 "recipe": {"group_size": 2, "max_new_tokens": 4}})
    run_dir = tmp_path / "runs" / "mix"
    assert train(cfg, str(run_dir), progress=False) == "completed"
    store = RunStore(run_dir)
    evals, metrics = store.read("evals"), store.read("metrics")
    for row in evals:
        assert {"eval/arithmetic/pass@1", "eval/arithmetic/pass@2", "eval/reasoning_gym_chain_sum/pass@1"} <= set(row)
        # the overall pass@1 is the problem-weighted mean of the per-task ones (6 and 4 problems)
        mixed = (6 * row["eval/arithmetic/pass@1"] + 4 * row["eval/reasoning_gym_chain_sum/pass@1"]) / 10
        assert math.isclose(row["eval/pass@1"], mixed, abs_tol=1e-9)
    assert any(k.startswith("train/arithmetic/") for r in metrics for k in r)
    assert all(is_defined(k) for r in evals + metrics for k in r if k != "step")
    rep = build_report([tmp_path / "runs"], tmp_path / "report.html", figures=False)
    assert set(rep.tasks["task"]) == {"arithmetic", "reasoning_gym_chain_sum"}
    assert "Per task (task mixture)" in (tmp_path / "report.md").read_text()
