"""Every GPU loan adds the next piece of issue 37's plan, with the same command.

    timeout 590 bash benchmarks/gpu/run.sh OUT --loan            # on the GPU: the next pieces that fit
    python benchmarks/gpu/kit.py --plan --loan                    # here: what the next loan would run

The plan is read from what earlier loans brought back (`benchmarks/gpu-race/*/results.json`, committed after each
loan), in the issue's order:

1. speed   step times and MFU of GPT+, nGPT, anGPT and Qwen3 (the kit's env and speed steps), until every shape of
           the settings has been measured once;
2. screen  the deviation screen: each of our deviations taken back alone at the paper's batch, two seeds;
3. tune    once `race.defaults_settled` is true (the screen decided, the defaults changed where it said): each
           race arm at every rate of its grid on the tuning seed, at the race's full length, until its best rate is
           inside the grid;
4. seed    one reported seed at a time: both arms at every budget, at the rates the tuning chose (largest budget
           first, both arms of a budget in the same loan, so that a pair shares the loan's corpus).

Extra arms (nGPT) and speed shapes marked `optional` are optional pieces, planned after the required ones: they run
where a loan has room left that no required piece fits. A loan starts the first piece of the plan whose estimated
time fits before the deadline (a run cut short counts for nothing: no arm is stopped early), then plans again. The
estimate comes from earlier loans' step times at the same shape, else from the measured MFU, else from the settings'
assumption. The data (the machine's own corpus, benchmarks/gpu/corpus.py) is made once, before the first piece that
trains.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import race_report as rr  # benchmarks/gpu/race_report.py: the rates are chosen where the report chooses them
from report import peaks  # benchmarks/gpu/report.py: the measured peak MFU is read against

RESERVE_S = 20.0  # left at the end for the report


@dataclass
class Run:
    """One training run: an arm at a rate and seed, for `steps` optimizer steps."""

    arm: str
    lr: float
    seed: int
    steps: int


@dataclass
class Piece:
    """What a loan starts as one: a speed measurement, or runs that belong together (both arms of a budget)."""

    stage: str  # speed | screen | tune | seed
    key: str
    runs: list[Run] = field(default_factory=list)
    estimate_s: float = 0.0
    optional: bool = False  # an extra arm's: planned after every required piece
    shapes: list[dict] = field(default_factory=list)  # speed: the shapes still to measure


def run_key(stage: str, run: Run) -> str:
    return f"{stage} {run.arm} lr={run.lr:g} seed={run.seed} steps={run.steps}"


def done_keys(loans: list[dict]) -> set[str]:
    """Runs some loan finished (a run that diverged is a result too)."""
    out = set()
    for loan in loans:
        for piece in loan.get("pieces", []):
            for r in piece.get("runs", []):
                if r.get("status") in ("finished", "diverged"):
                    out.add(run_key(piece["stage"], Run(r["arm"], float(r["lr"]), int(r["seed"]), int(r["steps"]))))
    return out


def shape_key(s: dict) -> tuple:
    """What identifies a speed shape, in the settings and in a loan's results: (preset, batch, context, compiled)."""
    return s.get("preset"), s.get("batch"), s.get("seq_len"), bool(s.get("compile"))


def measured(shape: dict, loans: list[dict]) -> bool:
    """Whether some loan measured a speed `shape` of the settings (status done), and did so at or after its `since`
    (a UTC time, "YYYY-MM-DD HH:MM", set when a fix is to be measured again: a loan started earlier does not count)."""
    since = str(shape.get("since", ""))
    return any(
        shape_key(s) == shape_key(shape) and s.get("status") == "done" and str(loan.get("started", "")) >= since
        for loan in loans
        for s in loan.get("speed") or []
    )


# ------------------------------------------------------------------------------------------------ estimates
def step_seconds(stage: str, spec: dict, loans: list[dict]) -> tuple[float, str] | None:
    """The slowest median step time an earlier loan measured for a run of `stage` at `spec`'s shape."""
    shape = {k: spec.get(k) for k in ("preset", "model", "seq_len", "batch_tokens", "micro_batch", "compile")}
    found = []
    for loan in loans:
        s = (loan.get("settings") or {}).get("race" if stage in ("tune", "seed") else "screen") or {}
        if {k: s.get(k) for k in shape} != shape:
            continue
        for piece in loan.get("pieces", []):
            if (piece["stage"] in ("tune", "seed")) == (stage in ("tune", "seed")) and piece["stage"] != "speed":
                found += [(r["step_time"], loan["loan"]) for r in piece.get("runs", []) if r.get("step_time")]
    if not found:
        return None
    t, where = max(found)
    return t, f"measured on loan {where}"


