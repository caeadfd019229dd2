"""Render a Report as self-contained HTML (inline CSS, base64 images, no scripts, no network) and as
Markdown. Section ids/titles are stable: tests and docs refer to them.

The HTML is `templates/report.html.j2`, rendered by Jinja2 with autoescaping from plain data: paragraphs,
lists, tables of cells and base64 figures (the block helpers below). No HTML is built from strings here, so
every string that reaches the page (a config value, an arm or sweep name, a status error, a sample
completion) is escaped on its way in, by construction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ablate.analysis.stats import MIN_BOOT_SEEDS

SECTIONS = [("headline", "Headline"), ("setup", "Setup"), ("warnings", "Warnings"), ("ranking", "Ranking"),
            ("effects", "Factorial effects"), ("scores", "Scores"), ("evalnoise", "Eval noise"),
            ("scaling", "Compute scaling"),
            ("curves", "Curves"), ("passk", "pass@k"),
            ("diagnostics", "Diagnostics"), ("samples", "Samples"), ("runs", "Runs")]


# --- HTML blocks: plain data for the template ----------------------------------------------------------

@dataclass(frozen=True)
class Pre:
    """A table cell shown as preformatted text (prompts, completions)."""

    text: str


def _para(text: str, cls: str | None = None) -> dict:
    return {"kind": "p", "text": text, "cls": cls}


def _bullets(items, cls: str | None = None) -> dict:
    return {"kind": "ul", "items": list(items), "cls": cls}


def _heading(text: str) -> dict:
    return {"kind": "h3", "text": text}


def _figure(alt: str, png: str) -> dict:
    return {"kind": "img", "alt": alt, "png": png}


def _table(header, rows, summary: str | None = None) -> dict:
    """A table block; a cell is shown as its text (a Pre cell preformatted); `summary`: folded under it."""
    return {"kind": "table", "header": [str(h) for h in header], "summary": summary,
            "rows": [[c if isinstance(c, Pre) else str(c) for c in r] for r in rows]}


def _md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


@functools.cache
def _template():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.tests["pre"] = lambda cell: isinstance(cell, Pre)
    return env.get_template("report.html.j2")


def _ci(est, lo, hi, scale=1.0, digits=1) -> str:
    if est is None or not np.isfinite(est):
        return "–"
    s = f"{est * scale:.{digits}f}"
    return s + (f" [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]" if np.isfinite(lo) else " [n/a]")


def _count(v) -> str:
    """Counts as integers ("19,200"), other numbers with one decimal."""
    if not np.isfinite(v):
        return "–"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def _boot(est, lo, hi, n, scale=1.0, digits=1) -> str:
    """A bootstrap interval: shown only from MIN_BOOT_SEEDS seeds (below, it is far too narrow)."""
    if n < MIN_BOOT_SEEDS and est is not None and np.isfinite(est):
        return f"{est * scale:.{digits}f} [n/a: < {MIN_BOOT_SEEDS} seeds]"
    return _ci(est, lo, hi, scale, digits)


def _ranking_rows(rep):
    a, s = rep.arms, rep.scale
    ranked = a.assign(_m=a["mean"].fillna(-np.inf)).sort_values("_m", ascending=False)

    def interval(est, lo, hi, scale, digits, n):   # the chosen --ci; a bootstrap one hidden below MIN_BOOT_SEEDS
        return _ci(est, lo, hi, scale, digits) if rep.ci_method == "t" else _boot(est, lo, hi, n, scale, digits)

    rows = []
    for i, r in enumerate(ranked.itertuples(), 1):
        diff = "reference" if r.reference else interval(r.diff, r.diff_lo, r.diff_hi, s, 1, r.n) + \
            ("" if r.paired is None else (" (paired)" if r.paired else " (unpaired)"))
        poi = "" if r.reference else _boot(r.poi, r.poi_lo, r.poi_hi, r.n, 1, 2)
        tests = [""] * len(_adj_header(rep)) if r.reference else _adj_cols(rep, r, r.diff)
        rows.append([i, r.arm, f"{r.n}/{r.runs}", interval(r.mean, r.mean_lo, r.mean_hi, s, 1, r.n),
                     _boot(r.iqm, r.iqm_lo, r.iqm_hi, r.n, s), diff, *tests, poi,
                     "–" if not np.isfinite(r.sd) else f"{r.sd * s:.2f}", r.excluded])
    return ["#", "arm", "seeds used/runs", f"mean {rep.unit} [95% CI]", "IQM [95% bootstrap CI]",
            "difference to reference [95% CI]", *_adj_header(rep), "P(improvement) [95% bootstrap CI]", "seed sd",
            "excluded runs"], rows


ADJUST_NAMES = {"none": "no adjustment", "holm": "Holm", "bh": "Benjamini-Hochberg"}


def _p(v) -> str:
    if v is None or not np.isfinite(v):
        return "–"
    return "<0.001" if v < 0.001 else f"{v:.3f}"


def _adj_cols(rep, r, est) -> list:
    """p, adjusted p and interval, MDE (and seeds needed for the user's effect) of one contrast row."""
    out = [_p(r.p)]
    if rep.adjust != "none":
        ci = "–" if not np.isfinite(r.adj_lo) else \
            f"[{r.adj_lo * rep.scale:.1f}, {r.adj_hi * rep.scale:.1f}]" + ("" if r.adj_significant else " n.s.")
        out += [_p(r.p_adj), ci]
    out.append("–" if not np.isfinite(r.mde) else f"{r.mde * rep.scale:.1f}")
    if rep.mde_target:
        out.append("–" if not np.isfinite(r.seeds_needed) else f"{int(r.seeds_needed)}")
    return out


def _adj_header(rep) -> list:
    h = ["p (t test)"]
    if rep.adjust != "none":
        h += [f"p {ADJUST_NAMES[rep.adjust]}", f"adjusted CI ({ADJUST_NAMES[rep.adjust]})"]
    h.append(f"MDE ({rep.unit})")
    if rep.mde_target:
        h.append(f"seeds per arm for {rep.mde_target * rep.scale:g}")
    return h


CI_NAMES = {"t": "Student t (Welch for unpaired arms)", "percentile": "percentile bootstrap (rliable)",
            "bca": "BCa bootstrap (scipy)"}


def _ci_note(rep) -> str:
    return (f"95% CIs over seeds. Means, differences and effects: {CI_NAMES[rep.ci_method]}, paired by seed where "
            f"arms share seeds; IQM and P(improvement): percentile bootstrap (marked; not shown below "
            f"{MIN_BOOT_SEEDS} seeds, where it is far too narrow). A CI that excludes 0 at 3-5 seeds is "
            f"one draw of a 5%-level test, not a verdict. p: two-sided t test of the contrast. "
            + ("No adjustment for multiple comparisons. " if rep.adjust == "none" else
               f"Adjusted ({ADJUST_NAMES[rep.adjust]}, each table one family): p-values, and intervals at the "
               f"family's adjusted level (Bonferroni 1 - 0.05/m for Holm, Benjamini-Yekutieli 1 - R 0.05/m for BH). ")
            + "MDE: the smallest true difference this many seeds detect with probability 0.8 (alpha 0.05, paired "
            "or Welch as the contrast is); a 'n.s.' smaller than its MDE says little.")


def _effect_rows(rep):
    rows = []
    for r in rep.effects.itertuples():
        rows.append([r.term, r.kind, _ci(r.estimate, r.lo, r.hi, rep.scale), "yes" if r.significant else "n.s.",
                     *_adj_cols(rep, r, r.estimate), r.n, {True: "paired", False: "unpaired"}.get(r.paired, "–"),
                     r.coverage])
    return ["term", "kind", f"effect ({rep.unit}) [95% CI]", "CI excludes 0", *_adj_header(rep), "seeds", "pairing",
            "cells used"], rows


SCORE_NAMES = {"final": "final", "last_k": "mean of last {k} evaluations", "auc": "area under the curve (mean level)",
               "max": "max over training (biased upward)"}


def _score_rows(rep):
    t = rep.score_table
    names = list(dict.fromkeys(t["score"]))
    rows = []
    for arm, g in t.groupby("arm", sort=False):
        g = g.set_index("score")
        cells = []
        for n in names:
            r = g.loc[n]
            c = _ci(r["mean"], r["lo"], r["hi"], rep.scale)
            if np.isfinite(r["diff"]):
                c += f"; vs reference {_ci(r['diff'], r['diff_lo'], r['diff_hi'], rep.scale)}"
            cells.append(c)
        rows.append([arm, int(g["n"].iloc[0]), *cells])
    k = rep.last_k
    return ["arm", "seeds", *[SCORE_NAMES[n].format(k=k) + (" (used)" if n == rep.score else "") for n in names]], rows


SCORE_NOTE = ("Per-run scores side by side, mean over seeds with the report's 95% CI, and the difference to the "
              "reference arm. The statistics above use the one marked (used; --score). The max over training picks "
              "the best of many noisy evaluations of the same held-out set: it is biased upward, never a result.")


SCALING_NOTE = ("Per arm, R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) (Khatri et al. 2025, ScaleRL, arXiv 2510.13786) "
                "fitted by least squares to every evaluation of the arm's seeds, R0 fixed to the measured step-0 "
                "value; A the ceiling, B the steepness, C_mid the compute at half the gain; 95% CIs from refits on "
                "seeds resampled with replacement (t-scaled). Extrapolation check: the fit on the first half of the "
                "compute range predicts the last evaluation. A ceiling beyond the measured range is an extrapolation.")


def _scaling_rows(rep):
    s, rows = rep.scale, []

    def num(v, d=0):
        return "–" if not np.isfinite(v) else f"{v:,.{d}f}"

    for r in rep.scaling.itertuples():
        rows.append([r.arm, r.n, f"{r.r0 * s:.1f}", _ci(r.A, r.A_lo, r.A_hi, s), _ci(r.B, r.B_lo, r.B_hi, 1, 2),
                     _ci(r.c_mid, r.c_mid_lo, r.c_mid_hi, 1, 0), num(r.c90), num(r.extrap_cut),
                     f"{num(r.extrap_predicted * s, 1)} vs {num(r.extrap_measured * s, 1)}", num(r.extrap_rmse * s, 2)])
    return (["arm", "seeds", f"R0 ({rep.unit})", "A (ceiling) [95% CI]", "B (steepness) [95% CI]",
             "C_mid [95% CI]", "C for 90% of the gain", "fit on C <=", "last: predicted vs measured",
             "held-out RMSE"], rows)


NOISE_NOTE = ("Held-out pass@1 of each run's last evaluation, per problem (eval_problems.jsonl; eval.repeats pooled), "
              "in points. Two-way bootstrap: training seeds and held-out problems resampled independently (Owen 2007, "
              "the pigeonhole bootstrap; not shown below 5 seeds, where its seed part is too narrow); problems alone: "
              "the seeds held fixed. The variance of a seed's score is split (two-way ANOVA, seeds x problems) into "
              "between-seed (training randomness) and eval parts (seed x problem interaction plus the sampling of "
              "completions, which shrinks with eval.n_samples x eval.repeats). Contrasts: the same problems, paired "
              "by seed; a difference is within eval noise when completion sampling alone could produce it (|diff| < "
              "1.96 sd) or the problems-alone interval covers 0 (Hochlehnert et al. 2025, arXiv 2504.07086).")


def _pct(v) -> str:
    return "–" if not np.isfinite(v) else f"{v * 100:.0f}%"


def _sd(v) -> str:
    return "–" if not np.isfinite(v) else f"{v * 100:.2f}"


def _noise_rows(rep):
    rows = [[r.arm, r.S, r.M, r.n, _boot(r.mean, r.lo, r.hi, r.S, 100), _ci(r.mean, r.p_lo, r.p_hi, 100),
             _sd(r.sd_seed), _sd(r.sd_eval), _sd(r.sd_sampling), _pct(r.share_seed), _pct(r.share_sampling)]
            for r in rep.noise.itertuples()]
    return (["arm", "seeds", "problems", "samples per problem", "pass@1 [95% two-way bootstrap CI]",
             "[95% CI, problems alone]", "sd between seeds", "sd eval", "of which sampling",
             "Var(seed score): between-seed", "Var(seed score): sampling"], rows)


def _noise_contrast_rows(rep):
    rows = []
    for r in rep.noise_contrasts.itertuples():
        seeds = f"{int(r.S)} paired" if r.paired else "unpaired (seed means)"
        rows.append([r.arm, r.reference, seeds, r.M, _boot(r.diff, r.lo, r.hi, r.S if r.paired else 0, 100),
                     _ci(r.diff, r.p_lo, r.p_hi, 100), f"{r.better} / {r.worse} / {r.tied}",
                     "–" if not np.isfinite(r.noise_sd) else f"+-{1.96 * r.noise_sd * 100:.1f}", r.verdict])
    return (["arm", "vs", "seeds", "problems", "difference (points) [95% two-way CI]", "[95% CI, problems alone]",
             "problems better / worse / tied", "completion-sampling noise (95%)", "verdict"], rows)


def _diag_rows(rep):
    cols = [("arm", "arm", None), ("entropy_start", "entropy start", 3), ("entropy_early", "entropy @20%", 3),
            ("entropy_end", "entropy end", 3), ("kl_max", "KL max", 3), ("kl_end", "KL end", 3),
            ("dead_all_correct", "dead: all-correct", 2), ("dead_all_wrong", "dead: all-wrong", 2),
            ("truncation", "truncation", 2), ("clip_low", "clip low", 3), ("clip_high", "clip high", 3),
            ("len_start", "length start", 1), ("len_end", "length end", 1),
            ("offpolicy_kl_k3", "behav-old KL k3", 5), ("offpolicy_ess", "IS ESS share", 4),
            ("offpolicy_cap", "IS capped", 4), ("offpolicy_rejected", "IS rejected", 4),
            ("episode_turns", "turns", 2), ("tool_calls_start", "tool calls start", 2),
            ("tool_calls_end", "tool calls end", 2), ("tool_errors", "tool errors", 2),
            ("env_token_frac", "env token share", 2), ("env_errors", "env errors (max)", 2),
            ("episode_truncation", "episodes truncated", 2)]
    d = rep.diagnostics
    cols = [c for c in cols if c[0] in d]

    def cell(r, c, n):
        if n is None:
            return r[c]
        if c.startswith("kl_") and r.get("kl_on") is False:
            return "not measured"            # kl_coef 0: no reference model, the logged 0 means nothing
        return "–" if not np.isfinite(r[c]) else f"{r[c]:.{n}f}"

    rows = [[cell(r, c, n) for c, _, n in cols] for _, r in d.iterrows()]
    return [t for _, t, _ in cols], rows


def _sample_rows(rows, pre=False):
    def text(v):
        return Pre(str(v)) if pre else f"`{str(v).replace('`', chr(39))}`"

    return (["run", "step", "split", "prompt", "completion", "reward", "correct"],
            [[r["run"], r.get("step"), r.get("split"), text(r.get("prompt")), text(r.get("completion")),
              r.get("reward"), r.get("correct")] for r in rows])


PASSK_NOTE = ("pass@k in points, mean over seeds with the report's 95% CI. The base model row has one observation "
              "per distinct step-0 evaluation (runs sharing a seed, base model and task / eval settings count once).")


def _passk_rows(rep):
    return (["arm", "k", "mean (points) [95% CI]", "n"],
            [[r.arm, r.k, _ci(r.mean, r.lo, r.hi, 100, 1), r.n] for r in rep.passk.itertuples()])


def _run_rows(rep):
    rows = []
    for r in rep.runs.itertuples():
        err = (str(r.error).strip().splitlines() or [""])[-1][:120] if isinstance(r.error, str) else ""
        rows.append([r.run_id, r.arm, r.seed, r.state, f"{r.last_step}/{r.planned_steps}",
                     "–" if not np.isfinite(r.value) else f"{r.value * rep.scale:.2f}",
                     "yes" if r.included else f"no: {r.reason}", err])
    return ["run", "arm", "seed", "state", "step/planned", f"final {rep.unit}", "in statistics", "error"], rows


def _setup_parts(rep):
    """The setup section: a summary line (text) and (header, rows) tables."""
    st = rep.setup
    varied = [[name, v["keys"], ", ".join(map(str, v["levels"])), v["reference"]] for name, v in st["varied"].items()]
    seeds = st["seeds"]
    seeds = f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]})" if len(seeds) > 10 else f"seeds {seeds}"
    out = [f"{st['runs']} runs in {st['arms']} arms; {seeds}; states "
           + ", ".join(f"{k}: {v}" for k, v in st["states"].items()) + f"; {st['used_runs']} runs used in the statistics."]
    out.append((["factor", "config keys", "levels (reference first)", "reference"], varied) if varied
               else "Nothing varied except the seed (one arm).")
    out.append((["fixed setting", "value"], [[k, v] for k, v in st["key_fixed"].items()]))
    if st["budget"]:
        out.append((["budget", "value"], [[k, _count(v)] for k, v in st["budget"].items()]))
    return out


