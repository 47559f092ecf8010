"""The report's text: report.md rendered from the report dict, and the dict made strict JSON for report.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from angpt.study.arms import format_setting
from angpt.study.comparison.analyse import bounds_text, chosen_settings, reported
from angpt.study.comparison.horizon import SMOKE
from angpt.study.comparison.plots import CURVES_NOT_TEST
from angpt.study.comparison.selection import lr_source, selects
from angpt.study.plan import Plan
from angpt.units import format_lr, format_tokens

# Why a small comparison is not evidence even where its horizon is long enough (the paper's runs, Section 4).
AT_SCALE = "need not survive at the paper's scale (0.5B parameters, 10B+ tokens)"


def _fmt(x: float | None, nd: int = 4) -> str:
    if x is None:
        return "–"
    if math.isinf(x):
        return "diverged"
    return f"{x:.{nd}f}"


def _pm(m: float | None, s: float | None, nd: int = 4) -> str:
    if m is None:
        return "–"
    return f"{m:.{nd}f} ± {s:.{nd}f}" if s is not None else f"{m:.{nd}f}"


def _p(x: float) -> str:
    return f"{x:.2g}" if x >= 1e-4 else "<1e-4"


def _reach_cell(d: dict) -> str:
    st = d["status"]
    if st == "exact":
        return f"{format_tokens(d['tokens_needed'])} → {d['speedup']:.2f}x"
    if st == "extrapolated":
        return f"{format_tokens(d['tokens_needed'])} → {d['speedup']:.2f}x (extrapolated)"
    if st == "below_range":
        return f"≤ {format_tokens(d['tokens_needed'])} (below range) → ≥ {d['speedup']:.2f}x"
    return f"> {format_tokens(d['tokens_needed'])} (not reached) → < {d['speedup']:.2f}x"


def _diff_cell(row: dict[str, Any]) -> str:
    """'-0.0520 [-0.0810, -0.0230], p=0.012 (W 0.031)': the paired mean difference, its 95% CI and both p-values."""
    if not row.get("compared", True):
        return "runs missing"
    d = row.get("difference") or {}
    if d.get("mean_diff") is None:
        return "–"
    text = f"{d['mean_diff']:+.4f}"
    if d.get("note"):
        return f"{text}, {d['note']}"
    paired, welch = d.get("paired"), d.get("welch")
    if paired:
        lo, hi = paired["ci95"]
        text += f" [{lo:+.4f}, {hi:+.4f}], p={_p(paired['p'])}"
        if paired.get("p_holm") is not None:
            text += f", Holm {_p(paired['p_holm'])}"
    if welch:
        text += f" (Welch p={_p(welch['p'])})"
    return text + _left_out_mark(row)


def _left_out_mark(row: dict[str, Any]) -> str:
    """' (left out, diverged: angpt seed 2)' where a budget's difference leaves out runs that diverged."""
    return f" (left out, diverged: {', '.join(row['left_out'])})" if row.get("left_out") else ""


def render_markdown(plan: Plan, report: dict[str, Any], plots: dict[str, Path]) -> str:
    """report.md: verdicts, warnings, the tables, provenance and how to read them, section by section."""
    hz = report.get("horizon") or {}
    smoke = bool(hz.get("short"))
    swept = selects(plan)
    lines = _header(plan, report, hz, smoke)
    lines += _verdict(plan, report, hz, smoke)
    lines += _loss_tables(plan, report["arms"])
    lines += _retuned(plan, report["arms"])
    others = [label for label in report["arms"] if label != plan.baseline]
    if others:
        lines += _differences(plan, report, others)
    if others and len(plan.budgets) > 1:
        lines += _speedups(plan, report["arms"], others)
    lines += _tuning_screen(plan, report.get("tuning_screen"))
    lines += _lead(plan, report.get("lead") or {}, report.get("power") or {})
    lines += _stability(report["arms"], swept)
    lines += _step_times(report["arms"])
    if swept:  # a one-point grid is no sweep: its table would show each arm's one run as "best"
        lines += _sweep_table(plan, report["arms"])
    lines += _lr_checks(plan, report["arms"])
    if report.get("partial"):
        lines += _runs_so_far(plan, report["partial"])
    lines += _plots(plan, plots)
    lines += _how_to_read(swept, smoke)
    return "\n".join(lines)


