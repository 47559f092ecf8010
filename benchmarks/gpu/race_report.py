"""The GPU race's report over every loan so far (issue 37, item 3).

Each loan brings back one folder under `benchmarks/gpu-race/` (its `results.json`: the pieces it ran, each run's
curve at every evaluation, final validation and test loss, settings, corpus fingerprint and revision). This
module reads them all and says what they add up to:

- the rates: each arm's learning rate chosen on the tuning seed by final **validation** loss (docs/protocol.md,
  selection apart from measurement), and whether its grid is finished (a best rate at an edge is not);
- the race: for every reported seed, both arms at every budget at their chosen rates, paired by seed; at each
  budget the paired difference of final **test** losses with its 95% interval, paired p and Holm's adjustment over
  the budgets, the verdict word docs/protocol.md allows, the horizon rule, and the convergence speedup of
  docs/protocol.md#convergence-speedup with its t-interval over seeds;
- what does not pool: loans whose race settings differ are refused (one line naming the loan and the setting),
  runs at a rate no longer chosen are left out and listed, and loans on another corpus are named.

    python benchmarks/gpu/race_report.py [--root benchmarks/gpu-race]    # writes ROOT/report.md, report.json, race.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent / "gpu-race"
if str(HERE.parents[1] / "src") not in sys.path:  # run from a source tree without an install, as the kit is
    sys.path.insert(0, str(HERE.parents[1] / "src"))

from angpt.stats import detectable_difference, holm, mean_ci95, paired_ttest, speedups, std, usable  # noqa: E402
from angpt.study.comparison.analyse import ALPHA, LEVEL_MARGIN  # noqa: E402
from angpt.study.comparison.horizon import MIN_STEPS, MIN_TOKENS_PER_PARAM  # noqa: E402

# The settings that define the race: two loans that differ in any of them measure different things.
IDENTITY = (
    "arms",
    "preset",
    "model",
    "seq_len",
    "batch_tokens",
    "steps",
    "budgets",
    "tuning_seed",
    "dtype",
    "eval_batches",
)
CORPUS_IDENTITY = ("tokenizer", "val_fraction", "test_fraction", "train_tokens")
MAX_EXTENSIONS = 2  # grid points added beyond an edge, per arm, before the sweep is called unfinished for good


THIS = "(this loan)"  # the loan being run, checked against the folder's before it starts


class RaceError(Exception):
    """Loans that cannot be pooled; the message is one line."""


# ------------------------------------------------------------------------------------------------ loading
def load_loans(root: Path) -> list[dict]:
    """Every loan's results.json under `root` (one folder per loan, sorted by name), each tagged with its folder."""
    loans = []
    for path in sorted(root.glob("*/results.json")):
        d = json.loads(path.read_text())
        d["loan"] = path.parent.name
        loans.append(d)
    return loans


def race_settings(loan: dict) -> dict | None:
    """The loan's race and corpus settings, or None for a loan that ran no race piece."""
    s = loan.get("settings") or {}
    return {"race": s["race"], "corpus": s.get("corpus", {})} if "race" in s else None


def ran_race(loan: dict) -> bool:
    """Whether the loan ran a tuning or seed run (a loan of issue 37's plan may carry other race settings)."""
    return any(p["stage"] in ("tune", "seed") and p.get("runs") for p in loan.get("pieces", []))


def check_settings(loans: list[dict]) -> None:
    """RaceError unless every loan that ran a tuning or seed run shares the race's defining settings."""
    first: tuple[str, dict] | None = None
    for loan in filter(ran_race, loans):
        s = race_settings(loan)
        if s is None:
            raise RaceError(f"loan {loan['loan']} ran race runs but recorded no race settings")
        if first is None:
            first = (loan["loan"], s)
            continue
        name, ref = first
        diff = [
            f"race.{k}={s['race'].get(k)!r} (there {ref['race'].get(k)!r})"
            for k in IDENTITY
            if s["race"].get(k) != ref["race"].get(k)
        ]
        diff += [
            f"corpus.{k}={s['corpus'].get(k)!r} (there {ref['corpus'].get(k)!r})"
            for k in CORPUS_IDENTITY
            if s["corpus"].get(k) != ref["corpus"].get(k)
        ]
        if diff:
            who = "this loan" if loan["loan"] == THIS else f"loan {loan['loan']}"
            raise RaceError(
                f"{who} has other race settings than loan {name}: {'; '.join(diff)}; "
                "start a new race folder (--race-root) or take the loan out"
            )


