"""Every GPU loan runs the race's next block, with the same command; the race is an `angpt compare` (issue 53).

    timeout 590 bash benchmarks/gpu/run.sh OUT --loan --work /tmp/work   # on the GPU: the next block, within 570 s
    python benchmarks/gpu/kit.py --plan --loan [--json]                    # here: what it will run, and after it
    python benchmarks/gpu/kit.py --take OUT                                # here, after it: its runs into the store

The race is a comparison of the study engine (:func:`race_plan`): GPT+ with its recipe against anGPT with its
defaults, each arm's rate swept on the tuning seed on full runs (`--tune-budget largest`) and extended until it lies
inside its grid, then the reported seeds at both budgets, the same tokens in the same order. Its runs live in the
engine's store (benchmarks/gpu-race/store), which every loan extends, and the engine writes its report: every
rule of docs/protocol.md is the engine's, none is here.

A loan runs these pieces in order, each as far as its deadline allows (:func:`pieces`):
1. the race: its tuning, then its first `seeds_before_screen` seeds, by the engine with the in-process executor
   (each arm built and compiled once; a run, or a seed's pair of runs, that cannot end before the deadline is not
   started);
2. the deviation screen, once those seeds are complete (docs/open_choices.md);
3. the race's other seeds;
4. where a loan has room that no required run fits: the extra arms (nGPT, the paper's own block), then the speed
   shapes.
Every run's seconds come from :class:`Costs` (what the store and the loans measured first, the settings' assumptions
last). `kit.py --plan` runs the same pieces through the same executor on those estimates, a clock that moves by
them, and made-up losses (:func:`simulate`): what it prints is what a loan whose runs take their estimates runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from report import peaks  # benchmarks/gpu/report.py

HERE = Path(__file__).resolve().parent
STORE = HERE.parent / "gpu-race" / "store"  # the race's store (committed after every loan)
LOANS = HERE.parent / "gpu-race"  # one folder per loan: its results.json (environment, data, speed, timings)
RESERVE_S = 10.0  # left at the end for the report


@dataclass
class Run:
    """One run outside the engine: a screen run (an arm at a rate and seed, `steps` long)."""

    arm: str
    lr: float
    seed: int
    steps: int


@dataclass
class Piece:
    """What a loan starts as one: the race's engine at some arms and seeds, a screen run, or a speed shape."""

    kind: str  # race | screen | speed
    key: str
    arms: list[str] = field(default_factory=list)  # race: the plan's arms
    seeds: list[int] = field(default_factory=list)  # race: the plan's reported seeds
    run: Run | None = None  # screen
    shape: dict | None = None  # speed
    optional: bool = False


# ------------------------------------------------------------------------------------------------ the race's plan
def race_steps(race: dict) -> list[int]:
    """The race's budgets in optimizer steps, ascending: fractions of its largest, `steps`."""
    return sorted({max(1, round(f * race["steps"])) for f in race["budgets"]})


def race_plan(cfg: dict, data_dir: str | Path, fingerprint: dict, arms: list[str], seeds: list[int]):
    """The race as `angpt compare`'s plan on the prepared data in `data_dir`, its arms and reported seeds: tuned on the
    tuning seed at the largest budget over each arm's grid, its rates' grids extended until the best is inside. Its
    data fingerprint is the race corpus's (`fingerprint`: :func:`data_fingerprint`), which a loan on a changed image
    does not match."""
    from angpt.study.plan import make_plan

    race = cfg["race"]
    plan = make_plan(
        data_dir,
        arms=arms,
        baseline=race["arms"][0],
        budgets=[s * race["batch_tokens"] for s in race_steps(race)],
        seeds=seeds,
        tuning_seed=race["tuning_seed"],
        tune_budget="largest",
        preset=race["preset"],
        batch_tokens=race["batch_tokens"],
        seq_len=race["seq_len"],
        micro_batch=race["micro_batch"],
        lr_grid=[1.0],
        lr_values={a: [float(x) for x in race["grid"][a]] for a in arms},
        settings=[f"model.{k}={v}" for k, v in race["model"].items()]
        + [f"train.{k}={v}" for k, v in (race.get("train") or {}).items()],
        eval_batches=race["eval_batches"],
        eval_points=race["eval_points"],
        dtype=race["dtype"],
        device=cfg["device"],
    )
    plan.data_fingerprint = fingerprint
    return plan


