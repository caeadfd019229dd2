"""How sweeps scale: spec expansion, SLURM submission, local executor throughput.

    python benchmarks/sweep_scale.py [--skip-slurm] [--local-runs 8] [--local-steps 300]

(a) seconds to load + expand + validate a 10,000-run spec (target < 2 s; best and median of 3);
(b) submitting a 256-run sweep to the dev SLURM cluster (`slurm/dev-cluster start`) with
    `ablate sweep run --executor slurm --profile slurm/profiles/dev.yaml` is exactly ONE sbatch call
    (a counting `sbatch` wrapper first on PATH of that subprocess) and one array job id in the
    manifest; the array is cancelled right away with `ablate sweep cancel` (no 256 trainings);
(c) CPU utilisation while `ablate sweep run` (local executor, max_parallel = cores) trains an 8-run
    toy sweep: busy share of every core from /proc/stat samples (whole machine, so other load on the
    box counts too) and the sweep's own share (CPU seconds of its processes / (wall x cores)).
Everything goes to a private temporary folder that is removed at the end. Runs in ~1-2 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import yaml  # noqa: E402

TOY = str(ROOT / "configs/toy.yaml")
DEV_PROFILE = ROOT / "slurm/profiles/dev.yaml"
ABLATE = [sys.executable, "-c", "from ablate.cli.main import main; main()"]  # the `ablate` console script


def write_spec(folder: Path, name: str, steps: int, **kw) -> Path:
    spec = {"name": name, "base": {"config": TOY, "overrides": {"steps": steps, "eval.every": 0,
                                                                "tracking.wandb.mode": "disabled"}},
            "out": str(folder / name), **kw}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def bench_expand(tmp: Path, repeats: int = 3) -> None:
    from ablate.experiments.sweep import expand, load_spec

    grid = {"optim.lr": [round(0.1 * i, 1) for i in range(1, 11)],             # 10
            "recipe.eps_high": [round(0.2 + 0.01 * i, 2) for i in range(10)],  # x 10
            "recipe.scale": ["none", "group"]}                                  # x 2
    spec = write_spec(tmp, "big", steps=100, grid=grid, seeds=list(range(50)))  # x 50 seeds = 10,000 runs
    times, n = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        runs = expand(load_spec(spec))
        times.append(time.perf_counter() - t0)
        n = len(runs)
    assert n == 10_000 and len({r.run_id for r in runs}) == n, n
    best, med = min(times), statistics.median(times)
    print(f"(a) expand + validate {n:,} runs: best {best:.2f} s, median {med:.2f} s of {repeats} "
          f"({best / n * 1e6:.0f} us/run)  target < 2 s: {'OK' if med < 2 else 'MISSED'}")


def bench_slurm_submit(tmp: Path, n: int = 256) -> None:
    real = shutil.which("sbatch")
    if real is None or subprocess.run(["sinfo", "-h"], capture_output=True, check=False).returncode != 0:
        print("(b) skipped: no SLURM cluster (run `slurm/dev-cluster start`)")
        return
    bin_dir, calls = tmp / "bin", tmp / "sbatch_calls.log"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\nexec "{real}" "$@"\n')
    (bin_dir / "sbatch").chmod(0o755)
    calls.touch()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    spec = write_spec(tmp, "scale256", steps=5, seeds=list(range(n)))
    out = tmp / "scale256"
    t0 = time.perf_counter()
    res = subprocess.run([*ABLATE, "sweep", "run", str(spec), "--executor", "slurm", "--profile", str(DEV_PROFILE),
                          "--quiet"], env=env, capture_output=True, text=True, check=False, cwd=tmp)
    submit_s = time.perf_counter() - t0
    manifest = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").exists() else {"runs": {}}
    ids = [j["job_id"] for e in manifest["runs"].values() for j in e["jobs"]]
    arrays = sorted({i.split("_")[0] for i in ids})
    t1 = time.perf_counter()
    cancelled = subprocess.run([*ABLATE, "sweep", "cancel", str(out)], capture_output=True, text=True, check=False)
    cancel_s = time.perf_counter() - t1
    for a in arrays:  # belt and braces: nothing of this benchmark stays queued
        subprocess.run(["scancel", a], capture_output=True, check=False)
    n_calls = len(calls.read_text().splitlines())
    ok = res.returncode == 0 and n_calls == 1 and len(arrays) == 1 and len(ids) == n
    print(f"(b) submit {n} runs to SLURM: {n_calls} sbatch call(s), {len(arrays)} array job id(s) "
          f"({arrays[0] if arrays else '-'}, {len(ids)} tasks) in {submit_s:.1f} s (exit {res.returncode}); "
          f"cancelled in {cancel_s:.1f} s (`sweep cancel` exit {cancelled.returncode})  {'OK' if ok else 'FAILED'}")
    if not ok:
        print(res.stdout[-2000:], res.stderr[-2000:], cancelled.stderr[-1000:], sep="\n")


def _cpu_times() -> list[tuple[int, int]]:
    """(busy, total) jiffies per core from /proc/stat."""
    rows = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]  # idle + iowait
            rows.append((sum(v[:8]) - idle, sum(v[:8])))
    return rows


def bench_local(tmp: Path, n_runs: int, steps: int) -> None:
    from ablate.experiments.worker import cpu_count

    cores = cpu_count()
    spec = write_spec(tmp, "local8", steps=steps, seeds=list(range(n_runs)))
    samples: list[list[float]] = []
    stop = threading.Event()

    def sample(every: float = 0.5) -> None:
        prev = _cpu_times()
        while not stop.wait(every):
            cur = _cpu_times()
            samples.append([(b - pb) / max(t - pt, 1) for (b, t), (pb, pt) in zip(cur, prev)])
            prev = cur

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    sampler.start()
    res = subprocess.run([*ABLATE, "sweep", "run", str(spec), "--max-parallel", str(cores), "--quiet"],
                         capture_output=True, text=True, check=False, cwd=tmp)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / (wall * cores)
    per_core = [statistics.mean(c) for c in zip(*samples)] if samples else []
    mean = statistics.mean(per_core) if per_core else float("nan")
    states = {}
    if (tmp / "local8" / "manifest.json").exists():
        from ablate.experiments.status import sweep_status

        for r in sweep_status(tmp / "local8"):
            states[r["state"]] = states.get(r["state"], 0) + 1
    print(f"(c) local executor, {n_runs} toy runs x {steps} steps, {cores} worker processes: {wall:.1f} s wall, "
          f"{states} (exit {res.returncode})")
    print(f"    machine CPU busy (/proc/stat, {len(samples)} samples): mean {mean:.0%}; per core "
          + ", ".join(f"cpu{i} {u:.0%}" for i, u in enumerate(per_core)))
    print(f"    the sweep's own processes: {own:.0%} of {cores} cores x wall (CPU seconds "
          f"{own * wall * cores:.0f} / {wall * cores:.0f})")
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-2000:], sep="\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-slurm", action="store_true", help="skip (b)")
    ap.add_argument("--local-runs", type=int, default=8)
    ap.add_argument("--local-steps", type=int, default=200)
    args = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ablate-sweep-scale-") as d:
        tmp = Path(d)
        bench_expand(tmp)
        if not args.skip_slurm:
            bench_slurm_submit(tmp)
        bench_local(tmp, args.local_runs, args.local_steps)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
