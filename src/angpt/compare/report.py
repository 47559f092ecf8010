"""Measures of a finished comparison (docs/protocol.md) and its outputs: report.md, report.json, plots."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from angpt.compare.plan import Plan, format_lr, format_tokens
from angpt.compare.runner import RunSpec, SweepResult, read_rows
from angpt.compare.stats import mean, median, speedups, std, usable, welch_ttest


# ----------------------------------------------------------------------------------------------- collect
@dataclass
class ArmRuns:
    """The main runs of one arm at its chosen LR."""

    label: str
    lr: float | None
    final: dict[int, dict[int, float]] = field(default_factory=dict)  # budget -> seed -> val loss (inf: diverged)
    bpb: dict[int, dict[int, float | None]] = field(default_factory=dict)
    step_times: list[float] = field(default_factory=list)
    curves: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # seed -> (tokens, val loss), largest


def collect(plan: Plan, report_dir: Path, sweeps: dict[str, SweepResult], records: dict[tuple, dict]) -> dict:
    """Final losses, bits per byte, step times and the largest budget's validation curves of every arm."""
    out: dict[str, ArmRuns] = {}
    for arm in plan.arms:
        lr = sweeps[arm.label].best
        runs = ArmRuns(arm.label, lr)
        out[arm.label] = runs
        if lr is None:
            continue
        for b in plan.budgets:
            runs.final[b], runs.bpb[b] = {}, {}
            for s in plan.seeds:
                rec = records.get(RunSpec(arm.label, b, s, lr).key())
                if rec is None:
                    continue
                diverged = rec["status"] != "finished" or rec.get("val_loss") is None
                runs.final[b][s] = math.inf if diverged else float(rec["val_loss"])
                runs.bpb[b][s] = None if diverged else rec.get("val_bpb")
                rows = read_rows(plan.run_dir(report_dir, arm, b, s, lr))
                # The first step of a run pays one-off costs (allocation, kernel selection): leave it out.
                runs.step_times += [r["step_time"] for r in rows if "step_time" in r and r["step"] > 1]
                if b == plan.budgets[-1]:
                    runs.curves[s] = [(int(r["tokens"]), float(r["val_loss"])) for r in rows if "val_loss" in r]
    return out


# ---------------------------------------------------------------------------------------------- analyse
def _finite(xs) -> list[float]:
    return [x for x in xs if x is not None and math.isfinite(x)]


def _speedup_block(plan: Plan, base: ArmRuns, cand: ArmRuns) -> dict[str, Any]:
    """Per seed: speedup_i for every baseline budget, their mean over i; then mean +- std over seeds."""
    ext = plan.extrapolate
    per_seed: dict[str, Any] = {}
    seed_means: list[float] = []
    statuses: list[str] = []
    bounds: dict[str, list[float]] = {"below_range": [], "not_reached": []}
    for s in plan.seeds:
        bl = [base.final.get(b, {}).get(s) for b in plan.budgets]
        cl = [cand.final.get(b, {}).get(s) for b in plan.budgets]
        if any(x is None for x in bl + cl):
            continue
        rows = speedups(plan.budgets, bl, cl, extrapolate=ext)  # type: ignore[arg-type]
        vals = [r.speedup for r in rows if usable(r, ext)]
        m = mean(vals)
        if m is not None:
            seed_means.append(m)
        for r in rows:
            statuses.append(r.reach.status)
            if r.reach.status in bounds:
                bounds[r.reach.status].append(r.speedup)
        per_seed[str(s)] = {"per_budget": [r.to_dict() for r in rows], "mean": m, "n_used": len(vals)}
    # The same measure on the seed-averaged curves (diverged runs make a mean infinite: left out).
    bm = [mean(_finite(base.final.get(b, {}).values())) for b in plan.budgets]
    cm = [mean(_finite(cand.final.get(b, {}).values())) for b in plan.budgets]
    of_means = None
    if all(x is not None for x in bm + cm):
        rows = speedups(plan.budgets, bm, cm, extrapolate=ext)  # type: ignore[arg-type]
        vals = [r.speedup for r in rows if usable(r, ext)]
        of_means = {"per_budget": [r.to_dict() for r in rows], "mean": mean(vals), "n_used": len(vals)}
    return {
        "per_seed": per_seed,
        "mean": mean(seed_means),
        "std": std(seed_means),
        "n_seeds": len(seed_means),
        "n_comparisons": len(statuses),
        "n_exact": statuses.count("exact"),
        "n_extrapolated": statuses.count("extrapolated"),
        "n_below_range": statuses.count("below_range"),
        "n_not_reached": statuses.count("not_reached"),
        # below range: speedup >= this (the smallest such bound is the safe statement); not reached: < this
        "lower_bound": min(bounds["below_range"]) if bounds["below_range"] else None,
        "upper_bound": max(bounds["not_reached"]) if bounds["not_reached"] else None,
        "extrapolate": ext,
        "of_seed_means": of_means,
    }


