"""Property: whatever a config or sweep spec is mutated into, `ablate sweep plan` exits 0 or 2 with a
message, never a traceback (plan validates every run and trains nothing)."""

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ablate.cli.main import app

ROOT = Path(__file__).resolve().parent.parent
BASE = yaml.safe_load((ROOT / "configs" / "toy.yaml").read_text())
SPEC = {"name": "p", "base": {"config": "c.yaml", "overrides": {"steps": 3}}, "grid": {"recipe.eps_high": [0.2, 0.3]},
        "seeds": [0, 1]}
WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                  st.text(max_size=8), st.lists(st.integers(-3, 9), max_size=3), st.dictionaries(
                      st.sampled_from(["a", "steps", "lr", "name"]), st.integers(), max_size=2))


def paths(d, prefix=()):
    for k, v in d.items():
        yield (*prefix, k)
        if isinstance(v, dict):
            yield from paths(v, (*prefix, k))


@st.composite
def mutated(draw, doc):
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        keys = list(paths(doc))
        if not keys:
            break
        path = draw(st.sampled_from(keys))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        op = draw(st.sampled_from(["set", "delete", "rename"]))
        if op == "set":
            parent[path[-1]] = draw(WEIRD)
        elif op == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1] + draw(st.sampled_from(["x", "_", "s"]))] = parent.pop(path[-1])
    return doc


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=mutated(BASE), spec=st.one_of(st.just(SPEC), mutated(SPEC)))
def test_mutated_config_or_spec_exits_0_or_2_never_a_traceback(tmp_path, monkeypatch, cfg, spec):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["sweep", "plan", "s.yaml"])
    assert res.exit_code in (0, 2), (res.exit_code, res.output, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