def _header(plan: Plan, report: dict[str, Any], hz: dict[str, Any], smoke: bool) -> list[str]:
    """The title, a partial report's notice, a smoke test's line, and the provenance: date, command, versions,
    machine, data, shape, selection, budgets, horizon, settings, the jobs measured."""
    mach, ds, base = report["machine"], report["dataset"], plan.baseline
    partial = report.get("partial")
    title = f"# angpt compare: {', '.join(a.label for a in plan.arms)} (baseline {base})" + (
        f" — {SMOKE}" if smoke else ""
    )
    lines = [title + (" — PARTIAL" if partial else ""), ""]
    if partial:
        lines += [
            f"**PARTIAL report: {partial['finished']} of {partial['planned']} planned runs finished; re-run the same "
            "command to resume.** Runs not finished are listed as missing (never estimated); means, tests, verdicts "
            "and speedups cover only the budgets where every seed of both arms has finished "
            "([runs](#runs-so-far) below).",
            "",
        ]
    if smoke:  # said once, with its reasons, under a partial report's notice: no section below repeats it
        lines += [_smoke_line(hz["message"]), ""]
    elif hz.get("short_comparisons"):  # some comparisons only: the others are judged as usual
        lines += [f"**Below the horizon: {hz['message']}.**", ""]
    lines += [
        f"- date: {mach['date']}",
        f"- command: `{report['command']}`",
        f"- angpt {mach['angpt_version']} (git {mach['git_revision'] or 'n/a'}), torch {mach['torch_version']}, "
        f"python {mach['python_version']}",
        f"- machine: {mach['hostname']} ({mach['platform']}); CPU {mach['cpu']} x{mach['cpu_cores']}{_bf16(mach)}; "
        f"GPU {mach['gpu'] or 'none'}; {_jobs(report)}, device {plan.device}",
        f"- data: {plan.data} (tokenizer {ds.get('tokenizer')}, vocab {ds.get('vocab_size')}, "
        f"{format_tokens(ds.get('train_tokens') or 0)} train / {format_tokens(ds.get('val_tokens') or 0)} val tokens; "
        f"fingerprint {plan.data_fingerprint.get('digest')})",
        f"- model preset {plan.preset}; batch {plan.batch_tokens} tokens = {plan.batch_tokens // plan.seq_len} x "
        f"{plan.seq_len}-token sequences (micro-batch {plan.micro_batch}); "
        f"dtype {mach.get('dtype', plan.dtype)} (parameters fp32); "
        f"evaluation: {plan.eval_batches} batches of {plan.micro_batch} sequences",
        _selection_line(plan, ds),
        f"- budgets: {', '.join(format_tokens(b) for b in plan.budgets)} tokens (each a full run with its own cosine "
        f"schedule); seeds {', '.join(map(str, plan.seeds))} (same init seed and data order for every arm)",
    ]
    if report.get("rewritten_by"):
        lines.append(f"- rewritten from the run store by `{report['rewritten_by']}` (nothing trained)")
    if hz.get("arms"):
        per = "; ".join(f"{label} {h['tokens_per_param']:.4g} ({h['params_non_embedding']:,} parameters, "
                        f"{h['params']:,} with the embedding table)" for label, h in hz["arms"].items())  # fmt: skip
        lines.append(f"- horizon: the largest budget is {hz['steps']:,} optimizer steps; tokens per non-embedding "
                     f"parameter, each arm's own: {per}")  # fmt: skip
    elif hz:  # recorded before 2026-11-28: the largest arm's total parameters judged the whole report
        lines.append(
            f"- horizon: the largest budget is {hz['steps']:,} optimizer steps and {hz['tokens_per_param']:.3g} tokens "
            f"per parameter ({hz['params']:,} parameters of {hz['arm']}, embeddings included; "
            f"{hz['params_non_embedding']:,} without)"
        )
    if plan.settings:
        lines.append(f"- settings for every arm: {', '.join(f'{k}={v}' for k, v in plan.settings.items())}")
    jm = report.get("jobs_measurement")
    if jm:
        cands = ", ".join(f"{c['jobs']}x{c['threads']}: {c['tokens_per_s']:,.0f} tok/s" for c in jm["candidates"])
        lines.append(
            f"- --jobs auto: measured jobs x threads on {jm['arm']} ({jm['steps']} steps each): {cands}; chose "
            f"{jm['jobs']}x{jm['threads']} (one short measurement on a shared machine: noisy)"
        )
    return lines


