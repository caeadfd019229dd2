"""ablate: ablation studies of RLVR (GRPO-family) recipes on language models."""

__version__ = "0.1.0"

# Imported on first use (PEP 562), so that `import ablate` and the CLI start without torch, pandas
# and matplotlib: `ablate --help` or `ablate sweep status` should answer at once.
_LAZY = {"compute_advantages": "ablate.rl.advantages", "load_runs": "ablate.analysis", "pass_at_k": "ablate.rl.stats"}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ablate' has no attribute {name!r}")