def data_fingerprint(data: dict, tokenizer: str) -> dict:
    """What identifies the race's data, from the data step's record (corpus.prepare_race_data) and its `tokenizer`
    (the settings' spec): its token stream's digest, tokenizer and splits. A loan on another image makes other text,
    another tokenizer and other tokens."""
    return {
        "digest": data["data_fingerprint"][:16],
        "data_fingerprint": data["data_fingerprint"],
        "tokenizer": tokenizer,
        "tokenizer_hash": data["tokenizer_hash"],
        "vocab_size": data["vocab_size"],
        "tokens": dict(sorted(data["tokens"].items())),
        "documents": dict(sorted(data["documents"].items())),
        "source": "the GPU machine's own text (benchmarks/gpu/corpus.py)",
    }


def stored_plan(cfg: dict, store: Path, arms: list[str], seeds: list[int]):
    """The store's plan at `arms` (each with its grid of the settings) and `seeds`: the race planned where its data is
    not (here), its identity the one :func:`race_plan` makes on the machine (tests/test_gpu_race.py)."""
    from angpt.study.arms import parse_arm
    from angpt.study.stored import load_plan

    plan = load_plan(store)
    plan.arms = [parse_arm(a) for a in arms]
    plan.lr_values = {a: [float(x) for x in cfg["race"]["grid"][a]] for a in arms}
    plan.centres = {a.label: plan.centre_lr(a) for a in plan.arms}
    plan.seeds = list(seeds)
    return plan


def store_digest(store: Path) -> str | None:
    """The digest of the data the store's runs trained on (its plan's fingerprint)."""
    return (json.loads((Path(store) / "plan.json").read_text()).get("data_fingerprint") or {}).get("digest")


def write_race_report(cfg: dict, store: Path, loans: list[dict] | None = None) -> str:
    """The race's report, written by the study engine from the store (`angpt compare --report-only`): its arms, the
    extra arms once they have every reported seed, and the seeds every arm has at the largest budget, where the
    verdict is (its smaller budget PARTIAL while a seed is under way there). The runs' machine is the loans' GPUs.
    Beside the store, speed.json: the runs' step times and MFU (race_speed). Returns the verdicts and the path."""
    from angpt.study.comparison.run import rewrite_report
    from angpt.study.store import PLAN_FILE, load_record, write_json

    race = cfg["race"]
    everyone = stored_plan(cfg, store, [*race["arms"], *race.get("extra_arms", [])], race["seeds"])

    def known(spec):
        return load_record(spec.run_dir(everyone, store), everyone.steps(spec.budget))

    largest = [everyone.budgets[-1]]
    seeds = complete_seeds(stored_plan(cfg, store, race["arms"], race["seeds"]), known, largest) or race["seeds"][:1]
    arms = list(race["arms"])
    for extra in race.get("extra_arms", []):
        if complete_seeds(stored_plan(cfg, store, [*race["arms"], extra], seeds), known, largest) == seeds:
            arms.append(extra)
    write_json(store / PLAN_FILE, stored_plan(cfg, store, arms, seeds).to_dict())
    write_json(store.parent / "speed.json", race_speed(cfg, store))
    report = rewrite_report(store, command="benchmarks/gpu/kit.py --take", machine=loans_machine(loans or []))
    return "\n".join([*report.verdicts, f"race report: {report.files['report.md']}"])


