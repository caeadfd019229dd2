"""`ablate tune status` warns when the best value sits at a bound of its search range."""

from ablate.cli.tune import bound_warnings
from ablate.experiments.search import Param

PARAMS = [Param("optim.lr", "float", 1e-6, 1e-3, log=True), Param("recipe.eps_high", "float", 0.2, 0.4),
          Param("recipe.group_size", "int", 4, 16), Param("recipe.scale", "categorical", choices=("group", "none"))]


def test_values_at_a_bound_are_warned_inside_are_not():
    # lr 9e-4: log position (log 9e-4 - log 1e-6) / (log 1e-3 - log 1e-6) = 0.985 -> upper bound
    w = bound_warnings(PARAMS, {"optim.lr": 9e-4, "recipe.eps_high": 0.3, "recipe.group_size": 4,
                                "recipe.scale": "none"})
    assert len(w) == 2
    assert w[0].startswith("best optim.lr = 0.0009 sits at the upper bound") and "(log scale)" in w[0]
    assert w[1].startswith("best recipe.group_size = 4 sits at the lower bound of the search range [4, 16]")
    # 3e-5 is in the middle of the log range (position 0.49) though near the bottom on a linear scale
    assert bound_warnings(PARAMS, {"optim.lr": 3e-5, "recipe.eps_high": 0.25}) == []
    assert len(bound_warnings(PARAMS, {"recipe.eps_high": 0.209})) == 1      # within 5% of the range
    assert bound_warnings(PARAMS, {}) == []