def band_lines(bands: list[dict]) -> list[str]:
    """One line per task.pass_rate_band the runs used: how many training prompts it kept."""
    out = []
    for e in bands:
        lo, hi = e["band"]
        s = e["summary"]
        head = f"task.pass_rate_band [{lo:g}, {hi:g}] ({', '.join(e['arms'])}): "
        out.append(head + (f"{s['kept']:,} of {s['total']:,} training prompts kept ({s['kept'] / s['total']:.0%}) by "
                           f"the base model's pass rate over {e['n']} samples" if s else
                           f"the pass-rate cache {e['cache']} is not on this machine (run `ablate difficulty`)"))
    return out


def _fig(rep, key: str, alt: str) -> dict | None:
    return _figure(alt, rep.figures[key]) if key in rep.figures else None


def _results(frame, note: str, tables, figure: dict | None = None, empty: str | None = None) -> list[dict]:
    """A results section: its note, its tables (`tables()`: (header, rows) pairs, built only when there are
    results) and its figure; or the `empty` line when `frame` holds nothing."""
    if frame is None or not len(frame):
        return [_para(empty)] if empty else []
    return [_para(note, "meta"), *(_table(*t) for t in tables()), *([figure] if figure else [])]


def sections(rep) -> list[dict]:
    """The report's content, once: each section of SECTIONS as {id, title, blocks}, rendered two ways (`html`,
    `markdown`)."""
    out: list[dict] = []
    p: list[dict] = []

    def sec(key):
        nonlocal p
        p = []
        out.append({"id": key, "title": dict(SECTIONS)[key], "blocks": p})

    sec("headline")
    if rep.base_lines:
        p.append(_para("Change from the base model (final minus step-0 evaluation of the same run):"))
        p.append(_bullets(rep.base_lines, "headline"))
    p.append(_bullets(rep.headline, "headline") if rep.headline else _para("No comparison: a single arm."))
    sec("setup")
    p += [_para(x) if isinstance(x, str) else _table(*x) for x in _setup_parts(rep)]
    p.append(_table([], [[k, v] for k, v in rep.setup["fixed"].items()], summary="every fixed config key"))
    p += [_para(line) for line in band_lines(rep.bands)]
    if "bands" in rep.figures:
        p.append(_figure("pass rates before and after the band", rep.figures["bands"]))
    sec("warnings")
    p.append(_bullets(rep.warnings, "warn") if rep.warnings else _para("None."))
    sec("ranking")
    p.append(_para(_ci_note(rep), "meta"))
    p.append(_table(*_ranking_rows(rep)))
    sec("effects")
    p += _results(rep.effects, _ci_note(rep), lambda: [_effect_rows(rep)], _fig(rep, "forest", "effect forest plot"),
                  "No factorial design (fewer than two levels varied).")
    sec("scores")
    p += _results(rep.score_table, SCORE_NOTE, lambda: [_score_rows(rep)])
    sec("evalnoise")
    p += _results(rep.noise, NOISE_NOTE, lambda: [_noise_rows(rep)] + ([_noise_contrast_rows(rep)] if len(
        rep.noise_contrasts) else []), None, "No per-problem counts (eval_problems.jsonl): runs written before "
                  "eval.repeats existed.")
    sec("scaling")
    p += _results(rep.scaling, f"{SCALING_NOTE} x: {rep.fit_x}.", lambda: [_scaling_rows(rep)],
                  _fig(rep, "scaling", "compute scaling fit"), "Not fitted (ablate report --fit tokens | samples | "
                  "wall | steps).")
    sec("curves")
    if "curves" in rep.figures:
        p.append(_para(rep.curves_caption, "meta"))
        p.append(_figure("training curves", rep.figures["curves"]))
    if rep.curves_notes:
        p.append(_bullets(rep.curves_notes))
    sec("passk")
    if len(rep.passk):
        p.append(_para(PASSK_NOTE, "meta"))
        p.append(_table(*_passk_rows(rep)))
    if "passk" in rep.figures:
        p.append(_figure("pass@k vs k", rep.figures["passk"]))
    elif not len(rep.passk):
        p.append(_para("No pass@k evaluations logged."))
    if rep.tasks is not None and len(rep.tasks):
        p.append(_heading("Per task (task mixture)"))
        p.append(_table(*_task_rows(rep)))
    if rep.multitask is not None and len(rep.multitask):
        p.append(_heading("Across tasks (rliable)"))
        p.append(_para(MULTITASK_NOTE, "meta"))
        p.append(_table(*_multitask_rows(rep)))
        if "profiles" in rep.figures:
            p.append(_figure("performance profiles", rep.figures["profiles"]))
    sec("diagnostics")
    p.append(_table(*_diag_rows(rep)) if len(rep.diagnostics) else _para("No per-step metrics."))
    p.append(_para("Entropy start / at 20% of steps / end; KL max and end; dead-group shares, truncation over the "
                "last quarter of training; clip fractions over the whole run; mean over the arm's runs.", "meta"))
    sec("samples")
    for arm, rows in rep.samples.items():
        p.append(_heading(arm))
        p.append(_table(*_sample_rows(rows, pre=True)))
    if not rep.samples:
        p.append(_para("No samples.jsonl found."))
    sec("runs")
    p.append(_table(*_run_rows(rep)))
    return out


