"""Render a Report as self-contained HTML (inline CSS, base64 images, no scripts, no network) and as
Markdown. Section ids/titles are stable: tests and docs refer to them."""

from __future__ import annotations

import html as H

import numpy as np

SECTIONS = [("headline", "Headline"), ("setup", "Setup"), ("warnings", "Warnings"), ("ranking", "Ranking"),
            ("effects", "Factorial effects"), ("curves", "Curves"), ("passk", "pass@k"),
            ("diagnostics", "Diagnostics"), ("samples", "Samples"), ("runs", "Runs")]

CSS = """body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1180px;margin:24px auto;
padding:0 16px;color:#222;line-height:1.45}h1{font-size:1.6em;border-bottom:2px solid #444}
h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ccc}table{border-collapse:collapse;margin:8px 0;
font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}.sig{font-weight:bold}
.ns{color:#777}.warn li{color:#8a4b00}.headline li{font-size:1.08em;margin:4px 0}img{max-width:100%}
pre{background:#f6f6f6;padding:4px 6px;margin:0;white-space:pre-wrap;font-size:12px}
.meta{color:#666;font-size:12px}.bad{color:#b00020;font-weight:bold}"""


def _ci(est, lo, hi, scale=1.0, digits=1) -> str:
    if est is None or not np.isfinite(est):
        return "–"
    s = f"{est * scale:.{digits}f}"
    return s + (f" [{lo * scale:.{digits}f}, {hi * scale:.{digits}f}]" if np.isfinite(lo) else " [n/a]")


def _table(header, rows, md=False) -> str:
    if md:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in r) + " |" for r in rows]
        return "\n".join(lines) + "\n"
    head = "".join(f"<th>{H.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c if str(c).startswith('<') else H.escape(str(c))}</td>" for c in r)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _ranking_rows(rep):
    a, s = rep.arms, rep.scale
    ranked = a.assign(_m=a["mean"].fillna(-np.inf)).sort_values("_m", ascending=False)
    rows = []
    for i, r in enumerate(ranked.itertuples(), 1):
        diff = "reference" if r.reference else _ci(r.diff, r.diff_lo, r.diff_hi, s) + \
            ("" if r.paired is None else (" (paired)" if r.paired else " (unpaired)"))
        poi = "" if r.reference else _ci(r.poi, r.poi_lo, r.poi_hi, 1, 2)
        rows.append([i, r.arm, f"{r.n}/{r.runs}", _ci(r.mean, r.mean_lo, r.mean_hi, s),
                     _ci(r.iqm, r.iqm_lo, r.iqm_hi, s), diff, poi,
                     "–" if not np.isfinite(r.sd) else f"{r.sd * s:.2f}", r.excluded])
    return ["#", "arm", "seeds used/runs", f"mean {rep.unit} [95% CI]", "IQM [95% CI]",
            "difference to reference [95% CI]", "P(improvement) [95% CI]", "seed sd", "excluded runs"], rows


CI_NAMES = {"t": "Student t (Welch for unpaired arms)", "percentile": "percentile bootstrap (rliable)",
            "bca": "BCa bootstrap (scipy)"}


def _ci_note(rep) -> str:
    return (f"95% CIs over seeds. Means, differences and effects: {CI_NAMES[rep.ci_method]}, paired by seed where "
            f"arms share seeds; IQM and P(improvement): percentile bootstrap. A CI that excludes 0 at 3-5 seeds is "
            f"one draw of a 5%-level test, not a verdict.")


def _effect_rows(rep):
    rows = []
    for r in rep.effects.itertuples():
        rows.append([r.term, r.kind, _ci(r.estimate, r.lo, r.hi, rep.scale), "yes" if r.significant else "n.s.",
                     r.n, {True: "paired", False: "unpaired"}.get(r.paired, "–"), r.coverage])
    return ["term", "kind", f"effect ({rep.unit}) [95% CI]", "CI excludes 0", "seeds", "pairing", "cells used"], rows


