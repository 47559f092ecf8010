"""The report's text: report.md rendered from the report dict, and the dict made strict JSON for report.json."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from angpt.compare.plan import Plan, format_lr, format_tokens


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


def _reach_cell(d: dict) -> str:
    st = d["status"]
    if st == "exact":
        return f"{format_tokens(d['tokens_needed'])} → {d['speedup']:.2f}x"
    if st == "extrapolated":
        return f"{format_tokens(d['tokens_needed'])} → {d['speedup']:.2f}x (extrapolated)"
    if st == "below_range":
        return f"≤ {format_tokens(d['tokens_needed'])} (below range) → ≥ {d['speedup']:.2f}x"
    return f"> {format_tokens(d['tokens_needed'])} (not reached) → < {d['speedup']:.2f}x"


def clean_json(x: Any) -> Any:
    """Non-finite floats -> None, so the file is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean_json(v) for v in x]
    return x


def render_markdown(plan: Plan, report: dict[str, Any], plots: dict[str, Path]) -> str:
    """report.md: verdicts, warnings, the tables, provenance and how to read them."""
    arms, base = report["arms"], plan.baseline
    mach, ds = report["machine"], report["dataset"]
    lines = [f"# angpt compare: {', '.join(a.label for a in plan.arms)} (baseline {base})", ""]
    lines += [
        f"- date: {mach['date']}",
        f"- command: `{report['command']}`",
        f"- angpt {mach['angpt_version']} (git {mach['git_revision'] or 'n/a'}), torch {mach['torch_version']}, "
        f"python {mach['python_version']}",
        f"- machine: {mach['hostname']} ({mach['platform']}); CPU {mach['cpu']} x{mach['cpu_cores']}; "
        f"GPU {mach['gpu'] or 'none'}; {report['jobs']} job(s) x {report['threads']} thread(s), device {plan.device}",
        f"- data: {plan.data} (tokenizer {ds.get('tokenizer')}, vocab {ds.get('vocab_size')}, "
        f"{format_tokens(ds.get('train_tokens') or 0)} train / {format_tokens(ds.get('val_tokens') or 0)} val tokens; "
        f"fingerprint {plan.data_fingerprint.get('digest')})",
        f"- model preset {plan.preset}; batch {plan.batch_tokens} tokens = {plan.batch_tokens // plan.seq_len} x "
        f"{plan.seq_len}-token sequences (micro-batch {plan.micro_batch}); "
        f"dtype {mach.get('dtype', plan.dtype)} (parameters fp32); "
        f"validation: {plan.eval_batches} batches of {plan.micro_batch} sequences",
        f"- budgets: {', '.join(format_tokens(b) for b in plan.budgets)} tokens (each a full run with its own cosine "
        f"schedule); seeds {', '.join(map(str, plan.seeds))} (same init seed and data order for every arm)",
    ]
    if plan.settings:
        lines.append(f"- settings for every arm: {', '.join(f'{k}={v}' for k, v in plan.settings.items())}")
    lines += ["", "## Verdict", ""]
    lines += [f"- {v}" for v in report["verdicts"]] or ["- (only the baseline was run)"]
    if report["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]

    head = "| arm | lr | " + " | ".join(format_tokens(b) for b in plan.budgets) + " |"
    sep = "|---|---|" + "---|" * len(plan.budgets)
    lines += ["", "## Final validation loss (nats/token, mean ± std over seeds)", "", head, sep]
    for label, e in arms.items():
        cells = []
        for r in e["budgets"]:
            c = _pm(r["val_loss_mean"], r["val_loss_std"])
            if r["diverged"]:
                c += f" ({r['diverged']} diverged)"
            cells.append(c)
        lines.append(f"| {label} | {format_lr(e['lr']) if e['lr'] else '–'} | " + " | ".join(cells) + " |")
    lines += ["", "## Validation bits per byte (mean ± std over seeds)", "", head, sep]
    for label, e in arms.items():
        cells = [_pm(r["val_bpb_mean"], r["val_bpb_std"], 4) for r in e["budgets"]]
        lines.append(f"| {label} | {format_lr(e['lr']) if e['lr'] else '–'} | " + " | ".join(cells) + " |")

    others = [lab for lab in arms if lab != base]
    if others:
        lines += [
            "",
            f"## Final loss against {base}",
            "",
            f"Relative improvement (L_{base} - L_arm) / L_{base} of the seed means (positive: the arm is better), and "
            "Welch's t-test p-value (two-sided) over seeds.",
            "",
            "| arm | " + " | ".join(format_tokens(b) for b in plan.budgets) + " |",
            "|---|" + "---|" * len(plan.budgets),
        ]
        for label in others:
            cells = []
            for r in arms[label]["budgets"]:
                rel = r.get("rel_improvement_pct")
                w = r.get("welch")
                cells.append(("–" if rel is None else f"{rel:+.2f}%") + (f", p={w['p']:.2g}" if w else ", p n/a"))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")

        lines += [
            "",
            f"## Convergence speedup over {base} (docs/protocol.md)",
            "",
            f"For each {base} budget D_i with final loss L_i, D'_i is the budget at which the arm reaches L_i "
            "(the arm's final loss interpolated linearly in log tokens); speedup_i = D_i / D'_i. Computed per seed, "
            "then averaged over i; the table gives mean ± std over seeds. Points outside the arm's budget range are "
            "bounds (≥: below range, <: not reached), never averaged in"
            + (" unless extrapolated (--extrapolate)." if plan.extrapolate else "."),
            "",
            "| arm | speedup (mean ± std over seeds) | points used | on seed-mean curves |",
            "|---|---|---|---|",
        ]
        for label in others:
            sp = arms[label].get("speedup")
            if not sp:
                lines.append(f"| {label} | – | – | – |")
                continue
            val = _pm(sp["mean"], sp["std"], 2) + "x" if sp["mean"] is not None else _bound_text(sp)
            om = sp.get("of_seed_means") or {}
            omv = f"{om['mean']:.2f}x" if om.get("mean") is not None else "–"
            used = sp["n_exact"] + (sp["n_extrapolated"] if plan.extrapolate else 0)
            lines.append(f"| {label} | {val} | {used}/{sp['n_comparisons']} | {omv} |")
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

    lines += [
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

    lines += [
        "",
        f"## Learning-rate sweeps ({format_tokens(plan.sweep_budget)} tokens, seed {plan.sweep_seed})",
        "",
        "| arm | lr | final val loss | |",
        "|---|---|---|---|",
    ]
    for label, e in arms.items():
        sw = e["sweep"]
        for row in sw["rows"]:
            mark = "best" if row["lr"] == sw["best_lr"] else ""
            loss = _fmt(row["val_loss"]) if row["val_loss"] is not None else "diverged"
            lines.append(f"| {label} | {format_lr(row['lr'])} | {loss} | {mark} |")

    if plots:
        lines += ["", "## Plots", ""] + [f"![{k}]({p.name})" for k, p in plots.items()]
    lines += [
        "",
        "## How to read this",
        "",
        "- Every arm saw the same tokens in the same order (same dataset, batch, sequence length and seeds), with "
        "parameters in fp32 and no run stopped early; each arm's peak LR comes from its own sweep.",
        "- A speedup is measured only between budgets that were trained; a loss outside that range is reported as "
        "a bound. Step times are this machine's, with these jobs running side by side.",
        "- Small models, few seeds and short budgets make this a smoke test, not evidence: differences of a few "
        "percent at small scale need not survive at the paper's scale (0.5B parameters, 10B+ tokens).",
        "- Every run's metrics: runs/<arm>/<budget>/seed<seed>/lr<lr>/metrics.jsonl; all numbers: report.json.",
        "",
    ]
    return "\n".join(lines)


def _bound_text(sp: dict) -> str:
    parts = []
    if sp.get("n_below_range"):
        parts.append(f"≥ {sp['lower_bound']:.2f}x (below range)")
    if sp.get("n_not_reached"):
        parts.append(f"< {sp['upper_bound']:.2f}x (not reached)")
    return "; ".join(parts) or "–"
