"""The two programs that run inside the sandbox (stdlib only; read as text, never imported).

HARNESS (trusted) reads one JSON job from stdin: {token, code, entry_point, tests, child, limits}. It
starts CHILD (untrusted) as a separate process, sends it the completion's code, then executes each test
statement itself, with `candidate` and the entry-point name bound to a proxy: every call is sent to the
child as plain data and the child's return value comes back as plain data (JSON with tags for tuples,
sets, dicts with non-string keys, bytes and non-finite floats), decoded into genuine builtins. So the
asserts and the comparisons run in the harness, which never executes model code, and the model code never
sees a test or an expected value. After each test the harness writes `<token> <i> <0|1>` to the result
file descriptor, which the child does not hold (and without /proc it cannot reopen it).
"""

# Plain data across the pipe, both ways: JSON with tags for tuples, sets, dicts with non-string keys,
# bytes and non-finite floats. One source for both programs; decoding is strict (the harness decodes the
# untrusted child's replies).
CODEC = r'''
def enc(v):
    t = type(v)
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return {"f": repr(v)}
    if t is list:
        return [enc(x) for x in v]
    if t is tuple:
        return {"t": [enc(x) for x in v]}
    if t is dict:
        return {"d": [[enc(k), enc(x)] for k, x in v.items()]}
    if t in (set, frozenset):
        return {"s" if t is set else "fs": [enc(x) for x in v]}
    if t is bytes:
        return {"b": v.hex()}
    raise TypeError(f"cannot send a {t.__name__} across the sandbox")

def dec(v):
    if v is None or type(v) in (bool, int, str):
        return v
    if type(v) is list:
        return [dec(x) for x in v]
    if type(v) is not dict or len(v) != 1:
        raise ValueError("bad reply")
    (tag, x), = v.items()
    if tag == "f":
        return float(x)
    if tag == "t":
        return tuple(dec(y) for y in x)
    if tag == "d":
        return {dec(k): dec(y) for k, y in x}
    if tag in ("s", "fs"):
        return (set if tag == "s" else frozenset)(dec(y) for y in x)
    if tag == "b":
        return bytes.fromhex(x)
    raise ValueError("bad reply")

'''

HARNESS = r'''
import ctypes, json, os, resource, select, subprocess, sys, time

ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: the child (same uid) cannot ptrace us
result_fd = int(sys.argv[1])
job = json.loads(sys.stdin.read())
token, limits = job.pop("token"), job["limits"]
MAX_REPLY = 1 << 20

''' + CODEC + r'''def child_limits():
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"]))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb, limits["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mb, limits["file_size_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_procs"], limits["max_procs"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

class Child:
    """The untrusted process; any failure (death, timeout, garbage) raises and the child is replaced."""

    def __init__(self):
        self.p = subprocess.Popen([sys.executable, "-I", "-S", "-c", job["child"]], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True,
                                  env={}, cwd="/tmp", preexec_fn=child_limits)
        self.buf = b""
        try:
            self.send({"code": job["code"], "entry_point": job["entry_point"]})
            if self.recv(limits["call_seconds"]) != "ready":
                raise RuntimeError("solution did not load")
        except BaseException:
            self.close()
            raise

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def recv(self, seconds):
        deadline = time.monotonic() + seconds
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("solution timed out")
            chunk = os.read(fd, 65536)
            if not chunk or len(self.buf) > MAX_REPLY:
                raise RuntimeError("solution exited")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        reply = json.loads(line)
        if type(reply) is not dict or len(reply) != 1:
            raise ValueError("bad reply")
        if "error" in reply:
            raise RuntimeError("solution raised")
        return dec(reply["ok"])

    def call(self, args, kwargs):
        self.send({"args": enc(list(args)), "kwargs": enc(dict(kwargs))})
        return self.recv(limits["call_seconds"])

    def close(self):
        try:
            self.p.kill()
            self.p.wait(1)
        except Exception:
            pass

child, load_failed = None, False

def candidate(*args, **kwargs):
    global child, load_failed
    if load_failed:  # the code itself does not load (or exits while loading): it never will
        raise RuntimeError("solution did not load")
    if child is None:
        try:
            child = Child()
        except BaseException:
            load_failed = True
            raise
    try:
        return child.call(args, kwargs)
    except BaseException:
        child.close()
        child = None
        raise

for i, test in enumerate(job["tests"]):
    ok = 0
    try:
        exec(compile(test, f"<test {i}>", "exec"), {"candidate": candidate, job["entry_point"]: candidate})
        ok = 1
    except BaseException:
        pass
    os.write(result_fd, f"{token} {i} {ok}\n".encode())
if child is not None:
    child.close()
'''

CHILD = r'''
import json, os, sys
proto_in, proto_out = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)  # the solution's prints go nowhere and cannot corrupt the protocol

''' + CODEC + r'''def reply(msg):
    proto_out.write(json.dumps(msg).encode() + b"\n")
    proto_out.flush()

job = json.loads(proto_in.readline())
namespace = {"__name__": "solution"}
try:
    exec(compile(job["code"], "<solution>", "exec"), namespace)
    fn = namespace[job["entry_point"]]
except BaseException:
    reply({"error": "load"})
    sys.exit(0)
reply({"ok": "ready"})
for line in proto_in:
    req = json.loads(line)
    try:
        reply({"ok": enc(fn(*dec(req["args"]), **dec(req["kwargs"])))})
    except BaseException:
        reply({"error": "call"})
'''