def race_speed(cfg: dict, store: Path) -> dict[str, Any]:
    """Each arm's training step at the race's shape, per GPU, from the store's runs (their medians' median), its MFU
    against the GPU's datasheet dense bf16 peak, and its ratio to the first arm's on the same GPU: what the loans
    measured of speed (benchmarks/gpu-race/speed.json)."""
    from angpt.train.hardware import peak_for_device_name

    costs, per = Costs(cfg, [], []), {}
    for path in sorted(Path(store).glob("runs/**/result.json")):
        rec = json.loads(path.read_text())
        prov = path.parent / "provenance.json"
        gpu = json.loads(prov.read_text()).get("device") if prov.is_file() else rec.get("gpu")
        if rec.get("step_time_median") and gpu:
            per.setdefault(gpu, {}).setdefault(rec["arm"], []).append(rec["step_time_median"])
    out: dict[str, Any] = {}
    for gpu, arms in sorted(per.items()):
        peak = peak_for_device_name(gpu)
        for arm, times in arms.items():
            step = _median(times)
            flops_s = costs.flops(arm) * cfg["race"]["batch_tokens"] / step
            row = {"runs": len(times), "step_time": step, "train_tflops": flops_s / 1e12}
            if peak:
                row["mfu_datasheet"] = flops_s / peak
            out.setdefault(gpu, {})[arm] = row
        base = out[gpu].get(cfg["race"]["arms"][0])
        for arm, row in out[gpu].items():
            if base and arm != cfg["race"]["arms"][0]:
                row["vs_baseline"] = row["step_time"] / base["step_time"]
    return out


def loans_machine(loans: list[dict]) -> dict[str, Any] | None:
    """The machine of the race's runs, as a report names one: the loans' GPUs and versions."""
    ran = [x for x in loans if x.get("runs") or any(p.get("kind", p.get("stage")) in ("race", "tune", "seed")
                                                     for p in x.get("pieces", []))]  # fmt: skip
    if not ran:
        return None
    env, versions = ran[-1].get("env") or {}, ran[-1].get("versions") or {}
    return {
        "date": ran[-1].get("started"),
        "angpt_version": "the loans' revisions",
        "torch_version": versions.get("torch"),
        "python_version": versions.get("python"),
        "git_revision": ", ".join(sorted({str(x.get("revision")) for x in ran})),
        "hostname": "GPU loans " + ", ".join(x["loan"] for x in ran),
        "platform": f"CUDA {versions.get('cuda')}",
        "cpu": "the loan machines'",
        "cpu_cores": env.get("cpu_count"),
        "gpu": ", ".join(sorted({str((x.get("env") or {}).get("gpu")) for x in ran})),
    }


