"""Fault tests for how a run ends: SIGTERM, a full disk, a killed sweep launcher. Whatever stops it, a run
folder ends at an honest final state (never `running`) and holds no temporary leftovers."""

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

TOY = ["configs/toy.yaml", "--set", "tracking.wandb.mode=disabled", "--set", "eval.every=0", "--quiet"]
ABLATE = [sys.executable, "-c", "from ablate.cli.main import main; main()"]


def status(run_dir: Path) -> dict:
    p = run_dir / "status.json"
    return json.loads(p.read_text()) if p.exists() else {}


def wait_for(predicate, timeout=120, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def leftovers(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp") or p.stat().st_size == 0]


def test_sigterm_ends_the_run_cancelled_with_the_reason(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*ABLATE, "train", *TOY, "--set", "steps=100000", "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: status(run_dir).get("step", 0) >= 2, what="two steps")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    st = status(run_dir)
    assert proc.returncode == 143, err
    assert st["state"] == "cancelled" and "SIGTERM" in st["error"] and st["step"] >= 2
    assert "cancelled:" in err and "Traceback" not in err
    assert leftovers(run_dir) == []


def test_full_disk_ends_the_run_failed_with_the_reason_and_no_temporary_files(tmp_path):
    """A file-size limit set on the running trainer (prlimit RLIMIT_FSIZE: what a full disk or a quota does
    to a write, without root) below what every log already holds: the next metrics row fails, and so does a
    status.json with the whole traceback. The run must still end `failed` naming the error, with no
    temporary file left behind."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([*ABLATE, "train", *TOY, "--set", "steps=100000", "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: status(run_dir).get("step", 0) >= 2, what="two steps")
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (400, 400))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    st = status(run_dir)
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
        def worker():
            infos, run_dirs = list(out.glob(".submitit/*/*_worker.json")), list(out.glob("*/status.json"))
            if infos and run_dirs and status(run_dirs[0].parent).get("step", 0) >= 2:
                return json.loads(infos[0].read_text())["pid"], int(infos[0].name.split("_")[0]), run_dirs[0].parent
            return None

        pid, controller, run_dir = wait_for(worker, what="a worker at step 2")
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        wait_for(lambda: not any(Path(f"/proc/{p}").exists() and b"submitit" in Path(f"/proc/{p}/cmdline")
                                 .read_bytes() for p in (pid, controller)), timeout=30, what="workers gone")
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
    st = status(run_dir)
    assert st["state"] == "cancelled" and "launcher" in st["error"], st