def _diag_rows(rep):
    cols = [("arm", "arm", None), ("entropy_start", "entropy start", 3), ("entropy_early", "entropy @20%", 3),
            ("entropy_end", "entropy end", 3), ("kl_max", "KL max", 3), ("kl_end", "KL end", 3),
            ("dead_all_correct", "dead: all-correct", 2), ("dead_all_wrong", "dead: all-wrong", 2),
            ("truncation", "truncation", 2), ("clip_low", "clip low", 3), ("clip_high", "clip high", 3),
            ("len_start", "length start", 1), ("len_end", "length end", 1)]
    d = rep.diagnostics
    cols = [c for c in cols if c[0] in d]
    rows = [[r[c] if n is None else ("–" if not np.isfinite(r[c]) else f"{r[c]:.{n}f}") for c, _, n in cols]
            for _, r in d.iterrows()]
    return [t for _, t, _ in cols], rows


def _run_rows(rep):
    rows = []
    for r in rep.runs.itertuples():
        err = (str(r.error).strip().splitlines() or [""])[-1][:120] if isinstance(r.error, str) else ""
        rows.append([r.run_id, r.arm, r.seed, r.state, f"{r.last_step}/{r.planned_steps}",
                     "–" if not np.isfinite(r.value) else f"{r.value * rep.scale:.2f}",
                     "yes" if r.included else f"no: {r.reason}", err])
    return ["run", "arm", "seed", "state", "step/planned", f"final {rep.unit}", "in statistics", "error"], rows


def _setup_parts(rep, md=False):
    st = rep.setup
    varied = [[name, v["keys"], ", ".join(map(str, v["levels"])), v["reference"]] for name, v in st["varied"].items()]
    seeds = st["seeds"]
    seeds = f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]})" if len(seeds) > 10 else f"seeds {seeds}"
    out = [f"{st['runs']} runs in {st['arms']} arms; {seeds}; states "
           + ", ".join(f"{k}: {v}" for k, v in st["states"].items()) + f"; {st['used_runs']} runs used in the statistics."]
    out.append(_table(["factor", "config keys", "levels (reference first)", "reference"], varied, md) if varied
               else "Nothing varied except the seed (one arm).")
    out.append(_table(["fixed setting", "value"], [[k, v] for k, v in st["key_fixed"].items()], md))
    if st["budget"]:
        out.append(_table(["budget", "value"], [[k, f"{v:,.1f}"] for k, v in st["budget"].items()], md))
    return out


