"""Throw out-of-domain and wrong-type values, generated over the schemas, at the real CLI and list the cases
that end in a traceback or are accepted (exit 0, or a run that started and failed later).

    python scripts/hostile_inputs.py [--only config|spec|tune|profile|storage] [--list]

Each case runs `ablate train`, `ablate sweep plan|run` or `ablate tune status|run` in a forked child (a
timeout, and no state shared between cases) in a fresh folder, on the toy testbed (configs/toy.yaml).
A case is good when the command exits 2 with a message and no traceback. Values that are legitimate for a
field are listed in LEGIT and not thrown. Prints the count of bad cases per class and in all.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import resource
import signal
import tempfile
import traceback
import typing
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent  # run with PYTHONPATH at the checkout under test

from ablate import config as C  # noqa: E402

TOY = yaml.safe_load((ROOT / "configs" / "toy.yaml").read_text()) | {"steps": 2, "checkpoint_every": 0}
TOY["eval"] = {**TOY["eval"], "every": 1}
TOY["tracking"] = {"wandb": {"mode": "disabled"}}
INF, NAN = float("inf"), float("nan")
# values no numeric field, text field or path field may take
NUMBERS = [-1, 10**30, INF, -INF, NAN, "abc", [1], {"a": 1}, True]
FLOATS = NUMBERS + [-1e-9]
COUNTS = NUMBERS + [0, 1.5]  # 0: for the fields that need >= 1
TEXTS = ["", " ", "a\nb", 5, [1], {"a": 1}, True]
PATHS = TEXTS + [".", "..", "/"]
MAPPINGS = [5, "x", [1]]
# config fields whose domain holds some of those values
LEGIT = {("task.dataset", ""), ("task.dataset", " "), ("task.path", ""), ("task.heldout_path", ""),
         ("recipe.clip_cov_lb", -1), ("recipe.clip_cov_lb", -1e-9), ("recipe.clip_cov_ub", -1),
         ("recipe.clip_cov_ub", -1e-9), ("tracking.wandb.name", " "), ("tracking.wandb.group", " ")}


def leaves(cls=C.RunConfig, prefix=""):
    """(dotted name, annotation) of every leaf field of a config dataclass."""
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (
            typing.Union, __import__("types").UnionType) else [tp]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            yield from leaves(inner[0], f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp


def pool(tp) -> list:
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return ["zzz", 5, [1], True]
    if origin is tuple:
        return [5, "x", [-1], [10**30], [INF], [NAN], ["a\nb"], [""], [[1]], [None]]
    if origin is dict:
        return MAPPINGS
    if any(a is bool for a in args):
        return ["maybe", 2, [True]]
    if any(a is float for a in args):
        return FLOATS
    if any(a is int for a in args):
        return NUMBERS + [1.5]
    return TEXTS


def config_cases():
    for name, tp in leaves():
        for v in pool(tp):
            if not isinstance(v, (list, dict)) and (name, v) in LEGIT:
                continue
            data = copy.deepcopy(TOY)
            if name.startswith("model.lora."):
                data["model"] = {"lora": {}}
            C.set_dotted(data, name, v)
            yield "config", f"{name}={v!r}", {"c.yaml": data}, ["train", "c.yaml", "--out", "o"]


SPEC = {"name": "s", "base": {"config": "toy.yaml"}, "seeds": [0]}
SPEC_POOLS = {"name": PATHS, "description": [5, [1], {"a": 1}, True], "out": PATHS, "slurm_profile": PATHS,
              "base": MAPPINGS, "base.config": PATHS, "base.preset": TEXTS + ["nope"], "base.overrides": MAPPINGS,
              "grid": [5, "x", True], "zip": [5, "x", True], "arms": [5, "x", [1]], "seeds": [5, "x", [], {"a": 1}],
              "seeds.0": COUNTS[:-2] + [1.5], "exclude": [5, "x"], "include": [5, "x"], "executor": MAPPINGS,
              "executor.name": TEXTS + ["k8s"], "executor.max_parallel": COUNTS, "executor.timeout_min": NUMBERS + [0],
              "executor.signal_delay_s": COUNTS[:-2] + [1.5], "executor.tasks_per_node": COUNTS,
              "grid.optim.weight_decay": [-1, -1e-9, INF, NAN, "abc"], "grid.recipe.kl_coef": [-1, -1e-9, INF, "abc"]}


def put(doc: dict, dotted: str, v) -> dict:
    doc = copy.deepcopy(doc)
    if dotted == "seeds.0":
        doc["seeds"] = [v]
    elif dotted.startswith("grid."):
        doc["grid"] = {dotted[5:]: [v]}
    elif "." in dotted:
        head, rest = dotted.split(".", 1)
        doc[head] = {**(doc.get(head) or {}), rest: v}
    else:
        doc[dotted] = v
    return doc


def spec_cases():
    for k, values in SPEC_POOLS.items():
        for v in values:
            files = {"toy.yaml": TOY, "s.yaml": put(SPEC, k, v)}
            argv = ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet"] if k.startswith("executor") else \
                ["sweep", "plan", "s.yaml"]
            yield "spec", f"{k}={v!r}", files, argv


SEARCH = {"name": "t", "base": {"config": "toy.yaml"}, "seeds": [0], "trials": 1,
          "search": {"optim.lr": {"type": "float", "low": 0.1, "high": 1.0}}, "objective": {"metric": "eval/pass@1"}}
TUNE_POOLS = {"name": PATHS, "description": [5, [1], {"a": 1}, True], "trials": COUNTS, "seeds": [5, "x", [], {"a": 1}],
              "objective": MAPPINGS, "objective.metric": TEXTS + ["loss"], "objective.direction": TEXTS + ["up"],
              "objective.last_k": COUNTS, "sampler": MAPPINGS, "sampler.name": TEXTS + ["bayes"],
              "sampler.seed": COUNTS[:-2] + [2**40, 1.5], "sampler.n_startup_trials": COUNTS[:-2] + [1.5],
              "pruner": MAPPINGS, "pruner.name": TEXTS, "pruner.n_startup_trials": COUNTS[:-2] + [1.5],
              "pruner.n_warmup_steps": COUNTS[:-2] + [1.5], "pruner.interval_steps": COUNTS,
              "storage": TEXTS + ["not-a-url"], "heartbeat": MAPPINGS, "heartbeat.interval_s": COUNTS,
              "heartbeat.grace_period_s": COUNTS, "heartbeat.max_retry": COUNTS[:-2] + [1.5], "executor": MAPPINGS,
              "executor.name": TEXTS + ["k8s"], "executor.workers": COUNTS, "executor.timeout_min": NUMBERS + [0],
              "out": PATHS, "search": [5, "x", [1], {}], "search.optim.lr": [5, "x", {}, {"type": "float"}, []],
              "low": NUMBERS, "high": NUMBERS, "step": NUMBERS + [0], "log": ["x", 5, [1]],
              "choices": [5, "x", [], [[1]], [{"a": 1}], [-1], [NAN]], "search.optim.weight_decay": [-1, -1e-9]}


def tune_put(k: str, v) -> dict:
    doc = copy.deepcopy(SEARCH)
    if k in ("low", "high", "step", "log"):
        doc["search"]["optim.lr"][k] = v
    elif k == "choices":
        doc["search"] = {"recipe.kl_coef": {"type": "categorical", "choices": v}}
    elif k == "search.optim.weight_decay":
        doc["search"] = {"optim.weight_decay": {"type": "float", "low": v, "high": 1.0}}
    elif k == "search.optim.lr":
        doc["search"] = {"optim.lr": v}
    else:
        return put(doc, k, v)
    return doc


def tune_cases():
    for k, values in TUNE_POOLS.items():
        for v in values:
            yield "tune", f"{k}={v!r}", {"toy.yaml": TOY, "t.yaml": tune_put(k, v)}, ["tune", "status", "t.yaml"]


PROFILE_POOLS = {"partition": TEXTS, "time": COUNTS[:-1] + ["soon", ""], "gpus": NUMBERS, "cpus": COUNTS,
                 "mem": COUNTS[:-1] + ["abc", "", "-5G"], "account": TEXTS, "qos": TEXTS, "constraint": TEXTS,
                 "setup": [5, "x", [5], ["a\nb"], [[1]]], "array_parallelism": COUNTS, "signal_delay_s": NUMBERS,
                 "additional": [5, "x", [1], {"a b": 1}, {"x": [1]}], "nodes": COUNTS, "tasks_per_node": COUNTS}


def profile_cases():
    for k, values in PROFILE_POOLS.items():
        for v in values:
            files = {"toy.yaml": TOY, "s.yaml": SPEC, "p.yaml": {k: v}}
            yield "profile", f"{k}={v!r}", files, ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet",
                                                   "--profile", "p.yaml"]


def storage_cases():
    urls = ["sqlite:///{d}/adir", "sqlite:///{d}/notdb.txt", "sqlite:///{d}/afile/sub.db", "sqlite:///", "sqlite://",
            "postgresql://nobody@127.0.0.1:1/x", "mysql://nobody@127.0.0.1:1/x", "not-a-url", "", " ",
            "journal:{d}/adir", "journal:{d}/notdb.txt", "journal:", "journal:{d}/afile/j.log", "sqlite:///{d}/a\nb.db",
            "postgresql://", "postgresql+psycopg2://nobody@127.0.0.1:1/x"]
    files = {"toy.yaml": TOY, "t.yaml": SEARCH, "adir/x": "", "notdb.txt": "hello, not a database\n", "afile": "x"}
    for u in urls:
        for cmd in (["tune", "status", "t.yaml"], ["tune", "run", "t.yaml", "--executor", "inline"]):
            yield "storage", f"{cmd[1]} --storage {u!r}", files, [*cmd, "--storage", u]
        yield "storage", f"spec storage: {u!r}", {**files, "t.yaml": {**SEARCH, "storage": u}}, \
            ["tune", "run", "t.yaml", "--executor", "inline"]
    for name, v in (("out", "."), ("out", ".."), ("out", "/"), ("out", ""), ("name", "."), ("name", ".."),
                    ("name", " ")):
        yield "storage", f"sweep {name}={v!r}", {"toy.yaml": TOY, "s.yaml": {**SPEC, name: v}}, \
            ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet"]
    for v in (".", "..", "/"):
        yield "storage", f"sweep run --out {v!r}", {"toy.yaml": TOY, "s.yaml": SPEC}, \
            ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet", "--out", v]


# --- running -------------------------------------------------------------------------------------------

def write(d: Path, files: dict) -> None:
    for name, body in files.items():
        p = d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(body if isinstance(body, str) else yaml.safe_dump(body))


def child(d: Path, argv: list[str], wfd: int) -> None:
    from typer.testing import CliRunner

    from ablate.cli.main import app

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    os.chdir(d)
    argv = [a.replace("{d}", str(d)) for a in argv]
    try:
        res = CliRunner().invoke(app, argv)
        tb = res.exception is not None and not isinstance(res.exception, SystemExit)
        text = "".join(traceback.format_exception(res.exception)) if tb else res.output
        msg = f"{res.exit_code}\t{int(tb)}\t{text[-400:]!r}"
    except BaseException as e:  # noqa: BLE001
        msg = f"-1\t1\t{type(e).__name__}: {e}"[:400]
    os.write(wfd, msg.encode()[:60000])
    os._exit(0)


def run_case(files: dict, argv: list[str], timeout: int) -> tuple[int, bool, str]:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write(d, {k: (v if isinstance(v, str) else yaml.safe_dump(v)).replace("{d}", str(d)) for k, v in files.items()})
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(d, argv, w)
        os.close(w)
        signal.alarm(timeout)
        try:
            data = b""
            while chunk := os.read(r, 65536):
                data += chunk
            os.waitpid(pid, 0)
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 0, False, "timed out (accepted: it ran)"
        finally:
            signal.alarm(0)
            os.close(r)
        code, tb, text = data.decode(errors="replace").split("\t", 2)
        return int(code), tb == "1", text


def _alarm(*_):
    raise TimeoutError


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None)
    ap.add_argument("--list", action="store_true", help="print every bad case")
    ap.add_argument("--timeout", type=int, default=60)
    args = ap.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    # imported once here, inherited by every forked case (no thread pools started yet: fork-safe)
    import typer.testing  # noqa: F401

    import ablate.cli.main  # noqa: F401
    import ablate.experiments.launch  # noqa: F401
    import ablate.experiments.search  # noqa: F401
    import ablate.train.trainer  # noqa: F401
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["WANDB_MODE"] = "disabled"
    gens = {"config": config_cases, "spec": spec_cases, "tune": tune_cases, "profile": profile_cases,
            "storage": storage_cases}
    total, bad = {}, {}
    for cls, gen in gens.items():
        if args.only and cls != args.only:
            continue
        for _, label, files, argv in gen():
            code, tb, text = run_case(files, argv, args.timeout)
            total[cls] = total.get(cls, 0) + 1
            accepted = code == 2 and "does not exist (run `ablate tune" in text  # tune status: the spec passed
            if tb or code != 2 or accepted:
                bad.setdefault(cls, []).append((label, code, tb, text))
                if args.list:
                    kind = "TRACEBACK" if tb else f"exit {code}"
                    print(f"{cls:8} {kind:10} {label[:70]:70} {text.splitlines()[-1][-150:] if text else ''}",
                          flush=True)
    print()
    for cls in total:
        n = len(bad.get(cls, []))
        tbs = sum(b[2] for b in bad.get(cls, []))
        print(f"{cls:8} {total[cls]:5} cases  {n:4} bad ({tbs} tracebacks, {n - tbs} accepted)")
    n = sum(len(b) for b in bad.values())
    print(f"{'all':8} {sum(total.values()):5} cases  {n:4} bad")


if __name__ == "__main__":
    main()