def speed_seconds(shape: dict, cfg: dict, loans: list[dict]) -> float:
    """Seconds the kit's speed step takes at `shape` (every arm, its timings and profile). A compiled shape whose
    eager twin an earlier loan timed: that time plus the compiling, measured as compiled minus eager at another
    shape, with a quarter more for a larger graph (2026-11-27, H200: gpt2-small 35 s eager, 212 s compiled; the
    0.5B's compiled shape, planned at a share of the budget (105 s), ran past 250 s and was cut off). Else the
    earlier loans' time at the same shape (a shape measured again after a fix) and a tenth more, else a share of
    the settings' budget."""
    timed = {}
    for loan in loans:
        for s in loan.get("speed") or []:
            if s.get("status") == "done" and s.get("seconds"):
                timed[shape_key(s)] = max(timed.get(shape_key(s), 0.0), float(s["seconds"]))
    key = shape_key(shape)
    if key in timed:  # measured again after a fix: its time then, and a tenth more
        return 1.1 * timed[key]
    eager = timed.get(key[:3] + (False,))
    compiling = [c - timed[k[:3] + (False,)] for k, c in timed.items() if k[3] and k[:3] + (False,) in timed]
    if shape["compile"] and eager is not None and compiling:
        return eager + 1.25 * max(compiling)
    return float(cfg["speed"]["budget_s"]) / len(cfg["speed"]["shapes"])


def race_step_estimate(race: dict, loans: list[dict], assume: dict) -> tuple[float, str]:
    """Seconds per race step: measured at the race's shape, else its FLOPs at the lowest MFU GPT+ reached in a
    speed measurement compiled as the race is (`race.compile`; against the measured bf16 peak) times 0.7 for the
    smaller width, else the assumption."""
    got = step_seconds("tune", race, loans)
    if got:
        return got
    flops = race_flops_per_token(race)
    compiled = bool(race.get("compile", False))
    mfus = []
    for loan in loans:
        peak = peaks(loan.get("env"))[0]
        for s in loan.get("speed") or []:
            for r in s.get("rows") or []:
                if r["arch"] == "gpt+" and bool(s.get("compile")) == compiled and peak:
                    mfus.append((r["train_flops"] / peak, peak))
    if mfus:
        mfu, peak = min(mfus)
        how = "compiled" if compiled else "eager"
        return flops * race["batch_tokens"] / (0.7 * mfu * peak), f"GPT+'s measured MFU {how} {mfu:.0%} x 0.7"
    return float(assume["race_step_s"]), "assumed (settings)"


def race_flops_per_token(race: dict) -> float:
    """Training FLOPs per token of the race's largest arm (meta device: nothing allocated)."""
    import torch

    from angpt.models import build_model
    from angpt.study.arms import parse_arm

    best = 0.0
    for arm in [*race["arms"], *race.get("extra_arms", [])]:
        parsed = parse_arm(arm)
        with torch.device("meta"):
            model = build_model(parsed.arch, race["preset"], **{**race["model"], **parsed.model})
        best = max(best, model.flops_per_token(race["seq_len"]))
    return best


def data_tokens(cfg: dict, pieces: list[Piece]) -> int:
    """Training tokens the loan's corpus needs: the race's when a race piece is planned, else what the screen's
    runs read (each window once). The same image gives the same files in the same order, so a smaller cut is a
    prefix of the larger one, with the same tokenizer (BPE is fitted on the first train documents)."""
    if any(p.stage in ("tune", "seed") for p in pieces):
        return int(cfg["corpus"]["train_tokens"])
    scr, corpus = cfg.get("screen") or {}, cfg["corpus"]
    need = max(int(1.02 * scr.get("steps", 0) * scr.get("batch_tokens", 0)), int(corpus.get("min_train_tokens", 0)))
    return min(need, int(corpus["train_tokens"])) if need else int(corpus["train_tokens"])


def corpus_seconds(loans: list[dict], assume: dict, tokens: int) -> float:
    """What making `tokens` of data takes: at the slowest rate per token an earlier loan measured, else assumed."""
    rates = [
        ((loan["data"].get("corpus_s") or 0) + (loan["data"].get("prepare_s") or 0)) / loan["data"]["tokens"]["train"]
        for loan in loans
        if loan.get("data") and loan["data"].get("source") == "machine" and loan["data"]["tokens"].get("train")
    ]
    per_token = max(rates) if rates else float(assume["corpus_s_per_mtoken"]) / 1e6
    return 10.0 + per_token * tokens


