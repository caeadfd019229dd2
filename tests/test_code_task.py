"""The code task and its sandbox: end to end with the scripted (reference) policy, and adversarial
completions that must score 0 within the timeout without harming the trainer's process or the host."""

import contextlib
import errno
import json
import os
import subprocess
import sys
import time

import pytest

from ablate.config import ConfigError, parse
from ablate.tasks import make_task, score_batch
from ablate.tasks.base import Problem
from ablate.tasks.code import as_tests, extract_code, procedural_problems
from ablate.tasks.sandbox import FIRST_UID, MAX_SLOTS, Limits, run_tests, slot

WALL = Limits().wall_seconds


def code_task(**task):
    return make_task(parse({"task": {"name": "code", "num_train": 40, "num_heldout": 8, **task}}).task)


def problem(tests, entry="f", prompt="Write f."):
    return Problem(id=f"p-{abs(hash(tuple(tests)))}", prompt=prompt, answer="", meta=(entry, tuple(tests)))


ADD = problem(["assert f(1, 2) == 3", "assert f(2, 2) == 4", "assert f(-1, 1) == 0", "assert f(0, 0) == 0"])


def score(completion, p=ADD, **task):
    t0 = time.monotonic()
    s = code_task(**task).score(p, completion)
    return s, time.monotonic() - t0


# --- verifier, end to end ----------------------------------------------------------------------------

def test_reference_solutions_score_one_and_wrong_ones_zero():
    task = code_task()
    train, heldout = task.problems("train"), task.problems("heldout")
    assert len(train) == 40 and len(heldout) == 8
    assert not {p.prompt for p in train} & {p.prompt for p in heldout}
    probs = train[:12] + heldout[:4]
    assert score_batch(task, probs, [p.answer for p in probs], train=True) == [1.0] * 16
    # the scripted policy in a fence, with prose around it, as a model would write it
    fenced = [f"Here it is:\n```python\n{p.answer}```\nDone." for p in probs]
    assert task.score_many(probs, fenced) == [1.0] * 16
    # the right signature with a wrong body fails every test
    wrong = [p.answer.split("return")[0] + "return None\n" for p in probs]
    assert task.score_many(probs, wrong) == [0.0] * 16


def test_partial_and_all_or_nothing_rewards():
    half = "def f(a, b):\n    return a + b if a > 0 else 99\n"  # passes tests 0 and 1 of 4 only
    assert run_tests(half, "f", list(ADD.meta[1])) == [True, True, False, False]
    assert score(half)[0] == 0.5
    assert score(half, code_reward="all")[0] == 0.0
    assert score("def f(a, b):\n    return a + b\n", code_reward="all")[0] == 1.0
    with pytest.raises(ConfigError, match="code_reward"):
        parse({"task": {"name": "code", "code_reward": "most"}})


def test_values_cross_as_exact_builtin_types():
    tests = ["assert candidate() == (1, [2], {3: 'x'}, {4}, b'5', None, 0.5)",
             "assert candidate() != [1, [2], {3: 'x'}, {4}, b'5', None, 0.5]",
             "import math\nassert math.isnan(candidate(float('nan'))[-1]) or True"]
    code = "def f(x=None):\n    return (1, [2], {3: 'x'}, {4}, b'5', None, 0.5)\n"
    assert run_tests(code, "f", tests) == [True, True, True]


def test_code_extraction_and_test_formats():
    assert extract_code("x\n```python\na = 1\n```\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```\nc = 3\n```") == "c = 3\n"
    assert extract_code("def f():\n  return 1") == "def f():\n  return 1"
    prompt = 'def f(x):\n    """Return x + 1."""\n'
    assert extract_code("    return x + 1\n", prompt, "f") == prompt + "    return x + 1\n"
    check = "def check(candidate):\n    assert candidate(1) == 2\n"
    assert as_tests(check) == (check + "\ncheck(candidate)",)
    assert run_tests("def f(x):\n    return x + 1\n", "f", list(as_tests(check))) == [True]