def html(rep, title: str, meta: dict) -> str:
    p = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{H.escape(title)}</title>"
         f"<style>{CSS}</style></head><body><h1>{H.escape(title)}</h1>",
         f"<p class='meta'>metric: <b>{H.escape(rep.metric)}</b> (final value per run, {H.escape(rep.unit)}); "
         f"x axis: {rep.x}; runs: {H.escape(', '.join(meta['paths']))}; generated {meta['generated']}</p>"]

    def sec(key):
        p.append(f"<h2 id='{key}'>{dict(SECTIONS)[key]}</h2>")

    sec("headline")
    p.append("<ul class='headline'>" + "".join(f"<li>{H.escape(h)}</li>" for h in rep.headline) + "</ul>"
             if rep.headline else "<p>No comparison: a single arm.</p>")
    sec("setup")
    p += [x if x.startswith("<") else f"<p>{H.escape(x)}</p>" for x in _setup_parts(rep)]
    fixed_all = "".join(f"<tr><td>{H.escape(k)}</td><td>{H.escape(str(v))}</td></tr>" for k, v in rep.setup["fixed"].items())
    p.append(f"<details><summary>every fixed config key</summary><table>{fixed_all}</table></details>")
    sec("warnings")
    p.append("<ul class='warn'>" + "".join(f"<li>{H.escape(w)}</li>" for w in rep.warnings) + "</ul>"
             if rep.warnings else "<p>None.</p>")
    sec("ranking")
    p.append(f"<p class='meta'>{H.escape(_ci_note(rep))}</p>")
    p.append(_table(*_ranking_rows(rep)))
    sec("effects")
    if rep.effects is not None and len(rep.effects):
        p.append(_table(*_effect_rows(rep)))
        if "forest" in rep.figures:
            p.append(f"<img alt='effect forest plot' src='data:image/png;base64,{rep.figures['forest']}'>")
    else:
        p.append("<p>No factorial design (fewer than two levels varied).</p>")
    sec("curves")
    if "curves" in rep.figures:
        p.append("<p class='meta'>Mean over the seeds of each arm (runs used in the statistics); shaded: 95% "
                 "bootstrap CI over seeds; per-step metrics averaged in bins.</p>")
        p.append(f"<img alt='training curves' src='data:image/png;base64,{rep.figures['curves']}'>")
    sec("passk")
    if "passk" in rep.figures:
        p.append(f"<img alt='pass@k vs k' src='data:image/png;base64,{rep.figures['passk']}'>")
    else:
        p.append("<p>No pass@k evaluations logged.</p>")
    if rep.tasks is not None and len(rep.tasks):
        p.append("<h3>Per task (task mixture)</h3>")
        p.append(_table(*_task_rows(rep)))
    sec("diagnostics")
    p.append(_table(*_diag_rows(rep)) if len(rep.diagnostics) else "<p>No per-step metrics.</p>")
    p.append("<p class='meta'>Entropy start / at 20% of steps / end; KL max and end; dead-group shares, truncation "
             "over the last quarter of training; clip fractions over the whole run; mean over the arm's runs.</p>")
    sec("samples")
    for arm, rows in rep.samples.items():
        p.append(f"<h3>{H.escape(arm)}</h3>")
        p.append(_table(["run", "step", "split", "prompt", "completion", "reward", "correct"],
                        [[r["run"], r.get("step"), r.get("split"), f"<pre>{H.escape(str(r.get('prompt')))}</pre>",
                          f"<pre>{H.escape(str(r.get('completion')))}</pre>", r.get("reward"), r.get("correct")]
                         for r in rows]))
    if not rep.samples:
        p.append("<p>No samples.jsonl found.</p>")
    sec("runs")
    p.append(_table(*_run_rows(rep)))
    p.append("</body></html>")
    return "\n".join(p)


def _task_rows(rep):
    """Final held-out pass@k of each task of a mixture, per arm."""
    return (["task", "arm", "k", "mean [95% CI]", "n"],
            [[r.task, r.arm, r.k, _ci(r.mean, r.lo, r.hi, 1, 3), r.n] for r in rep.tasks.itertuples()])


def markdown(rep, title: str, meta: dict) -> str:
    p = [f"# {title}", "", f"Metric: `{rep.metric}` (final value per run, {rep.unit}); runs: "
         f"{', '.join(meta['paths'])}; generated {meta['generated']}. Figures: see the HTML report.", ""]
    p += ["## Headline", ""] + ([f"- {h}" for h in rep.headline] or ["No comparison: a single arm."]) + [""]
    p += ["## Setup", ""] + [x + "\n" for x in _setup_parts(rep, md=True)]
    p += ["## Warnings", ""] + ([f"- {w}" for w in rep.warnings] or ["None."]) + [""]
    p += ["## Ranking", "", _ci_note(rep), "", _table(*_ranking_rows(rep), md=True)]
    p += ["## Factorial effects", ""]
    p += [_table(*_effect_rows(rep), md=True)] if rep.effects is not None and len(rep.effects) else ["No factorial design.", ""]
    if len(rep.passk):
        p += ["## pass@k", "", _table(["arm", "k", "mean [95% CI]", "n"],
                                     [[r.arm, r.k, _ci(r.mean, r.lo, r.hi, 1, 3), r.n] for r in rep.passk.itertuples()], md=True)]
    if rep.tasks is not None and len(rep.tasks):
        p += ["### Per task (task mixture)", "", _table(*_task_rows(rep), md=True)]
    if len(rep.diagnostics):
        p += ["## Diagnostics", "", _table(*_diag_rows(rep), md=True)]
    p += ["## Runs", "", _table(*_run_rows(rep), md=True)]
    return "\n".join(p)