def analyse(plan: Plan, runs: dict[str, ArmRuns], sweeps: dict[str, SweepResult]) -> dict[str, Any]:
    """Every number of the report, per arm: losses, bpb, improvement, Welch p, speedup, step time, sweep."""
    base = runs[plan.baseline]
    base_step = median(base.step_times)
    arms: dict[str, Any] = {}
    for arm in plan.arms:
        r = runs[arm.label]
        entry: dict[str, Any] = {
            "arch": arm.arch,
            "base": arm.base,
            "model_overrides": arm.model,
            "train_overrides": arm.train,
            "lr": r.lr,
            "sweep": sweeps[arm.label].to_dict(),
            "budgets": [],
        }
        for b in plan.budgets:
            losses = [r.final.get(b, {}).get(s) for s in plan.seeds]
            losses = [x for x in losses if x is not None]
            fin = _finite(losses)
            bpbs = _finite(r.bpb.get(b, {}).values())
            row: dict[str, Any] = {
                "budget": b,
                "steps": plan.steps(b),
                "val_loss": {str(s): r.final.get(b, {}).get(s) for s in plan.seeds},
                "val_loss_mean": mean(fin),
                "val_loss_std": std(fin),
                "val_bpb_mean": mean(bpbs),
                "val_bpb_std": std(bpbs),
                "n": len(fin),
                "diverged": len(losses) - len(fin),
            }
            if arm.label != plan.baseline:
                bfin = _finite(base.final.get(b, {}).values())
                bm = mean(bfin)
                row["rel_improvement_pct"] = (bm - row["val_loss_mean"]) / bm * 100 if fin and bm else None
                w = welch_ttest(fin, bfin)
                row["welch"] = None if w is None else {"t": w.t, "df": w.df, "p": w.p}
            entry["budgets"].append(row)
        st = median(r.step_times)
        entry["step_time_median"] = st
        entry["step_time_ratio"] = st / base_step if st and base_step else None
        if arm.label != plan.baseline and r.lr is not None and base.lr is not None:
            entry["speedup"] = _speedup_block(plan, base, r)
        arms[arm.label] = entry
    return arms


# ---------------------------------------------------------------------------------------------- verdict
def _pct(x: float) -> str:
    return f"{abs(x):.1f}% {'lower' if x > 0 else 'higher'}"