# ------------------------------------------------------------------------------------------------ the plan
def plan(cfg: dict, loans: list[dict]) -> tuple[list[Piece], list[str]]:
    """The pieces still to run, in the issue's order, with their estimates; and notes on what waits and why."""
    done, notes, pieces = done_keys(loans), [], []
    assume = cfg.get("assume", {})
    if "speed" in cfg:
        todo = [s for s in cfg["speed"]["shapes"] if not measured(s, loans)]
        for s in todo:  # one piece a shape, so that the deadline is checked before each
            est = speed_seconds(s, cfg, loans)
            pieces.append(Piece("speed", "speed " + _shape_name(s), [], est, bool(s.get("optional")), shapes=[s]))
    scr = cfg.get("screen")
    if scr:
        got = step_seconds("screen", scr, loans)
        per_step = got[0] if got else float(assume["screen_step_s"])
        setup = float(assume.get("screen_setup_s", 15))  # build, probe, and the compiling of a compiled screen
        for arm, seed in scr["runs"]:
            run = Run(arm, float(scr["lr"]), int(seed), int(scr["steps"]))
            if run_key("screen", run) not in done:
                pieces.append(Piece("screen", run_key("screen", run), [run], per_step * run.steps * 1.02 + setup))
    race = cfg.get("race")
    if race and not race.get("defaults_settled"):
        notes.append(
            "the race waits for the deviation screen's decision: settle the defaults (docs/open_choices.md), then "
            "set race.defaults_settled: true in settings.yaml"
        )
    elif race:
        per_step, _ = race_step_estimate(race, loans, assume)
        setup = float(assume.get("race_setup_s", 30))
        eval_share = 1 + race.get("eval_overhead", 0.05)

        def cost(steps: int) -> float:
            return steps * per_step * eval_share + setup

        rates = rr.select_rates(race, rr.runs(loans, "tune"))
        extra = race.get("extra_arms", [])
        for arms, optional in ((race["arms"], False), (extra, True)):
            todo = {a: list(rates[a]["todo"]) for a in arms}
            # interleaved: every arm's first missing rate, then every arm's second, ...
            for i in range(max((len(v) for v in todo.values()), default=0)):
                for a in arms:
                    if i < len(todo[a]):
                        run = Run(a, float(todo[a][i]), int(race["tuning_seed"]), int(race["steps"]))
                        pieces.append(Piece("tune", run_key("tune", run), [run], cost(run.steps), optional))
        primary_tuned = all(rates[a]["finished"] for a in race["arms"])
        if not primary_tuned:
            notes.append(
                "the reported seeds wait for the tuning: "
                + "; ".join(
                    f"{a}: {', '.join(f'{x:g}' for x in rates[a]['todo']) or 'no finite loss'}"
                    for a in race["arms"]
                    if not rates[a]["finished"]
                )
            )
        # the most a loan holds for race runs: a pair that does not fit it runs one arm per loan (the report names
        # pairs whose runs read different corpora, which happens only if the image changed in between)
        room = cfg["deadline_s"] - RESERVE_S - corpus_seconds(loans, assume, int(cfg["corpus"]["train_tokens"]))
        for seed in race["seeds"]:
            for steps in reversed(rr.budgets(race)):
                for arms, optional in ((race["arms"], False), ([a for a in extra if rates[a]["finished"]], True)):
                    if not primary_tuned or not arms:
                        continue
                    runs = [Run(a, float(rates[a]["lr"]), int(seed), steps) for a in arms]
                    runs = [r for r in runs if run_key("seed", r) not in done]
                    together = not optional and sum(cost(r.steps) for r in runs) <= room
                    for group in [runs] if together else [[r] for r in runs]:
                        if group:
                            key = f"seed {seed} steps={steps} " + ", ".join(f"{r.arm}@{r.lr:g}" for r in group)
                            pieces.append(Piece("seed", key, group, sum(cost(r.steps) for r in group), optional))
    return sorted(pieces, key=lambda p: p.optional), notes  # optional pieces after every required one, else in order


SHAPES = [(384, 8, 6), (384, 12, 6), (512, 8, 8), (512, 12, 8), (640, 10, 10), (768, 12, 12)]  # d, layers, heads