# ------------------------------------------------------------------------------------------------ costs
class Costs:
    """Seconds the loan's pieces take, each from the best source there is (`sources` says which):

    - a race run: its arm's median step time over the store's runs (all at the race's shape), else another arm's
      scaled by FLOPs and 6% more, else GPT+'s compiled MFU at `gpt2-small` (an earlier loan's speed shape) times
      `assume.width_factor`, else `assume.race_step_s`; times its steps, plus what its arm's runs took beyond their
      steps (evaluations, saves: `assume.run_setup_s` until measured);
    - an arm's compiling, on its first run of a loan: what a run that built its model took in its first step beyond
      a step, else `assume.compile_s`;
    - the data: the slowest rate per token an earlier loan made it at, else `assume.data_fixed_s` plus
      `assume.data_s_per_mtoken` per million tokens; the screen and the speed shapes from earlier loans, likewise.
    """

    def __init__(self, cfg: dict, loans: list[dict], records: list[dict]) -> None:
        self.cfg, self.loans, self.records = cfg, loans, records
        self.assume = cfg.get("assume", {})
        self.race = cfg["race"]
        self._flops: dict[str, float] = {}

    def _mine(self, arm: str) -> list[dict]:
        return [r for r in self.records if r.get("arm") == arm and r.get("step_time_median")]

    def flops(self, arm: str) -> float:
        """FLOPs a token of `arm`'s race model (6 N + 12 L T d, at the corpus tokenizer's padded vocabulary)."""
        if arm not in self._flops:
            import torch

            from angpt.models import build_model
            from angpt.study.arms import parse_arm

            parsed = parse_arm(arm)
            vocab = -(-int(str(self.cfg["corpus"]["tokenizer"]).split(":")[1]) // 64) * 64
            with torch.device("meta"):
                model = build_model(parsed.arch, self.race["preset"], **{**self.race["model"], **parsed.model},
                                    vocab_size=vocab, context_length=self.race["seq_len"])  # fmt: skip
            self._flops[arm] = model.flops_per_token(self.race["seq_len"])
        return self._flops[arm]

    def step(self, arm: str) -> tuple[float, str]:
        mine = self._mine(arm)
        if mine:
            return _median([r["step_time_median"] for r in mine]), "measured at the race's shape"
        others = [r for r in self.records if r.get("step_time_median")]
        if others:
            r = max(others, key=lambda r: r["step_time_median"])
            ratio = self.flops(arm) / self.flops(r["arm"])
            return 1.06 * r["step_time_median"] * ratio, f"{r['arm']}'s measured, x 1.06"
        best = None
        for loan in self.loans:
            for shape in loan.get("speed") or []:
                rows = {r["arch"]: r for r in shape.get("rows") or []}
                if shape.get("compile") and shape.get("preset") == "gpt2-small" and "gpt+" in rows:
                    flops_s = rows["gpt+"]["train_flops"]
                    ratio = rows.get(arm.split("[")[0], {}).get("train_ratio", 1.06)
                    if best is None or flops_s < best[0]:
                        best = (flops_s, ratio, peaks(loan.get("env"))[1])
        if best is not None:
            flops_s, ratio, sheet = best
            factor = float(self.assume.get("width_factor", 0.7))
            per_step = ratio * self.flops(arm) * self.race["batch_tokens"] / (factor * flops_s)
            of = f" ({flops_s / sheet:.0%} of the datasheet's peak)" if sheet else ""
            return per_step, f"GPT+'s compiled {flops_s / 1e12:.0f} TFLOP/s at gpt2-small{of} x {factor:g}"
        return float(self.assume.get("race_step_s", 0.1)), "assumed (settings)"

    def compile(self, arm: str) -> float:
        got = [r["first_step_s"] - r["step_time_median"] for r in self._mine(arm)
               if r.get("first_step_s") and not r.get("model_reused")]  # fmt: skip
        return max(got) if got else float(self.assume.get("compile_s", 45))

    def overhead(self, arm: str) -> float:
        """What a run of `arm` took beyond its steps and its compiling: evaluations, saves, set-up."""
        got = [r["wall_s"] - r["steps"] * r["step_time_median"] - (0 if r.get("model_reused") else self.compile(arm))
               for r in self._mine(arm) if r.get("wall_s")]  # fmt: skip
        return max(0.0, _median(got)) if got else float(self.assume.get("run_setup_s", 3))

    def run(self, arm: str, steps: int, built: bool) -> float:
        """A race run of `steps` steps; with its arm's compiling unless its model is `built` in this loan."""
        return steps * self.step(arm)[0] + self.overhead(arm) + (0.0 if built else self.compile(arm))

    def data(self) -> float:
        tokens = int(self.cfg["corpus"]["train_tokens"])
        rates = [float(x["data"]["seconds"]) / x["data"]["tokens"]["train"] for x in self.loans
                 if (x.get("data") or {}).get("seconds") and x["data"]["tokens"].get("train")]  # fmt: skip
        if rates:
            return max(rates) * tokens
        return (
            float(self.assume.get("data_fixed_s", 15)) + float(self.assume.get("data_s_per_mtoken", 0.3)) * tokens / 1e6
        )

    def env(self) -> float:
        return float(self.assume.get("env_s", 8))

    def screen(self, run: Run) -> float:
        screens = [p for x in self.loans for p in x.get("pieces", []) if p.get("kind", p.get("stage")) == "screen"]
        got = [r["step_time"] for p in screens for r in p.get("runs", []) if r.get("step_time")]
        step = max(got) if got else float(self.assume.get("screen_step_s", 1.6))
        return step * run.steps * 1.02 + float(self.assume.get("screen_setup_s", 60))

    def speed(self, shape: dict) -> float:
        timed = [float(s["seconds"]) for x in self.loans for s in x.get("speed") or []
                 if shape_key(s) == shape_key(shape) and s.get("status") == "done" and s.get("seconds")]  # fmt: skip
        if timed:
            return 1.1 * max(timed)
        return float(self.cfg["speed"]["budget_s"]) / len(self.cfg["speed"]["shapes"])

    def estimate(self, plan) -> Callable:
        """The in-process executor's estimate of a run of `plan` (study/inprocess.py): (spec, built) -> seconds."""
        return lambda spec, built: self.run(spec.arm, plan.steps(spec.budget), built)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])


