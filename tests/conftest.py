import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")  # tests/test_tracking.py opts in to offline explicitly
# tmp_path and tmp_path_factory folders on tmpfs where the machine has one: every run fsyncs its
# status.json each step, ~20% of a toy run's time on a disk (far more on a busy one), free on tmpfs.
# The same writes, renames and fsync calls happen; only the disk's latency is gone. Set
# PYTEST_DEBUG_TEMPROOT yourself (pytest's own variable) to put them elsewhere.
if "PYTEST_DEBUG_TEMPROOT" not in os.environ and os.access("/dev/shm", os.W_OK):
    os.environ["PYTEST_DEBUG_TEMPROOT"] = "/dev/shm"

# under pytest-xdist each worker's torch gets its share of the cores (read when torch initialises), not all
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

SYSTEM_PACKAGES = Path(__file__).resolve().parent.parent / "scripts" / "system-packages"


def pytest_sessionstart(session):
    """Before the first test: every system program the suite runs is there (scripts/system-packages.txt),
    else stop at once, naming each missing program and its Debian package, not 30 failures later."""
    if hasattr(session.config, "workerinput"):  # a pytest-xdist worker: the controller checked
        return
    res = subprocess.run([str(SYSTEM_PACKAGES), "check"], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.exit(res.stdout + res.stderr, returncode=pytest.ExitCode.USAGE_ERROR)


SLURM_STATE_DIR = Path(os.environ.get("ABLATE_SLURM_DIR", "/var/tmp/ablate-slurm"))
SLURM_START_HINT = "run `slurm/dev-cluster start` (as root) to bring up the dev SLURM cluster"


@pytest.fixture(scope="module")
def slurm_cluster() -> None:
    """Fail (never skip) with a clear hint when the dev SLURM cluster is not reachable."""
    conf = SLURM_STATE_DIR / "slurm.conf"
    if "SLURM_CONF" not in os.environ and conf.exists() and not Path("/etc/slurm/slurm.conf").exists():
        os.environ["SLURM_CONF"] = str(conf)  # inherited by sbatch/sacct and by submitit's subprocesses
    if shutil.which("sinfo") is None:
        pytest.fail(f"`sinfo` is not on PATH: {SLURM_START_HINT}", pytrace=False)
    try:
        res = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`sinfo` timed out, slurmctld is not answering: {SLURM_START_HINT}", pytrace=False)
    if res.returncode != 0 or not set(res.stdout.split()) & {"idle", "mixed", "allocated", "completing", "planned"}:
        pytest.fail(f"SLURM cluster is down (sinfo: {res.stdout.strip()} {res.stderr.strip()}): {SLURM_START_HINT}",
                    pytrace=False)
    # a module starts on an empty queue: the tests time their jobs, which must not wait behind another's
    deadline = time.monotonic() + 120
    while (queue := subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout.strip()):
        if time.monotonic() > deadline:
            pytest.fail(f"the dev cluster's queue is not empty after 120 s:\n{queue}", pytrace=False)
        time.sleep(0.5)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The tiny base model barely trained (10 steps): fast to build, and recipes only need to run. Built
    once per session and shared read-only (every run writes to its own folder)."""
    from ablate.train.models import build_base_model

    path = tmp_path_factory.mktemp("tiny-model")
    build_base_model(path, steps=10, progress=False)
    return str(path)


def crash_training_at(monkeypatch, cfg, run_dir, step: int) -> None:
    """Train `cfg` into `run_dir` until a simulated node loss as step `step` starts (the exception
    escapes the trainer), then undo the fault so that the next train() resumes normally."""
    from ablate.runs.store import RunStore
    from ablate.train import trainer

    real = RunStore.set_status

    def crash(self, state, at, error=None):
        if state == "running" and at == step:
            raise RuntimeError("node lost")
        return real(self, state, at, error)

    monkeypatch.setattr(RunStore, "set_status", crash)
    with pytest.raises(RuntimeError, match="node lost"):
        trainer.train(cfg, str(run_dir), progress=False)
    monkeypatch.setattr(RunStore, "set_status", real)


def sample_counting_rows(policy, prompts, n, *args, key=(0, 0, 0, 0)):
    """policy.sample(prompts, n, *args) with the row noise the trainer uses (a fixed key), and the number of
    rows of every decoder forward it ran."""
    from ablate.rl.sampling import RowNoise

    rows = []
    hook = policy.base.get_decoder().register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        return policy.sample(prompts, n, *args, noise=RowNoise(key, len(prompts) * n)), rows
    finally:
        hook.remove()


def wait_for(predicate, timeout=180, what="condition"):
    """The first truthy value of `predicate()`, polled every 0.1 s; TimeoutError naming `what`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(what)


def run_status(run_dir: Path) -> dict:
    """A run folder's status.json as it is now ({} before it exists or while it is being replaced)."""
    import json

    try:
        return json.loads((Path(run_dir) / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def sweep_worker(out: Path, step: int = 2):
    """(worker pid, submitit controller pid, run folder) of the first run of the local sweep in `out` once it
    has reached `step`, else None (the worker writes `<job id>_worker.json`; the job id is the controller's)."""
    import json

    infos, run_dirs = list(out.glob(".submitit/*/*_worker.json")), list(out.glob("*/status.json"))
    if infos and run_dirs and run_status(run_dirs[0].parent).get("step", 0) >= step:
        return json.loads(infos[0].read_text())["pid"], int(infos[0].name.split("_")[0]), run_dirs[0].parent
    return None


def snapshot(d: Path) -> dict:
    """Every path under `d` with its content hash: equal snapshots mean nothing was written or changed."""
    import hashlib

    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(d.rglob("*"))}


def assert_refused(d: Path, argv: list[str], monkeypatch, *expected: str) -> str:
    """`ablate argv` run in `d` (in-process): exit 2, no traceback, every expected substring in the message
    (unwrapped), nothing written or changed under `d`. Returns the message."""
    from typer.testing import CliRunner

    from ablate.cli.main import app

    before = snapshot(d)
    monkeypatch.chdir(d)
    res = CliRunner().invoke(app, argv)
    out = " ".join(res.output.split())
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    assert [e for e in expected if e not in out] == [], res.output
    assert snapshot(d) == before
    return out


CHROMIUM = "/usr/bin/chromium"


def assert_renders_in_chromium(html, tmp_path) -> None:
    """Screenshot `html` in headless Chromium (Debian's; `make services` installs it) and check that the
    page is not blank: text and figures, not a white sheet or an error page."""
    import numpy as np
    from PIL import Image

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (`make services` does)", pytrace=False)
    png = Path(tmp_path) / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", f"--user-data-dir={Path(tmp_path) / 'profile'}",
           f"--screenshot={png}", "--window-size=1200,2000", f"file://{Path(html).resolve()}"]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert png.exists() and png.stat().st_size > 20_000
    pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert pixels.shape == (2000, 1200)
    assert pixels.std() > 20 and (pixels < 128).mean() > 0.01               # not blank: text and figures


@functools.cache
def _uses_the_cluster(path: Path) -> bool:
    return "mark.slurm" in path.read_text()


def pytest_collection_modifyitems(config, items):
    """The dev SLURM cluster's tests first: under pytest-xdist they are one unit (see below), the longest."""
    items.sort(key=lambda item: item.get_closest_marker("slurm") is None)  # stable: files keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `-n auto --dist loadfile`: each file's tests on one worker, so its module fixtures are
    built once, and the files that use the dev SLURM cluster together as one unit, first, because the
    cluster's 2 CPUs hold one test's jobs at a time and its tests time their jobs."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesClusterTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "dev SLURM cluster" if _uses_the_cluster(config.rootpath / file) else file

    config.option.loadscopereorder = False  # units in collection order (not by size): the cluster's first
    return FilesClusterTogether(config, log)