def shape_table(cfg: dict, loans: list[dict]) -> list[str]:
    """Issue 37's choice of the race's shape: for each candidate (d >= 384, >= 8 layers), the steps that give 10
    tokens per non-embedding parameter (at least 1,000) at the race's batch, and whether one loan holds one seed
    (both arms at every budget, after the corpus). Step times scale from the race's estimate by FLOPs per token."""
    import torch

    from angpt.models import build_model
    from angpt.study.arms import parse_arm

    race, assume = cfg["race"], cfg.get("assume", {})
    per_step, source = race_step_estimate(race, loans, assume)
    base = race_flops_per_token(race)
    lines = [
        f"Race shapes ({race['batch_tokens']:,} tokens per step; step time {per_step:.3f} s at the settings' shape, "
        f"{source}, scaled by FLOPs):",
        "",
        "| d x layers | non-embedding params | steps for 10 tok/param | one seed, s | + corpus, s | fits one loan |",
        "|---|---|---|---|---|---|",
    ]
    for d, layers, heads in SHAPES:
        shape = {**race, "model": {**race["model"], "d_model": d, "n_layers": layers, "n_heads": heads}}
        params = 0
        for arm in race["arms"]:
            parsed = parse_arm(arm)
            with torch.device("meta"):
                model = build_model(parsed.arch, race["preset"], **{**shape["model"], **parsed.model}, vocab_size=8192)
            params = max(params, model.num_params(embeddings=False))
        steps = max(1000, math.ceil(10 * params / race["batch_tokens"]))
        t = per_step * race_flops_per_token(shape) / base
        budgets = rr.budgets({**race, "steps": steps})
        seed = len(race["arms"]) * sum(
            b * t * (1 + race.get("eval_overhead", 0.05)) + float(assume.get("race_setup_s", 30)) for b in budgets
        )
        corpus = corpus_seconds(loans, assume, steps * race["batch_tokens"])
        fits = seed + corpus <= cfg["deadline_s"] - RESERVE_S
        row = f"| {d} x {layers} | {params / 1e6:.1f}M | {steps:,} | {seed:.0f} | {seed + corpus:.0f} |"
        lines.append(f"{row} {'yes' if fits else 'no'} |")
    return lines


def _shape_name(s: dict) -> str:
    return f"{s['preset']} {s['batch']}x{s['seq_len']}{' compiled' if s['compile'] else ''}"


