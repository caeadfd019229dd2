"""SLURM profiles: the schema of a profile YAML (`SlurmProfile`), its mapping to submitit's parameters
(`load_profile`: the job's shape, time, memory, extra sbatch options) and the guards on every value that
reaches the batch script (`check_sbatch_text`: one printable line)."""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from ablate.experiments.sweep import SpecError
from ablate.schema import Count, Line, Natural, NonEmptyLine, Text, parse_section


@dataclass(frozen=True)
class SlurmProfile:
    """The keys of a SLURM profile YAML, their types and domains (null = unset); load_profile maps them to
    submitit's parameters. slurm/profiles/example.yaml shows every key."""

    partition: NonEmptyLine | None = None
    time: Count | NonEmptyLine | None = None       # minutes, or a SLURM time ('4:00:00', '1-00:00')
    gpus: Natural | None = None                     # per node
    cpus: Count | None = None                       # per task
    mem: Count | Annotated[str, Text(min_len=1, pattern=r"\d+[KMGT]?B?", what="digits and a unit K, M, G or T")] \
        | None = None                               # an integer is GB
    account: NonEmptyLine | None = None
    qos: NonEmptyLine | None = None
    constraint: NonEmptyLine | None = None
    setup: tuple[Line, ...] | None = None           # shell lines run before the job
    array_parallelism: Count | None = None
    signal_delay_s: Count | None = None
    additional: dict[str, Any] | None = None        # more sbatch options: name -> scalar
    nodes: Count | None = None
    tasks_per_node: Count | None = None


PROFILE_KEYS = tuple(f.name for f in dataclasses.fields(SlurmProfile))
# sbatch options that set a run's shape: only through the profile keys `nodes`, `gpus`, `tasks_per_node`
SHAPE_OPTIONS = ("nodes", "ntasks", "ntasks-per-node", "ntasks_per_node", "gpus-per-node", "gpus_per_node")


def slurm_minutes(value: int | str) -> int:
    """SLURM time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS -> whole minutes (rounded up)."""
    if isinstance(value, int):
        return value
    days, rest = value.split("-", 1) if "-" in value else ("0", value)
    parts = [int(p) for p in rest.split(":")]
    if "-" in value:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) <= 2:
        h, m, s = 0, parts[0], (parts[1] if len(parts) == 2 else 0)
    else:
        h, m, s = parts
    return int(days) * 1440 + h * 60 + m + (s > 0)


_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def control_chars(text: str) -> list[str]:
    """The control characters (newline, tab, NUL, ...) in `text`, as escapes: the batch script is line based,
    so any of them in a value that reaches it could end an `#SBATCH` line and start a command."""
    return sorted({repr(c) for c in text if unicodedata.category(c) in ("Cc", "Zl", "Zp")})


def check_sbatch_text(where: str, key: str, value: Any) -> None:
    """SpecError naming `where` and `key` when a value that goes into the batch script holds control
    characters (every other value is quoted by submitit, and setup lines are the profile's own shell)."""
    bad = control_chars(str(value))
    if bad:
        raise SpecError(f"{where}: {key}: {value!r} holds control characters ({', '.join(bad)}); values that reach "
                        f"the SLURM batch script must be one printable line")


def load_profile(path: str | Path) -> dict:
    """A SLURM profile YAML -> submitit AutoExecutor parameters. Errors name the file and the key."""
    from ablate.experiments.sweep import read_spec_file

    path = Path(path)
    data = read_spec_file(path, "SLURM profile") or {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of {', '.join(PROFILE_KEYS)}")
    parse_section(SlurmProfile, data, str(path), SpecError)  # keys, types and domains
    data = {k: v for k, v in data.items() if v is not None}
    for k, v in data.items():  # nothing that reaches the batch script may break a line
        entries = ([(f"{k}.{a}", a, b) for a, b in v.items()] if isinstance(v, dict) else
                   [(f"{k}[{i}]", None, b) for i, b in enumerate(v)] if isinstance(v, list) else [(k, None, v)])
        for key, sub, item in entries:
            if k == "setup" and not isinstance(item, str) or k == "additional" and not isinstance(
                    item, (str, int, float, bool)):
                raise SpecError(f"{path}: {key}: expected a {'string' if k == 'setup' else 'scalar'}, got {item!r}")
            check_sbatch_text(str(path), key, item)
            if k == "additional" and not _SBATCH_KEY.fullmatch(str(sub)):
                raise SpecError(f"{path}: additional: {sub!r} is not an sbatch option name (letters, digits, "
                                f"'-' and '_', without the leading dashes)")
    params = _shape(path, data)
    try:
        time_min = slurm_minutes(data["time"]) if "time" in data else None
    except (ValueError, KeyError):
        raise SpecError(f"{path}: time: {data['time']!r} is not a SLURM time (e.g. 90, '4:00:00', '1-00:00')") from None
    names = {"partition": "slurm_partition", "account": "slurm_account", "qos": "slurm_qos",
             "constraint": "slurm_constraint", "setup": "slurm_setup", "array_parallelism": "slurm_array_parallelism",
             "signal_delay_s": "slurm_signal_delay_s", "additional": "slurm_additional_parameters",
             "cpus": "cpus_per_task"}
    params.update({names[k]: v for k, v in data.items() if k in names})
    if time_min is not None:
        params["timeout_min"] = time_min
    if "mem" in data:
        params["slurm_mem"] = f"{data['mem']}G" if isinstance(data["mem"], int) else data["mem"]
    return params


def _shape(path: Path, data: dict) -> dict:
    """The profile's `nodes`, `gpus` (per node) and `tasks_per_node` -> submitit's `nodes`,
    `tasks_per_node`, `gpus_per_node`. One task is one rank of the run (torch.distributed): one rank per
    GPU, so with GPUs `tasks_per_node` is `gpus`; without GPUs `tasks_per_node` sets the CPU ranks.
    A job array has this shape for every array task: each task of the array is one multi-rank run."""
    gpus = data.get("gpus", 0)
    tasks = data.get("tasks_per_node", gpus or 1)
    if gpus and tasks != gpus:
        raise SpecError(f"{path}: tasks_per_node: {tasks} with gpus: {gpus}; each rank drives one GPU, so "
                        f"tasks_per_node must be {gpus} (or left out: it defaults to gpus)")
    for opt in data.get("additional", {}):
        if opt in SHAPE_OPTIONS:
            raise SpecError(f"{path}: additional.{opt}: sets the job's shape, which comes from the profile keys "
                            f"nodes, gpus and tasks_per_node; use those instead")
    shape = {"nodes": data["nodes"]} if "nodes" in data else {}
    if "tasks_per_node" in data or gpus > 1:  # 1 is submitit's default: a one-GPU profile stays as it was
        shape["tasks_per_node"] = tasks
    if "gpus" in data:
        shape["gpus_per_node"] = gpus
    return shape


def ranks(params: dict) -> int:
    """The number of ranks (torch.distributed processes) of each run under these executor parameters."""
    return params.get("nodes", 1) * params.get("tasks_per_node", 1)
