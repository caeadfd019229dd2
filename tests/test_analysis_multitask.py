"""Performance profiles and the optimality gap in the report for a task mixture (per-task held-out
pass@1 of two arms x five seeds, hand-computed)."""

import json

import numpy as np
import pytest

from ablate.analysis import build_report, multitask, plots
from ablate.analysis.synthetic import write_sweep

A = np.array([[0.2, 0.6], [0.4, 0.8], [0.6, 1.0], [0.3, 0.7], [0.5, 0.9]])   # (seeds, tasks: code, math)


def test_report_aggregates_a_mixture_across_tasks(tmp_path):
    dirs = write_sweep(tmp_path, {"recipe.scale": ["group", "none"]}, seeds=range(5), steps=20, eval_every=10,
                       samples=False)
    for d, row in zip(dirs, [*A, *(A - 0.1)]):
        rows = [json.loads(x) for x in (d / "evals.jsonl").read_text().splitlines()]
        rows[-1].update({"eval/code/pass@1": row[0], "eval/math/pass@1": row[1]})
        (d / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rep.html"
    rep = build_report([tmp_path], out, reps=500, figures=False)
    t = rep.multitask.set_index("arm")
    # 10 scores of arm group sorted: .2 .3 .4 .5 .6 .6 .7 .8 .9 1; IQM drops int(2.5) = 2 at each end
    assert t.loc["scale=group", ["n", "tasks", "mean", "iqm", "optimality_gap"]].tolist() == pytest.approx(
        [5, 2, 0.6, 3.6 / 6, 0.4])
    assert t.loc["scale=none", ["mean", "optimality_gap"]].tolist() == pytest.approx([0.5, 0.5])
    assert t.loc["scale=group", "optimality_gap_lo"] < 0.4 < t.loc["scale=group", "optimality_gap_hi"]
    names, mats = multitask.task_matrices(rep.study, rep.scores)
    assert names == ["code", "math"] and np.allclose(mats["scale=group"], A)
    taus, prof, lo, hi, n = multitask.profiles(mats, taus=[0.0, 0.5, 0.95, 1.0], reps=200)["scale=group"]
    assert prof.tolist() == pytest.approx([1.0, (1 / 5 + 5 / 5) / 2, (0 + 1 / 5) / 2, 0.0]) and n == 5
    assert "Across tasks (rliable)" in out.read_text()
    fig = plots.profile_figure(multitask.profiles(mats, reps=50), list(mats))
    assert [line.get_label() for line in fig.axes[0].lines] == ["scale=group (5 runs)", "scale=none (5 runs)"]
    assert len(fig.axes[0].collections) == 2                                  # 5 runs: bootstrap bands drawn
    assert plots.to_base64(fig)
    assert "### Across tasks (rliable)" in out.with_suffix(".md").read_text()


def test_single_task_studies_have_no_cross_task_section(tmp_path):
    write_sweep(tmp_path, {"recipe.scale": ["group", "none"]}, seeds=range(2), steps=20, eval_every=10, samples=False)
    rep = build_report([tmp_path], None, figures=False, reps=100)
    assert rep.multitask is None and "profiles" not in rep.figures
