"""Run store: atomic replaces, tolerant reads, truncation on resume."""

import json

from ablate.config import parse, run_id
from ablate.runs.store import RunStore


def test_jsonl_tolerates_torn_last_line(tmp_path):
    store = RunStore(tmp_path)
    store.append("metrics", {"step": 1, "x": 1.0})
    store.append("metrics", {"step": 2, "x": 2.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "x"')  # crash mid-write
    assert [r["step"] for r in store.read("metrics")] == [1, 2]


def test_truncate_after(tmp_path):
    store = RunStore(tmp_path)
    for s in range(5):
        store.append("metrics", {"step": s})
        store.append("evals", {"step": s})
    store.truncate_after(2)
    assert [r["step"] for r in store.read("metrics")] == [0, 1, 2]
    assert [r["step"] for r in store.read("evals")] == [0, 1, 2]


def test_config_status_provenance(tmp_path):
    cfg = parse({"seed": 4})
    store = RunStore(tmp_path / "run")
    store.write_config(cfg)
    assert store.read_config()["run_id"] == run_id(cfg)
    store.set_status("failed", 7, "boom")
    assert store.status()["state"] == "failed" and store.status()["error"] == "boom"
    store.write_provenance(cfg, "cpu")
    prov = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert prov["seed"] == 4 and prov["device"] == "cpu" and prov["torch"]
    assert not list((tmp_path / "run").glob(".*.tmp"))  # no temporary files left behind


class Recorder:
    def __init__(self):
        self.calls = []

    def append(self, log, row):
        self.calls.append(("append", log, row["step"]))

    def status(self, state, step, error):
        self.calls.append(("status", state, step))

    def close(self, state):
        self.calls.append(("close", state))


class Broken(Recorder):
    def append(self, log, row):
        raise ConnectionError("dashboard down")


def test_mirrors_receive_rows_and_a_failing_one_is_dropped_with_one_warning(tmp_path, recwarn):
    good, bad = Recorder(), Broken()
    store = RunStore(tmp_path, mirrors=[bad, good])
    for s in range(3):
        store.append("metrics", {"step": s})
    store.set_status("completed", 2)
    store.close("completed")
    assert good.calls == [("append", "metrics", 0), ("append", "metrics", 1), ("append", "metrics", 2),
                          ("status", "completed", 2), ("close", "completed")]
    assert [w for w in recwarn if "Broken disabled" in str(w.message)] and len(recwarn) == 1
    assert [r["step"] for r in store.read("metrics")] == [0, 1, 2]  # the local store is complete
