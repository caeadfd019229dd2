"""Data from disk is untrusted: a manifest, a status file and a provenance file are checked against their
format where they are read (ablate/experiments/manifest.py, ablate/runs/store.py), so a crafted id never
becomes a path outside the sweep folder, a process to signal or a scheduler argument; and every string
that reaches the HTML report is escaped by construction (Jinja2 autoescaping).

Generated cases: every field of the manifest format x hostile values, through every command that reads a
manifest (`sweep status`, `sweep cancel`, `sweep run`, `report`); every field of status.json and of the
provenance a run carries over, through `ablate train`; and payloads planted in every string field that
can reach the report (config values and keys, run ids, toggle values, arm and sweep names, the sweep
folder's name, status errors, sample prompts and completions, the title), checked by an HTML parser and by
headless Chromium (nothing runs)."""

import copy
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import CHROMIUM, snapshot
from typer.testing import CliRunner

from ablate.analysis import build_report
from ablate.analysis.synthetic import run_name, write_run
from ablate.cli.main import app
from ablate.config import load
from ablate.runs.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "configs" / "toy.yaml"
RID = "abc123abc123"
MANIFEST = {"name": "s", "spec": {"name": "s", "arms": {}, "grid": {}}, "runs": {RID: {
    "arm": None, "seed": 0, "toggles": {}, "steps": 3, "current": True,
    "jobs": [{"executor": "local", "job_id": "999999999", "submitted": 0.0, "folder": ".submitit/sub"}]}}}


def job(field):
    return lambda m, v: m["runs"][RID]["jobs"][0].__setitem__(field, v)


def entry(field):
    return lambda m, v: m["runs"][RID].__setitem__(field, v)


# (field, how to plant a value, hostile values, the key the message names)
FIELDS = [
    ("run id", lambda m, v: m["runs"].__setitem__(v, m["runs"].pop(RID)),
     ["../../escaped", "/tmp/escaped", "..", ".", "", "manifest.json", ".submitit", "ABC123ABC123", "abc123abc12",
      "abc123abc1234", "abc123abc12/", "abc123abc12\n"], "runs"),
    ("executor", job("executor"), ["k8s", None, 1], "jobs[0]"),
    ("local job id", job("job_id"), ["1; touch x", "-1", "../x", 123, "1 2", ""], "jobs[0].job_id"),
    ("slurm job id", lambda m, v: m["runs"][RID]["jobs"][0].update(executor="slurm", job_id=v),
     ["--uid=0", "123,456", "12_x", "-u root"], "jobs[0].job_id"),
    ("job folder", job("folder"), ["../outside", "/etc", "", None, "a/../../b"], "jobs[0].folder"),
    ("arm", entry("arm"), [1, ["x"]], "arm"), ("seed", entry("seed"), ["0", 1.5], "seed"),
    ("toggles", entry("toggles"), ["x", ["a"]], "toggles"), ("steps", entry("steps"), ["3"], "steps"),
    ("current", entry("current"), ["yes"], "current"), ("jobs", entry("jobs"), ["x", None], "jobs"),
    ("name", lambda m, v: m.__setitem__("name", v), [["x"], 5], "name"),
    ("spec", lambda m, v: m.__setitem__("spec", v), ["x", {"arms": ["a"]}, {"grid": {"k": 1}}], "spec"),
]
MANIFEST_CASES = [(f"{name}={v!r}", plant, v, key) for name, plant, values, key in FIELDS for v in values]
READERS = {"sweep status": ["sweep", "status", "sw"], "sweep cancel": ["sweep", "cancel", "sw"],
           "sweep run": ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet"], "report": ["report", "sw"]}


def invoke(d: Path, argv, monkeypatch):
    monkeypatch.chdir(d)
    return CliRunner().invoke(app, argv)


@pytest.mark.parametrize("case, plant, value, key", MANIFEST_CASES, ids=[c[0] for c in MANIFEST_CASES])
def test_every_manifest_field_is_checked_where_the_manifest_is_read(tmp_path, monkeypatch, case, plant, value, key):
    top = tmp_path / "top"  # the sweep folder sits inside it: nothing may appear beside or above it
    (top / "sw" / ".submitit" / "sub").mkdir(parents=True)
    m = copy.deepcopy(MANIFEST)
    plant(m, value)
    (top / "sw" / "manifest.json").write_text(json.dumps(m))
    (top / "toy.yaml").write_text(TOY.read_text())
    (top / "s.yaml").write_text(yaml.safe_dump({"name": "s", "base": {"config": "toy.yaml", "overrides": {"steps": 3}},
                                                "seeds": [0], "out": "sw"}))
    before = snapshot(tmp_path)
    for reader, argv in READERS.items():
        res = invoke(top, argv, monkeypatch)
        out = " ".join(res.output.split())
        assert res.exit_code == 2, (reader, res.exit_code, res.output, res.exception)
        assert "Traceback" not in res.output and "sw/manifest.json" in out and key in out, (reader, res.output)
        assert snapshot(tmp_path) == before, reader  # nothing written, inside the sweep folder or outside it


def test_a_manifest_ablate_writes_passes_its_own_check(tmp_path, monkeypatch):
    (tmp_path / "toy.yaml").write_text(TOY.read_text())
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"name": "s", "seeds": [0, 1], "out": "sw",
                                                     "base": {"config": "toy.yaml", "overrides": {
                                                         "steps": 2, "eval.every": 0, "tracking.wandb.mode": "disabled"}},
                                                     "grid": {"optim.lr": [0.5, 1.0]}}))
    res = invoke(tmp_path, ["sweep", "run", "s.yaml", "--executor", "debug", "--quiet"], monkeypatch)
    assert res.exit_code == 0, res.output
    for argv in (["sweep", "status", "sw"], ["report", "sw", "-o", "r.html"]):
        assert invoke(tmp_path, argv, monkeypatch).exit_code == 0