def verdict(plan: Plan, label: str, entry: dict[str, Any]) -> str:
    """One plain-language line on an arm against the baseline."""
    b = plan.baseline
    if entry["lr"] is None:
        return f"{label}: every LR of its sweep diverged; no comparison possible."
    sp = entry.get("speedup")
    parts = []
    if sp is None:
        parts.append(f"{label}: no speedup (the baseline has no usable runs)")
    elif sp["mean"] is not None:
        m = sp["mean"]
        spread = f"±{sp['std']:.2f} over {sp['n_seeds']} seeds" if sp["std"] is not None else "1 seed, no spread"
        if m >= 1:
            parts.append(f"{label} reaches {b}'s loss with {m:.2f}x fewer tokens ({spread})")
        else:
            parts.append(
                f"{label} needs {1 / m:.2f}x as many tokens as {b} to reach its loss (speedup {m:.2f}x, {spread})"
            )
        n = sp["n_comparisons"]
        if sp["n_extrapolated"]:
            parts[-1] += f" [{sp['n_extrapolated']} of {n} points extrapolated]"
        left = []
        if sp["n_below_range"]:
            left.append(f"{sp['n_below_range']} below range, speedup >= {sp['lower_bound']:.2f}x")
        if sp["n_not_reached"]:
            left.append(f"{sp['n_not_reached']} not reached, speedup < {sp['upper_bound']:.2f}x")
        if left:
            parts[-1] += f" [left out of the mean, of {n} points: {'; '.join(left)}]"
    elif sp["n_not_reached"] and not sp["n_below_range"]:
        parts.append(f"{label} does not reach {b}'s loss within its budgets (speedup < {sp['upper_bound']:.2f}x)")
    elif sp["n_below_range"] and not sp["n_not_reached"]:
        parts.append(
            f"{label} is below {b}'s loss already at its smallest budget (speedup >= {sp['lower_bound']:.2f}x; "
            "add smaller budgets to measure it)"
        )
    else:
        parts.append(f"{label}: no speedup measurable within the budget range")
    last = entry["budgets"][-1]
    if last.get("rel_improvement_pct") is not None:
        w = last.get("welch")
        p = f"p={w['p']:.2g}" if w else "no p-value (needs >= 2 seeds with spread)"
        parts.append(f"at {format_tokens(last['budget'])} tokens its loss is {_pct(last['rel_improvement_pct'])}, {p}")
    if entry.get("step_time_ratio") is not None:
        parts.append(f"steps take {entry['step_time_ratio']:.2f}x the baseline's time")
    return "; ".join(parts) + "."


def warnings(plan: Plan, arms: dict[str, Any], meta: dict | None) -> list[str]:
    """Everything that weakens the comparison, said plainly."""
    out = []
    for label, e in arms.items():
        sw = e["sweep"]
        if sw["fixed"]:
            lr = format_lr(sw["best_lr"] or 0)
            out.append(f"{label}: LR {lr} was given, not tuned by a sweep (docs/protocol.md).")
        elif sw["best_at_edge"]:
            out.append(
                f"{label}: the best LR {format_lr(sw['best_lr'] or 0)} is still at an edge of its grid after "
                f"{sw['extensions']} extension(s): the sweep is not finished (raise --max-extensions)."
            )
        if sw["best_lr"] is None:
            out.append(f"{label}: every LR of its sweep diverged.")
        div = sum(r["diverged"] for r in e["budgets"])
        if div:
            out.append(f"{label}: {div} run(s) at its chosen LR diverged (counted as not reaching any loss).")
    if len(plan.seeds) < 3:
        out.append(f"only {len(plan.seeds)} seed(s): spreads and p-values are weak or missing (use >= 3).")
    if meta is not None:
        train_tokens = meta.get("splits", {}).get("train", {}).get("tokens")
        if train_tokens and plan.budgets[-1] > train_tokens:
            out.append(
                f"the largest budget is {plan.budgets[-1] / train_tokens:.1f} epochs over the training split "
                f"({format_tokens(train_tokens)} tokens): repeated data favours memorisation."
            )
    if plan.extrapolate:
        out.append("speedups outside the budget range are extrapolated log-linearly (--extrapolate).")
    return out