def html(rep, title: str, meta: dict) -> str:
    """The report page: the blocks of each section, rendered by `templates/report.html.j2` (autoescaped)."""
    return _template().render(title=title, metric=rep.metric, unit=rep.unit, x=rep.x, paths=", ".join(meta["paths"]),
                              generated=meta["generated"], sections=sections(rep))


def _md_cell(cell) -> str:
    return f"`{cell.text.replace('`', chr(39))}`" if isinstance(cell, Pre) else cell


def _md_block(b: dict) -> list[str]:
    """One block as Markdown lines (figures are the HTML report's alone)."""
    if b["kind"] == "p":
        return [b["text"], ""]
    if b["kind"] == "ul":
        return [f"- {item}" for item in b["items"]] + [""]
    if b["kind"] == "h3":
        return [f"### {b['text']}", ""]
    if b["kind"] == "table":
        rows = [[_md_cell(c) for c in r] for r in b["rows"]]
        header = b["header"] or [""] * max((len(r) for r in rows), default=1)
        return ([f"{b['summary']}:", ""] if b["summary"] else []) + [_md_table(header, rows)]
    return []


def markdown(rep, title: str, meta: dict) -> str:
    """The same sections and blocks as the HTML page, as Markdown."""
    p = [f"# {title}", "", f"Metric: `{rep.metric}` (final value per run, {rep.unit}); runs: "
         f"{', '.join(meta['paths'])}; generated {meta['generated']}. Figures: see the HTML report.", ""]
    for section in sections(rep):
        if section["blocks"]:  # a section with nothing to say (no extra scores) is left out
            p += [f"## {section['title']}", ""] + [line for b in section["blocks"] for line in _md_block(b)]
    return "\n".join(p)