def test_jsonl_rows(tmp_path):
    rows = [{"prompt": f"Write f returning {i}.", "tests": [f"assert f() == {i}"], "entry_point": "f"}
            for i in range(20)]
    path = tmp_path / "code.jsonl"
    path.write_text("\n".join(map(json.dumps, rows)))
    task = code_task(path=str(path))
    train, heldout = task.problems("train"), task.problems("heldout")
    assert len(train) + len(heldout) == 20 and not {p.id for p in train} & {p.id for p in heldout}
    p = train[0]
    value = int(p.prompt.split()[-1].rstrip("."))
    assert task.score(p, f"def f():\n    return {value}\n") == 1.0
    assert task.score(p, f"def f():\n    return {value + 1}\n") == 0.0
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x", "tests": [], "entry_point": "f"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: 'tests'"):
        code_task(path=str(tmp_path / "bad.jsonl"))


def test_procedural_set_is_seeded_and_hash_split():
    a, b = procedural_problems("train", 30, 0), procedural_problems("train", 30, 0)
    assert a == b and procedural_problems("train", 30, 1) != a
    assert not {p.prompt for p in a} & {p.prompt for p in procedural_problems("heldout", 30, 0)}


# --- adversarial completions: each scores 0, within the timeout, and harms nothing -------------------