def runs(loans: list[dict], stage: str) -> list[dict]:
    """Every finished run of `stage` ("screen", "tune", "seed"), tagged with its loan and the loan's fingerprints."""
    out = []
    for loan in loans:
        data = loan.get("data") or {}
        for piece in loan.get("pieces", []):
            if piece["stage"] != stage:
                continue
            for run in piece.get("runs", []):
                if run.get("status") in ("finished", "diverged"):
                    fp = data.get("corpus_fingerprint"), data.get("data_fingerprint")
                    out.append({**run, "loan": loan["loan"], "corpus": fp, "revision": loan.get("revision")})
    return out


def _loss(x: Any) -> float:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else math.inf


# ------------------------------------------------------------------------------------------------ rates
def select_rates(race: dict, tune_runs: list[dict]) -> dict[str, dict]:
    """Each arm's rate chosen on the tuning seed by final validation loss, over every tuning run so far.

    Per arm: `grid` {lr: val_loss} of the runs made, `lr` the best (None before any run), `todo` the grid points
    still to run (the settings' grid, then one beyond an edge that holds the best, doubling or halving, up to
    MAX_EXTENSIONS), `finished` when nothing is left and the best is inside its grid (or the extensions ran out:
    `edge` then says so)."""
    out = {}
    for arm in [*race["arms"], *race.get("extra_arms", [])]:
        grid = sorted(float(x) for x in race["grid"][arm])
        made = {
            float(r["lr"]): _loss(r.get("val_loss"))
            for r in tune_runs
            if r["arm"] == arm and r["seed"] == race["tuning_seed"] and r["steps"] == race["steps"]
        }
        todo = [lr for lr in grid if lr not in made]
        best = min(made, key=lambda lr: (made[lr], lr)) if made else None
        edge = None
        if not todo and best is not None and math.isfinite(made[best]):
            tried = sorted(made)
            extensions = len([lr for lr in tried if lr not in grid])
            if best in (tried[0], tried[-1]) and len(tried) > 1:
                edge = "low" if best == tried[0] else "high"
                if extensions < MAX_EXTENSIONS:
                    todo = [best / 2 if edge == "low" else best * 2]
        out[arm] = {
            "grid": {f"{lr:g}": made[lr] for lr in sorted(made)},
            "lr": best,
            "val_loss": made.get(best) if best is not None else None,
            "todo": todo,
            "edge": edge,
            "finished": not todo and best is not None and math.isfinite(made[best]),
        }
    return out


# ------------------------------------------------------------------------------------------------ the race
def budgets(race: dict) -> list[int]:
    """The race's budgets in optimizer steps, ascending: fractions of its largest, `steps`."""
    return sorted({max(1, round(f * race["steps"])) for f in race["budgets"]})


def verdict_word(
    n: int, test: dict | None, p_holm: float | None, *, evidence: bool = True, diverged: list[str] | None = None
) -> str:
    """The word docs/protocol.md allows for a difference (candidate - baseline) over `n` seeds: a race short of the
    horizon (`evidence` False) is a smoke test whatever its numbers; a budget where a run `diverged` says which;
    fewer than three seeds is a screen; a Holm-adjusted p < ALPHA is established (the candidate lower) or behind
    (higher); an interval inside +-LEVEL_MARGIN is level; anything else is not distinguishable."""
    if not evidence:
        return "smoke test"
    if diverged:
        return f"diverged: {', '.join(diverged)}"
    if n < 3:
        return {1: "one-seed screen", 2: "two-seed screen"}.get(n, "no seeds")
    if test is None:
        return "not distinguishable"
    lo, hi = test["ci95"]
    if p_holm is not None and p_holm < ALPHA:
        return "established" if test["mean_diff"] < 0 else "behind"
    if -LEVEL_MARGIN < lo and hi < LEVEL_MARGIN:
        return "level"
    return "not distinguishable"


