"""The Task contract: a task owns its problems, its prompt format and its verifiers. Also what every task
that reads a data file shares: `DataError` (`file:line: what is wrong`) and `read_rows_once` (a file is
parsed once per version, however many runs and checks read it)."""

from __future__ import annotations

import functools
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class Problem:
    id: str        # stable and unique within the task (used for disjointness checks and logging)
    prompt: str    # the question as plain text, before any chat template
    answer: str    # the reference answer
    meta: tuple = ()  # task-specific extras (hashable), e.g. a reasoning-gym entry key


class Task(Protocol):
    name: str

    def problems(self, split: Split) -> list[Problem]:
        """Train and held-out problems; disjoint by construction."""

    def prompt_text(self, problem: Problem, tokenizer) -> str:
        """The text fed to the model (plain, or through the tokenizer's chat template)."""

    def score(self, problem: Problem, completion: str) -> float:
        """Strict verifier in [0, 1]; held-out evaluation always uses this one."""

    def train_score(self, problem: Problem, completion: str) -> float:
        """Training verifier in [0, 1]: `score`, unless the task was built gameable."""

    def format_score(self, completion: str) -> float:
        """1.0 when the completion has the expected structure, else 0.0."""


class DataError(ValueError):
    """A data file a task reads is unusable: `file:line: what is wrong` (`file: what` when no line is at
    fault). `path` and `line` say where, for callers that name the config field too."""

    def __init__(self, path: str | Path, line: int | None, what: str):
        self.path, self.line, self.what = str(path), line, what
        super().__init__(f"{path}:{line}: {what}" if line else f"{path}: {what}")


def read_rows_once(path: str | Path, parse: Callable[[Path], list]) -> tuple:
    """`parse(path)` as a tuple, computed once per version of the file (its size, mtime and inode): the
    preflight of a 100-run sweep, the launcher and each in-process run read it once. DataError when the
    path is not a readable file."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as err:
        raise DataError(p, None, "no such file" if isinstance(err, FileNotFoundError) else err.strerror) from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(p, None, "not a file (a folder or a device)")
    return _parsed(parse, str(p), (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev))


@functools.lru_cache(maxsize=16)
def _parsed(parse: Callable[[Path], list], path: str, version: tuple) -> tuple:
    return tuple(parse(Path(path)))


def json_rows(path: Path, keys: tuple[str, ...]):
    """(line number, object) for each non-blank line of a JSONL data file, each an object holding `keys`;
    DataError naming the file and the line for bytes that are not UTF-8, bad JSON or another shape, and
    for a file that cannot be read or holds no row."""
    import json

    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(path, None, f"cannot be read ({err.strerror})") from None
    found = False
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise DataError(path, n, f"not UTF-8 text (byte {err.start + 1} of the line)") from None
        except json.JSONDecodeError as err:
            raise DataError(path, n, f"bad JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(row, dict):
            raise DataError(path, n, f"expected an object with {', '.join(map(repr, keys))}")
        missing = [k for k in keys if k not in row]
        if missing:
            raise DataError(path, n, f"missing key {missing[0]!r} (each row holds {', '.join(map(repr, keys))})")
        found = True
        yield n, row
    if not found:
        raise DataError(path, None, "no rows")