# --- status.json and provenance.json of a run folder -----------------------------------------------------

STATUS = [("state", ["nope", None, 1]), ("step", ["3", -1, 1.5, True]), ("error", [5, ["x"]]), ("updated", ["now"])]
PROVENANCE = [("resumed_from_steps", ["x", [-1], ["1"]]),
              ("extended_from", ["x", {"run_id": "../../x", "steps": 2, "folder": "/"}, {"run_id": RID, "steps": "2"}])]
RUN_CASES = [("status.json", k, v) for k, vs in STATUS for v in vs] + \
            [("provenance.json", k, v) for k, vs in PROVENANCE for v in vs]


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    from ablate.train.trainer import train

    run = tmp_path_factory.mktemp("toy") / "r"
    cfg = load(TOY, ["tracking.wandb.mode=disabled", "steps=3", "eval.every=3"])
    assert train(cfg, str(run), progress=False) == "completed"
    RunStore(run).set_status("failed", 2, "node lost")
    return run


@pytest.mark.parametrize("name, key, value", RUN_CASES, ids=[f"{n}:{k}={v!r}" for n, k, v in RUN_CASES])
def test_every_field_of_status_and_provenance_is_checked_before_a_resume(tmp_path, monkeypatch, toy_run, name, key,
                                                                         value):
    run = tmp_path / "r"
    shutil.copytree(toy_run, run)
    data = json.loads((run / name).read_text())
    (run / name).write_text(json.dumps({**data, key: value}))
    (tmp_path / "toy.yaml").write_text(TOY.read_text())
    before = snapshot(tmp_path)
    res = invoke(tmp_path, ["train", "toy.yaml", "--out", "r", "--set", "tracking.wandb.mode=disabled", "--set",
                            "steps=3", "--set", "eval.every=3"], monkeypatch)
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in res.output, (res.exit_code, res.output, res.exception)
    assert f"r/{name}" in out and (key in out or name == "status.json" and key == "state"), res.output
    assert snapshot(tmp_path) == before


# --- the HTML report: every string that reaches it is escaped -----------------------------------------------

SCRIPT = "<script>document.title='PWNED {}'</script>"
IMG = "\"'><img src=x onerror=\"document.title='PWNED {}'\">"


def payload(field: str) -> str:
    return SCRIPT.format(field) + IMG.format(field)


