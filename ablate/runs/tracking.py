"""Weights & Biases as a mirror of the local run store (docs/tracking.md).

The run folder stays the source of truth; `open_mirrors(cfg, run_dir)` returns the mirrors `RunStore`
feeds with every appended row and status change. A W&B run lives in `<run_dir>/wandb/` and its id in
`<run_dir>/wandb.json`, so a resumed or requeued run continues the same W&B run. Every optimizer step
becomes one W&B history row (metrics, evaluation and a samples table merged), logged once with
`step=` the optimizer step and committed at once; steps the W&B run already holds are skipped, so a
resume that re-logs the steps after its checkpoint adds no duplicate. Nothing here can stop training:
a failed start or a mid-run error costs one warning and the local store carries on.
"""

from __future__ import annotations

import contextlib
import json
import netrc
import os
import secrets
import sys
import warnings
from pathlib import Path
from urllib.parse import urlsplit

from ablate.config import RunConfig, run_id, to_dict
from ablate.runs.store import RunStore

STATE_FILE = "wandb.json"  # {"id": W&B run id, "last_step": last optimizer step committed to W&B}
SAMPLE_COLUMNS = ("step", "split", "prompt", "completion", "reward", "advantage", "correct")
HIGHER_IS_BETTER = ("eval/pass@", "eval/greedy_acc", "eval/reward_mean")  # prefixes with a best/ summary
DEFAULT_HOSTS = ("api.wandb.ai", "api.forge.coreweave.com")  # wandb's default base URL and the host behind it


# --- what the run is called ------------------------------------------------------------------------

