"""Output locations: every path the CLI writes is checked at the boundary (one helper, cli/options.py
`check_output`), and the run store turns an OSError on a path of the run folder into an error naming it.

The cases are generated: every `--out`/`-o` option of every command (walked from the CLI itself, so a new
command with an output option fails here until it is covered), every output a spec names (`out`) or a
command derives (the report's .md, `sweep extend`'s spec, `tune confirm`'s spec, ABLATE_CACHE), and every
file of the run folder's contract replaced by a folder. Each exits 2 naming the path, with no traceback,
and writes nothing."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from conftest import assert_refused, run_status, wait_for
from typer.testing import CliRunner

from ablate.cli.main import app
from ablate.config import load
from ablate.runs.store import LOCK, RUN_FILES, RunFolderError, RunStore

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "configs" / "toy.yaml"
QUIET = ["tracking.wandb.mode=disabled", "eval.every=0"]
# a valid invocation of each command with an output option, which the option is added to
COMMANDS = {
    ("train",): ["train", "toy.yaml"],
    ("export",): ["export", "run"],
    ("base-model",): ["base-model"],
    ("report",): ["report", "runs"],
    ("sweep", "plan"): ["sweep", "plan", "s.yaml"],
    ("sweep", "run"): ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet"],
    ("sweep", "extend"): ["sweep", "extend", "s.yaml", "--until-ci-width", "1", "--max-seeds", "3"],
    ("tune", "run"): ["tune", "run", "t.yaml", "--executor", "inline"],
    ("tune", "status"): ["tune", "status", "t.yaml"],
    ("tune", "confirm"): ["tune", "confirm", "t.yaml"],
}


def output_options():
    """(command path, option, folder?) for every --out/-o option of the CLI."""
    def walk(cmd, path=()):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + (name,))
        else:
            for p in cmd.params:
                opts = getattr(p, "opts", [])
                if "--out" in opts or "-o" in opts:
                    yield path, opts[-1], p.metavar != "FILE"
    return list(walk(typer.main.get_command(app)))


OPTIONS = output_options()
# how an output location is wrong: (name, the value given, applies to folders / files, what the message says)
BAD = [("parent-is-a-file", "f.txt/x", None, "f.txt is a file, not a folder"),
       ("ancestor-is-a-file", "f.txt/a/b", None, "f.txt is a file, not a folder"),
       ("a-file-for-a-folder", "f.txt", True, "is a file, not a folder"),
       ("a-folder-for-a-file", "d", False, "is a folder, not a file")]
CASES = [(path, opt, bad, value, what) for path, opt, folder in OPTIONS for bad, value, kind, what in BAD
         if kind in (None, folder)]


def inputs(d: Path) -> None:
    """A toy config, a sweep spec and a search spec over it, a file and a folder to misuse, a runs folder."""
    (d / "toy.yaml").write_text(TOY.read_text() + "tracking: {wandb: {mode: disabled}}\n")
    (d / "s.yaml").write_text(yaml.safe_dump({"name": "s", "base": {"config": "toy.yaml"}, "seeds": [0]}))
    (d / "t.yaml").write_text(yaml.safe_dump({
        "name": "t", "base": {"config": "toy.yaml"}, "seeds": [0], "trials": 1,
        "search": {"optim.lr": {"type": "float", "low": 0.1, "high": 1.0}}, "objective": {"metric": "eval/pass@1"}}))
    (d / "f.txt").write_text("a file\n")
    (d / "d").mkdir()
    (d / "runs").mkdir()


def test_every_command_with_an_output_option_is_covered():
    assert {path for path, _, _ in OPTIONS} == set(COMMANDS)


@pytest.mark.parametrize("path, option, bad, value, what", CASES,
                         ids=[f"{' '.join(c[0])} {c[1]} {c[2]}" for c in CASES])
def test_every_output_option_is_checked_before_anything_is_written(tmp_path, monkeypatch, path, option, bad, value,
                                                                   what):
    inputs(tmp_path)
    assert_refused(tmp_path, [*COMMANDS[path], option, value], monkeypatch, f"{option} {value}: {what}")


@pytest.mark.parametrize("case", ["sweep spec out", "search spec out", "report .md", "sweep extend spec",
                                  "tune confirm spec", "ABLATE_CACHE"])
def test_outputs_named_by_a_spec_or_derived_by_a_command_are_checked(tmp_path, monkeypatch, case):
    inputs(tmp_path)
    if case == "sweep spec out":
        (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "base": {"config": "toy.yaml"}, "out": "f.txt/sw"}))
        argv, expected = ["sweep", "run", "s.yaml", "--executor", "debug"], ["s.yaml: out: f.txt/sw: f.txt is a file"]
    elif case == "search spec out":
        raw = yaml.safe_load((tmp_path / "t.yaml").read_text())
        (tmp_path / "t.yaml").write_text(yaml.safe_dump({**raw, "out": "f.txt/tr"}))
        argv, expected = ["tune", "run", "t.yaml", "--executor", "inline"], ["t.yaml: out:", "f.txt is a file"]
    elif case == "report .md":
        (tmp_path / "r.md").mkdir()
        argv, expected = ["report", "runs", "-o", "r.html"], ["-o/--out r.md: is a folder, not a file"]
    elif case == "sweep extend spec":
        (tmp_path / "s.extend.yaml").mkdir()
        argv, expected = COMMANDS[("sweep", "extend")], ["s.extend.yaml: is a folder, not a file"]
    elif case == "tune confirm spec":
        (tmp_path / "t_confirm.yaml").mkdir()
        argv, expected = COMMANDS[("tune", "confirm")], ["t_confirm.yaml: is a folder, not a file"]
    else:
        monkeypatch.setenv("ABLATE_CACHE", "f.txt/cache")
        argv, expected = ["difficulty", "toy.yaml"], ["ABLATE_CACHE f.txt/cache: f.txt is a file, not a folder"]
    assert_refused(tmp_path, argv, monkeypatch, *expected)


# --- the run folder: every file of its contract replaced by a folder -----------------------------------

READ_BY_REPORT = ("config.yaml", "status.json", "metrics.jsonl", "evals.jsonl", "samples.jsonl", "eval_problems.jsonl")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    from ablate.train.trainer import train

    run = tmp_path_factory.mktemp("toy") / "r"
    assert train(load(TOY, [*QUIET, "steps=3", "eval.every=3"]), str(run), progress=False) == "completed"
    return run


@pytest.mark.parametrize("name", ["config.yaml", *RUN_FILES, LOCK])
def test_a_run_file_replaced_by_a_folder_is_named(tmp_path, monkeypatch, toy_run, name):
    import shutil

    run = tmp_path / "r"
    shutil.copytree(toy_run, run)
    RunStore(run).set_status("failed", 2, "node lost")  # so that `ablate train` resumes it
    (run / name).unlink(missing_ok=True)
    (run / name).mkdir()
    (tmp_path / "toy.yaml").write_text(TOY.read_text())
    args = ["train", "toy.yaml", "--out", "r", *[x for kv in QUIET + ["steps=3", "eval.every=3"] for x in ("--set", kv)]]
    assert_refused(tmp_path, args, monkeypatch, f"r: {name}: expected a file, found a folder")
    res = CliRunner().invoke(app, ["report", "r", "-o", "rep.html"])
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    if name in READ_BY_REPORT:  # what the report reads: named; the rest (checkpoint, provenance, lock) unused
        assert res.exit_code == 2 and f"r/{name}" in " ".join(res.output.split()), res.output


def test_store_writes_name_the_path_instead_of_an_oserror(tmp_path):
    store = RunStore(tmp_path / "r")
    store.write_config(load(TOY))
    for name in ("metrics.jsonl", "status.json"):
        (tmp_path / "r" / name).mkdir()
    with pytest.raises(RunFolderError, match="metrics.jsonl: cannot be written"):
        store.append("metrics", {"step": 1})
    with pytest.raises(RunFolderError, match="status.json: cannot be written"):
        store.set_status("running", 1)
    with pytest.raises(RunFolderError, match="cannot be written"):
        RunStore(tmp_path / "r" / "config.yaml" / "x").lock()  # a file where the run folder would go


def test_a_log_replaced_by_a_folder_mid_run_ends_it_failed_naming_the_path(tmp_path):
    """A real run: its metrics.jsonl becomes a folder while it trains; the next row cannot be written, the
    run ends `failed` naming the path, `ablate train` exits 2 with one line (no traceback)."""
    run = tmp_path / "r"
    sets = [x for kv in QUIET + ["steps=100000"] for x in ("--set", kv)]
    proc = subprocess.Popen([sys.executable, "-c", "from ablate.cli.main import main; main()", "train", str(TOY),
                             *sets, "--out", str(run), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: run_status(run).get("step", 0) >= 2, timeout=180, what="two steps")
        os.rename(run / "metrics.jsonl", tmp_path / "metrics.jsonl")
        (run / "metrics.jsonl").mkdir()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    status = json.loads((run / "status.json").read_text())
    assert proc.returncode == 2, err
    assert f"{run}/metrics.jsonl: cannot be written (Is a directory)" in err and "Traceback" not in err
    assert status["state"] == "failed" and "metrics.jsonl: cannot be written" in status["error"]