def _verdict(plan: Plan, report: dict[str, Any], hz: dict[str, Any], smoke: bool) -> list[str]:
    """The verdict lines, then the warnings that the top did not say already."""
    base = plan.baseline
    lines = ["", "## Verdict", ""]
    lead = "the paired t-test over seeds" if plan.stat == "paired" else "Welch's t-test"
    how = f", with its 95% interval and {lead}" if len(plan.seeds) > 1 else " (one seed: no interval or test)"
    lines += [f"Each line leads with the arm's final loss minus {base}'s at the largest budget{how}.", ""]
    lines += [f"- {v}" for v in report["verdicts"]] or ["- (only the baseline was run)"]
    said = smoke or bool(hz.get("short_comparisons"))  # the top says the horizon's message
    warned = [w for w in report["warnings"] if not (said and w == hz["message"])]
    if warned:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warned]
    return lines


def _loss_tables(plan: Plan, arms: dict[str, Any]) -> list[str]:
    """The final loss and bits per byte of every arm at every budget, with their spread over seeds."""
    head = "| arm | lr | " + " | ".join(format_tokens(b) for b in plan.budgets) + " |"
    sep = "|---|---|" + "---|" * len(plan.budgets)
    n_seeds = len(plan.seeds)
    spread = "mean ± std over seeds" if n_seeds > 1 else "one seed"
    split = "test" if plan.report_split == "test" else "validation"
    lines = ["", f"## Final {split} loss (nats/token, {spread})", "", head, sep]
    for label, e in arms.items():
        cells = []
        for r in e["budgets"]:
            c = _missing(r, n_seeds) or _pm(reported(r, "loss_mean"), reported(r, "loss_std"))
            if r["diverged"]:
                c += f" ({r['diverged']} diverged)"
            cells.append(c)
        lines.append(f"| {label} | {_lr_cell(e)} | " + " | ".join(cells) + " |")
    lines += ["", f"## {split.capitalize()} bits per byte ({spread})", "", head, sep]
    for label, e in arms.items():
        cells = []
        for r in e["budgets"]:
            c = _missing(r, n_seeds) or _pm(reported(r, "bpb_mean"), reported(r, "bpb_std"), 4)
            cells.append(c + (f" ({r['diverged']} diverged)" if r["diverged"] else ""))
        lines.append(f"| {label} | {_lr_cell(e)} | " + " | ".join(cells) + " |")
    return lines


def _retuned(plan: Plan, arms: dict[str, Any]) -> list[str]:
    """The setting each re-tuned arm chose at each budget (none without one)."""
    lines: list[str] = []
    tuned = [label for label, e in arms.items() if e.get("tune")]
    if tuned:
        lines += [
            "",
            "## Re-tuned arms: the setting chosen at each budget",
            "",
            "Swept at every budget (seed "
            + str(plan.sweep_seed)
            + ") over LR x "
            + " x ".join(sorted({k for lab in tuned for k in arms[lab]["tune"]}))
            + "; the setting with the lowest final validation loss there is used for every seed of that budget.",
            "",
        ]
        lines += [f"- {label}: {chosen_settings(plan, arms[label])}" for label in tuned]
    return lines


