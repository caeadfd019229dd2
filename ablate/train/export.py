"""`ablate export RUN_DIR --out DIR`: a finished run's final weights as a Hugging Face model folder.

The policy is rebuilt exactly as the trainer builds it (base model of `model.path`), the checkpoint's
weights are loaded (LoRA adapters merged into the base weights when the policy has them), and the
folder gets `save_pretrained` weights, the tokenizer, and the run's config.yaml, provenance.json and
status.json beside them (plus export.json: run id, step, source folder), so `from_pretrained(DIR)` loads
the trained model and its origin stays on record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ablate.config import ConfigError, parse
from ablate.runs.store import RunFolderError, RunStore


def export(run_dir: str | Path, out: str | Path) -> dict:
    """Write the run's final weights to `out`; RunFolderError / ConfigError name what is missing."""
    import torch

    from ablate.tasks import make_task
    from ablate.train.models import build_policy

    store, out = RunStore(run_dir), Path(out)
    data = store.read_config()
    if data is None:
        raise RunFolderError(f"{run_dir}: no config.yaml (not a run folder)")
    rid = data.pop("run_id", None)
    cfg = parse(data, source=str(store.path("config.yaml")))
    if cfg.task.name == "toy_addition":
        raise ConfigError(f"{store.path('config.yaml')}: task.name: 'toy_addition' trains a tabular policy, "
                          f"not a Hugging Face model; nothing to export")
    ckpt = store.load_checkpoint(rid)
    if ckpt is None:
        raise RunFolderError(f"{run_dir}: no checkpoint.pt (the run has not saved weights yet)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunFolderError(f"--out {out}: exists and is not an empty folder; refusing to overwrite it")
    policy = build_policy(cfg, make_task(cfg.task), torch.device("cpu"))
    policy.module.load_state_dict(ckpt["model"])
    model = policy.module.merge_and_unload() if hasattr(policy.module, "merge_and_unload") else policy.module
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    policy.tokenizer.save_pretrained(out)
    for name in ("config.yaml", "provenance.json", "status.json"):
        if store.path(name).exists():
            shutil.copy(store.path(name), out / name)
    info = {"run_id": rid, "step": ckpt["step"], "steps": cfg.steps, "source": str(Path(run_dir).resolve()),
            "state": (store.status() or {}).get("state")}
    (out / "export.json").write_text(json.dumps(info, indent=2) + "\n")
    return info
