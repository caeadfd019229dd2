"""Analysis of run stores: loading runs into pandas frames, statistics across seeds (rliable
conventions), factorial effects, diagnostics and the HTML / Markdown report (docs/report.md)."""

from ablate.analysis.load import Study, final_table, find_runs, load_runs, load_study
from ablate.analysis.report import Report, build_report

__all__ = ["Report", "Study", "build_report", "final_table", "find_runs", "load_runs", "load_study"]
