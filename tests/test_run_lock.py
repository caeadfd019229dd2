"""One writer per run folder, and a log that holds every step exactly once, with real processes.

- Two `ablate train` on one folder: the second refuses at once (exit 2) naming the pid that holds the folder's
  lock; the lock is the kernel's (flock), so it is released when its holder dies, even by SIGKILL. Held by
  rank 0 of a multi-rank run and by the worker process of a sweep.
- A torn last line of metrics.jsonl: the step it belonged to is trained again on resume (from the checkpoint
  when the line is of a later step; from step 0 when a log lost rows its checkpoint covers), so the log
  holds every step exactly once, equal to the run that was never interrupted."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import crash_training_at, run_status, sweep_worker, wait_for

import ablate.train.trainer as trainer
from ablate.config import load
from ablate.runs.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
ABLATE = [sys.executable, "-c", "from ablate.cli.main import main; main()"]
QUIET = ["tracking.wandb.mode=disabled", "eval.every=0"]


def sets(*overrides) -> list[str]:
    return [x for kv in (*QUIET, *overrides) for x in ("--set", kv)]


def start(run_dir: Path, *argv) -> subprocess.Popen:
    return subprocess.Popen([*ABLATE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))


def logged_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in RunStore(run_dir).read("metrics")]


def refused_naming(run_dir: Path, holder_pids, *argv) -> str:
    """A second `ablate train` on `run_dir`: exit 2 naming one of `holder_pids`, without a traceback."""
    res = subprocess.run([*ABLATE, "train", "configs/toy.yaml", *argv, "--out", str(run_dir), "--quiet"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "is in use" in res.stderr and "Traceback" not in res.stderr
    assert any(f"pid {p} " in res.stderr for p in holder_pids), (holder_pids, res.stderr)
    return res.stderr


def test_a_second_train_is_refused_naming_the_holder_and_the_kernel_frees_the_folder(tmp_path):
    run_dir, third = tmp_path / "r", None
    first = start(run_dir, "train", "configs/toy.yaml", *sets("steps=100000", "checkpoint_every=5"),
                  "--out", str(run_dir), "--quiet")
    try:
        wait_for(lambda: run_status(run_dir).get("step", 0) >= 2, what="the first at step 2")
        refused_naming(run_dir, [first.pid], *sets("steps=100000", "checkpoint_every=5"))
        assert first.poll() is None  # the first trains on, alone
        at = run_status(run_dir)["step"]
        wait_for(lambda: run_status(run_dir).get("step", 0) >= max(at + 2, 6), what="the first two steps on")
        first.send_signal(signal.SIGKILL)  # no clean-up at all: the kernel releases the flock
        first.wait()
        assert RunStore(run_dir).holder() is None
        third = start(run_dir, "train", "configs/toy.yaml", *sets("steps=100000", "checkpoint_every=5"),
                      "--out", str(run_dir), "--quiet")
        killed_at = max(logged_steps(run_dir))
        wait_for(lambda: run_status(run_dir).get("step", 0) >= killed_at + 2, what="the third resumed two steps on")
        third.send_signal(signal.SIGTERM)
        _, err = third.communicate(timeout=120)
    finally:
        for p in (first, third):
            if p is not None and p.poll() is None:
                p.kill()
    assert run_status(run_dir)["state"] == "cancelled", err
    steps = logged_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1))  # every step once, in order: one writer at a time
    assert RunStore(run_dir).provenance()["resumed_from_steps"][-1] % 5 == 0


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        todo += children.get(p, [])
    return out


def test_rank_0_of_a_multi_rank_run_holds_the_folder(tmp_path):
    run_dir = tmp_path / "r"
    launcher = start(run_dir, "train", "configs/toy.yaml", *sets("steps=100000"), "--out", str(run_dir), "--quiet",
                     "--nproc", "2")
    try:
        wait_for(lambda: run_status(run_dir).get("step", 0) >= 2, timeout=300, what="2 ranks at step 2")
        ranks = descendants(launcher.pid) - {launcher.pid}
        err = refused_naming(run_dir, ranks, *sets("steps=100000"))
        holder = int(err.split("pid ")[1].split()[0])
        assert holder in ranks and holder != launcher.pid  # a rank, not the launcher
        assert launcher.poll() is None
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    steps = logged_steps(run_dir)
    assert steps == list(range(1, len(steps) + 1))


def test_the_worker_of_a_sweep_holds_its_run_folder(tmp_path):
    spec = tmp_path / "s.yaml"
    overrides = {"steps": 100000, "eval.every": 0, "tracking.wandb.mode": "disabled"}
    spec.write_text(yaml.safe_dump({"name": "held", "out": str(tmp_path / "runs"), "seeds": [0],
                                    "base": {"config": str(ROOT / "configs" / "toy.yaml"), "overrides": overrides}}))
    launcher = subprocess.Popen([*ABLATE, "sweep", "run", str(spec), "--quiet"], start_new_session=True, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "runs"
    try:
        pid, _, run_dir = wait_for(lambda: sweep_worker(out), timeout=300, what="a worker at step 2")
        refused_naming(run_dir, [pid], *[x for k, v in overrides.items() for x in ("--set", f"{k}={v}")])
        assert run_status(run_dir)["state"] == "running"
    finally:
        os.killpg(launcher.pid, signal.SIGINT)  # the launcher cancels its runs (Ctrl-C)
        try:
            launcher.wait(timeout=120)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)


# --- a torn last line ------------------------------------------------------------------------------------

def toy(*overrides):
    return load(ROOT / "configs" / "toy.yaml", [*QUIET, *overrides])


def strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def tear_last_line(path: Path, drop: int = 0) -> None:
    """Drop the last `drop` lines, then cut the last one mid-line (what a crash of the machine leaves)."""
    lines = path.read_bytes().splitlines(keepends=True)[: -drop or None]
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])


def resume(run_dir: Path, *overrides) -> subprocess.CompletedProcess:
    return subprocess.run([*ABLATE, "train", "configs/toy.yaml", *sets(*overrides), "--out", str(run_dir), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


OVERRIDES = ("steps=8", "checkpoint_every=2", "eval.every=4")


def test_a_torn_line_of_a_step_after_the_checkpoint_is_trained_again(tmp_path, monkeypatch):
    whole = RunStore(tmp_path / "whole")
    assert trainer.train(toy(*OVERRIDES), str(whole.root), progress=False) == "completed"
    run_dir = tmp_path / "r"
    crash_training_at(monkeypatch, toy(*OVERRIDES), run_dir, step=5)  # node lost: checkpoint of 4, rows of 1..5
    tear_last_line(run_dir / "metrics.jsonl")  # step 5's line, torn
    res = resume(run_dir, *OVERRIDES)
    assert res.returncode == 0, res.stderr
    store = RunStore(run_dir)
    assert [r["step"] for r in store.read("metrics")] == list(range(1, 9))
    assert strip_timing(store.read("metrics")) == strip_timing(whole.read("metrics"))
    assert store.read("evals") == whole.read("evals")
    assert store.provenance()["resumed_from_steps"] == [4]  # from the checkpoint: step 5 trained again


def test_a_log_that_lost_rows_of_the_checkpoints_steps_is_trained_again_from_the_start(tmp_path, monkeypatch):
    """The checkpoint of step 4 is on disk but the log's tail is not (a crash of the machine before the page
    cache reached the disk, or an edit): its last line, step 4's, is torn and step 5's gone. Resuming at 5
    would leave step 4 out of the log forever; the run is trained again from step 0 and says so."""
    whole = RunStore(tmp_path / "whole")
    assert trainer.train(toy(*OVERRIDES), str(whole.root), progress=False) == "completed"
    run_dir = tmp_path / "r"
    crash_training_at(monkeypatch, toy(*OVERRIDES), run_dir, step=5)
    tear_last_line(run_dir / "metrics.jsonl", drop=1)  # step 5's line gone, step 4's (the checkpoint's) torn
    res = resume(run_dir, *OVERRIDES)
    assert res.returncode == 0, res.stderr
    assert "metrics.jsonl" in res.stderr and "training the run again from step 0" in res.stderr
    store = RunStore(run_dir)
    assert [r["step"] for r in store.read("metrics")] == list(range(1, 9))
    assert strip_timing(store.read("metrics")) == strip_timing(whole.read("metrics"))
    assert store.read("evals") == whole.read("evals")
    assert store.provenance()["resumed_from_steps"] == []
