"""The README's main job end to end, shortened: the quickstart sweep (2x2 x 2 seeds on the committed
tiny model, 4 steps instead of 150) through `ablate sweep run`, then `ablate report` on it, rendered
in headless Chromium. The full-length numbers are in benchmarks/quickstart_lift.py."""

import subprocess
import sys
from pathlib import Path

import yaml
from conftest import assert_renders_in_chromium

from ablate.analysis.render import SECTIONS

ROOT = Path(__file__).resolve().parents[1]
ABLATE = str(Path(sys.executable).parent / "ablate")


def test_quickstart_sweep_and_its_report(tmp_path):
    spec = yaml.safe_load((ROOT / "sweeps" / "quickstart.yaml").read_text())
    spec["base"]["config"] = str(ROOT / "configs" / "quickstart.yaml")
    spec["base"]["overrides"] = {**spec["base"]["overrides"], "steps": 4, "eval.every": 2}
    spec["out"] = str(tmp_path / "runs" / "quickstart")
    (tmp_path / "quickstart.yaml").write_text(yaml.safe_dump(spec))

    run = subprocess.run([ABLATE, "sweep", "run", str(tmp_path / "quickstart.yaml"), "--quiet"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "completed: 8" in run.stdout, run.stdout + run.stderr

    out = tmp_path / "reports" / "quickstart.html"
    rep = subprocess.run([ABLATE, "report", spec["out"], "-o", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert f"wrote {out} and {out.with_suffix('.md')}" in rep.stdout
    assert "scale group -> none:" in rep.stdout and "kl_coef 0.04 -> 0.0:" in rep.stdout   # the headline
    html, md = out.read_text(), out.with_suffix(".md").read_text()
    for key, title in SECTIONS:
        assert f"id='{key}'" in html
    for title in ("Headline", "Setup", "Warnings", "Ranking", "Factorial effects", "pass@k", "Diagnostics", "Runs"):
        assert f"## {title}" in md
    assert html.count("data:image/png;base64,") == 3                  # curves, pass@k, effect forest
    assert "has 2 usable seed(s) (< 3)" in rep.stderr                  # the demo's 2 seeds are flagged
    assert_renders_in_chromium(out, tmp_path)