ADVERSARIAL = {
    "infinite_loop_in_call": "def f(a, b):\n    while True:\n        pass\n",
    "infinite_loop_at_import": "while True:\n    pass\ndef f(a, b):\n    return a + b\n",
    "sleep_forever": "import time\ndef f(a, b):\n    time.sleep(10**6)\n",
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    "fork_bomb_in_call": "import os\ndef f(a, b):\n    while True:\n        try:\n            os.fork()\n"
                         "        except OSError:\n            pass\n",
    "huge_allocation": "def f(a, b):\n    x = bytearray(64 * 1024**3)\n    return a + b if x else 0\n",
    "sys_exit_before_asserts": "import sys\nsys.exit(0)\ndef f(a, b):\n    return a + b\n",
    "os_exit_before_asserts": "import os\nos._exit(0)\n",
    "os_exit_in_call": "import os\ndef f(a, b):\n    os._exit(0)\n",
    "kill_parent": "import os, signal\ndef f(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n",
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\ndef f(a, b):\n    return 0\n",
    # equality hacks: an object equal to everything cannot cross the channel (plain data only)
    "always_equal_object": "class A:\n    __eq__ = lambda s, o: True\ndef f(a, b):\n    return A()\n",
    "patch_assert_machinery": "import builtins\nbuiltins.AssertionError = type('X', (Exception,), {})\n"
                              "def f(a, b):\n    return None\n",
    # forging the result channel: write pass lines to every fd, pre-fill replies, print a verdict
    "forge_result_lines": "import os\nfor fd in range(3, 64):\n    for i in range(8):\n        try:\n"
                          "            os.write(fd, f'x {i} 1\\n'.encode())\n        except OSError:\n"
                          "            pass\nprint('0 1\\n1 1\\n2 1\\n3 1')\ndef f(a, b):\n    return None\n",
    "prefill_replies": "import os, json\nfor fd in range(3, 16):\n    try:\n"
                       "        os.write(fd, (json.dumps({'ok': 3}) + '\\n').encode() * 8)\n    except OSError:\n"
                       "        pass\ndef f(a, b):\n    return None\n",
    "reopen_result_fd": "import os\ndef f(a, b):\n    for pid in (1, 2, os.getppid()):\n        for fd in range(64):\n"
                        "            try:\n                open(f'/proc/{pid}/fd/{fd}', 'w').write('x 0 1\\n')\n"
                        "            except OSError:\n                pass\n    return None\n",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_completion_scores_zero_within_timeout(name):
    pid, cwd = os.getpid(), os.getcwd()
    s, seconds = score(ADVERSARIAL[name])
    assert s == 0.0
    assert seconds < WALL + 3
    assert os.getpid() == pid and os.getcwd() == cwd  # the trainer's process is untouched


def test_no_process_survives_a_fork_bomb():
    # other runs on this machine may use the sandbox meanwhile: hold every slot but one, so the fork bomb
    # runs in that one, and hold that one too while looking for its processes
    with contextlib.ExitStack() as held:
        uids = {held.enter_context(slot()) for _ in range(MAX_SLOTS - 1)}
        (bomb_uid,) = set(range(FIRST_UID, FIRST_UID + MAX_SLOTS)) - uids
        score(ADVERSARIAL["fork_bomb"])
        assert held.enter_context(slot()) == bomb_uid
        deadline, left = time.monotonic() + 5, ["?"]
        while left and time.monotonic() < deadline:  # the kernel reaps a dead pid namespace asynchronously
            left = [u for u in subprocess.run(["ps", "-eo", "uid="], capture_output=True, text=True).stdout.split()
                    if int(u) == bomb_uid]
            time.sleep(0.1)
        assert not left


def test_slots_exclude_each_other_across_processes():
    script = ("import sys\nfrom ablate.tasks.sandbox import slot\nwith slot() as uid:\n"
              "    print(uid, flush=True)\n    sys.stdin.read()\n")
    with slot() as mine:
        other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        theirs = int(other.stdout.readline())
        assert theirs != mine and FIRST_UID <= theirs < FIRST_UID + MAX_SLOTS
    with slot() as again:
        assert again != theirs  # still held by the other process
    other.communicate("")
    assert other.returncode == 0


def test_cannot_write_outside_its_private_tmp(tmp_path):
    targets = [tmp_path / "pwned", "/tmp/ablate-pwned", "/usr/pwned", "/pwned", "/dev/shm/pwned"]
    code = ("def f(path):\n    try:\n        open(path, 'w').write('x')\n        return True\n"
            "    except OSError:\n        return False\n")
    tests = [f"assert candidate({str(t)!r})" for t in targets] + ["assert candidate('/tmp/ok')"]
    # /tmp/... succeeds inside, in the sandbox's own tmpfs: the host's /tmp never sees it
    assert run_tests(code, "f", tests) == [False, True, False, False, False, True]
    assert not any(os.path.exists(t) for t in targets)


def test_environment_and_host_files_are_invisible(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_FAKE_SECRET", "hunter2")
    secret = tmp_path / "netrc"
    secret.write_text("hunter2")
    p = problem(["assert candidate() == 'hunter2'"])
    steal_env = "import os\ndef f():\n    return os.environ.get('ABLATE_FAKE_SECRET', '')\n"
    steal_file = f"def f():\n    return open({str(secret)!r}).read()\n"
    dump_env = "import os\ndef f():\n    return dict(os.environ)\n"
    assert score(steal_env, p)[0] == 0.0 and score(steal_file, p)[0] == 0.0
    assert score("def f():\n    return 'hunter2'\n", p)[0] == 1.0  # the test would see a leak
    env = problem(["assert 'ABLATE_FAKE_SECRET' not in candidate() and len(candidate()) <= 2"])
    assert score(dump_env, env)[0] == 1.0  # the child's environment holds at most PWD / LC_CTYPE


def test_no_network():
    code = ("import socket\ndef f():\n    try:\n        socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
            "        return True\n    except OSError:\n        return False\n")
    assert run_tests(code, "f", ["assert candidate() is False"]) == [True]


# --- the seccomp filter: what untrusted code may not ask the kernel -----------------------------------

# each probe returns 0 on success or the errno; arguments are chosen so that the kernel itself answers with
# success or another error (EFAULT, EINVAL, ENOSYS) here, so an EPERM can only come from the filter
SYSCALL_PROBES = r"""
import ctypes, os, socket, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(r):
    return 0 if r >= 0 else ctypes.get_errno()

def f(name):
    if name == "ptrace_traceme":
        return call(libc.ptrace(0, 0, 0, 0))                        # PTRACE_TRACEME
    if name == "unshare_user":
        return call(libc.unshare(0x10000000))                       # CLONE_NEWUSER
    if name == "clone_user":
        return call(libc.syscall(56, 0x10000000 | 0x200, 0, 0, 0, 0))  # clone(NEWUSER|FS): EINVAL unfiltered
    if name == "mount":
        return call(libc.mount(b"none", ctypes.c_void_p(1), b"tmpfs", 0, None))  # bad target: EFAULT
    if name == "bpf":
        return call(libc.syscall(321, 9999, 0, 0))                  # unknown command: EINVAL
    if name == "io_uring_setup":
        return call(libc.syscall(425, 1, 0))                        # no params: EFAULT
    if name == "x32_getpid":
        return call(libc.syscall(0x40000000 | 39))                  # x32 ABI: ENOSYS where it is off
    if name == "clone3":
        return call(libc.syscall(435, 0, 0))
    if name in ("socket_inet", "socket_inet6", "socket_unix"):
        family = {"socket_inet": socket.AF_INET, "socket_inet6": socket.AF_INET6}.get(name, socket.AF_UNIX)
        try:
            socket.socket(family).close()
            return 0
        except OSError as e:                                        # PermissionError: a clean failure
            return e.errno
    if name == "thread_and_fork":                                   # what test code does need still works
        out = []
        t = threading.Thread(target=out.append, args=(1,))
        t.start()
        t.join()
        pid = os.fork()
        if pid == 0:
            os._exit(3)
        return out == [1] and os.waitpid(pid, 0)[1] >> 8 == 3
"""
DENIED = ["ptrace_traceme", "unshare_user", "clone_user", "mount", "bpf", "io_uring_setup", "x32_getpid",
          "socket_inet", "socket_inet6"]


def test_seccomp_refuses_escape_calls_with_eperm():
    tests = ["assert candidate('thread_and_fork') is True", "assert candidate('socket_unix') == 0",
             f"assert candidate('clone3') == {errno.ENOSYS}"]  # glibc falls back to clone
    tests += [f"assert candidate({n!r}) == {errno.EPERM}" for n in DENIED]
    assert run_tests(SYSCALL_PROBES, "f", tests) == [True] * len(tests)
    # without the filter the same calls succeed or fail otherwise: the EPERMs above are the filter's
    unfiltered = run_tests(SYSCALL_PROBES, "f", tests, Limits(seccomp=False))
    assert unfiltered == [True, True, False] + [False] * len(DENIED)


def test_results_do_not_depend_on_workers():
    task1, task4 = code_task(code_workers=1), code_task(code_workers=4)
    probs = task1.problems("train")[:8]
    texts = [p.answer if i % 2 else ADVERSARIAL["os_exit_in_call"] for i, p in enumerate(probs)]
    assert task1.score_many(probs, texts) == task4.score_many(probs, texts) == [0.0, 1.0] * 4


def test_trainer_runs_the_code_task(tmp_path):
    from ablate.runs.store import RunStore
    from ablate.train.trainer import train

    cfg = parse({"model": {"path": "models/tiny-arith"}, "device": "cpu",
                 "task": {"name": "code", "num_train": 8, "num_heldout": 2},
                 "prompts_per_step": 2, "steps": 2, "checkpoint_every": 0,
                 "eval": {"every": 0, "n_samples": 2, "ks": [1]}, "recipe": {"group_size": 2, "max_new_tokens": 4}})
    assert train(cfg, str(tmp_path), progress=False) == "completed"
    rows = RunStore(tmp_path).read("metrics")
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["train/reward_correct_mean"] == 0.0  # it cannot code


def test_both_sandbox_programs_run_the_one_codec():
    """The harness and the child encode and decode with the same source (ablate/tasks/sandbox_harness.py)."""
    from ablate.tasks.sandbox_harness import CHILD, CODEC, HARNESS

    assert CODEC in HARNESS and CODEC in CHILD and HARNESS.count("def enc(") == CHILD.count("def enc(") == 1
    ns: dict = {}
    exec(CODEC, ns)  # noqa: S102 - our own stdlib-only source, as the sandbox runs it
    value = [1, 2.5, float("inf"), (1, "a", [None, True]), {1: b"\x00x", "k": {2}}, frozenset({4})]
    wire = json.loads(json.dumps(ns["enc"](value)))
    assert ns["dec"](wire) == value and type(ns["dec"](wire)[3]) is tuple
    for bad in ({"x": 1}, {"f": "1", "t": []}, 1.5):
        with pytest.raises(ValueError, match="bad reply"):
            ns["dec"](bad)
    with pytest.raises(TypeError, match="cannot send a object"):
        ns["enc"](object())
