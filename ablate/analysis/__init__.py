"""Analysis of run stores: loading runs into tidy pandas frames (statistics and reports build on it)."""

from ablate.analysis.load import load_runs

__all__ = ["load_runs"]
