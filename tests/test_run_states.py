"""A run's state is one vocabulary, `RunState` (ablate/runs/store.py): every state the package writes,
compares against or returns is one of its members, found by reading the code (AST), so a misspelt or new
bare state string fails here instead of silently never matching."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import optuna

from ablate.runs.store import FINISHED, STATES, RunState

ROOT = Path(__file__).resolve().parents[1]
RUN_STATES = set(typing.get_args(RunState))
# `ablate tune status` rows hold Optuna trial states ("complete", "pruned", ...) under "state"
TRIAL_STATES = {s.name.lower() for s in optuna.trial.TrialState}
TRIAL_MODULES = {"ablate/cli/tune.py"}


def _is_state(e: ast.expr) -> bool:
    """`state`, `store_state`, `states[-1]`, `x.state`, `row["state"]`, `row.get("state")`."""
    if isinstance(e, ast.Name):
        return e.id in ("state", "store_state", "states")
    if isinstance(e, ast.Attribute):
        return e.attr == "state"
    if isinstance(e, ast.Subscript):
        return (isinstance(e.slice, ast.Constant) and e.slice.value == "state") or _is_state(e.value)
    return (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "get" and bool(e.args)
            and isinstance(e.args[0], ast.Constant) and e.args[0].value == "state")


def _strings(e: ast.expr | None) -> list[str]:
    if isinstance(e, ast.Constant) and isinstance(e.value, str):
        return [e.value]
    if isinstance(e, (ast.Tuple, ast.List, ast.Set)):
        return [s for x in e.elts for s in _strings(x)]
    return []


def state_strings(source: str) -> list[tuple[int, str, bool]]:
    """(line, string, written) for each state string in `source`: compared with a state, passed to
    `set_status`/`close` (written: it lands in status.json), given as `state=`, assigned to `state` or
    to a name annotated RunState, returned by a function annotated to return RunState."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(_is_state(s) for s in (node.left, *node.comparators)):
            found += [(node.lineno, v, False) for s in (node.left, *node.comparators) if not _is_state(s)
                      for v in _strings(s)]
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr in ("set_status", "close") and node.args:
                found += [(node.lineno, v, True) for v in _strings(node.args[0])]
            found += [(node.lineno, v, False) for k in node.keywords if k.arg == "state" for v in _strings(k.value)]
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, v, False) for k, val in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "state" for v in _strings(val)]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "state" for t in node.targets):
            found += [(node.lineno, v, False) for v in _strings(node.value)]
        elif isinstance(node, ast.AnnAssign) and "RunState" in ast.unparse(node.annotation):
            found += [(node.lineno, v, False) for v in _strings(node.value)]
        elif isinstance(node, ast.FunctionDef) and node.returns is not None and "RunState" in ast.unparse(node.returns):
            found += [(r.lineno, v, False) for r in ast.walk(node) if isinstance(r, ast.Return) for v in _strings(r.value)]
    return found


def test_the_reader_finds_state_strings_where_the_code_uses_them():
    src = ('def f(row, store) -> "RunState":\n    if row["state"] in ("completed", "done"):\n'
           '        store.set_status("finished", 1)\n    state = "stuck"\n    return "lost"\n')
    assert sorted(state_strings(src)) == [(2, "completed", False), (2, "done", False), (3, "finished", True),
                                          (4, "stuck", False), (5, "lost", False)]


def test_every_state_string_in_the_package_is_a_run_state():
    bad, seen = [], set()
    for path in sorted((ROOT / "ablate").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        allowed = RUN_STATES | (TRIAL_STATES if rel in TRIAL_MODULES else set())
        for line, value, written in state_strings(path.read_text()):
            seen.add(value)
            if value not in (set(STATES) if written else allowed):
                bad.append(f"{rel}:{line}: {value!r}" + (" (written to status.json)" if written else ""))
    assert not bad, f"state strings outside RunState {sorted(RUN_STATES)}:\n" + "\n".join(bad)
    assert {"completed", "failed", "cancelled", "diverged", "pruned", "running", "pending", "missing"} <= seen


def test_the_state_tuples_are_run_states():
    assert set(STATES) <= RUN_STATES and set(FINISHED) <= set(STATES)
    assert RUN_STATES - set(STATES) == {"pending", "missing", "unknown"}  # derived, never written
