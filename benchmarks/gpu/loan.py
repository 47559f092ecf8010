"""Every GPU loan runs the next block of issue 45's race, with the same command.

    timeout 590 bash benchmarks/gpu/run.sh OUT --loan           # on the GPU: the next block, within 570 s
    python benchmarks/gpu/kit.py --plan --loan [--json]          # here: what the next loan would run, and after it

The plan is read from what earlier loans brought back (`benchmarks/gpu-race/*/results.json`, committed after each
loan). In order:

1. tune    GPT+ (its recipe) and anGPT (its defaults) on the tuning seed at every rate of their grids, each a full
           run at the race's whole budget; a best rate at an edge of its grid brings the next rate (doubling or
           halving). The first loan runs all six: a one-seed tuned comparison already (a screen).
2. seed    once both arms are tuned: one block per reported seed, both arms at every budget at the chosen rates
           (the largest budget first), the same tokens in the same order for both arms. A block starts only if the
           whole of it fits: a pair is never half run (one that no loan could hold is split, budget by budget).
3. screen  once `race.screen_after_seeds` seeds are complete: the deviation screen (docs/open_choices.md).
4. seed    the remaining seeds.
Optional pieces come after every required one and run only where a loan has room that no required piece fits:
the extra arms (nGPT, the paper's own block), tuned and then seeded the same way, and the speed shapes.

A loan starts the first piece of the plan that fits before its deadline, then plans again with what it has
measured (`Costs`: this loan's own step times first, then earlier loans', then the first loan's measured MFU scaled
to the race's width, then the settings' assumptions). Each arm's model is compiled once a loan (benchmarks/gpu/
race.py), so an arm's first run in a loan carries the compiling. The data is made once, before the first piece that
trains.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import race_report as rr  # benchmarks/gpu/race_report.py: the rates are chosen where the report chooses them
from race import Run  # benchmarks/gpu/race.py
from report import peaks  # benchmarks/gpu/report.py

RESERVE_S = 10.0  # left at the end for the report
RACE_STAGES = ("tune", "seed")


@dataclass
class Piece:
    """What a loan starts as one: a speed measurement, a tuning run, a seed's block, or a screen run."""

    stage: str  # speed | tune | seed | screen
    key: str
    runs: list[Run] = field(default_factory=list)
    optional: bool = False  # an extra arm's or a speed shape: planned after every required piece
    shapes: list[dict] = field(default_factory=list)  # speed: the shapes to measure

    def arms(self) -> list[str]:
        return sorted({r.arm for r in self.runs}) if self.stage in RACE_STAGES else []


def run_key(stage: str, run: Run) -> str:
    return f"{stage} {run.arm} lr={run.lr:g} seed={run.seed} steps={run.steps}"


def done_keys(loans: list[dict]) -> set[str]:
    """Runs some loan finished (a run that diverged is a result too; one cut short is not)."""
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
    """Whether some loan measured a speed `shape` of the settings (status done), at or after its `since` (UTC)."""
    since = str(shape.get("since", ""))
    return any(
        shape_key(s) == shape_key(shape) and s.get("status") == "done" and str(loan.get("started", "")) >= since
        for loan in loans
        for s in loan.get("speed") or []
    )


def _shape_name(s: dict) -> str:
    return f"{s['preset']} {s['batch']}x{s['seq_len']}{' compiled' if s['compile'] else ''}"


