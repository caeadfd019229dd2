"""Reward shaping terms (ablate/rl/rewards.py) against hand-computed values."""

import pytest
import torch

from ablate.config import ConfigError, parse
from ablate.rl.rewards import format_weight_at, overlong_penalty


def test_overlong_soft_penalty_hand_computed():
    # max 8, buffer 4: no penalty up to 4 tokens, then -factor * (len - 4) / 4, capped at -factor
    lengths = torch.tensor([0, 4, 5, 6, 8, 9])
    got = overlong_penalty(lengths, max_len=8, buffer=4, factor=1.0)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    assert overlong_penalty(torch.tensor([7]), 8, 4, 0.5).item() == pytest.approx(-0.375)


def test_format_weight_anneals_linearly_to_zero():
    assert [format_weight_at(0.5, 0, s) for s in (0, 1, 1000)] == [0.5, 0.5, 0.5]      # 0 = constant
    assert [format_weight_at(0.5, 4, s) for s in (0, 1, 2, 4, 5)] == pytest.approx([0.5, 0.375, 0.25, 0.0, 0.0])


def test_format_anneal_config_checks():
    assert parse({"recipe": {"format_weight": 0.2, "format_anneal_steps": 100}}).recipe.format_anneal_steps == 100
    with pytest.raises(ConfigError, match="format_anneal_steps anneals recipe.format_weight, which is 0"):
        parse({"recipe": {"format_anneal_steps": 100}})
    with pytest.raises(ConfigError, match="format_anneal_steps: -1 is not allowed; allowed: an integer >= 0"):
        parse({"recipe": {"format_weight": 0.2, "format_anneal_steps": -1}})