def analyse(loans: list[dict]) -> dict[str, Any]:
    """The whole race so far: settings, rates, pairs, per-budget statistics, speedup, horizon, warnings."""
    check_settings(loans)
    # the race is what its runs ran; before any, the newest loan's settings
    raced = [x for x in loans if ran_race(x)] or [x for x in reversed(loans) if race_settings(x)]
    ref = race_settings(raced[0]) if raced else None
    if ref is None:
        return {"race": None, "loans": [x["loan"] for x in loans]}
    race = ref["race"]
    rates = select_rates(race, runs(loans, "tune"))
    steps = budgets(race)
    base, cands = race["arms"][0], [a for a in [*race["arms"][1:], *race.get("extra_arms", [])]]
    seeds = sorted({r["seed"] for r in runs(loans, "seed")})
    table: dict[tuple[str, int, int], dict] = {}  # (arm, seed, steps) -> the run at the arm's chosen rate
    stale, warnings = [], []
    for r in runs(loans, "seed"):
        chosen = rates.get(r["arm"], {}).get("lr")
        if chosen is None or not math.isclose(float(r["lr"]), chosen, rel_tol=1e-9):
            stale.append(r)
            continue
        key = (r["arm"], r["seed"], r["steps"])
        if key in table:
            warnings.append(
                f"{r['arm']} seed {r['seed']} at {r['steps']} steps ran twice; the later loan's run is used"
            )
        table[key] = r
    corpora = sorted({r["corpus"] for r in table.values()})
    if len(corpora) > 1:
        by = {}
        for r in table.values():
            by.setdefault(r["corpus"], set()).add(r["loan"])
        names = "; ".join(f"{(fp[0] or '?')[:12]}: {', '.join(sorted(v))}" for fp, v in sorted(by.items()))
        warnings.append(
            f"the image changed the corpus between loans ({names}): seeds from different corpora pool as they are, "
            "each pair within one loan's corpus"
        )
    arms_out: dict[str, Any] = {}
    for cand in cands:
        rows = []
        for s in steps:
            pairs = [
                (sd, table[(base, sd, s)], table[(cand, sd, s)])
                for sd in seeds
                if (base, sd, s) in table and (cand, sd, s) in table
            ]
            mixed = [sd for sd, b, c in pairs if b["corpus"] != c["corpus"]]
            if mixed:
                warnings.append(f"{cand} vs {base} at {s} steps: seeds {mixed} paired runs on different corpora")
            b_loss = [_loss(b.get("test_loss")) for _, b, _ in pairs]
            c_loss = [_loss(c.get("test_loss")) for _, _, c in pairs]
            test = paired_ttest(c_loss, b_loss) if len(pairs) >= 2 else None
            d = [c - b for b, c in zip(b_loss, c_loss)]
            # a run that diverged (or gave no finite loss) is a result, never left out of a mean: its pair is named
            failed = [
                f"{arm} seed {sd}"
                for sd, b, c in pairs
                for arm, r in ((base, b), (cand, c))
                if not math.isfinite(_loss(r.get("test_loss")))
            ]
            rows.append(
                {
                    "steps": s,
                    "tokens": s * race["batch_tokens"],
                    "diverged": failed,
                    "seeds": [sd for sd, _, _ in pairs],
                    "base_test_loss": b_loss,
                    "cand_test_loss": c_loss,
                    "mean_diff": sum(d) / len(d) if d and all(map(math.isfinite, d)) else None,
                    "test": test.to_dict() if test else None,
                    "detectable": detectable_difference(std(d) or 0.0, len(d)) if len(d) >= 2 else None,
                }
            )
        adjusted = holm([r["test"]["p"] for r in rows if r["test"]])
        it = iter(adjusted)
        evidence = horizon(race, table)["evidence"]
        for r in rows:
            r["p_holm"] = next(it) if r["test"] else None
            r["verdict"] = verdict_word(
                len(r["seeds"]), r["test"], r["p_holm"], evidence=evidence, diverged=r["diverged"]
            )
        arms_out[cand] = {"budgets": rows, "speedup": _speedup(race, base, cand, table, seeds, steps)}
    return {
        "race": race,
        "corpus": ref["corpus"],
        "rates": rates,
        "tuning_screen": tuning_screen(race, rates, runs(loans, "tune")),
        "speed": speed(loans, race),
        "baseline": base,
        "arms": arms_out,
        "seeds": seeds,
        "stale": [{k: r[k] for k in ("arm", "lr", "seed", "steps", "loan")} for r in stale],
        "warnings": warnings,
        "horizon": horizon(race, table),
        "loans": [x["loan"] for x in loans],
        "revisions": sorted({str(x.get("revision")) for x in loans}),
        "curves": {f"{k[0]}|{k[1]}|{k[2]}": v.get("curve", []) for k, v in table.items()},
    }