# ------------------------------------------------------------------------------------------------ the race's shape
def vocab_of(cfg: dict) -> int:
    """The race model's vocabulary: the corpus tokenizer's size (`bpe:N`), padded to a multiple of 64 as a run pads
    the dataset's."""
    spec = str(cfg["corpus"]["tokenizer"])
    n = int(spec.split(":")[1]) if spec.startswith("bpe:") else 50304
    return -(-n // 64) * 64


def race_model(cfg: dict, arm: str):
    """`arm`'s race model on the meta device (nothing allocated), at the race's vocabulary."""
    import torch

    from angpt.models import build_model
    from angpt.study.arms import parse_arm

    race = cfg["race"]
    parsed = parse_arm(arm)
    with torch.device("meta"):
        return build_model(
            parsed.arch,
            race["preset"],
            **{**race["model"], **parsed.model},
            vocab_size=vocab_of(cfg),
            context_length=race["seq_len"],
        )


def race_shape(cfg: dict) -> dict[str, Any]:
    """The race's shape, as `--plan --json` and the README state it."""
    race = cfg["race"]
    models = {a: race_model(cfg, a) for a in race["arms"]}
    params = max(m.num_params(embeddings=False) for m in models.values())
    tokens = race["steps"] * race["batch_tokens"]
    return {
        "d_model": race["model"]["d_model"],
        "n_layers": race["model"]["n_layers"],
        "n_heads": race["model"]["n_heads"],
        "d_ff": race["model"].get("d_ff") or 4 * race["model"]["d_model"],
        "context": race["seq_len"],
        "vocab": vocab_of(cfg),
        "batch_tokens": race["batch_tokens"],
        "steps": race["steps"],
        "budgets_steps": rr.budgets(race),
        "tokens": tokens,
        "params_non_embedding": params,
        "tokens_per_param": round(tokens / params, 2),
        "flops_per_token": {a: m.flops_per_token(race["seq_len"]) for a, m in models.items()},
    }


# ------------------------------------------------------------------------------------------------ costs
class Costs:
    """Seconds the loan's pieces take, each from the best source there is (`sources` says which):

    - a race step: this loan's and earlier loans' measured step times of the arm at the race's shape (the slowest);
      else GPT+'s compiled MFU measured at `gpt2-small` (a speed shape of an earlier loan) times
      `assume.width_factor` for the smaller width, at the race's FLOPs per token (its own vocabulary), times the
      arm's step ratio to GPT+ measured there; else `assume.race_step_s`;
    - an arm's compiling: the largest extra time of an arm's first window in a loan, else `assume.compile_s`;
    - the data: the slowest rate per token an earlier loan made it at, else `assume.data_fixed_s` plus
      `assume.data_s_per_mtoken` per million tokens;
    - a run: its steps, its evaluations (a batch forward ~`assume.eval_batch_steps` of a step) and
      `assume.run_setup_s` (fresh weights, optimizer, loader).
    """

    def __init__(self, cfg: dict, loans: list[dict]) -> None:
        self.cfg, self.loans = cfg, loans
        self.assume = cfg.get("assume", {})
        self.race = cfg.get("race") or {}
        self.sources: dict[str, str] = {}
        self._flops: dict[str, float] = {}

    def _race_runs(self) -> list[dict]:
        """Race runs with a step time, from loans with this race's settings."""
        out = []
        for loan in self.loans:
            s = (loan.get("settings") or {}).get("race") or {}
            if any(s.get(k) != self.race.get(k) for k in rr.IDENTITY):
                continue
            for piece in loan.get("pieces", []):
                if piece["stage"] in RACE_STAGES:
                    out += [{**r, "loan": loan.get("loan")} for r in piece.get("runs", []) if r.get("step_time")]
        return out

    def flops(self, arm: str) -> float:
        if arm not in self._flops:
            self._flops[arm] = race_model(self.cfg, arm).flops_per_token(self.race["seq_len"])
        return self._flops[arm]

    def step(self, arm: str) -> tuple[float, str]:
        runs = self._race_runs()
        mine = [r["step_time"] for r in runs if r["arm"] == arm]
        if mine:
            return max(mine), "measured at the race's shape"
        if runs:  # another arm measured here: its time, scaled by FLOPs, and 6% more (nGPT's measured excess)
            r = max(runs, key=lambda r: r["step_time"])
            return 1.06 * r["step_time"] * self.flops(arm) / self.flops(r["arm"]), f"{r['arm']}'s measured, x 1.06"
        best = None
        for loan in self.loans:
            for shape in loan.get("speed") or []:
                if not (shape.get("compile") and shape.get("preset") == "gpt2-small" and shape.get("rows")):
                    continue
                rows = {r["arch"]: r for r in shape["rows"]}
                if "gpt+" in rows:
                    flops_s = rows["gpt+"]["train_flops"]
                    ratio = rows[arm.split("[")[0]]["train_ratio"] if arm.split("[")[0] in rows else 1.06
                    if best is None or flops_s < best[0]:
                        best = (flops_s, ratio, peaks(loan.get("env"))[1], loan.get("loan"))
        if best is not None:
            flops_s, ratio, sheet, where = best
            factor = float(self.assume.get("width_factor", 0.7))
            per_step = ratio * self.flops(arm) * self.race["batch_tokens"] / (factor * flops_s)
            of = f" ({flops_s / sheet:.0%} of the datasheet's peak)" if sheet else ""
            return (
                per_step,
                f"GPT+'s compiled {flops_s / 1e12:.0f} TFLOP/s at gpt2-small{of} x {factor:g}, x {ratio:.3f} for {arm}",
            )
        return float(self.assume.get("race_step_s", 0.1)), "assumed (settings)"

    def compile(self, arm: str) -> float:
        got = [
            r["first_window_extra_s"]
            for r in self._race_runs()
            if r["arm"] == arm and not r.get("model_reused") and r.get("first_window_extra_s") is not None
        ]
        return max(got) if got else float(self.assume.get("compile_s", 45))

    def run(self, run: Run) -> float:
        per_step, _ = self.step(run.arm)
        race = self.race
        evals = (run.steps - 1) // race["eval_every"] + 2 if race.get("eval_every") else 2
        batch = race["micro_batch"] * race["seq_len"] / race["batch_tokens"]  # an eval batch against a step's tokens
        eval_s = evals * race["eval_batches"] * batch * float(self.assume.get("eval_batch_steps", 0.7)) * per_step
        return run.steps * per_step + eval_s + float(self.assume.get("run_setup_s", 3))

    def data(self, tokens: int) -> float:
        rates = [
            float(loan["data"]["seconds"]) / loan["data"]["tokens"]["train"]
            for loan in self.loans
            if (loan.get("data") or {}).get("seconds") and loan["data"]["tokens"].get("train")
        ]
        if rates:
            return max(rates) * tokens
        return (
            float(self.assume.get("data_fixed_s", 15)) + float(self.assume.get("data_s_per_mtoken", 0.3)) * tokens / 1e6
        )

    def env(self) -> float:
        return float(self.assume.get("env_s", 8))

    def screen(self, run: Run) -> float:
        per_step = [
            r["step_time"]
            for loan in self.loans
            for p in loan.get("pieces", [])
            if p["stage"] == "screen"
            for r in p.get("runs", [])
            if r.get("step_time")
        ]
        step = max(per_step) if per_step else float(self.assume.get("screen_step_s", 1.6))
        return step * run.steps * 1.02 + float(self.assume.get("screen_setup_s", 60))

    def speed(self, shape: dict) -> float:
        """A speed shape's seconds: an earlier loan's at the same shape and a tenth more, else a share of the
        budget."""
        timed = [
            float(s["seconds"])
            for loan in self.loans
            for s in loan.get("speed") or []
            if shape_key(s) == shape_key(shape) and s.get("status") == "done" and s.get("seconds")
        ]
        if timed:
            return 1.1 * max(timed)
        return float(self.cfg["speed"]["budget_s"]) / len(self.cfg["speed"]["shapes"])

    def piece(self, p: Piece, compiled: set[str] | None = None) -> float:
        """The piece's seconds, with the compiling of each arm not yet compiled in this loan (`compiled`)."""
        if p.stage == "speed":
            return sum(self.speed(s) for s in p.shapes)
        if p.stage == "screen":
            return sum(self.screen(r) for r in p.runs)
        compiling = sum(self.compile(a) for a in p.arms() if a not in (compiled or set()))
        return sum(self.run(r) for r in p.runs) + compiling

    def race_tokens(self) -> int:
        """Training tokens the race's corpus is made with (each window read at most once where the machine's files
        hold that much)."""
        return int(self.cfg["corpus"]["train_tokens"])


# ------------------------------------------------------------------------------------------------ the plan
def complete_seeds(race: dict, rates: dict, done: set[str]) -> list[int]:
    """Reported seeds with both arms at every budget done at the chosen rates."""
    out = []
    for seed in race["seeds"]:
        runs = [Run(a, float(rates[a]["lr"]), seed, s) for a in race["arms"] for s in rr.budgets(race)]
        if all(rates[a]["lr"] is not None for a in race["arms"]) and all(run_key("seed", r) in done for r in runs):
            out.append(seed)
    return out


def plan(cfg: dict, loans: list[dict]) -> tuple[list[Piece], list[str]]:
    """The pieces still to run, in the order of the module docstring; and notes on what waits and why."""
    done, notes = done_keys(loans), []
    race = cfg.get("race")
    required: list[Piece] = []
    optional: list[Piece] = []
    if race:
        costs = Costs(cfg, loans)
        rates = rr.select_rates(race, rr.runs(loans, "tune"))
        required += _tuning(race, rates, race["arms"], done)
        optional += _tuning(race, rates, race.get("extra_arms", []), done, optional=True)
        tuned = all(rates[a]["finished"] for a in race["arms"])
        if not tuned:
            notes.append(
                "the reported seeds wait for the tuning: "
                + "; ".join(
                    f"{a}: {', '.join(f'{x:g}' for x in rates[a]['todo']) or 'no finite loss'}"
                    for a in race["arms"]
                    if not rates[a]["finished"]
                )
            )
        room = cfg["deadline_s"] - RESERVE_S - costs.env() - costs.data(costs.race_tokens())
        room -= sum(costs.compile(a) for a in race["arms"])
        blocks = _seed_blocks(race, rates, race["arms"], done, costs, room) if tuned else []
        first = race.get("screen_after_seeds", 4)
        complete = complete_seeds(race, rates, done) if tuned else []
        early = [b for b in blocks if b.runs[0].seed in race["seeds"][:first]]
        required += early
        if cfg.get("screen"):
            screen = _screen(cfg["screen"], done)
            if len(complete) >= first:
                required += screen
            elif screen:
                notes.append(f"the deviation screen waits for {first} complete seeds (now {len(complete)})")
        required += [b for b in blocks if b not in early]
        extra = [a for a in race.get("extra_arms", []) if rates[a]["finished"]]
        for arm in extra:
            optional += _seed_blocks(race, rates, [arm], done, costs, room, optional=True)
    elif cfg.get("screen"):
        required += _screen(cfg["screen"], done)
    if "speed" in cfg:
        for s in cfg["speed"]["shapes"]:
            if not measured(s, loans):
                optional.append(Piece("speed", "speed " + _shape_name(s), [], True, shapes=[s]))
    return required + optional, notes


def _tuning(race: dict, rates: dict, arms: list[str], done: set[str], optional: bool = False) -> list[Piece]:
    """Each arm's missing tuning runs, one piece a run, in rounds that keep the arms level: every arm's grid centre,
    then their lower neighbours, then their upper ones, then any extension beyond a grid. A loan cut short has then
    tuned both arms as far as each other."""
    ranked = []
    for i, a in enumerate(arms):
        grid = sorted(float(x) for x in race["grid"][a])
        order = _centre_first(grid, grid)
        for lr in rates[a]["todo"]:
            rank = order.index(lr) if lr in order else len(order)
            ranked.append((rank, i, a, float(lr)))
    out = []
    for _, _, a, lr in sorted(ranked):
        run = Run(a, lr, int(race["tuning_seed"]), int(race["steps"]), "tune")
        if run_key("tune", run) not in done:
            out.append(Piece("tune", run_key("tune", run), [run], optional))
    return out


def _centre_first(grid: list[float], todo: list[float]) -> list[float]:
    """`todo` ordered by distance from the grid's centre, the lower side first on a tie."""
    centre = grid[len(grid) // 2] if grid else 0.0
    return sorted(todo, key=lambda lr: (abs(math.log(lr / centre)) if centre else 0.0, lr))


def _seed_blocks(
    race: dict, rates: dict, arms: list[str], done: set[str], costs: Costs, room: float, optional: bool = False
) -> list[Piece]:
    """One piece a seed: `arms` at every budget at the chosen rates, the largest budget first, each budget's arms
    together. A block no loan could hold (more than `room`) is split into its budgets' pairs, and a pair that no
    loan could hold into single runs (the report pairs what shares a seed and budget, whichever loan ran it)."""
    out = []
    for seed in race["seeds"]:
        pairs = [
            [r for r in (Run(a, float(rates[a]["lr"]), int(seed), s) for a in arms) if run_key("seed", r) not in done]
            for s in reversed(rr.budgets(race))
        ]
        pairs = [p for p in pairs if p]
        if not pairs:
            continue
        block = [r for p in pairs for r in p]

        def fits(runs: list[Run]) -> bool:  # `room` has the compiling of every arm taken out already
            return costs.piece(Piece("seed", "", runs), compiled=set(arms)) <= room

        groups = (
            [block] if fits(block) else [g for pair in pairs for g in ([pair] if fits(pair) else [[r] for r in pair])]
        )
        for g in groups:
            key = f"seed {seed} " + ", ".join(f"{r.arm}@{r.lr:g}x{r.steps}" for r in g)
            out.append(Piece("seed", key, g, optional))
    return out


def _screen(scr: dict, done: set[str]) -> list[Piece]:
    out = []
    for arm, seed in scr["runs"]:
        run = Run(arm, float(scr["lr"]), int(seed), int(scr["steps"]), "screen")
        if run_key("screen", run) not in done:
            out.append(Piece("screen", run_key("screen", run), [run]))
    return out


# ------------------------------------------------------------------------------------------------ a loan's choice
@dataclass
class Choice:
    """What a loan starts, estimated before it does: pieces in order, each with its seconds (compiling included)."""

    chosen: list[tuple[Piece, float]]
    waiting: list[tuple[Piece, float]]
    env_s: float
    data_s: float  # 0 when nothing trains
    left_s: float


def choose(cfg: dict, loans: list[dict], limit_s: float | None = None) -> Choice:
    """The pieces a loan of `limit_s` (default: the deadline) would start, by the estimates of `Costs`: the
    environment step, then in the plan's order each piece that fits what is left (the data before the first piece
    that trains, each arm's compiling before its first run)."""
    pieces, _ = plan(cfg, loans)
    costs = Costs(cfg, loans)
    left = (cfg["deadline_s"] if limit_s is None else limit_s) - RESERVE_S - costs.env()
    compiled: set[str] = set()
    data_s = 0.0
    chosen, waiting = [], []
    for p in pieces:
        need = costs.piece(p, compiled)
        data = costs.data(costs.race_tokens()) if p.stage != "speed" and not data_s else 0.0
        if need + data <= left:
            left -= need + data
            data_s = data_s or data
            compiled |= set(p.arms())
            chosen.append((p, need))
        else:
            waiting.append((p, need))
    return Choice(chosen, waiting, costs.env(), data_s, left)


def describe(cfg: dict, loans: list[dict]) -> str:
    """What the next loan would run, piece by piece (`kit.py --plan --loan`)."""
    got = plan_json(cfg, loans)
    lines = [f"# GPU kit plan: the race's next loan ({cfg['deadline_s']} s; {len(loans)} earlier loan(s) read)", ""]
    a = got["assumptions"]
    lines.append(f"- environment ~{a['env_s']:.0f} s" + (f", data ~{a['data_s']:.0f} s" if a["data_s"] else ""))
    for key in dict.fromkeys(r["piece"] for r in got["runs"]):
        mine = [r for r in got["runs"] if r["piece"] == key]
        comp = sum(r.get("compile_s", 0) for r in mine)
        est = sum(r["estimate_s"] for r in mine) + comp
        lines.append(f"- [run] {key}: ~{est:.0f} s" + (f" ({comp:.0f} of it compiling)" if comp else ""))
    for w in got["waiting"][:8]:
        lines.append(f"- [wait] {w['piece']}: ~{w['estimate_s']:.0f} s{' (optional)' if w['optional'] else ''}")
    if len(got["waiting"]) > 8:
        lines.append(f"- ... and {len(got['waiting']) - 8} more waiting")
    lines += ["", f"total ~{got['estimate_s']['total']:.0f} s of {got['estimate_s']['limit_s']} s", ""]
    lines += [f"note: {n}" for n in got["notes"]]
    if got.get("shape"):
        s = got["shape"]
        lines += [
            "",
            f"race shape: d={s['d_model']}, {s['n_layers']} layers, d_ff {s['d_ff']}, context {s['context']}, vocab "
            f"{s['vocab']}, {s['batch_tokens']:,} tokens x {s['steps']:,} steps = {s['tokens'] / 1e6:.1f}M tokens, "
            f"{s['tokens_per_param']:.2f} per non-embedding parameter ({s['params_non_embedding'] / 1e6:.2f}M)",
            f"step time: {a['step_s']}",
        ]
    for i, later in enumerate(got.get("later", []), 2):
        roles = ", ".join(f"{k} {v}" for k, v in later["runs_by_role"].items()) or "nothing"
        seeds = ", ".join(map(str, later["seeds"])) or "none"
        lines.append(
            f"then loan {i} (if loan {i - 1} goes as estimated): {roles} runs; seeds completed: {seeds} "
            f"({later['pairs']} pairs of arms); ~{later['total_s']:.0f} s"
        )
    return "\n".join(lines)


def plan_json(cfg: dict, loans: list[dict], later: int = 2) -> dict[str, Any]:
    """The next loan as data (`kit.py --plan --loan --json`): the race's shape, the runs it starts with their
    estimates, what waits, the assumptions, and `later` loans after it simulated as if each went as estimated (each
    tuning run landing where its grid's centre is best, an assumption only)."""
    got = choose(cfg, loans)
    costs = Costs(cfg, loans)
    _, notes = plan(cfg, loans)
    runs, compiled = [], set()
    for p, _need in got.chosen:
        for r in p.runs:
            est = costs.screen(r) if p.stage == "screen" else costs.run(r) if p.stage != "speed" else 0.0
            row = {"piece": p.key, "stage": p.stage, "arm": r.arm, "lr": r.lr, "seed": r.seed, "steps": r.steps,
                   "role": r.role, "estimate_s": round(est, 1)}  # fmt: skip
            if p.stage in RACE_STAGES and r.arm not in compiled:
                row["compile_s"] = round(costs.compile(r.arm), 1)
                compiled.add(r.arm)
            runs.append(row)
        if p.stage == "speed":
            runs.append({"piece": p.key, "stage": "speed", "arm": "-", "lr": 0.0, "seed": -1, "steps": 0,
                         "role": "speed", "estimate_s": round(_need, 1)})  # fmt: skip
    total = got.env_s + got.data_s + sum(n for _, n in got.chosen)
    race = cfg.get("race")
    step = {a: costs.step(a) for a in race["arms"]} if race else {}
    out: dict[str, Any] = {
        "shape": race_shape(cfg) if race else None,
        "runs": runs,
        "waiting": [
            {"piece": p.key, "stage": p.stage, "optional": p.optional, "estimate_s": round(n, 1)}
            for p, n in got.waiting
        ],  # fmt: skip
        "estimate_s": {
            "env": round(got.env_s, 1),
            "data": round(got.data_s, 1),
            "total": round(total, 1),
            "limit_s": cfg["deadline_s"],
            "reserve_s": RESERVE_S,
        },  # fmt: skip
        "assumptions": {
            "env_s": got.env_s,
            "data_s": got.data_s,
            "data_tokens": costs.race_tokens(),
            "compile_s": {a: costs.compile(a) for a in (race or {}).get("arms", [])},
            "step_s": "; ".join(f"{a} {s:.4f} s ({how})" for a, (s, how) in step.items()),
            "mfu": _mfu(cfg, costs, step),
        },
        "notes": notes,
    }
    if later and race:
        out["later"] = []
        simulated = list(loans)
        for i in range(later):
            simulated.append(_as_if_run(cfg, got, f"(simulated loan {i + 1})", costs))
            got = choose(cfg, simulated)
            roles: dict[str, int] = {}
            for p, _ in got.chosen:
                for r in p.runs:
                    roles[r.role] = roles.get(r.role, 0) + 1
            pairs = [(r.seed, r.steps) for p, _ in got.chosen if p.stage == "seed" for r in p.runs]
            pairs = {k for k in pairs if sum(1 for x in pairs if x == k) >= len(race["arms"])}
            seeds = {sd for sd, _ in pairs if all((sd, b) in pairs for b in rr.budgets(race))}
            total = got.env_s + got.data_s + sum(n for _, n in got.chosen)
            out["later"].append({"runs_by_role": roles, "seeds": sorted(seeds), "pairs": len(pairs),
                                 "total_s": round(total, 1), "pieces": [p.key for p, _ in got.chosen]})  # fmt: skip
    return out


def _mfu(cfg: dict, costs: Costs, step: dict) -> dict[str, Any]:
    """The race step's MFU as estimated: against the datasheet's dense bf16 peak first, the measured peak beside."""
    sheet = measured_peak = 0.0
    for loan in costs.loans:
        m, s = peaks(loan.get("env"))
        measured_peak, sheet = measured_peak or m, sheet or s
    sheet = sheet or 989.5e12  # H100 / H200 SXM dense bf16 (the datasheet)
    out = {"datasheet_tflops": sheet / 1e12}
    for arm, (s, _) in step.items():
        flops_s = costs.flops(arm) * cfg["race"]["batch_tokens"] / s
        out[arm] = {"tflops": round(flops_s / 1e12, 1), "of_datasheet": round(flops_s / sheet, 3)}
        if measured_peak:
            out[arm]["of_measured_peak"] = round(flops_s / measured_peak, 3)
    if measured_peak:
        out["measured_peak_tflops"] = measured_peak / 1e12
    return out


def _as_if_run(cfg: dict, got: Choice, name: str, costs: Costs) -> dict:
    """A loan record of `got`'s pieces as if each finished at its estimate, tuning runs best at their grid's
    centre (for `plan_json`'s look ahead; never committed)."""
    race = cfg["race"]
    pieces = []
    for p, _ in got.chosen:
        runs = []
        for r in p.runs:
            grid = sorted(float(x) for x in race["grid"].get(r.arm, [r.lr])) if p.stage in RACE_STAGES else [r.lr]
            centre = grid[len(grid) // 2]
            val = 3.0 + abs(math.log2(r.lr / centre)) / 10
            runs.append({**asdict(r), "status": "finished", "val_loss": val, "test_loss": val})
        pieces.append({"stage": p.stage, "key": p.key, "status": "done", "runs": runs})
    speed = [{**s, "status": "done"} for p, _ in got.chosen if p.stage == "speed" for s in p.shapes]
    return {"loan": name, "settings": cfg, "pieces": pieces, "data": None, "speed": speed, "started": "9999"}


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
    race_run: Callable[[dict, Run, float], dict],
    max_pieces: int | None = None,
) -> None:
    """Run the plan's pieces that fit before `deadline` (a time.time()), recording each in `res` ("pieces") as it
    goes. The plan is made again after every piece, with this loan's runs counted and measured: a tuning run that
    moves an arm's best rate to an edge of its grid brings the next rate into this same loan, and the step times it
    measured decide what fits next. A race run that could not end before the deadline stops ("cut") and counts for
    nothing; a screen run resets Dynamo, so the race's arms compile again after it."""
    record: list[dict] = []
    this: dict[str, Any] = {"loan": rr.THIS, "settings": cfg, "pieces": record, "started": res_started(res)}
    pieces, notes = plan(cfg, loans)
    res.set("plan", {"pieces": [p.key for p in pieces], "notes": notes})
    data: dict | None = None
    compiled: set[str] = set()
    attempted: set[str] = set()
    while max_pieces is None or len(attempted) < max_pieces:
        costs = Costs(cfg, [*loans, this])
        chosen = None
        for p in plan(cfg, [*loans, this])[0]:  # the first piece in the plan's order that fits
            need = costs.piece(p, compiled) + (
                costs.data(costs.race_tokens()) if data is None and p.stage != "speed" else 0.0
            )
            if p.key not in attempted and need <= deadline - RESERVE_S - time.time():
                chosen = (p, need)
                break
        if chosen is None:
            break
        piece, need = chosen
        attempted.add(piece.key)
        entry: dict[str, Any] = {"stage": piece.stage, "key": piece.key, "status": "running", "estimate_s": round(need)}
        record.append(entry)
        res.set("pieces", record)
        t0 = time.time()
        try:
            if piece.stage == "speed":
                speed(piece.shapes)
            else:
                if data is None:
                    data = make_data(costs.race_tokens())
                    res.set("data", data)
                    this["data"] = data
                entry["runs"] = []
                for run in piece.runs:
                    entry["runs"].append({**asdict(run), "status": "running"})
                    res.set("pieces", record)
                    if piece.stage == "screen":
                        got = screen_run(data, run, deadline - RESERVE_S)
                        compiled.clear()  # the screen compiles afresh (a Dynamo reset): the arms compile again
                    else:
                        got = race_run(data, run, deadline - RESERVE_S)
                        compiled.add(run.arm)
                    entry["runs"][-1] = {**asdict(run), **got}
                    res.set("pieces", record)
                    if got.get("status") == "cut":
                        break  # the deadline: nothing after it fits either
            cut = any(r.get("status") == "cut" for r in entry.get("runs", []))
            entry["status"] = "cut by the deadline" if cut else "done"
        except Exception as e:  # noqa: BLE001 - a failed piece is recorded; the loan goes on with the next
            entry["status"] = f"failed: {type(e).__name__}: {str(e)[:300]}"
            entry["traceback"] = traceback.format_exc(limit=4)[-1500:]
        entry["seconds"] = round(time.time() - t0, 1)
        res.set("pieces", record)
        if entry["status"] == "cut by the deadline":
            break  # the deadline is at hand: nothing else starts
    left = deadline - RESERVE_S - time.time()
    costs = Costs(cfg, [*loans, this])
    waiting = [p for p in plan(cfg, [*loans, this])[0] if p.key not in attempted]
    res.set("waiting", [f"{p.key} (~{costs.piece(p, compiled):.0f} s; {left:.0f} s were left)" for p in waiting])


def res_started(res) -> str:
    return str(getattr(res, "data", {}).get("started", ""))