class Page(HTMLParser):
    """What a browser would build: elements with attributes, and the text."""

    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def planted_sweep(root: Path, named: bool) -> None:
    """Two arms x 3 seeds with a payload in every string field that can reach the report: arms named in the
    manifest (`named`), or labelled by their toggle values."""
    rng, entries = np.random.default_rng(0), {}
    for i, (arm, toggle) in enumerate([("a", "group"), (payload("arm"), payload("toggle"))]):
        for s in range(3):
            rid = run_name(i + 2 * named, s) if (i, s) != (1, 2) else payload("run id")
            cfg = {"run_id": rid, "seed": s, "steps": 50, "model": {"path": payload("config value")},
                   "task": {"name": "jsonl", payload("config key"): 1}, "recipe": {"scale": toggle}}
            d = root / run_name(i + 2 * named, s)
            write_run(d, cfg, 0.5 + 0.1 * i, 50, rng, state="failed" if (i, s) == (1, 1) else "completed")
            status = json.loads((d / "status.json").read_text())
            if (i, s) == (1, 1):
                (d / "status.json").write_text(json.dumps({**status, "error": "Traceback:\n" + payload("error")}))
            with open(d / "samples.jsonl", "a") as f:
                for split in ("heldout", payload("split")):
                    f.write(json.dumps({"step": 50, "split": split, "prompt": payload("prompt"),
                                        "completion": payload("completion"), "reward": 1.0, "correct": True}) + "\n")
            if (i, s) != (1, 2):
                entries[rid] = {"arm": arm if named else None, "seed": s, "toggles": {"recipe.scale": toggle},
                                "steps": 50, "jobs": []}
    spec = {"name": payload("sweep name"), **({"arms": {"a": {}, payload("arm"): {}}} if named else {})}
    (root / "manifest.json").write_text(json.dumps({"name": payload("sweep name"), "runs": entries, "spec": spec}))


FIELDS_SHOWN = ["config value", "config key", "run id", "toggle", "arm", "error", "prompt", "completion", "folder",
                "title"]


@pytest.fixture(scope="module")
def planted_reports(tmp_path_factory):
    """Two reports: a sweep whose arms the manifest names, and one whose arms are their toggle values."""
    top = tmp_path_factory.mktemp("xss")
    outs = []
    for named, root in ((True, top / ("named" + IMG.format("folder").replace("/", ""))), (False, top / "toggles")):
        planted_sweep(root, named)  # a folder name holds no slash
        outs.append(top / f"{root.name[:5]}.html")
        build_report([root], outs[-1], reps=100, title=payload("title"))
    return outs


def test_no_planted_string_reaches_the_report_unescaped(planted_reports):
    shown = []
    for out in planted_reports:
        text = out.read_text()
        page = Page()
        page.feed(text)
        assert [t for t, _ in page.tags if t == "script"] == []
        assert [a for _, attrs in page.tags for a in attrs if a.lower().startswith("on")] == []
        assert all(attrs["src"].startswith("data:image/png;base64,") for t, attrs in page.tags if t == "img")
        assert "<script" not in text and "<img src=x" not in text  # as markup: only escaped (&lt;script&gt;)
        shown.append("".join(page.text))
    # every field the report shows (as text) was planted, and reached the page escaped
    reached = [f for f in FIELDS_SHOWN if any(f"document.title='PWNED {f}'" in text for text in shown)]
    assert reached == FIELDS_SHOWN


def test_a_browser_runs_nothing_planted(planted_reports, tmp_path):
    """Headless Chromium loads each page, runs what it would run, and dumps the DOM: had any payload run, the
    title would read `PWNED <field>`; it is still the planted title, as text."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (`make services` does)", pytrace=False)
    for out in planted_reports:
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                              f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"file://{out.resolve()}"],
                             capture_output=True, text=True, timeout=120).stdout
        page = Page()
        page.feed(dom)
        assert len(dom) > 10_000 and [t for t, _ in page.tags if t == "script"] == []
        assert [a for _, attrs in page.tags for a in attrs if a.lower().startswith("on")] == []
        title = re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
        assert title.startswith("&lt;script&gt;document.title='PWNED title'"), title
