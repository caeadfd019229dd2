"""The local run store, the source of truth: one folder per run.

    config.yaml       the fully resolved config (plus its run id)
    provenance.json   versions, git SHA, device, host, seed, SLURM job id
    status.json       {"state": running|completed|failed|diverged|cancelled|pruned, "step", "error", ...}
    metrics.jsonl     one line per optimizer step: {"step": s, "train/...": v, "perf/...": v}
    evals.jsonl       one line per held-out evaluation: {"step": s, "eval/...": v}
    samples.jsonl     sample completions: {"step", "split", "prompt", "completion", "reward", ...}
    eval_problems.jsonl  one line per held-out evaluation pass (eval.repeats per evaluation):
                      {"step", "repeat", "n", "problems": [id, ...], "correct": [count, ...]}
    checkpoint.pt     trainer state for resuming (atomic replace): tensors plus a JSON document, read with
                      torch's tensor-only loader, so a crafted file on a shared file system cannot run code
    .lock             one writer per run folder: the process training the run holds an exclusive flock on
                      it (its pid inside) for the run's life; the kernel releases it when that process ends

Appends are line-buffered so a crash loses at most the step in flight; readers skip a half-written
last line (and report any other damaged line with its file and line number). Before a checkpoint is
written the logs are flushed to disk, so a checkpoint never outlives the rows of its steps: a torn line
belongs to a step after the checkpoint, which the resume trains again. Files that are replaced (config,
status, checkpoint) are written to a temporary file and renamed, so a reader never sees a partial one; on a
full disk the temporary file is removed and the final status is written over status.json's own bytes, so a
run never stays `running` after it ended. Any other error on a path of the folder (a folder where a file
belongs, no permission, a read-only file system) is a RunFolderError naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import re
import socket
import subprocess
import time
import warnings
from pathlib import Path
from typing import Literal

import yaml

from ablate.config import RunConfig, run_id, to_dict

LOGS = ("metrics", "evals", "samples", "eval_problems")
# A run's state, everywhere it is named. status.json holds one of STATES; a sweep's status adds `pending`
# (its job is queued) and `missing` (never started), the analysis `unknown` (logs without a status.json).
RunState = Literal["running", "completed", "failed", "diverged", "cancelled", "pruned", "pending", "missing", "unknown"]
STATES: tuple[RunState, ...] = ("running", "completed", "failed", "diverged", "cancelled", "pruned")
FINISHED: tuple[RunState, ...] = ("completed", "diverged", "pruned")  # ended for good: never resumed or resubmitted
CHECKPOINT = "checkpoint.pt"
RUN_FILES = ("status.json", "provenance.json", CHECKPOINT, *(f"{log}.jsonl" for log in LOGS))
CHECKPOINT_FORMAT = 2  # {"format", "meta": JSON text, "tensors": {name: tensor}}
LOCK = ".lock"
SPACE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full disk or quota: the run ends `failed` (exit 1)


RUN_ID = re.compile(r"[0-9a-f]{12}")  # config.hash_config: the first 12 hex digits of a SHA-256


def is_run_id(text) -> bool:
    """Whether `text` has a run id's format (read from disk, it may then name a run folder)."""
    return isinstance(text, str) and RUN_ID.fullmatch(text) is not None


class RunFolderError(ValueError):
    """A run folder that cannot be trusted or read; the message names the folder and the files."""


class CheckpointError(RunFolderError):
    """An unreadable checkpoint, or one of another run."""


