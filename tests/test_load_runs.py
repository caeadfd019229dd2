"""ablate.load_runs reads run folders back into a tidy frame."""

import ablate
from ablate.config import load
from ablate.trainer import train


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
