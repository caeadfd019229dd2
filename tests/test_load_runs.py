"""ablate.load_runs reads run folders back into a tidy frame."""

import pytest

import ablate
from ablate.config import load
from ablate.runs.store import RunFolderError
from ablate.train.trainer import train


def test_load_runs_tidy(tmp_path):
    for seed in (0, 1):
        cfg = load("configs/toy.yaml", ["steps=4", "eval.every=2", f"seed={seed}"])
        train(cfg, str(tmp_path / "sweep" / f"s{seed}"), progress=False)
    with open(tmp_path / "sweep" / "s1" / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "train/reward_mean"')  # a torn last line is tolerated
    df = ablate.load_runs(tmp_path / "sweep")
    assert list(df.columns[:6]) == ["run_id", "run_dir", "state", "step", "metric", "value"]
    assert set(df["seed"]) == {0, 1} and df["run_id"].nunique() == 2
    assert "recipe.baseline" in df.columns and set(df["state"]) == {"completed"}
    one = df[(df.seed == 1) & (df.metric == "train/reward_mean")]
    assert sorted(one.step) == [1, 2, 3, 4]
    evals = df[(df.seed == 0) & (df.metric == "eval/pass@1")]
    assert sorted(evals.step) == [0, 2, 4]
    # a single run folder works too
    assert ablate.load_runs(tmp_path / "sweep" / "s0")["run_id"].nunique() == 1


def test_read_log_edge_cases(tmp_path):
    """The Arrow fast path and the line-by-line fallback give the same table."""
    import math

    from ablate.analysis.load import read_log

    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "a": NaN, "ok": true, "note": "text"}\n\n{"step": 2, "a": 1.5, "b": 3}\n{"step": 3, "a')
    t = read_log(p).to_pydict()  # torn last line cut, blank line skipped, text column dropped
    assert t["step"] == [1, 2] and math.isnan(t["a"][0]) and t["a"][1] == 1.5
    assert t["ok"] == [1.0, None] and t["b"] == [None, 3.0] and "note" not in t

    p.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}')  # a complete last line without newline is kept
    assert read_log(p).to_pydict() == {"step": [1, 2], "a": [1.0, 2.0]}

    p.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": oops}\n{"step": 3, "a": 3}\n')  # corrupt middle line:
    with pytest.raises(RunFolderError, match=r"metrics\.jsonl:2: corrupt line"):  # reported, never dropped
        read_log(p)

    assert read_log(tmp_path / "absent.jsonl").num_rows == 0