def shape_key(s: dict) -> tuple:
    """What identifies a speed shape, in the settings and in a loan's results: (preset, batch, context, compiled)."""
    return s.get("preset"), s.get("batch"), s.get("seq_len"), bool(s.get("compile"))


def measured(shape: dict, loans: list[dict]) -> bool:
    """Whether some loan measured a speed `shape` of the settings (status done), at or after its `since` (UTC)."""
    since = str(shape.get("since", ""))
    return any(shape_key(s) == shape_key(shape) and s.get("status") == "done" and str(x.get("started", "")) >= since
               for x in loans for s in x.get("speed") or [])  # fmt: skip


def screen_done(cfg: dict, loans: list[dict]) -> set[tuple]:
    """(arm, seed) of every screen run some loan finished (a diverged run is a result too)."""
    return {(r["arm"], int(r["seed"])) for x in loans for p in x.get("pieces", [])
            if p.get("kind", p.get("stage")) == "screen"
            for r in p.get("runs", []) if r.get("status") in ("finished", "diverged")}  # fmt: skip


# ------------------------------------------------------------------------------------------------ the pieces
def complete_seeds(plan, known: Callable, budgets: list[int] | None = None) -> list[int]:
    """The plan's reported seeds whose every run at every budget (or at `budgets`) is done, for every arm, at its
    chosen rate (a diverged run is done)."""
    from angpt.study.store import RunSpec
    from angpt.study.sweep import chosen

    out, settled = [], _settled(plan, known)
    for seed in plan.seeds:
        specs = []
        for arm in plan.arms:
            point = chosen(plan, settled, arm.label, plan.budgets[-1])
            specs += [RunSpec(arm.label, b, seed, *point) for b in budgets or plan.budgets] if point else [None]
        if all(s is not None and known(s) is not None for s in specs):
            out.append(seed)
    return out


def _settled(plan, known: Callable) -> dict:
    """Each arm's sweep settled from what `known` knows (an arm whose sweep waits for a run is left out)."""
    from angpt.study.sweep import SweepUnfinished, run_sweeps

    class Read:
        def run(self, specs):
            pass

        def known(self, spec):
            return known(spec)

    out: dict = {a.label: {} for a in plan.arms}
    for arm in plan.arms:
        try:
            out[arm.label][plan.sweep_budget] = run_sweeps(plan, Read(), plan.sweep_budget, [arm])[arm.label]
        except SweepUnfinished:
            pass
    return out


def pieces(cfg: dict, plan_for: Callable, known: Callable, loans: list[dict]) -> list[Piece]:
    """What a loan runs next, in order (the module docstring), given the runs `known` knows, the screen runs and
    speed shapes the `loans` made; `plan_for(arms, seeds)` is the race's plan at those arms and seeds."""
    race = cfg["race"]
    first = race["seeds"][: race["seeds_before_screen"]]
    screened, spec = screen_done(cfg, loans), cfg.get("screen") or {"runs": []}
    todo_screen = [Run(a, float(spec["lr"]), int(s), int(spec["steps"]))
                   for a, s in spec["runs"] if (a, int(s)) not in screened]  # fmt: skip
    seeds = first if todo_screen else race["seeds"]
    out = [Piece("race", f"race: {', '.join(race['arms'])}, seeds {_span(seeds)}", race["arms"], seeds)]
    if todo_screen and complete_seeds(plan_for(race["arms"], first), known) == first:
        out += [Piece("screen", f"screen {r.arm} seed {r.seed}", run=r) for r in todo_screen]
        out.append(Piece("race", f"race: {', '.join(race['arms'])}, seeds {_span(race['seeds'])}", race["arms"],
                         race["seeds"]))  # fmt: skip
    if race.get("extra_arms"):
        arms = [*race["arms"], *race["extra_arms"]]
        out.append(Piece("race", f"race with {', '.join(race['extra_arms'])}: seeds {_span(seeds)}", arms, seeds,
                         optional=True))  # fmt: skip
    for s in (cfg.get("speed") or {}).get("shapes", []):
        if not measured(s, loans):
            out.append(Piece("speed", f"speed {s['preset']} {s['batch']}x{s['seq_len']}"
                             + (" compiled" if s.get("compile") else ""), shape=s, optional=True))  # fmt: skip
    return out


