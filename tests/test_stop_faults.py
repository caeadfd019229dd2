"""Fault tests for how a run ends: SIGTERM, SIGHUP, Ctrl-C, a full disk, a killed sweep launcher. Whatever
stops it, a run folder ends at an honest final state (never `running`) and holds no temporary leftovers."""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_status, sweep_worker, wait_for

TOY = ["configs/toy.yaml", "--set", "tracking.wandb.mode=disabled", "--set", "eval.every=0", "--quiet"]
ABLATE = [sys.executable, "-c", "from ablate.cli.main import main; main()"]


def leftovers(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp") or p.stat().st_size == 0]


def default_signals():
    """In the child: the stop signals at their default action, whatever this process inherited (nohup)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code, named", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP"),
                                              (signal.SIGINT, 130, "SIGINT")])
def test_a_stop_signal_ends_the_run_cancelled_naming_it(tmp_path, sig, code, named):
    """kill, a closed terminal or SSH session (SIGHUP), Ctrl-C: the run ends `cancelled` with the signal named,
    and the same command resumes it; never `running` after the process is gone."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*ABLATE, "train", *TOY, "--set", "steps=100000", "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        wait_for(lambda: run_status(run_dir).get("step", 0) >= 2, what="two steps")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    st = run_status(run_dir)
    assert proc.returncode == code, err
    assert st["state"] == "cancelled" and named in st["error"] and st["step"] >= 2
    assert "cancelled:" in err and "Traceback" not in err
    assert leftovers(run_dir) == []


def test_sighup_under_nohup_is_left_to_nohup(tmp_path):
    """A run started with SIGHUP ignored (nohup) outlives its terminal: the trainer leaves that choice alone."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*ABLATE, "train", *TOY, "--set", "steps=100000", "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        wait_for(lambda: run_status(run_dir).get("step", 0) >= 2, what="two steps")
        proc.send_signal(signal.SIGHUP)
        step = run_status(run_dir)["step"]
        wait_for(lambda: run_status(run_dir).get("step", 0) >= step + 3, what="three more steps after SIGHUP")
        assert proc.poll() is None and run_status(run_dir)["state"] == "running"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert run_status(run_dir)["state"] == "cancelled" and "SIGTERM" in run_status(run_dir)["error"]


def test_full_disk_ends_the_run_failed_with_the_reason_and_no_temporary_files(tmp_path):
    """A file-size limit set on the running trainer (prlimit RLIMIT_FSIZE: what a full disk or a quota does
    to a write, without root) below what every log already holds: the next metrics row fails, and so does a
    status.json with the whole traceback. The run must still end `failed` naming the error, with no
    temporary file left behind."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*ABLATE, "train", *TOY, "--set", "steps=100000", "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: run_status(run_dir).get("step", 0) >= 2, what="two steps")
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (400, 400))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    st = run_status(run_dir)
    assert proc.returncode == 1, err
    assert st["state"] == "failed" and "File too large" in st["error"], st
    assert "error: File too large" in err and "Traceback" not in err
    assert leftovers(run_dir) == []


def test_killed_sweep_launcher_leaves_no_worker_running(tmp_path):
    spec = tmp_path / "toy.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "orphans", "out": str(tmp_path / "runs"), "seeds": [0],
        "base": {"config": str(Path("configs/toy.yaml").resolve()),
                 "overrides": {"steps": 100000, "eval.every": 0, "tracking.wandb.mode": "disabled"}}}))
    launcher = subprocess.Popen([*ABLATE, "sweep", "run", str(spec), "--quiet"], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "runs"
    try:
        pid, controller, run_dir = wait_for(lambda: sweep_worker(out), what="a worker at step 2")
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        wait_for(lambda: not any(Path(f"/proc/{p}").exists() and b"submitit" in Path(f"/proc/{p}/cmdline")
                                 .read_bytes() for p in (pid, controller)), timeout=30, what="workers gone")
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
    st = run_status(run_dir)
    assert st["state"] == "cancelled" and "launcher" in st["error"], st
