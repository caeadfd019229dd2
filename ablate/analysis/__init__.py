"""Analysis of run stores: loading runs into pandas frames, statistics across seeds (rliable
conventions), factorial effects, diagnostics and the HTML / Markdown report (docs/report.md)."""

# Imported on first use (PEP 562): loading runs should not wait for matplotlib and scipy.
_LAZY = {"Study": "load", "final_table": "load", "find_runs": "load", "load_runs": "load", "load_study": "load",
         "Report": "report", "build_report": "report"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"ablate.analysis.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'ablate.analysis' has no attribute {name!r}")