def _differences(plan: Plan, report: dict[str, Any], others: list[str]) -> list[str]:
    """Each arm's final loss against the baseline's, and its relative improvement."""
    arms, base = report["arms"], plan.baseline
    lines = [
        "",
        f"## Final loss against {base}",
        "",
        _difference_intro(
            plan, report.get("multiple_comparisons") or {}, bool((report.get("horizon") or {}).get("short"))
        ),
        "",
        "| arm | " + " | ".join(format_tokens(b) for b in plan.budgets) + " |",
        "|---|" + "---|" * len(plan.budgets),
    ]
    for label in others:
        lines.append(f"| {label} | " + " | ".join(_diff_cell(r) for r in arms[label]["budgets"]) + " |")
    lines += [
        "",
        f"Relative improvement (L_{base} - L_arm) / L_{base} of the seed means (positive: the arm's loss is lower):",
        "",
        "| arm | " + " | ".join(format_tokens(b) for b in plan.budgets) + " |",
        "|---|" + "---|" * len(plan.budgets),
    ]
    for label in others:
        cells = []
        for r in arms[label]["budgets"]:
            rel = r.get("rel_improvement_pct")
            cell = ("–" if r.get("compared", True) else "runs missing") if rel is None else f"{rel:+.2f}%"
            cells.append(cell + _left_out_mark(r))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _speedups(plan: Plan, arms: dict[str, Any], others: list[str]) -> list[str]:
    """The convergence speedup of docs/protocol.md over the baseline: per arm, then per budget and seed."""
    base = plan.baseline
    spread = "mean ± std over seeds" if len(plan.seeds) > 1 else "one seed"
    lines = [
        "",
        f"## Convergence speedup over {base} (docs/protocol.md)",
        "",
        f"For each {base} budget D_i with final loss L_i, D'_i is the budget at which the arm reaches L_i "
        "(the arm's final loss interpolated linearly in log tokens); speedup_i = D_i / D'_i. Computed per seed, "
        f"then averaged over i ({spread}). Points outside the arm's budget range are bounds "
        "(≥: below range, <: not reached), never averaged in"
        + (" unless extrapolated (--extrapolate)" if plan.extrapolate else "")
        + ". The mean is a speedup only when no point was left out in the arm's favour (none not reached) and "
        f"the arm's loss at the largest budget is not above {base}'s; otherwise it is shown as not established.",
        "",
        "| arm | speedup | points measured | bounds (left out) | on seed-mean curves |",
        "|---|---|---|---|---|",
    ]
    for label in others:
        sp = arms[label].get("speedup")
        if not sp:
            lacking = any(not r.get("compared", True) for r in arms[label]["budgets"])
            lines.append(f"| {label} | {'– (runs missing)' if lacking else '–'} | – | – | – |")
            continue
        val = _pm(sp["mean"], sp["std"], 2) + "x" if sp["mean"] is not None else "–"
        if sp.get("ci95") and sp["mean"] is not None:
            val += f", 95% CI [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]"
        if not sp["established"]:
            val = f"not established ({sp['why_not']})" + (
                f"; measured points alone: {val}" if sp["mean"] is not None else ""
            )
        om = sp.get("of_seed_means") or {}
        omv = f"{om['mean']:.2f}x" if om.get("mean") is not None else "–"
        used = sp["n_exact"] + (sp["n_extrapolated"] if plan.extrapolate else 0)
        bounds = bounds_text(sp) or "none"
        lines.append(f"| {label} | {val} | {used}/{sp['n_comparisons']} | {bounds} | {omv} |")
    lines += ["", "Per budget and seed (tokens the arm needs → speedup):", ""]
    lines += [
        "| arm | seed | " + " | ".join(f"D={format_tokens(b)}" for b in plan.budgets) + " |",
        "|---|---|" + "---|" * len(plan.budgets),
    ]
    for label in others:
        sp = arms[label].get("speedup") or {}
        for seed, blk in sp.get("per_seed", {}).items():
            by_b = {d["budget"]: d for d in blk["per_budget"]}
            cells = [_reach_cell(by_b[b]) if b in by_b else "–" for b in plan.budgets]
            lines.append(f"| {label} | {seed} | " + " | ".join(cells) + " |")
    return lines