def _fmt(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def run_name(cfg: RunConfig, varying: dict | None = None, arm: str | None = None) -> str:
    """Readable name: the arm (else preset, else "custom"), the toggles that differ within a sweep, and
    the seed, e.g. `grpo-eps_high=0.28-s1` for varying={"recipe.eps_high": 0.28, "seed": 1}."""
    parts = [arm or cfg.preset or "custom"]
    parts += [f"{key.rsplit('.', 1)[-1]}={_fmt(v)}" for key, v in (varying or {}).items() if key != "seed"]
    return "-".join(parts + [f"s{cfg.seed}"])


def run_tags(cfg: RunConfig) -> list[str]:
    """The recipe toggles as tags, for filtering runs in the W&B UI."""
    r = cfg.recipe
    tags = [f"preset={cfg.preset or 'custom'}", f"task={cfg.task.name}", f"baseline={r.baseline}",
            f"scale={r.scale}", f"loss_agg={r.loss_agg}", f"ratio_level={r.ratio_level}",
            f"optimizer={cfg.optim.optimizer}", f"overlong={r.overlong}",
            f"kl={r.kl_estimator}-in-{r.kl_placement}" if r.kl_coef > 0 else "kl=off"]
    if r.dynamic_sampling:
        tags.append("dynamic_sampling")
    if r.eps_high > r.eps_low:
        tags.append("clip_higher")
    if r.dual_clip is not None:
        tags.append("dual_clip")
    return tags


# --- which mode --------------------------------------------------------------------------------------

def has_credentials() -> bool:
    """W&B credentials are configured (env or a netrc entry for the W&B host); no network involved."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    base = os.environ.get("WANDB_BASE_URL")
    hosts = [urlsplit(base).netloc] if base else list(DEFAULT_HOSTS)
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        entries = netrc.netrc(path)
    except (OSError, netrc.NetrcParseError):
        return False
    return any(entries.authenticators(h) for h in hosts if h)


def resolve_mode(cfg: RunConfig) -> str:
    """online | offline | disabled. `disabled` in the config always wins (an explicit opt-out); otherwise
    WANDB_MODE (and WANDB_DISABLED) override the config as usual; `auto` means online iff credentials exist."""
    mode = cfg.tracking.wandb.mode
    if mode == "disabled":
        return "disabled"
    if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return "disabled"
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    mode = {"dryrun": "offline", "run": "online"}.get(env, env) or mode
    if mode == "auto":
        return "online" if has_credentials() else "offline"
    return mode if mode in ("online", "offline", "disabled") else "offline"


def open_mirrors(cfg: RunConfig, run_dir) -> list:
    """The store mirrors for this run: [] when W&B is disabled (nothing written) or fails to start."""
    mode = resolve_mode(cfg)
    if mode == "disabled":
        return []
    try:
        return [WandbMirror(cfg, run_dir, mode)]
    except Exception as err:  # noqa: BLE001 - a dashboard must never stop training
        why = _why(err, init_timeout(cfg))
        if mode == "online" and cfg.tracking.wandb.mode == "auto" and not os.environ.get("WANDB_MODE"):
            try:  # auto with unreachable W&B: keep the history in offline files for `wandb sync`
                mirror = WandbMirror(cfg, run_dir, "offline")
                _warn(f"W&B online start failed ({why}); logging offline instead under {run_dir}/wandb")
                return [mirror]
            except Exception as err2:  # noqa: BLE001
                why = _why(err2, init_timeout(cfg))
        _warn(f"W&B disabled: it failed to start ({why}); training continues and the local run store in "
              f"{run_dir} stays complete")
        return []


def init_timeout(cfg: RunConfig) -> float:
    """Seconds wandb.init may wait for the server: `tracking.timeout_s`, unless WANDB_INIT_TIMEOUT is set."""
    try:
        return float(os.environ["WANDB_INIT_TIMEOUT"])
    except (KeyError, ValueError):
        return cfg.tracking.timeout_s


def _why(err: Exception, timeout: float) -> str:
    """One line: W&B's errors run to several (a retry log and advice on init_timeout)."""
    first = (str(err).strip().splitlines() or [""])[0][:200]
    if any(w in first.lower() for w in ("timed out", "timeout", "deadline exceeded")):
        return f"no answer within {timeout:g} s, tracking.timeout_s: {first}"
    return f"{type(err).__name__}: {first}"


def _warn(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


# --- the mirror ------------------------------------------------------------------------------------------

class WandbMirror:
    """One W&B run mirroring one run folder; `RunStore` calls append/status/close."""

    def __init__(self, cfg: RunConfig, run_dir, mode: str):
        import wandb

        self._wandb, self.root = wandb, Path(run_dir)
        saved = self._read_state()
        self.id = saved.get("id") or os.environ.get("WANDB_RUN_ID") or secrets.token_hex(4)
        self.last_step = saved.get("last_step", -1)  # steps <= this are already in the W&B run
        w = cfg.tracking.wandb
        name = os.environ.get("WANDB_NAME") or w.name or run_name(cfg)
        timeout = init_timeout(cfg)
        self.run = wandb.init(
            id=self.id, resume="allow", mode=mode, dir=str(self.root), entity=w.entity, project=w.project,
            group=w.group, job_type=w.job_type, name=name, tags=run_tags(cfg),
            config={"run_id": run_id(cfg), **to_dict(cfg)}, allow_val_change=True, reinit="create_new",
            settings=wandb.Settings(init_timeout=timeout, console="off", quiet=True, silent=True, save_code=False))
        self.offline = mode == "offline"
        self._write_state()  # the id first, so a crash from here on still resumes this W&B run
        self.run.define_metric("train/step")
        for prefix in ("train", "eval", "perf", "counters", "episode"):
            self.run.define_metric(f"{prefix}/*", step_metric="train/step")
        self.step, self.row, self.samples = None, {}, []  # the optimizer step being assembled

    # state file
    def _read_state(self) -> dict:
        path = self.root / STATE_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    def _write_state(self) -> None:  # atomic (rename) but not fsynced: once per step, and cheap
        tmp = self.root / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps({"id": self.id, "last_step": self.last_step}))
        os.replace(tmp, self.root / STATE_FILE)

    # store interface
    def append(self, log: str, row: dict) -> None:
        with self._finish_on_error():
            if log == "eval_problems":
                return  # per-problem counts stay in the local run store
            step = row["step"]
            if step <= self.last_step:  # a resumed run re-logs the steps after its checkpoint: W&B has them
                return
            if self.step is not None and step != self.step:
                self._commit()
            self.step = step
            if log == "samples":
                self.samples.append([row.get(c) for c in SAMPLE_COLUMNS])
            else:
                self.row.update({k: v for k, v in row.items() if k != "step"})

    def status(self, state: str, step: int, error: str | None) -> None:
        with self._finish_on_error():
            self._commit()  # the store sets the status once a step's rows are all written

    def close(self, state: str) -> None:
        with self._finish_on_error():
            self._commit()
            self.run.summary.update(self._summary(state))
            folder = self.run.dir
            self.run.finish(exit_code=1 if state == "failed" else 0)
            if self.offline:  # W&B's own footer (silenced) takes three lines for this
                print(f"wandb: offline; upload with `wandb sync {Path(folder).parent}`", file=sys.stderr)

    # internals
    def _commit(self) -> None:
        """Log the assembled step as one W&B row, then record it as done."""
        if self.step is None:
            return
        data = {"train/step": self.step, **self.row}
        if self.step == 0:  # the evaluation before training: give it the counters' x-axes too
            data.update({"counters/samples": 0, "counters/tokens": 0})
        if self.samples:
            data["samples"] = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=self.samples)
        self.run.log(data, step=self.step, commit=True)
        self.last_step, self.step, self.row, self.samples = self.step, None, {}, []
        self._write_state()

    def _summary(self, state: str) -> dict:
        """Final and best held-out metrics, read from the local store (complete across resumes)."""
        store = RunStore(self.root)
        out, evals = {"status": state, "final_step": (store.status() or {}).get("step")}, store.read("evals")
        for key in sorted({k for r in evals for k in r if k != "step"}):
            rows = [r for r in evals if r.get(key) is not None]
            out[f"final/{key}"] = rows[-1][key]
            if key.startswith(HIGHER_IS_BETTER):
                best = max(rows, key=lambda r: r[key])
                out[f"best/{key}"], out[f"best/{key}@step"] = best[key], best["step"]
        return out

    @contextlib.contextmanager
    def _finish_on_error(self):
        """On any error, finish the W&B run (quietly) and re-raise so the store drops this mirror."""
        try:
            yield
        except Exception:
            with contextlib.suppress(Exception):  # already failing; the store reports the first error
                self.run.finish(exit_code=1)
            raise