def _span(seeds: list[int]) -> str:
    return (
        f"{seeds[0]}-{seeds[-1]}"
        if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1))
        else (", ".join(map(str, seeds)))
    )


# ------------------------------------------------------------------------------------------------ a loan
@dataclass
class Loan:
    """One loan's course: its clock, its deadline, the arms compiled so far, and every piece with what it started."""

    cfg: dict
    deadline: float  # a clock() value: nothing may end after it
    clock: Callable[[], float]
    models: Any = None  # study/inprocess.py's ModelCache: each arm's model, built and compiled once a loan
    built: set[str] = field(default_factory=set)
    record: list[dict] = field(default_factory=list)  # the pieces as results.json records them


def run_loan(
    loan: Loan,
    costs: Costs,
    plan_for: Callable,
    known: Callable,
    loans: list[dict],
    *,
    race: Callable,
    screen: Callable,
    speed: Callable,
    make_data: Callable,
    publish: Callable = lambda: None,
    max_pieces: int | None = None,
) -> None:
    """The loan: the data (`make_data()`), then each piece of :func:`pieces` in order, as far as the deadline allows;
    after each, the pieces are decided again from what it did (a seed completed brings the screen). `race(plan,
    executor)` runs the engine (raising nothing at its deadline), `screen(run)` and `speed(shape)` run theirs. The
    loan's own runs count in `known` as they end. `publish()` after every piece."""
    from angpt.study.inprocess import InProcess, ModelCache

    loan.models = loan.models or ModelCache()
    attempted: set[str] = set()
    make_data()  # first: every piece but a speed shape trains on it, and the race's plan names it
    while max_pieces is None or len(attempted) < max_pieces:
        todo = [p for p in pieces(loan.cfg, plan_for, known, loans) if p.key not in attempted]
        if not todo:
            break
        piece = todo[0]
        attempted.add(piece.key)
        entry: dict[str, Any] = {"kind": piece.kind, "key": piece.key, "optional": piece.optional}
        left = loan.deadline - RESERVE_S - loan.clock()
        loan.record.append(entry)
        if piece.kind == "race":
            plan = plan_for(piece.arms, piece.seeds)
            ex = InProcess(deadline=loan.deadline - RESERVE_S, estimate=costs.estimate(plan), clock=loan.clock,
                           models=loan.models, built=loan.built)  # fmt: skip
            entry["status"] = "running"  # what a loan killed by its limit leaves behind
            publish()
            t0 = loan.clock()
            race(plan, ex)
            entry.update(started=[s.name() for s in ex.started], skipped=[s.name() for s in ex.skipped])
            entry.update(seconds=round(loan.clock() - t0, 1), status="done")
        else:
            need = costs.screen(piece.run) if piece.kind == "screen" else costs.speed(piece.shape)
            entry["estimate_s"] = round(need, 1)
            if need > left:
                entry["status"] = f"waits: ~{need:.0f} s, {left:.0f} s left"
                publish()
                continue
            entry["status"] = "running"
            publish()
            t0 = loan.clock()
            got = screen(piece.run) if piece.kind == "screen" else speed(piece.shape)
            entry.update(got or {})
            entry.update(seconds=round(loan.clock() - t0, 1), status="done")
            loan.models.models.clear()  # a screen run and a speed shape reset Dynamo: the race's arms compile again
            loan.built.clear()
        publish()