# ---------------------------------------------------------------------------------------------- machine
def machine_info() -> dict[str, Any]:
    """Versions, host, CPU and GPU: what a reader needs to judge step times."""
    import torch

    import angpt

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = None
    if torch.cuda.is_available():
        gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    from angpt.train.provenance import git_revision

    return {
        "angpt_version": angpt.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "git_revision": git_revision(),
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "gpu": gpu,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


# ------------------------------------------------------------------------------------------------ plots
def write_plots(plan: Plan, runs: dict[str, ArmRuns], arms: dict[str, Any], out: Path) -> dict[str, Path]:
    """The three PNGs; empty when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    files: dict[str, Path] = {}

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, r in runs.items():
        curves = [c for c in r.curves.values() if c]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        xs = [c[0] for c in curves[0][:n]]
        ys = [[c[i][1] for c in curves] for i in range(n)]
        m = [sum(v) / len(v) for v in ys]
        sd = [std(v) or 0.0 for v in ys]
        (line,) = ax.plot(xs, m, marker="o", ms=3, label=f"{label} (lr {format_lr(r.lr or 0)})")
        if len(curves) > 1:
            ax.fill_between(
                xs, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], alpha=0.2, color=line.get_color()
            )
    ax.set_xlabel("tokens")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"validation loss, {format_tokens(plan.budgets[-1])}-token runs (band: ±1 std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    files["val_loss_vs_tokens"] = out / "val_loss_vs_tokens.png"
    fig.savefig(files["val_loss_vs_tokens"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, e in arms.items():
        pts = [
            (r["budget"], r["val_loss_mean"], r["val_loss_std"] or 0.0)
            for r in e["budgets"]
            if r["val_loss_mean"] is not None
        ]
        if pts:
            ax.errorbar(
                [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=3, label=label
            )
    ax.set_xscale("log")
    ax.set_xlabel("token budget (each a full run with its own schedule)")
    ax.set_ylabel("final validation loss")
    ax.set_title("final validation loss vs budget (mean ± std over seeds)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    files["final_loss_vs_budget"] = out / "final_loss_vs_budget.png"
    fig.savefig(files["final_loss_vs_budget"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [lab for lab in arms if lab != plan.baseline]
    for i, label in enumerate(labels):
        sp = arms[label].get("speedup") or {}
        if sp.get("mean") is not None:
            ax.bar(i, sp["mean"], yerr=sp.get("std") or 0.0, capsize=5, color="C0")
            ax.text(i, sp["mean"], f"{sp['mean']:.2f}x", ha="center", va="bottom", fontsize=8)
        else:
            why = "not reached" if sp.get("n_not_reached") else ("below range" if sp.get("n_below_range") else "n/a")
            ax.text(i, 1.0, why, ha="center", va="bottom", fontsize=8, color="C3")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_xlim(-0.8, max(len(labels), 1) - 0.2)
    ax.set_ylabel(f"speedup over {plan.baseline} (x fewer tokens)")
    ax.set_title("tokens to reach the baseline's loss (mean ± std over seeds)")
    fig.tight_layout()
    files["speedup"] = out / "speedup.png"
    fig.savefig(files["speedup"], dpi=110)
    plt.close(fig)
    return files


# ------------------------------------------------------------------------------------------------ write
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
        f"{plan.seq_len}-token sequences (micro-batch {plan.micro_batch}); dtype {plan.dtype} (parameters fp32); "
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


def dataset_summary(meta: dict | None) -> dict[str, Any]:
    if meta is None:
        return {}
    splits = meta.get("splits", {})
    return {
        "tokenizer": meta.get("tokenizer", {}).get("spec"),
        "vocab_size": meta.get("vocab_size"),
        "train_tokens": splits.get("train", {}).get("tokens"),
        "val_tokens": splits.get("val", {}).get("tokens"),
        "source": meta.get("source"),
    }


def write_report(
    plan: Plan,
    report_dir: Path,
    sweeps: dict[str, SweepResult],
    records: dict[tuple, dict],
    *,
    command: str,
    jobs: int,
    threads: int,
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Analyse and write report.json, report.md and the plots. Returns (the report dict, the files written)."""
    from angpt.data import load_meta

    runs = collect(plan, report_dir, sweeps, records)
    arms = analyse(plan, runs, sweeps)
    try:
        meta = load_meta(plan.data)
    except Exception:  # the dataset may have moved since the runs; the report stands without its summary
        meta = None
    report: dict[str, Any] = {
        "command": command,
        "machine": machine_info(),
        "jobs": jobs,
        "threads": threads,
        "plan": plan.to_dict(),
        "dataset": dataset_summary(meta),
        "baseline": plan.baseline,
        "arms": arms,
        "verdicts": [verdict(plan, lab, e) for lab, e in arms.items() if lab != plan.baseline],
        "warnings": warnings(plan, arms, meta),
    }
    plots = write_plots(plan, runs, arms, report_dir)
    report["plots"] = {k: p.name for k, p in plots.items()}
    files = {"report.json": report_dir / "report.json", "report.md": report_dir / "report.md", **plots}
    (report_dir / "report.json").write_text(json.dumps(clean_json(report), indent=2))
    (report_dir / "report.md").write_text(render_markdown(plan, report, plots))
    return report, files
