"""Load + report benchmark: 1,000 synthetic runs x 500 steps x ~25 metrics (23 per step + 6 held-out).

    python benchmarks/load_report.py [--runs 1000] [--steps 500] [--dir /tmp/ablate-bench]

Prints wall time and peak memory (max RSS of a fresh process) for: writing the runs, the first
report (JSONL parsed, Parquet cache written, statistics, figures, HTML/Markdown), a warm load (from
the cache), the report again from the warm cache, and the tidy `load_runs` frame. Target: load +
report under 30 s and 4 GB, first time included.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPORT = "from ablate.analysis import build_report; build_report([ROOT], OUT, metric='eval/pass@1', x='tokens')"
PHASES = {
    "cold load + full report (parse JSONL)": REPORT,
    "warm load (Parquet cache)": "from ablate.analysis import load_study; s = load_study(ROOT)",
    "warm load + full report": REPORT,
    "tidy load_runs frame": "import ablate; df = ablate.load_runs(ROOT); print('rows', len(df), "
                            "'MB', round(df.memory_usage(deep=True).sum() / 1e6))",
}


def phase(code: str, root: Path, out: Path) -> tuple[float, float]:
    """Run `code` in a fresh interpreter; (seconds excluding imports, peak RSS in GB)."""
    script = (f"import time, resource, ablate.analysis, ablate.analysis.report\nROOT, OUT = {str(root)!r}, {str(out)!r}\n"
              f"t = time.time()\n{code}\n"
              "print('SECONDS', time.time() - t)\n"
              "print('PEAK_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=None)
    if res.returncode:
        raise SystemExit(res.stderr)
    vals = dict(line.split(" ", 1) for line in res.stdout.splitlines() if line.startswith(("SECONDS", "PEAK_KB")))
    for line in res.stdout.splitlines():
        if line.startswith("rows"):
            print("   ", line)
    return float(vals["SECONDS"]), int(vals["PEAK_KB"]) / 1024 ** 2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    from ablate.analysis.synthetic import STEP_KEYS, write_sweep

    tmp = args.dir or Path(tempfile.mkdtemp(prefix="ablate-bench-"))
    root = tmp / "runs"
    grid = {"recipe.eps_high": [0.2, 0.28], "recipe.scale": ["group", "none"], "recipe.kl_coef": [0.0, 0.04]}
    seeds = range(args.runs // 8)
    t = time.time()
    if not root.exists():
        write_sweep(root, grid, seeds=seeds, steps=args.steps, eval_every=25,
                    effects={"recipe.eps_high": 0.03}, noise=0.02)
    print(f"{len(list(root.glob('*/config.yaml')))} runs x {args.steps} steps x {len(STEP_KEYS)} per-step + 6 eval "
          f"metrics written in {time.time() - t:.1f} s ({root})")
    for cache in root.glob("*/.ablate-cache"):  # a kept --dir starts cold too
        shutil.rmtree(cache)
    for name, code in PHASES.items():
        secs, gb = phase(code, root, tmp / "report.html")
        print(f"{name:42s} {secs:7.1f} s   peak RSS {gb:5.2f} GB")
    print(f"report: {tmp / 'report.html'}")
    if not args.keep and args.dir is None:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