def tuning_screen(race: dict, rates: dict, tune_runs: list[dict]) -> dict[str, Any]:
    """The tuning seed's full runs at each arm's chosen rate: a one-seed tuned comparison (issue 45: what the first
    loan already answers). Its rates were chosen on these very runs' validation loss, so it is a screen, never a
    reported number; the test loss of the same runs is given beside it."""
    base = race["arms"][0]
    chosen = {}
    for r in tune_runs:
        lr = rates.get(r["arm"], {}).get("lr")
        if r["seed"] == race["tuning_seed"] and r["steps"] == race["steps"] and lr is not None:
            if math.isclose(float(r["lr"]), lr, rel_tol=1e-9):
                chosen[r["arm"]] = r
    out: dict[str, Any] = {"seed": race["tuning_seed"], "baseline": base, "arms": {}}
    for arm, r in chosen.items():
        out["arms"][arm] = {
            "lr": r["lr"],
            "val_loss": _loss(r.get("val_loss")),
            "test_loss": _loss(r.get("test_loss")),
            "tuning": "finished"
            if rates[arm]["finished"]
            else "to run: " + ", ".join(f"{x:g}" for x in rates[arm]["todo"]),
        }
    if base in chosen:
        for arm, row in out["arms"].items():
            if arm != base:
                row["val_diff"] = row["val_loss"] - out["arms"][base]["val_loss"]
                row["test_diff"] = row["test_loss"] - out["arms"][base]["test_loss"]
    return out