def _stability(arms: dict[str, Any], swept: bool) -> list[str]:
    """The largest gradient norm of each arm's runs against its median, and its loss spikes."""
    lines = [
        "",
        "## Training stability at the chosen LR" if swept else "## Training stability",
        "",
        "The largest pre-clip gradient norm of each arm's runs against that run's median (flagged above 100x), and "
        "loss spikes (a training loss above 1.5x the running mean of the losses before it).",
        "",
        "| arm | largest grad norm | x its run's median | where | loss spikes | |",
        "|---|---|---|---|---|---|",
    ]
    for label, e in arms.items():
        st = e["stability"]
        ratio = f"{st['ratio']:.1f}" if st.get("ratio") is not None else "–"
        top = f"{st['max_grad_norm']:.3g}" if st.get("max_grad_norm") is not None else "–"
        flag = "**unstable**" if st["unstable"] else ""
        lines.append(f"| {label} | {top} | {ratio} | {st.get('where', '–')} | {st['loss_spikes']} | {flag} |")
    return lines


def _step_times(arms: dict[str, Any]) -> list[str]:
    """Each arm's median step time and its ratio to the baseline's."""
    lines = [
        "",
        "## Training step time",
        "",
        "Median seconds per step over every step (but the first) of the "
        "runs above, and the ratio to the baseline. Parallel jobs share the machine, so compare only within "
        "one report.",
        "",
        "| arm | s/step | ratio |",
        "|---|---|---|",
    ]
    for label, e in arms.items():
        ratio = f"{e['step_time_ratio']:.3f}" if e["step_time_ratio"] else "–"
        lines.append(f"| {label} | {_fmt(e['step_time_median'], 4)} | {ratio} |")
    return lines


def _lr_checks(plan: Plan, arms: dict[str, Any]) -> list[str]:
    """The check of each chosen rate at the largest budget against its grid neighbours (none without one)."""
    lines: list[str] = []
    checks = {label: e["lr_check"] for label, e in arms.items() if e.get("lr_check")}
    if checks:
        first = next(iter(checks.values()))
        lines += [
            "",
            f"## LR check at {format_tokens(first['budget'])} (seed {first['seed']})",
            "",
            f"Each LR was chosen at {format_tokens(plan.sweep_budget)}. On the tuning seed at the largest budget, the "
            "chosen LR and its two grid neighbours: *confirmed* when the chosen one is the best of the three (the "
            "best LR there lies within one grid step of it), *flagged* when a neighbour is better.",
            "",
            "| arm | lr | final val loss | |",
            "|---|---|---|---|",
        ]
        for label, chk in checks.items():
            for row in chk["rows"]:
                loss = _fmt(row["val_loss"]) if row["val_loss"] is not None else "diverged / not run"
                best = "best" if row["lr"] == chk["best_lr"] else ""
                mark = chk["status"] if row["lr"] == chk["chosen_lr"] else best
                lines.append(f"| {label} | {format_lr(row['lr'])} | {loss} | {mark} |")
    return lines


