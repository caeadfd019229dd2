"""Health checks (ablate.analysis.diagnostics.RULES), each on hand-made arm rows: it fires on the
case it names and stays quiet on the healthy one; plus the jump detector and the flags from configs."""

import inspect

import numpy as np
import pandas as pd
import pytest

from ablate.analysis import diagnostics as D

HEALTHY = pd.Series({"arm": "a", "clip_low": 0.1, "clip_high": 0.1, "off_policy": True, "adv_std_end": 0.7,
                     "kl_jump": 1.2, "kl_max": 0.05, "kl_on": True, "kl_abs_max": 0.05, "grad_jump": 1.5,
                     "len_start": 40.0, "len_end": 44.0, "heldout_start": 0.2, "heldout_end": 0.5,
                     "format_on": True, "format_max": 0.8, "env_errors": 0.0, "episode_truncation": 0.05,
                     "tool_calls_start": 0.4, "tool_calls_end": 0.9})


def with_(**kw):
    return pd.concat([HEALTHY.drop(list(kw)), pd.Series(kw)])


def test_every_rule_is_quiet_on_a_healthy_arm_and_has_one_signature():
    for name, rule in D.RULES.items():
        assert list(inspect.signature(rule).parameters) == ["r"], name
        assert rule(HEALTHY) is None, name


@pytest.mark.parametrize("rule,bad,good,text", [
    ("clip_range", {"clip_low": 0.01, "clip_high": 0.02}, {"clip_low": 0.01, "clip_high": 0.02, "off_policy": False},
     "trust region is inactive"),
    ("clip_range", {"clip_low": 0.4, "clip_high": 0.3}, {"clip_low": 0.3, "clip_high": 0.2}, "fight the clip"),
    ("adv_std_low", {"adv_std_end": 0.05}, {"adv_std_end": 0.1}, "almost every group is dead"),
    ("kl_spike", {"kl_jump": 4.0}, {"kl_jump": 4.0, "kl_max": 0.005}, "KL spike"),
    ("kl_zero", {"kl_abs_max": 0.0}, {"kl_abs_max": 0.0, "kl_on": False}, "exactly 0"),
    ("grad_spike", {"grad_jump": 6.0}, {"grad_jump": 4.9}, "grad-norm spike"),
    ("length_without_accuracy", {"len_end": 60.0, "heldout_end": 0.205}, {"len_end": 60.0}, "length rises 40 -> 60"),
    ("format_never", {"format_max": 0.0}, {"format_max": 0.0, "format_on": False}, "never above 0"),
    ("env_errors", {"env_errors": 0.25}, {"env_errors": np.nan}, "up to 25% of a step's episodes"),
    ("episodes_truncated", {"episode_truncation": 0.3}, {"episode_truncation": 0.1}, "30% of episodes end"),
    ("tools_abandoned", {"tool_calls_end": 0.05}, {"tool_calls_end": 0.1}, "tool calls per episode fall 0.4 -> 0.05"),
])
def test_rule_fires_on_its_case_only(rule, bad, good, text):
    assert text in D.RULES[rule](with_(**bad))
    assert D.RULES[rule](with_(**good)) is None


def test_jump_hand_computed():
    y = np.array([1.0] * 10 + [1.2, 5.0, 1.0])
    # windows of the 10 steps before t = 10, 11, 12: medians 1, 1, 1 -> ratios 1.2, 5.0, 1.0
    assert D.jump(y) == pytest.approx(5.0)
    assert np.isnan(D.jump(np.ones(10)))                                # too short for one full window
    assert np.isnan(D.jump(np.zeros(20)))                               # median 0: no ratio


def test_flags_from_configs():
    runs = pd.DataFrame({"run_id": ["a", "b", "c"], "recipe.kl_coef": [0.0, 0.04, None],
                         "recipe.update_epochs": [1, 2, 1], "recipe.minibatches": [1, 1, 4],
                         "recipe.format_weight": [0.0, 0.1, 0.0]})
    f = D.run_flags(runs).set_index("run_id")
    assert f["kl_on"].tolist() == [False, True, False]
    assert f["off_policy"].tolist() == [False, True, True] and f["format_on"].tolist() == [False, True, False]
    bare = D.run_flags(pd.DataFrame({"run_id": ["x"]}))                # RunConfig defaults
    assert not bare[["kl_on", "off_policy", "format_on"]].to_numpy().any()


def test_rules_run_in_the_report(tmp_path):
    """A synthetic on-policy sweep with an injected grad-norm spike: the report names it; no clip warning."""
    import json

    from ablate.analysis import build_report
    from ablate.analysis.synthetic import write_sweep

    write_sweep(tmp_path, {"recipe.eps_high": [0.2, 0.28]}, seeds=range(2), samples=False)
    path = tmp_path / "c00001d00000" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[60]["train/grad_norm"] = 20.0
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = build_report([tmp_path], None, figures=False, reps=100)
    assert [w for w in rep.warnings if "grad-norm spike" in w] == [
        "grad-norm spike in 'eps_high=0.28': a step at " + f"{rep.diagnostics.grad_jump.iloc[1]:.3g}"
        + "x the median of the 10 before it"]
    assert not any("clip fraction" in w or "format" in w for w in rep.warnings)
