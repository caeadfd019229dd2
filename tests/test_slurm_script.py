"""No shell injection into the SLURM batch script: control characters in any value that reaches sbatch are
refused (naming the file and key); printable hostile values are quoted. Checked on the real batch script
submitit writes, handed to a fake `sbatch` on PATH (no cluster needed), with `bash -n` and by running it."""

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from ablate.experiments.launch import launch
from ablate.experiments.slurm_profile import load_profile
from ablate.experiments.sweep import SpecError, expand, parse_spec

TOY = str(Path("configs/toy.yaml").resolve())


def fake_bin(tmp_path) -> Path:
    """`sbatch` that keeps the script and prints a job id; `srun` that does nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"sbatch": f'#!/bin/sh\ncp "$1" {tmp_path}/submitted.sh\necho "Submitted batch job 4242"\n',
               "srun": "#!/bin/sh\nexit 0\n"}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return bin_dir


def sweep(tmp_path, name="toy", out=None):
    return parse_spec({"name": name, "base": {"config": TOY, "overrides": {"steps": 2}},
                       "out": str(out or tmp_path / "runs")}, "spec.yaml", Path("."))


def profile(tmp_path, **data):
    p = tmp_path / "profile.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


PWN = "touch {m}"
HOSTILE_LINES = {  # each would put `touch MARKER` on a line of its own
    "partition": lambda m: {"partition": f"debug\n{PWN.format(m=m)}"},
    "account": lambda m: {"account": f"lab\r\n{PWN.format(m=m)}"},
    "additional value": lambda m: {"additional": {"comment": f"x\n{PWN.format(m=m)}"}},
    "additional key": lambda m: {"additional": {f"x=1\n{PWN.format(m=m)}\n#": "y"}},
    "setup line": lambda m: {"setup": [f"echo hi\n{PWN.format(m=m)}"]},
    "qos with NUL": lambda m: {"qos": "normal\x00"},
}


@pytest.mark.parametrize("case", HOSTILE_LINES)
def test_control_characters_in_a_profile_are_refused(tmp_path, case):
    p = profile(tmp_path, **HOSTILE_LINES[case](tmp_path / "pwned"))
    with pytest.raises(SpecError, match=f"{p}: (partition|account|additional|setup|qos)") as err:
        load_profile(p)
    assert "control characters" in str(err.value) or "option name" in str(err.value)


def test_newline_in_the_sweep_name_or_runs_root_is_refused(tmp_path, monkeypatch):
    with pytest.raises(SpecError, match="spec.yaml: name: .*control characters"):
        sweep(tmp_path, name="toy\ntouch pwned")
    with pytest.raises(SpecError, match="spec.yaml: out: .*control characters"):
        sweep(tmp_path, out=tmp_path / "runs\ntouch pwned")
    s = sweep(tmp_path)
    s.out = tmp_path / "runs\ntouch pwned"  # set past the spec's check: the launcher checks again
    monkeypatch.setenv("PATH", f"{fake_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SpecError, match="out .*control characters"):
        launch(s, expand(s), "slurm")
    assert not (tmp_path / "submitted.sh").exists()


def test_printable_hostile_values_are_quoted_in_the_script(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker})`touch {marker}`;touch {marker}' \"&&touch {marker}"
    p = profile(tmp_path, partition=evil, account=evil, additional={"comment": evil})
    s = sweep(tmp_path, name="toy;touch pwned`touch pwned`$(touch pwned)")  # relative: the script runs in tmp_path
    monkeypatch.setenv("PATH", f"{fake_bin(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    res = launch(s, expand(s), "slurm", p)
    assert len(res["submitted"]) == 1
    script = tmp_path / "submitted.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    lines = script.read_text().splitlines()
    assert all(line.startswith("#") or not line.strip() or line.startswith(("export ", "srun ")) for line in lines)
    subprocess.run(["bash", str(script)], capture_output=True, cwd=tmp_path, timeout=60)
    assert not marker.exists()
