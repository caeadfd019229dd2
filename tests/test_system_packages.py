"""The one list of system programs (scripts/system-packages.txt): it names every program the code and the
tests run, `scripts/system-packages check` names what is missing with its Debian package, and the suite
stops at its start when something is (tests/conftest.py)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "system-packages"


def listed() -> dict[str, str]:
    """program -> package, from the list."""
    lines = (line.split() for line in (ROOT / "scripts" / "system-packages.txt").read_text().splitlines())
    return {words[0]: words[1] for words in lines if words and not words[0].startswith("#")}


def path_without(tmp_path, program: str) -> str:
    """A PATH holding every program of the list that is on this machine's PATH (and bash, which runs the
    script), but `program`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in [p for p in listed() if "/" not in p and p != program] + ["bash"]:
        (bin_dir / name).symlink_to(shutil.which(name))
    return str(bin_dir)


def test_every_program_the_code_and_tests_run_is_on_the_list():
    # a program by its path, looked up by shutil.which, or first in a literal argv
    named = re.compile(r"""["'](/usr/s?bin/[\w.+-]+)["']|which\(["']([\w.+-]+)["']"""
                       r"""|(?:run|Popen|check_output|check_call)\(\[\s*["']([\w.+-]+)["']""")
    found = {}  # program -> the first file that runs it
    for path in [*ROOT.glob("ablate/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py")]:
        for m in named.finditer(path.read_text()):
            found.setdefault(next(g for g in m.groups() if g), path.name)
    found.pop("bash")  # Debian's essential set: on every machine
    assert {"/usr/bin/bwrap", "sinfo", "git"} <= found.keys()  # the pattern sees the kinds of use
    names = {p.rsplit("/", 1)[-1] for p in listed()}
    unlisted = {prog: where for prog, where in found.items()
                if prog not in listed() and (prog.startswith("/") or prog not in names)}
    assert not unlisted, f"programs run but not in scripts/system-packages.txt: {unlisted}"


def test_the_list_is_complete_on_this_machine():
    res = subprocess.run([SCRIPT, "check"], capture_output=True, text=True)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_check_names_a_program_missing_from_path_and_its_package(tmp_path):
    res = subprocess.run([SCRIPT, "check"], capture_output=True, text=True,
                         env={**os.environ, "PATH": path_without(tmp_path, "sinfo")})
    assert res.returncode == 1
    assert res.stdout.splitlines() == ["system programs missing (program: Debian package):",
                                       "  sinfo: slurm-client",
                                       "install them: make services (as root), or scripts/system-packages install"]


def test_check_names_each_missing_path_and_glob(tmp_path):
    """A program given by its path (a glob allowed) counts only there, whatever PATH holds."""
    custom = tmp_path / "list.txt"
    custom.write_text(f"# a comment\n{tmp_path}/no/bwrap  bubblewrap\n\n{tmp_path}/pg/*/bin/pg_ctl postgresql\n"
                      f"{sys.executable} python3\n")

    def named() -> list[str]:
        res = subprocess.run([SCRIPT, "check", custom], capture_output=True, text=True)
        assert res.returncode == 1
        return res.stdout.splitlines()[1:-1]

    assert named() == [f"  {tmp_path}/no/bwrap: bubblewrap", f"  {tmp_path}/pg/*/bin/pg_ctl: postgresql"]
    (tmp_path / "pg" / "15" / "bin").mkdir(parents=True)
    (tmp_path / "pg" / "15" / "bin" / "pg_ctl").touch()
    assert named() == [f"  {tmp_path}/no/bwrap: bubblewrap"]


def test_the_suite_stops_before_its_first_test_when_a_program_is_missing(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          str(ROOT / "tests" / "test_system_packages.py")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PATH": path_without(tmp_path, "scancel")})
    assert res.returncode == 4  # pytest's usage error: no test ran
    assert "  scancel: slurm-client" in res.stderr + res.stdout
    assert "passed" not in res.stdout and "failed" not in res.stdout


def test_install_needs_nothing_when_nothing_is_missing():
    res = subprocess.run([SCRIPT, "install"], capture_output=True, text=True)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")  # no apt-get run, nothing printed
