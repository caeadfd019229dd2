"""The executors' one interface (ablate/experiments/executors.py): one registry whose names are the spec's,
the CLI's and the manifest's, and the scheduler states each derives from what a job left on disk."""

from __future__ import annotations

import os
import typing
from pathlib import Path

from ablate.experiments.executors import EXECUTORS, Executor
from ablate.experiments.manifest import JOB_IDS
from ablate.experiments.sweep import ExecutorSection
from ablate.runs.store import RunStore

DEAD_PID = "999999999"  # above any pid_max: no such process


def test_one_registry_names_every_executor_the_spec_and_the_manifest_know():
    spec_names = set(typing.get_args(typing.get_type_hints(ExecutorSection)["name"]))
    assert set(EXECUTORS) == spec_names == set(JOB_IDS) == {"local", "slurm", "debug"}
    for name, ex in EXECUTORS.items():
        assert isinstance(ex, Executor) and ex.name == name
    assert [n for n, ex in EXECUTORS.items() if ex.uses_profile] == ["slurm"]


def test_local_states_come_from_the_process_table_the_result_file_and_the_store(tmp_path):
    folder = tmp_path / ".submitit" / "s1"
    folder.mkdir(parents=True)
    jobs = {rid: {"executor": "local", "job_id": DEAD_PID, "folder": ".submitit/s1"} for rid in ("a" * 12, "b" * 12)}
    assert EXECUTORS["local"].states(tmp_path, jobs) == dict.fromkeys(jobs, "LOST")  # gone without a result
    (folder / f"{DEAD_PID}_0_result.pkl").write_bytes(b"not unpickled")
    for rid, state in (("a" * 12, "completed"), ("b" * 12, "running")):
        (tmp_path / rid).mkdir()
        RunStore(tmp_path / rid).set_status(state, 1)
    assert EXECUTORS["local"].states(tmp_path, jobs) == {"a" * 12: "COMPLETED", "b" * 12: "FAILED"}


def test_debug_runs_are_done_and_nothing_is_left_to_stop(tmp_path):
    jobs = {"c" * 12: {"executor": "debug", "job_id": "DEBUG_1", "folder": ".submitit/s1"}}
    assert EXECUTORS["debug"].states(tmp_path, jobs) == {"c" * 12: "DONE"}
    assert EXECUTORS["debug"].cancel(tmp_path, {"runs": {}}, [])()


def test_slurm_cancel_without_an_active_job_calls_no_scheduler(tmp_path):
    rows = [{"run_id": "d" * 12, "job_id": "12_0", "scheduler": "COMPLETED", "executor": "slurm"}]
    assert EXECUTORS["slurm"].cancel(tmp_path, {"runs": {}}, rows)()  # no scancel: nothing active


def test_workers_are_given_the_folder_that_holds_the_package(monkeypatch):
    """A job's `python -m submitit...` imports `ablate` from PYTHONPATH: the folder holding ablate/, not ablate/
    itself (whose modules would then also import as top-level `config`, `schema`, ...)."""
    from ablate.experiments.worker import importable

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    importable()
    first, rest = os.environ["PYTHONPATH"].split(os.pathsep, 1)
    assert (Path(first) / "ablate" / "__init__.py").is_file() and rest == "/elsewhere"
    importable()  # once only
    assert os.environ["PYTHONPATH"].split(os.pathsep).count(first) == 1