def _tuning_screen(plan: Plan, screen: dict[str, Any] | None) -> list[str]:
    """The tuning seed's runs at the chosen rates: a one-seed screen, its differences, and along the run."""
    rows = (screen or {}).get("arms") or {}
    if len(rows) < 2:
        return []
    base, steps = plan.baseline, screen["steps"]
    lines = [
        "",
        f"## The tuning seed at the chosen rates (seed {screen['seed']}, {steps:,} steps): a one-seed screen",
        "",
        "Each arm's sweep run at the rate its final validation loss chose: a tuned comparison of one seed, whose rates "
        "were chosen on these very runs. A screen, never a reported number. An arm whose sweep is not finished (its "
        "best rate at an edge, a run still to come) shows its best so far, which more tuning can only lower.",
        "",
        f"| arm | lr | sweep | final val loss | - {base} | final test loss | - {base} |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        sweep = r["sweep"] + (f": {', '.join(format_lr(x) for x in r['next'])} next" if r.get("next") else "")
        val, test = _f4(r.get("val_loss_diff"), "+.4f"), _f4(r.get("test_loss_diff"), "+.4f")
        lines.append(f"| {label} | {format_lr(r['lr'])} | {sweep} | {_f4(r['val_loss'])} | {val} | "
                     f"{_f4(r['test_loss'])} | {test} |")  # fmt: skip
    lines += [""] + [f"- {r['words']}" for label, r in rows.items() if r.get("words")]
    return lines


def _lead(plan: Plan, lead: dict[str, Any], power: dict[str, Any]) -> list[str]:
    """Each arm against the baseline along the largest budget's runs, seed by seed, and what the seeds detect."""
    lines: list[str] = []
    for label, e in lead.items():
        if not e["mean"]:
            continue
        seeds = sorted(e["seeds"])
        if not lines:
            lines += [
                "",
                f"## Where the lead comes from ({format_tokens(plan.budgets[-1])} tokens, validation loss)",
                "",
            ]
        lines += [
            f"- {e['words']} (mean over {len(seeds)} seed{'s' if len(seeds) > 1 else ''})",
            "",
            f"| step | share of the run | {plan.baseline} | {label} | difference | "
            + " | ".join(f"seed {s}" for s in seeds)
            + " |",
            "|---|---|---|---|---|" + "---|" * len(seeds),
        ]
        for p in e["mean"]:
            per = [next(q["diff"] for q in e["seeds"][s] if q["step"] == p["step"]) for s in seeds]
            cells = [
                f"{p['step']:,}",
                f"{p['fraction']:.0%}",
                f"{p['base']:.4f}",
                f"{p['arm']:.4f}",
                f"{p['diff']:+.4f}",
            ]
            lines.append("| " + " | ".join(cells + [f"{d:+.4f}" for d in per]) + " |")
        lines.append("")
    if power:
        from angpt.study.comparison.lead import power_text

        lines += ["", "## What the seeds can detect", ""] + [f"- {power_text(k, v)}" for k, v in power.items()]
    return lines


def _f4(x: Any, fmt: str = ".4f") -> str:
    return "-" if x is None else format(x, fmt)


def _plots(plan: Plan, plots: dict[str, Path]) -> list[str]:
    if not plots:
        return []
    lines = ["", "## Plots", ""] + [f"![{k}]({p.name})" for k, p in plots.items()]
    if "val_loss_vs_tokens" in plots and plan.report_split == "test":
        lines += ["", f"The loss curves are validation losses during training: {CURVES_NOT_TEST}."]
    return lines


def _how_to_read(swept: bool, smoke: bool) -> list[str]:
    lines = [
        "",
        "## How to read this",
        "",
        "- Every arm saw the same tokens in the same order (same dataset, batch, sequence length and seeds), with "
        "parameters in fp32 and no run stopped early; "
        + (
            "each arm's peak LR comes from its own sweep."
            if swept
            else "each arm ran at the one peak LR named under selection above (no sweep ran)."
        ),
        "- The verdict leads with the difference in final loss at the largest budget: the paired test uses each "
        "seed's difference, which removes the noise the arms share (same init seed, same data order).",
        "- A speedup is measured only between budgets that were trained; a loss outside that range is reported as "
        "a bound. Step times are this machine's, with these jobs running side by side.",
    ]
    if not smoke:
        lines.append(
            f"- The horizon is met here, at this scale only: differences of a few percent at small scale {AT_SCALE}."
        )
    lines += [
        "- Every run's metrics: runs/<arm>/<budget>/seed<seed>/lr<lr>/metrics.jsonl; all numbers: report.json.",
        "",
    ]
    return lines


def _lr_cell(e: dict[str, Any]) -> str:
    lrs = {r["lr"] for r in e["budgets"] if r["lr"] is not None}
    if not lrs:
        return "–"
    if e.get("tune"):
        return "per budget"
    return format_lr(next(iter(lrs)))


def _smoke_line(message: str) -> str:
    """The horizon's message under the title that already says SMOKE: why, and what it means for the numbers."""
    why = message.removeprefix(f"{SMOKE}: ")
    return f"**{why[:1].upper()}{why[1:]}.** Differences of a few percent at small scale {AT_SCALE}."


def _difference_intro(plan: Plan, family: dict[str, Any], smoke: bool = False) -> str:
    """What the difference table holds; Holm's correction is named only where there are tests to correct; below the
    horizon its p-values are said to be no evidence (docs/protocol.md#horizon)."""
    head = f"Mean over seeds of the per-seed difference L_arm - L_{plan.baseline} (negative: the arm's loss is lower)"
    if family.get("n_tests") == 0:  # nothing to adjust: naming Holm over "0 tests" only confuses
        why = "one seed" if len(plan.seeds) == 1 else "each cell says why"
        return f"{head}. No interval or test: {why}."
    return (
        f"{head}, its 95% confidence interval and the paired t-test's two-sided p-value (every arm shares the seeds: "
        "init and data order), its Holm-adjusted value over "
        + family.get("family", "the report's tests")
        + ", and Welch's unequal-variance p beside it. "
        + (
            "This comparison is a smoke test (below the horizon): its p-values describe these runs only, and no "
            "difference here is evidence, however small its p."
            if smoke
            else "Read significance from the Holm value (family-wise 5%)."
        )
    )


def _sweep_table(plan: Plan, arms: dict[str, Any]) -> list[str]:
    """Every sweep run of every arm, its final validation loss and which one was chosen."""
    lines = [
        "",
        f"## Learning-rate sweeps (seed {plan.sweep_seed})",
        "",
        "| arm | tokens | lr | setting | final val loss | |",
        "|---|---|---|---|---|---|",
    ]
    for label, e in arms.items():
        for sw in e["sweeps"]:
            for row in sw["rows"]:
                mark = "best" if row["lr"] == sw["best_lr"] and row["setting"] == sw["best_setting"] else ""
                loss = _fmt(row["val_loss"]) if row["val_loss"] is not None else "diverged"
                setting = format_setting(tuple(row["setting"].items())) or "–"
                cells = [label, format_tokens(sw["budget"]), format_lr(row["lr"]), setting, loss, mark]
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def _missing(row: dict[str, Any], n_seeds: int) -> str | None:
    """'missing (1 of 3 seeds)' for an arm x budget a partial report has no mean for; None when it has every seed."""
    return f"missing ({len(row['missing'])} of {n_seeds} seeds)" if row.get("missing") else None


def _jobs(report: dict[str, Any]) -> str:
    """How the runs shared out the CPUs: --jobs x --threads here, or what each Slurm job asked for."""
    slurm = report.get("slurm")
    if slurm:  # --jobs and --threads do not reach a Slurm job
        ranks, cpus, gpus = slurm["ranks_per_run"], slurm["cpus_per_run"], slurm["gpus_per_run"]
        most = f"at most {slurm['max_jobs']} in Slurm at once" if slurm["max_jobs"] else "no limit on jobs at once"
        return (f"Slurm: each run a job of {ranks} rank(s) x {cpus // ranks} thread(s) ({cpus} CPU(s)"
                f"{f', {gpus} GPU(s)' if gpus else ''}), {most}")  # fmt: skip
    if report.get("jobs") is None:  # rewritten from a store whose runs left no earlier report
        return "jobs x threads not recorded"
    return f"{report['jobs']} job(s) x {report['threads']} thread(s)"


def _runs_so_far(plan: Plan, partial: dict[str, Any]) -> list[str]:
    """A partial report's list of every planned run: its final validation loss, or that it is missing."""
    lines = [
        "",
        "## Runs so far",
        "",
        f"{partial['finished']} of {partial['planned']} planned runs finished. Each run's final validation loss as "
        "its result.json records it; a run without one is missing (an interrupted run resumes from its last "
        "checkpoint when the command is re-run). A sweep still waiting for runs may add LRs at an edge of its grid, "
        "and decides the LR of its arm's main runs (lr –).",
        "",
        "| arm | tokens | seed | lr | setting | role | final val loss |",
        "|---|---|---|---|---|---|---|",
    ]
    failed = []
    for r in partial["runs"]:
        loss = {"missing": "missing", "diverged": "diverged", "failed": "FAILED (below)"}.get(r["status"])
        loss = loss or _fmt(r["val_loss"])
        if r["status"] == "failed":
            failed.append(r)
        lr = format_lr(r["lr"]) if r["lr"] is not None else "–"
        setting = format_setting(tuple(r["setting"].items())) or "–"
        cells = [r["arm"], format_tokens(r["budget"]), str(r["seed"]), lr, setting, r["role"], loss]
        lines.append("| " + " | ".join(cells) + " |")
    waiting = [
        f"- {label}: its sweep at {', '.join(format_tokens(b) for b in budgets)} tokens is waiting for runs"
        for label, budgets in partial.get("unsettled", {}).items()
    ]
    return lines + ([""] + waiting if waiting else []) + _failures(failed)


def _failures(rows: list[dict[str, Any]]) -> list[str]:
    """Each failed run's exit status, job and the last lines of its log (study/store.py's failed.json)."""
    lines = []
    for r in rows:
        f = r["failure"]
        job = f" (Slurm job {f['job_id']})" if f.get("job_id") else ""
        name = f"{r['arm']} {format_tokens(r['budget'])} tokens seed {r['seed']} lr {format_lr(r['lr'])}"
        status = f"Exit status {f['exit']}"
        if f.get("exit") is None:  # only a Slurm job ends so: its log says which (empty: it never started)
            status = "No exit status: cancelled before it started, or killed before its worker ended"
        lines += ["", f"### Failed: {name}", "", f"{status}{job}; the end of its log, {f['log']}:"]
        lines += ["", "```", *f["tail"], "```"]
    if rows:
        lines = ["", "## Failed runs", "", "Re-running the same command tries each again."] + lines
    return lines


def _bf16(mach: dict[str, Any]) -> str:
    """' (bf16: avx512_bf16, matmuls 0.58x fp32's)': what decides `auto` on the CPU (absent from older reports)."""
    if "cpu_bf16_instructions" not in mach:
        return ""
    speedup = mach.get("cpu_bf16_matmul_speedup")
    return f" (bf16: {', '.join(mach['cpu_bf16_instructions']) or 'no instructions'}" + (
        f", matmuls {speedup}x fp32's)" if speedup else ")"
    )


def _selection_line(plan: Plan, ds: dict[str, Any]) -> str:
    """How selection is kept apart from measurement in this report, and what its evaluation covers."""
    n = plan.eval_batches * plan.micro_batch * plan.seq_len
    split = plan.report_split
    tokens, docs = ds.get(f"{split}_tokens"), ds.get(f"{split}_documents")
    cover = f"{min(n, tokens):,} of its {tokens:,} tokens" if tokens else f"{n:,} tokens"
    cover += f" ({docs} documents)" if docs else ""
    cover += ", windows evenly spaced over the whole split" if tokens and n < tokens else ", the whole split"
    if not selects(plan):
        rates = ", ".join(
            f"{a.label} at {format_lr(plan.initial_grid(a)[0])} ({lr_source(plan, a)})" for a in plan.arms
        )
        how = f"- selection: none (one learning rate per arm and nothing else tuned; no sweep ran): {rates}"
    elif plan.tuning_seed is None:
        how = (
            f"- selection: learning rates chosen on seed {plan.sweep_seed}, by the validation loss, and that seed's "
            "sweep run is also reported (the design before 2026-11-25: selection and measurement share a seed)"
        )
    else:
        how = f"- selection: learning rates chosen on tuning seed {plan.tuning_seed} (not reported) by validation loss"
    where = "the test split" if split == "test" else "the validation split (this dataset has no test split)"
    return f"{how}; reported losses: seeds {', '.join(map(str, plan.seeds))} on {where}, {cover}"
