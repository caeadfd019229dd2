"""Run untrusted code against unit tests in a bubblewrap sandbox, never in the caller's process.

    caller (trainer) ── setuid to a slot uid ──▶ bwrap ──▶ harness (trusted, runs the tests)
                                                              └──▶ child (untrusted, runs the code)

The sandbox: a fresh user, pid, network, IPC, UTS and cgroup namespace (`--unshare-all`: no network),
a read-only root holding only /usr (no /home, /root, /work, /etc, /proc), a private writable tmpfs /tmp
of bounded size and nothing else writable, a cleared environment, no capabilities, a new session, death
with the caller (`--die-with-parent`), and a seccomp filter (`ablate.tasks.seccomp`: ptrace, namespaces,
mounts, bpf, io_uring, non-AF_UNIX sockets, ... fail with EPERM). The untrusted child also gets rlimits on CPU time, address
space, processes and file size; the whole job a hard wall-clock timeout, after which its process group
is killed. Each concurrent job runs under its own unprivileged uid (one per worker slot; the slots are
file locks shared by every process on the machine, so concurrent runs never share one), so the process
limit counts only that job's processes and no job can signal another.

The result channel: the harness writes `<token> <test index> <0|1>` after each test to a pipe that only
it holds; the token is a fresh random value per job. The verdict is read from those lines, never from an
exit code, and a test without a line is a failure. See `ablate.tasks.sandbox_harness` for why the model
code can neither see the tests nor forge a pass, and docs/tasks.md for what is and is not guaranteed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from ablate.tasks.sandbox_harness import CHILD, HARNESS
from ablate.tasks.seccomp import FILTER, supported

BWRAP = "/usr/bin/bwrap"
PYTHON = "/usr/bin/python3"  # the system interpreter: under /usr, the only tree the sandbox can see
FIRST_UID = 61000            # slot uids FIRST_UID .. FIRST_UID + MAX_SLOTS - 1 (no passwd entry needed)
MAX_SLOTS = 64
SLOT_LOCK = "/tmp/ablate-sandbox-slot-{uid}.lock"  # one per slot uid, for every process on the machine


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 2      # RLIMIT_CPU of the untrusted child
    memory_mb: int = 512      # RLIMIT_AS of the untrusted child
    max_procs: int = 8        # RLIMIT_NPROC of the child: the slot uid's processes, the job's own included
    file_size_mb: int = 1     # RLIMIT_FSIZE of the child
    tmp_mb: int = 16          # size of the private /tmp
    call_seconds: float = 2.0  # wall clock per call into the solution (loading included)
    wall_seconds: float = 10.0  # hard wall clock of the whole job
    seccomp: bool = True       # load the syscall filter of `ablate.tasks.seccomp` (x86_64 only)


def available() -> str | None:
    """None when the sandbox can run here, else the reason."""
    for path in (BWRAP, PYTHON):
        if not os.path.exists(path):
            return f"{path} is missing (Debian: apt-get install bubblewrap python3)"
    return None


def bwrap_argv(limits: Limits) -> list[str]:
    argv = [BWRAP, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib64", "sbin"):
        target = os.readlink(f"/{name}") if os.path.islink(f"/{name}") else None
        if target is not None:
            argv += ["--symlink", target, f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    argv += ["--dev", "/dev", "--remount-ro", "/dev", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp", "--remount-ro", "/", "--chdir", "/tmp"]
    return argv


def _open_lock(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY)  # another user's lock file: no O_CREAT (fs.protected_regular)
    except FileNotFoundError:
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)


@contextlib.contextmanager
def slot() -> Iterator[int]:
    """The lowest slot uid that no job on this machine holds, held until exit: an flock on its file (per
    open file, so threads of one process exclude each other too; the kernel drops it when a holder dies).
    Waits while every slot is held."""
    while True:
        for uid in range(FIRST_UID, FIRST_UID + MAX_SLOTS):
            fd = _open_lock(SLOT_LOCK.format(uid=uid))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)  # releases the lock
            return
        time.sleep(0.05)


def run_tests(code: str, entry_point: str, tests: list[str], limits: Limits = Limits()) -> list[bool]:
    """Per-test outcome of `code` against `tests` (statements using `candidate` or the entry point)."""
    if not tests:
        return []
    token = secrets.token_hex(16)
    job = {"token": token, "code": code, "entry_point": entry_point, "tests": list(tests), "child": CHILD,
           "limits": asdict(limits)}
    filter_fds = _seccomp_fds(limits)
    seccomp = [arg for fd in filter_fds for arg in ("--seccomp", str(fd))]
    read_fd, write_fd = os.pipe()
    with slot() as uid:
        user = {"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 else {}
        proc = subprocess.Popen(bwrap_argv(limits) + seccomp + [PYTHON, "-I", "-S", "-c", HARNESS, str(write_fd)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                pass_fds=(write_fd, *filter_fds), env={}, process_group=0, **user)
        os.close(write_fd)
        for fd in filter_fds:
            os.close(fd)
        try:
            proc.communicate(json.dumps(job).encode(), timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _kill(proc)
        with os.fdopen(read_fd, "rb") as f:
            lines = f.read(1 << 20).decode(errors="replace").splitlines()
    passed = [False] * len(tests)
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == token and parts[1].isdigit() and int(parts[1]) < len(tests):
            passed[int(parts[1])] = parts[2] == "1"
    return passed


# Runs a script with the untrusted child's rlimits (the tests' harness does the same for its child), then
# replaces itself by the interpreter on the script: its stdout, stderr and exit status are the script's.
RUNNER = r'''
import json, os, resource, sys
job = json.loads(sys.stdin.read())
mb, lim = 1 << 20, job["limits"]
for res, value in ((resource.RLIMIT_CPU, lim["cpu_seconds"]), (resource.RLIMIT_AS, lim["memory_mb"] * mb),
                   (resource.RLIMIT_FSIZE, lim["file_size_mb"] * mb), (resource.RLIMIT_NPROC, lim["max_procs"]),
                   (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(res, (value, value))
os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", job["code"]])
'''
MAX_OUTPUT = 4096  # bytes of stdout and of stderr kept


@dataclass(frozen=True)
class Execution:
    stdout: str
    stderr: str
    exit_status: int  # the script's; -9 when the wall clock ran out


def run_code(code: str, limits: Limits = Limits()) -> Execution:
    """Run a script in the sandbox (as the tests' child runs: same namespaces, filter, rlimits, wall clock) and
    return what it printed (the first MAX_OUTPUT bytes of each stream) and its exit status."""
    filter_fds = _seccomp_fds(limits)
    seccomp = [arg for fd in filter_fds for arg in ("--seccomp", str(fd))]
    with slot() as uid:
        user = {"user": uid, "group": uid, "extra_groups": []} if os.geteuid() == 0 else {}
        proc = subprocess.Popen(bwrap_argv(limits) + seccomp + [PYTHON, "-I", "-S", "-c", RUNNER],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=filter_fds, env={}, process_group=0, **user)
        for fd in filter_fds:
            os.close(fd)
        try:
            out, err = proc.communicate(json.dumps({"code": code, "limits": asdict(limits)}).encode(),
                                        timeout=limits.wall_seconds)
            status = proc.returncode
        except subprocess.TimeoutExpired:
            _kill(proc)
            out, err = proc.communicate()
            status = -9
        finally:
            _kill(proc)
    text = lambda b: b[:MAX_OUTPUT].decode(errors="replace")  # noqa: E731
    return Execution(text(out), text(err), status)


def _seccomp_fds(limits: Limits) -> tuple[int, ...]:
    """() without the filter, else the read end of a pipe holding it (bubblewrap reads it to EOF)."""
    if not limits.seccomp:
        return ()
    if supported():
        raise RuntimeError(f"code sandbox: {supported()}; Limits(seccomp=False) runs without it")
    read_fd, write_fd = os.pipe()
    os.write(write_fd, FILTER)  # a few hundred bytes: far below a pipe's buffer
    os.close(write_fd)
    return (read_fd,)


def _kill(proc: subprocess.Popen) -> None:
    """Kill the job's process group (bwrap; the sandbox's pid namespace dies with it) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_many(jobs: list[tuple[str, str, list[str]]], limits: Limits = Limits(), workers: int = 4) -> list[list[bool]]:
    """`run_tests` over (code, entry_point, tests) jobs in parallel worker slots, results in order."""
    workers = max(1, min(workers, MAX_SLOTS, len(jobs)))
    if workers == 1:
        return [run_tests(*job, limits=limits) for job in jobs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: run_tests(*job, limits=limits), jobs))


def require() -> None:
    reason = available()
    if reason:
        raise RuntimeError(f"code sandbox unavailable: {reason}")
    if shutil.which(BWRAP) is None:
        raise RuntimeError(f"code sandbox unavailable: {BWRAP} is not executable")