# ------------------------------------------------------------------------------------------------ the simulation
def made_up_loss(spec, known: Callable, plan) -> float:
    """A run's made-up validation loss in the simulation, never a claim: beyond a real sweep's runs, worse than its
    best (its rate is a step beyond the edge: the best then lies inside); otherwise best at the grid's centre."""
    from angpt.study.store import RunSpec

    grid = plan.initial_grid(plan.arm(spec.arm))
    real = {lr: (known(RunSpec(spec.arm, spec.budget, spec.seed, lr)) or {}).get("val_loss") for lr in grid}
    real = {lr: v for lr, v in real.items() if v is not None and math.isfinite(v)}
    if real and spec.lr not in real:
        return max(real.values()) + 0.01 * (1 + abs(math.log2(spec.lr / min(real, key=real.get))))
    return 3.0 + abs(math.log2(spec.lr / grid[len(grid) // 2])) / 10


def simulate(cfg: dict, store: Path, loans: list[dict], records: list[dict], *, later: int = 2) -> dict[str, Any]:
    """The next loan, and `later` loans after it, as the executor would run them if every run took its estimate:
    {"loans": [{"pieces", "runs", "seeds_complete", "total_s", "limit_s"}], "assumptions": {...}}."""
    from angpt.study.store import RunSpec, load_record

    made: dict[tuple, dict] = {}  # the simulated runs' records, loan after loan
    race_cfg = cfg["race"]
    everyone = stored_plan(cfg, store, [*race_cfg["arms"], *race_cfg.get("extra_arms", [])], race_cfg["seeds"])

    def known(spec: RunSpec) -> dict | None:
        if spec.key() in made:
            return made[spec.key()]
        return load_record(spec.run_dir(everyone, store), everyone.steps(spec.budget))

    def plan_for(arms: list[str], seeds: list[int]):
        return stored_plan(cfg, store, arms, seeds)

    out: dict[str, Any] = {"loans": []}
    sim_loans = list(loans)
    for i in range(1 + later):
        got, record = _simulated_loan(cfg, store, Costs(cfg, sim_loans, records), plan_for, known, made, sim_loans)
        got["seeds_complete"] = complete_seeds(plan_for(race_cfg["arms"], race_cfg["seeds"]), known)
        out["loans"].append(got)
        sim_loans.append({"loan": f"(simulated loan {i + 1})", "started": "9999", "pieces": record,
                          "speed": [p["speed"] for p in record if "speed" in p]})  # fmt: skip
    costs = Costs(cfg, loans, records)
    out["assumptions"] = {
        "env_s": costs.env(),
        "data_s": round(costs.data(), 1),
        "step_s": {a: [round(costs.step(a)[0], 4), costs.step(a)[1]] for a in race_cfg["arms"]},
        "compile_s": {a: round(costs.compile(a), 1) for a in race_cfg["arms"]},
        "overhead_s": {a: round(costs.overhead(a), 1) for a in race_cfg["arms"]},
        "mfu": _mfu(cfg, costs),
    }
    return out


def _simulated_loan(cfg, store, costs, plan_for, known, made, loans) -> tuple[dict[str, Any], list[dict]]:
    """One loan of :func:`simulate`: the real loan's course (run_loan) and executor, on a clock that moves by the
    estimates, with made-up losses (:func:`made_up_loss`) recorded in `made`."""
    from angpt.study.execute import Runner
    from angpt.study.progress import Progress
    from angpt.study.sweep import SweepUnfinished, run_plan

    now = [0.0]
    loan = Loan(cfg, deadline=float(cfg["deadline_s"]), clock=lambda: now[0])
    now[0] += costs.env()
    runs: list[dict] = []

    def race(plan, ex) -> None:
        def fake_train(p, report_dir, spec, models=None):
            seconds = ex.estimate(spec, spec.arm in ex.built)
            now[0] += seconds
            loss = made_up_loss(spec, known, p)
            made[spec.key()] = {"arm": spec.arm, "budget": spec.budget, "seed": spec.seed, "lr": spec.lr,
                                "setting": {}, "steps": p.steps(spec.budget), "status": "finished", "val_loss": loss,
                                "test_loss": loss, "simulated": True}  # fmt: skip
            runs.append({"piece": "race", "run": spec.name(), "arm": spec.arm, "budget": spec.budget,
                         "seed": spec.seed, "lr": spec.lr, "estimate_s": round(seconds, 1),
                         "compile": spec.arm not in ex.built})  # fmt: skip
            return dict(made[spec.key()])

        ex.train = fake_train
        runner = Runner(plan, store, jobs=1, threads=1, progress=Progress(False, 0, 0), executor=ex)
        runner.records.update(made)
        try:
            run_plan(plan, runner)
        except SweepUnfinished:
            pass

    def screen(run: Run) -> dict:
        now[0] += costs.screen(run)
        runs.append({"piece": "screen", "run": f"{run.arm} seed {run.seed}", "estimate_s": round(costs.screen(run), 1)})
        return {"runs": [{"arm": run.arm, "seed": run.seed, "lr": run.lr, "status": "finished"}]}

    def speed(shape: dict) -> dict:
        now[0] += costs.speed(shape)
        runs.append({"piece": "speed", "run": str(shape_key(shape)), "estimate_s": round(costs.speed(shape), 1)})
        return {"speed": {**shape, "status": "done"}}

    def make_data() -> None:
        now[0] += costs.data()

    run_loan(loan, costs, plan_for, known, loans, race=race, screen=screen, speed=speed, make_data=make_data)
    pieces_out = [{k: v for k, v in p.items() if k not in ("runs", "speed")} for p in loan.record]
    return {"pieces": pieces_out, "runs": runs, "total_s": round(now[0], 1), "limit_s": cfg["deadline_s"]}, loan.record


def _mfu(cfg: dict, costs: Costs) -> dict[str, Any]:
    """The race step's MFU as estimated: against the datasheet's dense bf16 peak first, the measured peak beside."""
    sheet = measured_peak = 0.0
    for x in costs.loans:
        m, s = peaks(x.get("env"))
        measured_peak, sheet = measured_peak or m, sheet or s
    sheet = sheet or 989.5e12  # H100 / H200 SXM dense bf16 (the datasheet)
    out: dict[str, Any] = {"datasheet_tflops": sheet / 1e12}
    for arm in cfg["race"]["arms"]:
        flops_s = costs.flops(arm) * cfg["race"]["batch_tokens"] / costs.step(arm)[0]
        out[arm] = {"tflops": round(flops_s / 1e12, 1), "of_datasheet": round(flops_s / sheet, 3)}
        if measured_peak:
            out[arm]["of_measured_peak"] = round(flops_s / measured_peak, 3)
    return out


def describe(got: dict[str, Any]) -> str:
    """`kit.py --plan --loan`: the next loan's runs, then each later loan's, as :func:`simulate` found them."""
    lines = []
    for i, x in enumerate(got["loans"]):
        head = "the next loan" if i == 0 else f"then loan +{i + 1} (if the ones before go as estimated)"
        lines += [f"# {head}: ~{x['total_s']:.0f} s of {x['limit_s']} s; seeds complete after it: "
                  f"{', '.join(map(str, x['seeds_complete'])) or 'none'}"]  # fmt: skip
        for p in x["pieces"]:
            if p["kind"] == "race":
                started, skipped = p.get("started", []), p.get("skipped", [])
                lines.append(f"- {p['key']}: {len(started)} run(s)" + (f", {len(skipped)} left for later" if skipped
                                                                        else ""))  # fmt: skip
                lines += [f"    {name}" for name in started]
            else:
                lines.append(f"- {p['key']}: {p.get('status', 'runs')} (~{p.get('estimate_s', 0):.0f} s)")
        lines.append("")
    a = got["assumptions"]
    lines.append(f"assumed: environment {a['env_s']:.0f} s, data {a['data_s']:.0f} s; step "
                 + "; ".join(f"{k} {v[0]} s ({v[1]})" for k, v in a["step_s"].items())
                 + "; compiling " + ", ".join(f"{k} {v:.0f} s" for k, v in a["compile_s"].items()))  # fmt: skip
    return "\n".join(lines)


def load_loans(root: Path = LOANS) -> list[dict]:
    """Every loan's results.json under `root` (one folder per loan, sorted by name), each tagged with its folder."""
    out = []
    for path in sorted(Path(root).glob("*/results.json")):
        d = json.loads(path.read_text())
        d["loan"] = path.parent.name
        out.append(d)
    return out


def store_records(store: Path) -> list[dict]:
    """Every finished run's record in the race's store (the costs' step times, compiling and overheads)."""
    out = []
    for path in sorted(Path(store).glob("runs/**/result.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out