def speed(loans: list[dict], race: dict) -> dict[str, Any]:
    """Each arm's training step at the race's shape, from the race runs themselves (median over its runs, per GPU),
    its MFU against the datasheet's dense bf16 peak and the loan's measured peak, and each arm's step against the
    baseline's measured in the same loans."""
    per: dict[tuple[str, str], list[dict]] = {}
    for loan in loans:
        gpu = (loan.get("env") or {}).get("gpu") or (loan.get("versions") or {}).get("gpu") or "unknown"
        measured_peak = 1e12 * float((loan.get("env") or {}).get("bf16_matmul_tflops") or 0)
        for piece in loan.get("pieces", []):
            if piece["stage"] not in ("tune", "seed"):
                continue
            for r in piece.get("runs", []):
                if r.get("step_time") and r.get("status") in ("finished", "diverged"):
                    per.setdefault((gpu, r["arm"]), []).append({**r, "loan": loan["loan"], "peak": measured_peak})
    out: dict[str, Any] = {}
    base = race["arms"][0]
    for (gpu, arm), rs in sorted(per.items()):
        times = sorted(r["step_time"] for r in rs)
        med = times[len(times) // 2]
        flops_s = rs[0].get("flops_per_token", 0) * race["batch_tokens"] / med
        peak = max(r["peak"] for r in rs)
        row = {"runs": len(rs), "step_time": med, "train_tflops": flops_s / 1e12}
        sheet = [r.get("mfu_datasheet") for r in rs if r.get("mfu_datasheet")]
        if sheet:
            row["mfu_datasheet"] = sorted(sheet)[len(sheet) // 2]
        if peak:
            row["mfu_measured_peak"] = flops_s / peak
        if (gpu, base) in per and arm != base:
            bt = sorted(r["step_time"] for r in per[(gpu, base)])
            row["vs_baseline"] = med / bt[len(bt) // 2]
        out.setdefault(gpu, {})[arm] = row
    return out


def _speedup(race, base, cand, table, seeds, steps) -> dict[str, Any]:
    """docs/protocol.md#convergence-speedup per seed (both arms at every budget), then the mean over seeds."""
    per_seed, bounds = [], {"below_range": 0, "not_reached": 0}
    for sd in seeds:
        if not all((a, sd, s) in table for a in (base, cand) for s in steps):
            continue
        tokens = [s * race["batch_tokens"] for s in steps]
        b = [_loss(table[(base, sd, s)].get("test_loss")) for s in steps]
        c = [_loss(table[(cand, sd, s)].get("test_loss")) for s in steps]
        points = speedups(tokens, b, c)
        exact = [p.speedup for p in points if usable(p)]
        for p in points:
            if p.reach.status in bounds:
                bounds[p.reach.status] += 1
        if exact:
            per_seed.append({"seed": sd, "speedup": sum(exact) / len(exact), "points": [p.to_dict() for p in points]})
    values = [x["speedup"] for x in per_seed]
    ci = mean_ci95(values) if len(values) >= 2 else None
    return {
        "per_seed": per_seed,
        "mean": sum(values) / len(values) if values else None,
        "ci95": list(ci) if ci else None,
        "n_seeds": len(values),
        **bounds,
    }


def horizon(race: dict, table: dict) -> dict[str, Any]:
    """docs/protocol.md#horizon at the largest budget, parameters counted without the embedding table (issue 37's
    rule: >= 10 training tokens per non-embedding parameter) and with it (the rule `angpt compare` applies)."""
    params = [r.get("params_non_embedding") for r in table.values() if r.get("params_non_embedding")]
    total = [r.get("params") for r in table.values() if r.get("params")]
    tokens = race["steps"] * race["batch_tokens"]
    out: dict[str, Any] = {"steps": race["steps"], "tokens": tokens}
    if params:
        out.update(params_non_embedding=max(params), tokens_per_param=tokens / max(params))
    if total:
        out.update(params=max(total), tokens_per_param_total=tokens / max(total))
    out["evidence"] = bool(params) and race["steps"] >= MIN_STEPS and tokens / max(params) >= MIN_TOKENS_PER_PARAM
    return out


# ------------------------------------------------------------------------------------------------ rendering
def _f(x: Any, fmt: str = ".4f") -> str:
    return "-" if x is None else (format(x, fmt) if isinstance(x, int | float) and math.isfinite(x) else str(x))


def render(a: dict[str, Any]) -> str:
    """report.md."""
    if a.get("race") is None:
        return "# GPU race\n\nNo loan has run a race piece yet.\n"
    race, hz = a["race"], a["horizon"]
    m = race["model"]
    out = [
        "# The GPU race: anGPT against GPT+, seed by seed (issues 37, 45)",
        "",
        f"- loans: {', '.join(a['loans'])}; revisions: {', '.join(a['revisions'])}",
        f"- shape: `{race['preset']}` with {', '.join(f'{k}={v}' for k, v in m.items())}, context {race['seq_len']}, "
        f"{race['batch_tokens']:,} tokens per step, {race['dtype']}",
        f"- budgets: {', '.join(f'{s:,}' for s in budgets(race))} optimizer steps, each a full run with its own "
        "schedule; the same tokens in the same order for every arm of a seed",
        f"- selection: each arm's rate on tuning seed {race['tuning_seed']} by final validation loss at "
        f"{race['steps']:,} steps; reported: final test loss of seeds {', '.join(map(str, a['seeds'])) or 'none yet'}",
    ]
    if hz.get("tokens_per_param") is not None:
        out.append(
            f"- horizon: {hz['steps']:,} steps and {hz['tokens_per_param']:.1f} tokens per non-embedding parameter "
            f"({hz['params_non_embedding']:,}; {hz['tokens_per_param_total']:.1f} per parameter with the embedding "
            f"table): {'meets' if hz['evidence'] else 'short of'} the rule (>= {MIN_STEPS:,} steps, >= "
            f"{MIN_TOKENS_PER_PARAM:g} tokens per non-embedding parameter)"
            + ("" if hz["evidence"] else ": a smoke test, not evidence")
        )
    out += ["", "## Rates (tuning seed, validation loss)", "", "| arm | grid: lr -> val loss | chosen | status |"]
    out.append("|---|---|---|---|")
    for arm, r in a["rates"].items():
        grid = ", ".join(f"{lr} -> {_f(v)}" for lr, v in r["grid"].items()) or "none run"
        if r["finished"]:
            status = "finished"
            if r["edge"]:
                status += f" (best at the {r['edge']} edge after {MAX_EXTENSIONS} extensions: the sweep is not)"
        else:
            status = f"to run: {', '.join(f'{x:g}' for x in r['todo'])}" if r["todo"] else "no finite loss"
        out.append(f"| {arm} | {grid} | {_f(r['lr'], 'g')} | {status} |")
    out += _render_tuning_screen(a)
    for cand, e in a["arms"].items():
        out += [
            "",
            f"## {cand} against {a['baseline']} (final test loss; difference = {cand} - {a['baseline']})",
            "",
            "| steps | seeds | mean difference | 95% CI | paired p | Holm p | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in e["budgets"]:
            t = r["test"] or {}
            ci = f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]" if t else "-"
            out.append(
                f"| {r['steps']:,} | {len(r['seeds'])} | {_f(r['mean_diff'], '+.4f')} | {ci} | {_f(t.get('p'), '.3g')} "
                f"| {_f(r['p_holm'], '.3g')} | {r['verdict']} |"
            )
        sp = e["speedup"]
        if sp["mean"] is None:
            text = "no seed has both arms at every budget with a crossing inside the budgets yet"
        else:
            ci = f", 95% CI [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]" if sp["ci95"] else ", no interval (one seed)"
            text = f"{sp['mean']:.2f}x over {sp['n_seeds']} seed(s){ci}"
        extra = [
            f"{v} {k.replace('_', ' ')}"
            for k, v in (("below_range", sp["below_range"]), ("not_reached", sp["not_reached"]))
            if v
        ]
        out += [
            "",
            f"- convergence speedup (docs/protocol.md): {text}" + (f"; bounds: {', '.join(extra)}" if extra else ""),
        ]
        out.append(
            f"- Holm over the {sum(1 for r in e['budgets'] if r['test'])} budgets with a test; verdict words as "
            f"docs/protocol.md: level needs the interval inside +-{LEVEL_MARGIN} nats, established a Holm p < {ALPHA}, "
            "and fewer than three seeds is a screen"
        )
    out += _render_speed(a)
    if a["stale"]:
        out += ["", "Left out (run at a rate no longer chosen):"]
        out += [
            f"- {r['arm']} @ {r['lr']:g}, seed {r['seed']}, {r['steps']} steps (loan {r['loan']})" for r in a["stale"]
        ]
    if a["warnings"]:
        out += ["", "Warnings:", *[f"- {w}" for w in a["warnings"]]]
    return "\n".join(out) + "\n"


def _render_tuning_screen(a: dict[str, Any]) -> list[str]:
    ts = a.get("tuning_screen") or {}
    rows = ts.get("arms") or {}
    if not rows:
        return []
    out = [
        "",
        f"## The tuning seed at the chosen rates (seed {ts['seed']}): a one-seed screen",
        "",
        "Each arm's full run at the rate its validation loss chose, on the tuning seed: a tuned comparison of one "
        "seed, whose rates were chosen on these same runs. A screen, not a reported number. While an arm's tuning "
        "is not finished (its best rate at an edge of its grid), its row is its best rate so far: more tuning can "
        "only lower its validation loss.",
        "",
        f"| arm | lr | tuning | final val loss | - {ts['baseline']} | final test loss | - {ts['baseline']} |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, r in rows.items():
        out.append(
            f"| {arm} | {r['lr']:g} | {r.get('tuning', '-')} | {_f(r['val_loss'])} | {_f(r.get('val_diff'), '+.4f')} "
            f"| {_f(r['test_loss'])} | {_f(r.get('test_diff'), '+.4f')} |"
        )
    return out


def _render_speed(a: dict[str, Any]) -> list[str]:
    sp = a.get("speed") or {}
    if not sp:
        return []
    out = [
        "",
        "## Step time at the race's shape (the race runs themselves; medians over runs)",
        "",
        "MFU: model FLOPs (6 N + 12 L T d per token) per second over the datasheet's dense bf16 peak (989 TFLOP/s on "
        "an H100 or H200), and over the bf16 matmul peak the loan measured.",
        "",
        f"| GPU | arm | runs | s/step | vs {a['baseline']} | TFLOP/s | of datasheet | of measured peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for gpu, arms in sp.items():
        for arm, r in arms.items():
            out.append(
                f"| {gpu} | {arm} | {r['runs']} | {r['step_time']:.4f} | {_f(r.get('vs_baseline'), '.3f')} | "
                f"{r['train_tflops']:.0f} | {_pct(r.get('mfu_datasheet'))} | {_pct(r.get('mfu_measured_peak'))} |"
            )
    return out


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def plot(a: dict[str, Any], path: Path) -> bool:
    """race.png: validation loss against tokens, every seed's run of every arm at every budget (thin lines), and
    each run's final test loss (markers). False when there is nothing to draw."""
    if not a.get("curves"):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {}
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, curve in sorted(a["curves"].items()):
        arm, seed, steps = key.split("|")
        color = colors.setdefault(arm, f"C{len(colors)}")
        pts = [(r["tokens"], r["val_loss"]) for r in curve if r.get("val_loss") is not None]
        if pts:
            ax.plot(
                *zip(*pts),
                color=color,
                alpha=0.5,
                lw=1,
                label=arm if arm not in ax.get_legend_handles_labels()[1] else None,
            )
    batch = a["race"]["batch_tokens"]
    for cand, e in a["arms"].items():
        for r in e["budgets"]:
            ax.scatter(
                [r["steps"] * batch] * len(r["base_test_loss"]),
                r["base_test_loss"],
                color=colors.get(a["baseline"], "C0"),
                marker="x",
            )
            ax.scatter(
                [r["steps"] * batch] * len(r["cand_test_loss"]),
                r["cand_test_loss"],
                color=colors.get(cand, "C1"),
                marker="x",
            )
    ax.set(xlabel="training tokens", ylabel="loss (lines: validation; x: final test)", xscale="log")
    ax.set_title(f"GPU race: every seed ({len(a['seeds'])})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(ROOT), help="the folder of loan folders (default: benchmarks/gpu-race)")
    args = p.parse_args(argv)
    root = Path(args.root)
    if not root.is_dir():
        print(f"error: {root} is not a folder of loans", file=sys.stderr)
        return 2
    try:
        a = analyse(load_loans(root))
    except RaceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    (root / "report.md").write_text(render(a))
    (root / "report.json").write_text(json.dumps({k: v for k, v in a.items() if k != "curves"}, indent=1, default=str))
    drawn = plot(a, root / "race.png")
    print(f"wrote {root / 'report.md'}{' and race.png' if drawn else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