def _task_rows(rep):
    """Final held-out pass@k of each task of a mixture, per arm."""
    return (["task", "arm", "k", "mean [95% CI]", "n"],
            [[r.task, r.arm, r.k, _ci(r.mean, r.lo, r.hi, 1, 3), r.n] for r in rep.tasks.itertuples()])


MULTITASK_NOTE = ("Final held-out pass@1 of every run on every task of the mixture, in points (Agarwal et al. 2021, "
                  "rliable): mean and IQM over all run x task scores, and the optimality gap 100 - mean(min(score, "
                  "100)) (lower is better); 95% stratified-bootstrap CIs (runs resampled within each task; not shown "
                  "below 5 runs). The figure: the performance profile, the share of run x task scores above each "
                  "threshold (a curve above another everywhere dominates it).")


def _multitask_rows(rep):
    rows = [[r.arm, r.n, r.tasks, _boot(r.mean, r.mean_lo, r.mean_hi, r.n, 100),
             _boot(r.iqm, r.iqm_lo, r.iqm_hi, r.n, 100),
             _boot(r.optimality_gap, r.optimality_gap_lo, r.optimality_gap_hi, r.n, 100)]
            for r in rep.multitask.itertuples()]
    return ["arm", "runs", "tasks", "mean [95% bootstrap CI]", "IQM [95% bootstrap CI]",
            "optimality gap [95% bootstrap CI]"], rows