def pack(obj, tensors: dict) -> object:
    """Nested state -> JSON-able data; each tensor moves into `tensors` and is replaced by a reference.
    Tuples and dicts with non-string keys (optimizer state) are tagged so that `unpack` restores them."""
    import torch

    if isinstance(obj, torch.Tensor):
        name = str(len(tensors))
        tensors[name] = obj
        return {"__tensor__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and "__tensor__" not in obj and "__items__" not in obj:
            return {k: pack(v, tensors) for k, v in obj.items()}
        return {"__items__": [[pack(k, tensors), pack(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [pack(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [pack(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint state holds a {type(obj).__name__}; only tensors and plain data are stored")


def unpack(data, tensors: dict):
    """The inverse of `pack`."""
    if isinstance(data, list):
        return [unpack(v, tensors) for v in data]
    if not isinstance(data, dict):
        return data
    if "__tensor__" in data:
        return tensors[data["__tensor__"]]
    if "__tuple__" in data:
        return tuple(unpack(v, tensors) for v in data["__tuple__"])
    if "__items__" in data:
        return {unpack(k, tensors): unpack(v, tensors) for k, v in data["__items__"]}
    return {k: unpack(v, tensors) for k, v in data.items()}


@contextlib.contextmanager
def writing(path: Path):
    """An OSError on `path` that is not a full disk (a folder where a file belongs, a file where a folder
    does, no permission, a read-only file system) as a RunFolderError naming the path."""
    try:
        yield
    except OSError as err:
        if err.errno in SPACE_ERRORS:
            raise
        raise RunFolderError(f"{path}: cannot be written ({err.strerror or err}); a run folder's files are "
                             f"regular files in a writable folder") from None


def atomic_write(path: Path, write) -> None:
    """`write(file)` into a temporary sibling, then rename over `path`. On any error (a full disk) the
    temporary file is removed: no empty or partial leftovers, and `path` is unchanged."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path):
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def overwrite_in_place(path: Path, data: bytes) -> None:
    """Write `data` over `path`'s own bytes (then cut it to length): works on a full disk, where a new
    temporary file cannot get a block but a small file's first block is already its own. Not atomic:
    only for the last status write of a run that is failing anyway."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path, what: str, hint: str, error: type[Exception] = RunFolderError):
    """A JSON file read from disk; `error` naming the file, what it is and what to do when it does not parse."""
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as err:
        raise error(f"{path}: unreadable {what} ({err}); {hint}") from None


def status_problem(row) -> str | None:
    """What breaks the format of a status.json read from disk, or None (the one check, for the trainer, the
    sweep launcher and the report alike)."""
    if not isinstance(row, dict) or row.get("state") not in STATES:
        return f"state must be one of {', '.join(STATES)}"
    if type(row.get("step", 0)) is not int or row.get("step", 0) < 0:
        return f"step: {row.get('step')!r} is not a step (an integer >= 0)"
    if not isinstance(row.get("error"), (str, type(None))):
        return "error: expected text or null"
    if not isinstance(row.get("updated", 0), (int, float)) or isinstance(row.get("updated"), bool):
        return "updated: expected a time"
    return None


def provenance_problem(info) -> str | None:
    """What breaks the format of the provenance fields a run carries over, or None."""
    if not isinstance(info, dict):
        return "expected a mapping"
    steps = info.get("resumed_from_steps", [])
    if not (isinstance(steps, list) and all(type(s) is int and s >= 0 for s in steps)):
        return "resumed_from_steps: expected a list of steps"
    ext = info.get("extended_from")
    if ext is not None and not (isinstance(ext, dict) and is_run_id(ext.get("run_id")) and type(ext.get("steps")) is int
                                and isinstance(ext.get("folder"), str)):
        return "extended_from: expected {run_id: 12 hex digits, steps, folder}"
    return None


def _fsync(path: Path) -> None:
    """Flush a file's written data to disk (nothing when it does not exist)."""
    if path.exists():
        with writing(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def read_jsonl(path: Path) -> list[dict]:
    """All rows. Only a torn last line (a crash mid-write: no newline yet) is skipped; any other line that is
    not a JSON object raises RunFolderError naming the file and the line, so no row is ever dropped silently."""
    if not path.exists():
        return []
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RunFolderError(f"{path}: cannot be read ({err.strerror or err}); a log is a regular file") from None
    *lines, tail = data.split(b"\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue  # a blank line holds no row
        try:
            row = json.loads(line)
        except (ValueError, UnicodeDecodeError) as err:
            raise RunFolderError(f"{path}:{i}: corrupt line ({err}); only a torn last line is tolerated. Repair "
                                 f"or remove the line (the run is otherwise complete up to it)") from None
        if not isinstance(row, dict):
            raise RunFolderError(f"{path}:{i}: expected a JSON object per line, got {line[:60]!r}")
        rows.append(row)
    try:
        row = json.loads(tail) if tail.strip() else None
        if isinstance(row, dict):
            rows.append(row)  # complete, only its newline is missing
    except (ValueError, UnicodeDecodeError):
        pass  # torn by a crash mid-write: the step it belonged to is redone on resume
    return rows


class RunStore:
    """The run folder. Optional `mirrors` (e.g. W&B) receive every appended row and status change;
    a mirror that fails is dropped with one warning, and the local store carries on regardless."""

    def __init__(self, root: str | Path, mirrors: list | None = None):
        self.root = Path(root)
        self.mirrors = list(mirrors or [])
        self._lock = None  # the open lock file while this process holds the folder

    def _mirror(self, method: str, *args) -> None:
        for m in list(self.mirrors):
            try:
                getattr(m, method)(*args)
            except Exception as err:  # noqa: BLE001 - a dashboard must never stop training
                self.mirrors.remove(m)
                warnings.warn(f"{type(m).__name__} disabled after an error: {err!r}; the local run store "
                              f"in {self.root} stays complete", RuntimeWarning, stacklevel=3)

    def close(self, state: RunState) -> None:
        self._mirror("close", state)
        self.unlock()

    # --- one writer per run folder ---
    def lock(self) -> None:
        """Hold the folder for this process until `unlock` (or its end: the kernel releases a flock even after
        kill -9): an exclusive, non-blocking flock on `.lock`, which then names this process. RunFolderError
        naming the pid that holds it when another process does."""
        import fcntl

        with writing(self.path(LOCK)):
            self.root.mkdir(parents=True, exist_ok=True)
            f = open(self.path(LOCK), "a+")  # not "w": the holder's line stays readable until we hold it
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            self.check_free()  # names the holder
            raise RunFolderError(f"{self.root} is in use by another process (it has just ended); run the same "
                                 f"command again") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        self._lock = f

    def unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None

    def check_free(self) -> None:
        """RunFolderError naming the process that holds the folder, if one does."""
        holder = self.holder()
        if holder is not None:
            raise RunFolderError(f"{self.root} is in use: {holder} is training it (one process writes a run "
                                 f"folder); wait for it to end, or stop it, then run the same command")

    def holder(self) -> str | None:
        """Who holds the folder (`pid N on HOST since ...`), or None when no process does; writes nothing."""
        import fcntl

        try:
            f = open(self.path(LOCK), "rb")
        except OSError:
            return None
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return f.read().decode(errors="replace").strip() or "another process"
            return None

    def path(self, name: str) -> Path:
        return self.root / name

    # --- config and provenance ---
    def write_config(self, cfg: RunConfig) -> None:
        with writing(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump({"run_id": run_id(cfg), **to_dict(cfg)}, sort_keys=False)
        atomic_write(self.path("config.yaml"), lambda f: f.write(text.encode()))

    def read_config(self) -> dict | None:
        p = self.path("config.yaml")
        if not p.exists():
            return None
        try:
            data = yaml.safe_load(p.read_text())
        except (yaml.YAMLError, UnicodeDecodeError, OSError) as err:
            raise RunFolderError(f"{p}: unreadable run config ({str(err).splitlines()[0]}); the folder cannot "
                                 f"be resumed safely: move it aside or pick another --out") from None
        if not isinstance(data, dict):
            raise RunFolderError(f"{p}: expected a mapping (the run's resolved config), got {type(data).__name__}")
        return data

    def claim(self, run: str) -> None:
        """Check, before run `run` writes anything here, that the folder is its own: refuses another run's
        folder, run files without a readable config.yaml, and a damaged or foreign checkpoint."""
        odd = [n for n in ("config.yaml", *RUN_FILES, LOCK) if self.path(n).exists() and not self.path(n).is_file()]
        if odd:
            raise RunFolderError(f"{self.root}: {', '.join(odd)}: expected a file, found a folder (or another "
                                 f"non-file); move {'it' if len(odd) == 1 else 'them'} aside to resume the run")
        existing = self.read_config()
        if existing is None:
            files = [n for n in RUN_FILES if self.path(n).exists()]
            if files:
                raise RunFolderError(f"{self.root}: holds run files ({', '.join(files)}) but no config.yaml, so "
                                     f"whose they are is unknown; refusing to resume or overwrite them (move "
                                     f"them aside, or pick another --out)")
        elif existing.get("run_id") != run:
            raise RunFolderError(f"{self.root} holds another run ({existing.get('run_id')}); refusing to "
                                 f"overwrite it")
        self.status()
        self.provenance()
        for log in LOGS:  # a damaged log is reported here, before a resume would rewrite it
            self.read(log)
        self.load_checkpoint(run, mmap=True)

    def write_provenance(self, cfg: RunConfig, device: str, **extra) -> None:
        """provenance.json; `extra`: more facts of this start (e.g. the sampler, the world size)."""
        from importlib.metadata import version  # not `import transformers`: a toy run never loads it

        import torch  # here and in the checkpoint methods only: reading a run store needs no torch

        import ablate

        info = {
            "ablate": ablate.__version__, "git_sha": _git_sha(), "torch": torch.__version__,
            "transformers": version("transformers"), "python": platform.python_version(),
            "device": device, "host": socket.gethostname(), "seed": cfg.seed, "run_id": run_id(cfg),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "resumed_from_steps": self.provenance().get("resumed_from_steps", []),  # kept across restarts
            **{k: v for k, v in self.provenance().items() if k == "extended_from"},  # --extend-to: the source run
            **extra,
        }
        atomic_write(self.path("provenance.json"), lambda f: f.write(json.dumps(info, indent=2).encode()))

    def provenance(self) -> dict:
        """provenance.json ({} without one); RunFolderError naming the field when what a new start carries
        over (resumed_from_steps, extended_from) does not have its format."""
        p = self.path("provenance.json")
        if not p.exists():
            return {}
        info = read_json(p, "provenance", "move the file aside to resume")
        problem = provenance_problem(info)
        if problem:
            raise RunFolderError(f"{p}: {problem}; not written by ablate: move the file aside to resume")
        return info

    def note_resume(self, step: int) -> None:
        """Record in provenance.json that this start resumed from the checkpoint of `step`."""
        info = self.provenance()
        info["resumed_from_steps"] = [*info.get("resumed_from_steps", []), step]
        atomic_write(self.path("provenance.json"), lambda f: f.write(json.dumps(info, indent=2).encode()))

    # --- status ---
    def status(self) -> dict | None:
        p = self.path("status.json")
        if not p.exists():
            return None
        row = read_json(p, "run status", "move the file aside to resume the run from its checkpoint")
        problem = status_problem(row)
        if problem:
            raise RunFolderError(f"{p}: not a run status ({problem})")
        return row

    def set_status(self, state: RunState, step: int, error: str | None = None) -> None:
        assert state in STATES, state
        row = {"state": state, "step": step, "error": error, "updated": time.time()}
        try:
            atomic_write(self.path("status.json"), lambda f: f.write(json.dumps(row, indent=2).encode()))
        except OSError as err:  # disk full, quota, file-size limit: a short row in the file's own blocks
            if not self.path("status.json").exists():
                raise
            last = (error or "").strip().splitlines()[-1:] or [""]
            row["error"] = f"{last[0][:400]} [status.json rewritten in place: {err.strerror}]".lstrip()
            overwrite_in_place(self.path("status.json"), json.dumps(row).encode())
        self._mirror("status", state, step, error)

    # --- append-only logs ---
    def append(self, log: str, row: dict) -> None:
        with writing(self.path(f"{log}.jsonl")), open(self.path(f"{log}.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        self._mirror("append", log, row)

    def read(self, log: str) -> list[dict]:
        return read_jsonl(self.path(f"{log}.jsonl"))

    def truncate_after(self, step: int) -> None:
        """Drop rows logged after `step` (work lost since the last checkpoint is redone on resume)."""
        for log in LOGS:
            p = self.path(f"{log}.jsonl")
            if p.exists():
                keep = "".join(json.dumps(r) + "\n" for r in read_jsonl(p) if r["step"] <= step)
                atomic_write(p, lambda f: f.write(keep.encode()))

    def _log_bytes(self) -> dict[str, int]:
        """Each log's length up to its last newline (its complete rows), 0 when it does not exist."""
        out = {}
        for log in LOGS:
            p = self.path(f"{log}.jsonl")
            with writing(p):
                size = p.stat().st_size if p.exists() else 0
                if size:
                    with open(p, "rb") as f:
                        f.seek(max(0, size - 1))
                        if f.read(1) != b"\n":  # a torn last line (rare: only a crash leaves one)
                            size = p.read_bytes().rfind(b"\n") + 1
            out[log] = size
        return out

    def logs_cover_checkpoint(self) -> bool:
        """Whether every log still holds the rows the checkpoint saw when it was written (False when a log
        lost rows of the checkpoint's steps: a torn line or a lost tail left by a crash of the machine, or an
        edit). The trainer then starts the run again (the rows are dropped, each step is trained again and
        logged once) instead of resuming at a step whose rows are gone. True without a checkpoint."""
        seen = (self._checkpoint_meta(mmap=True) or {}).get("logs") or {}
        now = self._log_bytes()
        short = [f"{log}.jsonl ({now[log]} of {n} bytes)" for log, n in seen.items() if now.get(log, 0) < n]
        if short:
            warnings.warn(f"{self.root}: {', '.join(short)} lost rows that its checkpoint covers (a torn or lost "
                          f"tail): training the run again from step 0 so that every step is logged once",
                          RuntimeWarning, stacklevel=2)
        return not short

    # --- checkpoint ---
    def save_checkpoint(self, state: dict, run: str | None = None) -> None:
        """`state`: nested dicts/lists/tuples of tensors and plain values; `run` is the run id it belongs to.
        The logs are flushed to disk first: a checkpoint never outlives the rows of its steps."""
        import torch

        for log in LOGS:
            _fsync(self.path(f"{log}.jsonl"))
        tensors: dict = {}
        meta = json.dumps({"run_id": run, "state": pack(state, tensors), "logs": self._log_bytes()})
        blob = {"format": CHECKPOINT_FORMAT, "meta": meta, "tensors": tensors}
        atomic_write(self.path(CHECKPOINT), lambda f: torch.save(blob, f))

    def load_checkpoint(self, run: str | None = None, mmap: bool = False) -> dict | None:
        """The saved state, or None without a checkpoint. Read with torch's tensor-only unpickler
        (`weights_only=True`): nothing in the file is executed. With `run`, a checkpoint of another run id
        is refused (CheckpointError); so is a damaged one, naming the file."""
        p = self.path(CHECKPOINT)
        meta = self._checkpoint_meta(mmap)
        if meta is None:
            return None
        owner, state = meta["run_id"], meta["state"]
        if run is not None and owner != run:
            raise CheckpointError(f"{p}: checkpoint of run {owner}, not of run {run}; refusing to resume "
                                  f"another run's weights (move it aside to restart from step 0)")
        return state

    def _checkpoint_meta(self, mmap: bool = False) -> dict | None:
        """{"run_id", "state" (tensors in place), "logs" (their lengths when it was written)}, or None."""
        import pickle

        import torch

        p = self.path(CHECKPOINT)
        if not p.exists():
            return None
        try:
            blob = torch.load(p, weights_only=True, mmap=mmap, map_location="cpu")
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as err:
            raise CheckpointError(f"{p}: not a readable checkpoint (truncated, or not written by ablate): "
                                  f"{str(err).splitlines()[0][:300]}; move it aside to restart the run from "
                                  f"step 0") from None
        if not isinstance(blob, dict):
            raise CheckpointError(f"{p}: not a checkpoint written by ablate (a {type(blob).__name__})")
        if blob.get("format") == CHECKPOINT_FORMAT:
            try:
                meta = json.loads(blob["meta"])
                return {**meta, "run_id": meta["run_id"], "state": unpack(meta["state"], blob["tensors"])}
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise CheckpointError(f"{p}: not a checkpoint written by ablate (its JSON part: {type(err).__name__}: "
                                      f"{err}); move it aside to restart the run from step 0") from None
        # written before format 2: the same state dict, with the config instead of the run id
        from ablate.config import hash_config

        owner = hash_config(blob["config"]) if isinstance(blob.get("config"), dict) else None
        return {"run_id": owner, "state": blob}


class FollowerStore(RunStore):
    """The run folder as a rank other than 0 sees it: it reads (status, the checkpoint to resume from)
    and writes nothing; rank 0 writes every file and the W&B mirror."""

    def write_config(self, cfg) -> None:
        pass

    def write_provenance(self, cfg, device: str, **extra) -> None:
        pass

    def note_resume(self, step: int) -> None:
        pass

    def set_status(self, state: RunState, step: int, error: str | None = None) -> None:
        pass

    def append(self, log: str, row: dict) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def save_checkpoint(self, state: dict, run: str | None = None) -> None:
        pass

    def lock(self) -> None:  # rank 0 holds the run folder for the run
        pass


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None