def describe(cfg: dict, loans: list[dict]) -> str:
    """What the next loan would run, piece by piece, in a deadline of cfg['deadline_s'] after the environment step
    (`assume.env_s`) (`kit.py --plan --loan`)."""
    pieces, notes = plan(cfg, loans)
    tokens = data_tokens(cfg, pieces)
    corpus = corpus_seconds(loans, cfg.get("assume", {}), tokens)
    env = float(cfg.get("assume", {}).get("env_s", 0))  # the environment step, before the first piece
    left, made = cfg["deadline_s"] - RESERVE_S - env, False
    lines = [f"# GPU kit plan: the next loan ({cfg['deadline_s']} s; {len(loans)} earlier loan(s) read)", ""]
    for p in pieces:
        need = p.estimate_s + (corpus if p.stage != "speed" and not made else 0.0)
        fits = need <= left
        if fits:
            left -= need
            made = made or p.stage != "speed"
        lines.append(
            f"- [{'run' if fits else 'wait'}] {p.key}: ~{p.estimate_s:.0f} s{' (optional)' if p.optional else ''}"
        )
    if not pieces:
        lines.append("- nothing left in the plan")
    lines += ["", *(f"note: {n}" for n in notes)]
    if made:
        lines.append(f"the data: {tokens:,} training tokens, ~{corpus:.0f} s before the first training piece")
    if cfg.get("race"):
        lines += ["", *shape_table(cfg, loans)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ a loan
def run_loan(
    cfg: dict,
    loans: list[dict],
    res,  # kit.Results
    deadline: float,
    *,
    make_data: Callable[[int], dict],
    speed: Callable[[list[dict]], None],
    screen_run: Callable[[dict, Run, float], dict],
    race_run: Callable[[dict, Run], dict],
    max_pieces: int | None = None,
) -> None:
    """Run the plan's pieces that fit before `deadline`, recording each in `res` ("pieces") as it goes. The plan
    is made again after every piece, with this loan's runs counted: a tuning run that moves an arm's best rate
    to an edge of its grid brings the next rate into this same loan."""
    record: list[dict] = []
    this = {"loan": "(this loan)", "settings": cfg, "pieces": record}
    pieces, notes = plan(cfg, loans)
    res.set("plan", {"pieces": [p.key for p in pieces], "notes": notes})
    tokens = data_tokens(cfg, pieces)
    corpus = corpus_seconds(loans, cfg.get("assume", {}), tokens)
    data: dict | None = None
    attempted: set[str] = set()
    while max_pieces is None or len(attempted) < max_pieces:
        chosen = None
        for p in plan(cfg, [*loans, this])[0]:  # the first piece in the plan's order that fits
            need = p.estimate_s + (corpus if data is None and p.stage != "speed" else 0.0)
            if p.key not in attempted and need <= deadline - RESERVE_S - time.time():
                chosen = p
                break
        if chosen is None:
            break
        attempted.add(chosen.key)
        entry: dict[str, Any] = {"stage": chosen.stage, "key": chosen.key, "status": "running"}
        entry["estimate_s"] = round(chosen.estimate_s)
        record.append(entry)
        res.set("pieces", record)
        t0 = time.time()
        try:
            if chosen.stage == "speed":
                speed(chosen.shapes)
            else:
                if data is None:
                    data = make_data(tokens)
                    res.set("data", data)
                    this["data"] = data
                entry["runs"] = []
                for run in chosen.runs:
                    entry["runs"].append({**asdict(run), "status": "running"})
                    res.set("pieces", record)
                    got = screen_run(data, run, deadline) if chosen.stage == "screen" else race_run(data, run)
                    entry["runs"][-1] = {**asdict(run), **got}
                    res.set("pieces", record)
            entry["status"] = "done"
        except Exception as e:  # noqa: BLE001 - a failed piece is recorded; the loan goes on with the next
            entry["status"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
            entry["traceback"] = traceback.format_exc(limit=4)[-1500:]
        entry["seconds"] = round(time.time() - t0, 1)
        res.set("pieces", record)
    left = deadline - RESERVE_S - time.time()
    waiting = [p for p in plan(cfg, [*loans, this])[0] if p.key not in attempted]
    res.set("waiting", [f"{p.key} (~{p.estimate_s:.0f} s; {left:.0f} s were left)" for p in waiting])


def race_train(race: dict, cfg: dict, data: dict, run: Run, work: Path) -> dict:
    """One race run through `angpt train` (the one training step): its curve at every evaluation, final
    validation and test loss, median step time and parameter counts. A run that diverges is a result (its losses
    infinite), recorded as diverged."""
    from angpt.study.arms import parse_arm
    from angpt.train.config import load_run_config
    from angpt.train.dryrun import plan_run
    from angpt.train.loop import TrainingError, train
    from angpt.train.metrics import read_metrics

    parsed = parse_arm(run.arm)
    out_dir = work / "race" / f"{parsed.slug}-lr{run.lr:g}-s{run.seed}-{run.steps}"
    overrides = {
        "arch": parsed.arch,
        "preset": race["preset"],
        "data": data["dir"],
        "out": str(out_dir),
        **{f"model.{k}": v for k, v in {**race["model"], **parsed.model}.items()},
        **{f"train.{k}": v for k, v in parsed.train.items()},
        "train.lr": run.lr,
        "train.seed": run.seed,
        "train.max_steps": run.steps,
        "train.batch_tokens": race["batch_tokens"],
        "train.micro_batch": race["micro_batch"],
        "train.seq_len": race["seq_len"],
        "train.eval_every": race["eval_every"],
        "train.eval_batches": race["eval_batches"],
        "train.log_every": race.get("log_every", 10),
        "train.save_every": 0,
        "train.keep_last": 1,
        "train.keep_best": False,
        "train.dtype": cfg["dtype"],
        "train.device": cfg["device"],
        "train.compile": bool(race.get("compile", False)),
        "train.tensorboard": False,
        "train.progress": False,
    }
    rc = load_run_config(None, overrides)
    sizes = plan_run(load_run_config(None, {**overrides, "model.vocab_size": data["vocab_size"]}), gpus=1)
    t0 = time.time()
    status, error = "finished", None
    try:
        result = train(rc)
        val, test, step_time = result.val_loss, result.test_loss, result.step_time_median
        status = "finished" if result.status == "finished" else result.status
    except TrainingError as e:  # a diverged run: its metrics so far are its curve, its losses infinite
        status, error, val, test, step_time = "diverged", str(e).splitlines()[0][:300], math.inf, math.inf, None
    rows = read_metrics(out_dir)
    curve = [{k: r[k] for k in ("step", "tokens", "loss", "val_loss", "test_loss") if k in r} for r in rows]
    if step_time is None:
        times = sorted(r["step_time"] for r in rows if r.get("step_time"))
        step_time = times[len(times) // 2] if times else None
    return {
        "status": status,
        **({"error": error} if error else {}),
        "tokens": run.steps * race["batch_tokens"],
        "val_loss": val,
        "test_loss": test,
        "step_time": step_time,
        "params": sizes.params,
        "params_non_embedding": sizes.params_non_embedding,
        "seconds": round(time.time() - t0, 1),
        "curve": curve,
    }
