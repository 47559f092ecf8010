"""The GPU evidence kit: one command that turns a short GPU loan into measured results.

    bash benchmarks/gpu/run.sh OUT [--smoke] [--only env,speed,sweep]
    python benchmarks/gpu/kit.py --plan        # what the full run costs on one H100 (estimates, no GPU)
    bash benchmarks/gpu/run.sh OUT --loan      # a loan: the race's next block (benchmarks/gpu/loan.py)

Steps, in order; each writes OUT/results.json and re-renders OUT/report.md as it finishes, so a loan that ends
early keeps what the earlier steps measured:
  data   a corpus made on the machine (offline), tokenised with a BPE trained there
  env    GPU, torch/CUDA versions, measured bf16 matmul TFLOP/s, the SDPA flash backend, torch.compile
  speed  step time and MFU of GPT+, nGPT, anGPT and transformers' Qwen3 side by side in one process (bench step)
  sweep  the first steps at the paper's batch (~0.5M tokens per step, context 1024, gpt2-small): loss, pre-clip
         gradient norm and per-layer residual norms after every step (angpt.bench.firststeps)
Sizes and budgets come from benchmarks/gpu/settings.yaml (`full`, or `smoke`: tiny shapes on the CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
STEPS = ("data", "env", "speed", "sweep")


# ------------------------------------------------------------------------------------------------ results
class Results:
    """results.json, rewritten after every change, and report.md rendered from it."""

    def __init__(self, out: Path, profile: str, settings: dict) -> None:
        self.out = out
        self.started = time.time()
        self.data: dict[str, Any] = {
            "profile": profile,
            "settings": settings,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),  # loan.measured compares with UTC
            "command": " ".join(sys.argv),
            "revision": _revision(),
            "timeline": [],
        }

    def elapsed(self) -> float:
        return time.time() - self.started

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.write()

    def mark(self, step: str, status: str, seconds: float, error: str | None = None) -> None:
        entry = {"step": step, "status": status, "seconds": round(seconds, 1), "at": round(self.elapsed(), 1)}
        if error:
            entry["error"] = error
        self.data["timeline"].append(entry)
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.out / "results.json")
        from report import render  # benchmarks/gpu/report.py

        (self.out / "report.md").write_text(render(self.data))


def _revision() -> str:
    """The git commit of this checkout (with "+changes" if it has uncommitted ones), or $ANGPT_REVISION where the
    tree was copied without its .git (a GPU machine)."""
    import subprocess

    if os.environ.get("ANGPT_REVISION"):
        return os.environ["ANGPT_REVISION"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src", "benchmarks/gpu"],
            cwd=HERE.parent.parent,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head.stdout.strip()[:12] + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ------------------------------------------------------------------------------------------------ steps
def step_data(cfg: dict, work: Path, res: Results) -> dict:
    """Make the corpus and tokenise it: `site-packages` (every .py file of the installed packages), `stdlib`, or
    a path `angpt prepare` reads."""
    from angpt.data import prepare_dataset

    spec = cfg["data"]
    source = spec["source"]
    t0 = time.time()
    if source == "site-packages":
        source = str(_site_packages_corpus(work / "corpus.jsonl", 5 * spec["max_tokens"]))
    corpus_s = time.time() - t0
    data_dir = work / f"data-{spec['tokenizer'].replace(':', '')}-{spec['max_tokens']}"
    meta = prepare_dataset(
        source,
        spec["tokenizer"],
        data_dir,
        val_fraction=spec["val_fraction"],
        max_tokens=spec["max_tokens"],
        progress=False,
    )
    splits = {k: v.get("tokens", 0) for k, v in meta.get("splits", {}).items()}
    return {
        "dir": str(data_dir),
        "source": spec["source"],
        "vocab_size": meta["vocab_size"],
        "tokens": splits,
        "corpus_s": round(corpus_s, 1),
        "prepare_s": round(time.time() - t0 - corpus_s, 1),
    }


def _site_packages_corpus(path: Path, max_bytes: int) -> Path:
    """A JSONL of the .py files under this Python's site-packages (sorted paths), up to `max_bytes` of text."""
    if path.exists():
        return path
    roots = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
    files = sorted(p for r in roots for p in Path(r).rglob("*.py") if "__pycache__" not in p.parts)
    used = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for p in files:
            try:
                text = p.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) < 200:
                continue
            f.write(json.dumps({"text": text}) + "\n")
            used += len(text)
            if used >= max_bytes:
                break
    tmp.replace(path)
    return path


def step_env(cfg: dict) -> dict:
    """What this machine is and whether the features the project relies on work here."""
    import torch.nn.functional as F

    from angpt.train.hardware import peak_for_device_name

    dev = torch.device(cfg["device"])
    env: dict[str, Any] = {"cpu_count": os.cpu_count(), "device": str(dev), **versions(dev)}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gb=round(props.total_memory / 1e9, 1),
            sms=props.multi_processor_count,
            cudnn=torch.backends.cudnn.version(),
            datasheet_bf16_tflops=(peak_for_device_name(props.name) or 0) / 1e12,
        )
    n = 8192 if dev.type == "cuda" else 256  # a CPU without bf16 instructions: 512 took 2.8 s of a rehearsal loan
    # four significant figures: a CPU without bf16 instructions runs bf16 matmuls at well under 0.05 TFLOP/s
    env["bf16_matmul_tflops"] = float(f"{_matmul_tflops(dev, torch.bfloat16, n):.4g}")
    env["fp32_matmul_tflops"] = float(f"{_matmul_tflops(dev, torch.float32, n // 2):.4g}")
    # the SDPA backends our attention call can take (flash for causal training on CUDA)
    q = torch.randn(2, 4, 256, 64, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        env[f"sdpa_{name.lower()}"] = _sdpa_works(name, q, F)
    if not cfg.get("compile_check", True):  # a CPU rehearsal: 20 s of compiling that tells nothing about a loan
        return env
    t0 = time.perf_counter()
    try:
        fn = torch.compile(lambda x: torch.nn.functional.silu(x) * x + 1.0)
        x = torch.randn(64, 64, device=dev)
        ok = bool(torch.allclose(fn(x), torch.nn.functional.silu(x) * x + 1.0, atol=1e-5))
        env["compile"] = "works" if ok else "wrong result"
    except Exception as e:  # noqa: BLE001 - the kit reports what is broken and goes on
        env["compile"] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    env["compile_s"] = round(time.perf_counter() - t0, 1)
    return env


def versions(dev: torch.device) -> dict[str, Any]:
    """What a loan's figures depend on, cheap to read: the GPU, its driver, torch, CUDA and cuDNN."""
    import subprocess

    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
        out["cudnn"] = torch.backends.cudnn.version()
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            out["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            out["driver"] = None
    else:
        out["cpu"] = platform.processor() or platform.machine()
    with contextlib.suppress(ImportError):
        import transformers

        out["transformers"] = transformers.__version__
    return out


def _matmul_tflops(dev: torch.device, dtype: torch.dtype, n: int, reps: int = 10) -> float:
    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(dev)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(dev)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def _sdpa_works(name: str, q: torch.Tensor, F) -> str:
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, name)):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return "works"
    except Exception as e:  # noqa: BLE001
        return f"no: {str(e).splitlines()[0][:120]}" if str(e) else f"no: {type(e).__name__}"


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step_speed(cfg: dict, res: Results, deadline: float) -> list[dict]:
    """`angpt bench step` at each shape: every arm in turns in one process, bf16, eager then compiled."""
    from angpt.bench.step import bench_step

    spec = cfg["speed"]
    out: list[dict] = res.data.setdefault("speed", [])  # a second call in one loan adds to the first's record
    for shape in spec["shapes"]:
        entry = {**shape, "arms": spec["arms"]}
        if time.time() > deadline:
            entry["status"] = "skipped: out of the step's time budget"
            out.append(entry)
            continue
        entry["status"] = "running"  # what a loan cut off here brings back
        out.append(entry)
        res.set("speed", out)
        t0 = time.time()
        try:
            rows = bench_step(
                spec["arms"],
                shape["preset"],
                batch_size=shape["batch"],
                seq_len=shape["seq_len"],
                dtype=cfg["dtype"],
                compile=shape["compile"],
                warmup=spec["warmup"],
                reps=spec["reps"],
                device=cfg["device"],
                profile_steps=spec.get("profile_steps", 0),  # the top kernels' table, for a target missed
            )
            entry["rows"] = [vars(r) for r in rows]
            entry["status"] = "done"
        except Exception as e:  # noqa: BLE001 - one shape failing (out of memory, say) leaves the others
            entry["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            entry["traceback"] = traceback.format_exc(limit=4)[-1500:]
        entry["seconds"] = round(time.time() - t0, 1)
        if cfg["device"] == "cuda":
            entry["max_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        res.set("speed", out)
    return out


def next_run_fits(times: list[float], steps: int, left: float) -> bool:
    """Whether step_sweep starts its next run with `left` seconds of its budget: while half a run at the slowest step
    time measured so far fits (a run that diverges stops early; the deadline cuts one that runs long)."""
    return left > 0 and (max(times) if times else 0.0) * steps * 0.5 <= left


def sweep_run(entry: list) -> tuple[str, float, int]:
    """(arm, lr, seed) of a sweep run written [arm, lr] or [arm, lr, seed] in the settings (seed 0 by default)."""
    if not 2 <= len(entry) <= 3:
        raise ValueError(f"a sweep run is [arm, lr] or [arm, lr, seed], not {entry!r}")
    return str(entry[0]), float(entry[1]), int(entry[2]) if len(entry) == 3 else 0


def sweep_one(cfg: dict, spec: dict, data: dict, arm: str, lr: float, seed: int, deadline: float, publish=None) -> dict:
    """One run of a first-steps sweep (`spec`: the sweep's shape) at `seed`, which fixes the initialisation and
    the data order as a run's seed does in `angpt train`; `publish(run)` after every step."""
    from angpt.bench.firststeps import first_steps
    from angpt.data import TokenLoader
    from angpt.train.loop import SIDE_SEED

    T, micro = spec["seq_len"], spec["micro_batch"]
    accum = spec["batch_tokens"] // (T * micro)
    if accum * T * micro != spec["batch_tokens"]:
        raise ValueError(f"batch_tokens {spec['batch_tokens']} is not a multiple of seq_len x micro_batch")
    probe, _ = TokenLoader(data["dir"], "val", spec["probe_batch"], T, seed=0).next_batch()
    loader = TokenLoader(data["dir"], "train", micro, T, seed=seed)
    side = TokenLoader(data["dir"], "train", micro, T, seed=seed + SIDE_SEED)  # nu_att calibrated's batches
    run = first_steps(
        arm,
        spec["preset"],
        lr,
        spec["steps"],
        loader.next_batch,
        probe,
        batch_tokens=spec["batch_tokens"],
        accum=accum,
        device=cfg["device"],
        dtype=cfg["dtype"],
        seed=seed,
        stop_factor=spec["stop_factor"],
        deadline=deadline,
        on_step=publish,
        max_steps=spec.get("schedule_steps"),  # the LR schedule's length (default: the steps run)
        side_batches=lambda n: [side.next_batch()[0] for _ in range(n)],
        vocab_size=data["vocab_size"],
        context_length=T,
        compile=bool(spec.get("compile", False)),
    )
    if cfg["device"] == "cuda":
        torch.cuda.empty_cache()
    return {**run.to_dict(), "seed": seed}


def step_sweep(cfg: dict, data: dict, res: Results, deadline: float) -> list[dict]:
    """The first steps of each (arm, lr, seed) at the paper's batch, in the settings' order, until the budget ends."""
    spec = cfg["sweep"]
    runs: list[dict] = []
    times: list[float] = []  # measured seconds per step, any arm: the next run's estimate
    for entry in spec["runs"]:
        arm, lr, seed = sweep_run(entry)
        if not next_run_fits(times, spec["steps"], deadline - time.time()):
            runs.append({"arm": arm, "lr": lr, "seed": seed, "status": "skipped: out of the step's time budget"})
            res.set("sweep", runs)
            continue
        slot = len(runs)
        runs.append({"arm": arm, "lr": lr, "seed": seed, "status": "starting"})

        def publish(run, slot=slot, seed=seed):
            runs[slot] = {**run.to_dict(), "seed": seed}
            res.set("sweep", runs)

        try:
            runs[slot] = sweep_one(cfg, spec, data, arm, lr, seed, deadline, publish)
            if runs[slot].get("step_time"):
                times.append(runs[slot]["step_time"])
        except Exception as e:  # noqa: BLE001
            runs[slot] = {"arm": arm, "lr": lr, "seed": seed, "status": f"failed: {type(e).__name__}: {str(e)[:300]}"}
            runs[slot]["traceback"] = traceback.format_exc(limit=4)[-1500:]
        res.set("sweep", runs)
    return runs


# ------------------------------------------------------------------------------------------------ plan
def measured_step_time(sw: dict, root: Path | None = None) -> tuple[float, str] | None:
    """(slowest seconds per step, where) that an earlier loan's sweep measured at this sweep's shape (preset, context,
    batch and micro-batch), from the newest `benchmarks/gpu-*/**/results.json` holding one; None if none does. The
    slowest, as step_sweep estimates with it; a measurement beats the estimate at an assumed MFU (35% gave 1.26
    s/step where the H200 took 2.1-2.3)."""
    shape = ("preset", "seq_len", "batch_tokens", "micro_batch")
    root = root or Path(__file__).resolve().parents[1]
    loaded = {}
    for path in sorted(root.glob("gpu-*/**/results.json")):
        with contextlib.suppress(OSError, ValueError):
            loaded[path] = json.loads(path.read_text())
    found = []
    for path, d in loaded.items():
        if [(d.get("settings") or {}).get("sweep", {}).get(k) for k in shape] != [sw.get(k) for k in shape]:
            continue
        times = [r["step_time"] for r in d.get("sweep") or [] if r.get("step_time")]
        # A run of some steps only has no env of its own: the device it recorded at start, else the loan folder's
        # first run, else the folder's name (gpu-DATE-GPU) names the GPU.
        loan = path.relative_to(root).parts[0]
        first = loaded.get(root / loan / "results.json", {})
        named = [e.get("gpu") for e in (d.get("env"), first.get("env")) if e] + [d.get("device"), first.get("device")]
        gpu = next((g for g in named if g), loan.split("-")[-1] if loan.count("-") >= 4 else "an unnamed GPU")
        if times:
            found.append((d.get("started", ""), max(times), f"{gpu} ({path.parent.relative_to(root.parent)})"))
    return max(found)[1:] if found else None


def sweep_fit(step_s: float, steps: int, runs: list, budget_s: float) -> tuple[list, list]:
    """(runs that start, runs skipped) of a sweep whose steps take `step_s`, none diverging, by step_sweep's rule."""
    left, times, started, skipped = float(budget_s), [], [], []
    for run in runs:
        if next_run_fits(times, steps, left):
            started.append(run)
            left -= step_s * steps
            times.append(step_s)
        else:
            skipped.append(run)
    return started, skipped


def plan(cfg: dict, gpu: str = "H100", mfu: float = 0.35) -> str:
    """The full run's cost on one `gpu` from the dry-run estimates (memory, step time at `mfu`), step by step."""
    from angpt.study.arms import parse_arm
    from angpt.train.config import load_run_config
    from angpt.train.dryrun import plan_run

    lines = [f"# GPU kit plan: one {gpu}, assumed MFU {mfu:.0%} (eager bf16), deadline {cfg['deadline_s']} s", ""]
    lines += ["| step | shape | arm | micro x accum | memory GB | s/step | runs x steps | est. s |", "|" + "---|" * 8]
    total = 0.0

    def estimate(arm, preset, T, micro, batch_tokens, **model):
        parsed = parse_arm(arm if arm != "qwen3" else "gpt+")
        over = {"arch": parsed.arch, "preset": preset, "train.seq_len": T, "train.micro_batch": micro}
        over.update({"train.batch_tokens": batch_tokens, "train.dtype": "bf16", "train.max_steps": 1})
        over.update({f"model.{k}": v for k, v in {**model, **parsed.model}.items()})
        return plan_run(load_run_config(None, over), gpus=1, gpu=gpu, mfu=mfu)

    sp = cfg.get("speed") or {"shapes": [], "arms": [], "budget_s": 0}  # a profile may run only some steps
    for shape in sp["shapes"]:
        for arm in sp["arms"]:
            T, b = shape["seq_len"], shape["batch"]
            r = estimate(arm, shape["preset"], T, b, T * b)
            n = sp["warmup"] + sp["reps"]
            s = n * r.step_time + (60.0 if shape["compile"] else 5.0)  # + compile, or build and first-call costs
            total += s
            lines.append(
                f"| speed | {shape['preset']} T={T}{' compiled' if shape['compile'] else ''} | {arm} | {b} x 1 | "
                f"{r.needed / 1e9:.1f} | {r.step_time:.2f} | {n} | {s:.0f} |"
            )
    sw = cfg["sweep"]
    accum = sw["batch_tokens"] // (sw["seq_len"] * sw["micro_batch"])
    sweep_s = 0.0
    for arm, lr, seed in map(sweep_run, sw["runs"]):
        r = estimate(arm, sw["preset"], sw["seq_len"], sw["micro_batch"], sw["batch_tokens"], vocab_size=8192)
        sweep_s += sw["steps"] * r.step_time
        lines.append(
            f"| sweep | {sw['preset']} T={sw['seq_len']}, {sw['batch_tokens']} tok/step | {arm} @ {lr:g}"
            f"{f' seed {seed}' if seed else ''} | "
            f"{sw['micro_batch']} x {accum} | {r.needed / 1e9:.1f} | {r.step_time:.2f} | 1 x {sw['steps']} | "
            f"{sw['steps'] * r.step_time:.0f} |"
        )
    lines += [
        "",
        f"- data: ~{cfg['data']['max_tokens'] / 1e6:.0f}M tokens ({cfg['data']['tokenizer']}), budgeted ~120 s",
        f"- speed: {total:.0f} s estimated, capped at its budget {sp['budget_s']} s",
        f"- sweep: {sweep_s:.0f} s if no run diverges, capped at its budget {sw['budget_s']} s (the tail is cut)",
    ]
    measured = measured_step_time(sw)
    if measured is not None and sw["runs"]:
        step_s, where = measured
        started, skipped = sweep_fit(step_s, sw["steps"], sw["runs"], sw["budget_s"])
        names = ", ".join(f"{arm} @ {lr:g}" for arm, lr, _ in map(sweep_run, skipped))
        lines.append(
            f"- sweep, measured: {step_s:.2f} s/step at this shape on {where}: {len(sw['runs'])} runs need "
            f"{step_s * sw['steps'] * len(sw['runs']):.0f} s; within {sw['budget_s']} s, {len(started)} start"
            + (f" and {names} {'is' if len(skipped) == 1 else 'are'} skipped" if skipped else " (all)")
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main
def load_settings(path: Path, profile: str) -> dict:
    from angpt.train.config import load_yaml

    tree = load_yaml(path.read_text())
    if profile not in tree:
        raise SystemExit(f"error: {path} has no profile {profile!r} (it has {', '.join(tree)})")
    return tree[profile]


def open_output(a: argparse.Namespace, profile: str, cfg: dict) -> tuple[Path, Path, Results]:
    """The output folder, the scratch folder (`--work`, else beside OUT) and the results record, with the device."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work) if a.work else out.resolve().parent / "gpu-kit-work"
    work.mkdir(parents=True, exist_ok=True)
    res = Results(out, profile, cfg)
    res.set("device", torch.cuda.get_device_name(0) if cfg["device"] == "cuda" and torch.cuda.is_available() else "cpu")
    return out, work, res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="the output folder (results.json, report.md, plots)")
    p.add_argument("--smoke", action="store_true", help="the smoke profile: tiny shapes on the CPU, ~1 minute")
    p.add_argument("--profile", default=None, help="a profile of the settings file (default: full, or smoke)")
    p.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps (default: {','.join(STEPS)})")
    p.add_argument("--settings", default=str(HERE / "settings.yaml"))
    p.add_argument("--work", default=None, help="scratch folder for data and runs (default: OUT/../gpu-kit-work)")
    p.add_argument("--plan", action="store_true", help="print the full run's estimated cost on one H100 and exit")
    p.add_argument("--loan", action="store_true", help="run the next block of the race (profile loan; issue 45)")
    p.add_argument(
        "--race-root",
        default=None,
        help="the earlier loans' folders (--loan; default: benchmarks/gpu-race for a GPU's loan, none for a rehearsal "
        "on the CPU, whose tiny race is not the race those loans ran)",
    )
    p.add_argument(
        "--store",
        default=None,
        help="the race's run store (--loan; default: benchmarks/gpu-race/store for a GPU's loan, none on the CPU)",
    )
    p.add_argument("--take", default=None, metavar="OUT", help="--loan: a loan's OUT (runs.tar.gz) into the store")
    p.add_argument("--pieces", type=int, default=None, help="--loan: start at most this many pieces (rehearsals)")
    p.add_argument(
        "--deadline", type=float, default=None, metavar="SECONDS", help="--loan: the profile's deadline_s, replaced"
    )
    p.add_argument("--json", action="store_true", help="--plan --loan: the next loan as JSON")
    p.add_argument(
        "--corpus-root",
        default=None,
        help="--loan: make the race's corpus from this folder's text files instead of the machine's (your own text, "
        "or a rehearsal's)",
    )
    p.add_argument(
        "--kill-after-runs",
        type=int,
        default=None,
        help="--loan rehearsal: kill the loan (SIGKILL) as its command's limit would, once N race runs have ended "
        "(the runs of the race piece then running that ended are brought back)",
    )
    a = p.parse_args(argv)
    defaults = {(False, False): "full", (True, False): "smoke", (False, True): "loan", (True, True): "loan-smoke"}
    profile = a.profile or defaults[(a.smoke, a.loan)]
    cfg = load_settings(Path(a.settings), profile)
    if a.deadline is not None:
        cfg["deadline_s"] = a.deadline
    if a.loan or a.take or "race" in cfg:  # a loan profile, however named
        return main_loan(a, profile, cfg)
    if a.plan:
        print(plan(cfg))
        return 0
    if not a.out:
        p.error("OUT is required (except with --plan)")
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(STEPS))
    if unknown:
        p.error(f"unknown step(s) {', '.join(unknown)}; use {', '.join(STEPS)}")
    if cfg["device"] == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; run with --smoke on a CPU", file=sys.stderr)
        return 2
    out, work, res = open_output(a, profile, cfg)
    deadline = res.started + cfg["deadline_s"]
    torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 paths (constants, norms) as a GPU user runs them
    data = None

    def run_step(name, fn):
        t0 = time.time()
        print(f"[{res.elapsed():6.0f} s] {name} ...", flush=True)
        try:
            value = fn()
            res.mark(name, "done", time.time() - t0)
            print(f"[{res.elapsed():6.0f} s] {name} done in {time.time() - t0:.0f} s", flush=True)
            return value
        except Exception as e:  # noqa: BLE001 - a failed step is reported; the next ones still run
            traceback.print_exc()
            res.mark(name, "failed", time.time() - t0, f"{type(e).__name__}: {str(e)[:500]}")
            return None

    need_data = any(s in only for s in ("data", "sweep"))
    if need_data:
        data = run_step("data", lambda: step_data(cfg, work, res))
        if data is not None:
            res.set("data", data)
    if "env" in only:
        env = run_step("env", lambda: step_env(cfg))
        if env is not None:
            res.set("env", env)
    if "speed" in only:
        run_step("speed", lambda: step_speed(cfg, res, time.time() + cfg["speed"]["budget_s"]))
    if "sweep" in only and data is not None:
        end = min(deadline, time.time() + cfg["sweep"]["budget_s"])
        run_step("sweep", lambda: step_sweep(cfg, data, res, end))
    try:
        from report import plots

        res.set("plots", plots(res.data, out))
    except Exception as e:  # noqa: BLE001 - no matplotlib, say: the report and JSON stand without plots
        res.set("plots", f"failed: {type(e).__name__}: {e}")
    res.write()
    print(f"[{res.elapsed():6.0f} s] kit finished: {out / 'report.md'}", flush=True)
    failed = [t["step"] for t in res.data["timeline"] if t["status"] == "failed"]
    return 1 if failed else 0


def main_loan(a: argparse.Namespace, profile: str, cfg: dict) -> int:
    """`--loan`: the race's next block (benchmarks/gpu/loan.py), or with --plan what it would be, or with --take a
    loan's runs into the race's store."""
    import loan as race

    store = Path(a.store) if a.store else (race.STORE if cfg.get("device") == "cuda" else None)
    root = Path(a.race_root) if a.race_root else (race.LOANS if cfg.get("device") == "cuda" else None)
    loans = race.load_loans(root) if root is not None and root.is_dir() else []
    if a.take:
        return take(Path(a.take), cfg, store, root)
    if a.plan:
        if store is None or not (store / "plan.json").is_file():
            print(f"error: no race store at {store}: --plan reads one (--store DIR)", file=sys.stderr)
            return 2
        got = race.simulate(cfg, store, loans, race.store_records(store))
        print(json.dumps(got, indent=1) if a.json else race.describe(got))
        return 0
    if not a.out:
        print("error: OUT is required (except with --plan)", file=sys.stderr)
        return 2
    if cfg["device"] == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; rehearse with --loan --smoke on a CPU", file=sys.stderr)
        return 2
    if cfg.get("device") == "cuda" and hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        # a compiled forward past Dynamo's recompile limit would run eagerly without a word and be timed as compiled
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    out, work, res = open_output(a, profile, cfg)
    res.set("versions", versions(torch.device(cfg["device"])))
    res.set("earlier_loans", [x["loan"] for x in loans])
    torch.backends.cuda.matmul.allow_tf32 = True
    clock = time.time
    loan = race.Loan(cfg, deadline=res.started + cfg["deadline_s"], clock=clock)
    t0 = time.time()
    res.set("env", step_env(cfg))
    res.mark("env", "done", time.time() - t0)
    here = work / "store"  # the race's store, copied: the loan adds to it; OUT/runs.tar.gz brings its runs back
    shutil.rmtree(here, ignore_errors=True)
    if store is not None and store.is_dir():
        shutil.copytree(store, here, ignore=shutil.ignore_patterns("*.png", "report.*"))
    before = {p.parent for p in here.glob("runs/**/result.json")}
    state: dict[str, Any] = {}

    def make_data() -> None:
        from corpus import prepare_race_data

        roots = [("corpus-root", Path(a.corpus_root).resolve())] if a.corpus_root else None
        data = prepare_race_data(cfg["corpus"], work, cfg.get("workers", os.cpu_count() or 1), roots=roots)
        state["data"], state["fingerprint"] = data, race.data_fingerprint(data, cfg["corpus"]["tokenizer"])
        res.set("data", data)
        res.mark("data", "done", data["seconds"])
        stored = (here / "plan.json").is_file() and json.loads((here / "plan.json").read_text())
        if stored and stored.get("data_fingerprint") != state["fingerprint"]:  # another image: other tokens
            there = stored["data_fingerprint"].get("digest")
            res.set("store_note", f"this machine's corpus ({state['fingerprint']['digest']}) is not the store's "
                                  f"({there}): the race starts again in a store of its own")  # fmt: skip
            shutil.rmtree(here)

    plans: dict[tuple, Any] = {}

    def plan_for(arms: list[str], seeds: list[int]):
        key = (tuple(arms), tuple(seeds))
        if key not in plans:
            plans[key] = race.race_plan(cfg, state["data"]["dir"], state["fingerprint"], arms, seeds)
        return plans[key]

    def known(spec):
        from angpt.study.store import load_record

        race_cfg = cfg["race"]
        plan = plan_for([*race_cfg["arms"], *race_cfg.get("extra_arms", [])], race_cfg["seeds"])
        return load_record(spec.run_dir(plan, here), plan.steps(spec.budget))

    def brought_back(spec=None, record=None) -> None:
        """Each run's folder packed as it ends: a loan cut by its command's limit brings back every run it ended."""
        runs = bundle(here, before, out / "runs.tar.gz")
        if spec is not None:
            peak = 1e12 * float((res.data.get("env") or {}).get("datasheet_bf16_tflops") or 0) or None
            row = race_run_times(cfg, spec, record, costs.flops(spec.arm), peak)
            res.data.setdefault("race_runs", []).append(row)
        res.set("runs", runs)
        if a.kill_after_runs is not None and len(runs) >= a.kill_after_runs:
            os.kill(os.getpid(), signal.SIGKILL)  # a rehearsal of the command's limit

    def race_piece(plan, ex) -> None:
        from angpt.errors import DeadlineReached
        from angpt.study.comparison.run import run_comparison

        ex.after = brought_back
        with contextlib.suppress(DeadlineReached):
            run_comparison(plan, here, executor=ex, progress=False, command="benchmarks/gpu/kit.py --loan")

    def screen_piece(run) -> dict:
        data = state["data"]
        got = sweep_one(cfg, cfg["screen"], data, run.arm, run.lr, run.seed, loan.deadline - race.RESERVE_S)
        return {"runs": [got]}

    def speed_piece(shape: dict) -> dict:
        step_speed({**cfg, "speed": {**cfg["speed"], "shapes": [shape]}}, res, time.time() + cfg["speed"]["budget_s"])
        return {"speed": res.data["speed"][-1]}

    def publish() -> None:
        res.set("pieces", loan.record)

    make_data()
    if not (here / "plan.json").is_file():  # a new race (or a new image's): its plan, for the estimates to read
        from angpt.study.store import write_json

        here.mkdir(parents=True, exist_ok=True)
        first = cfg["race"]["seeds"][: cfg["race"]["seeds_before_screen"]]
        write_json(here / "plan.json", plan_for(cfg["race"]["arms"], first).to_dict())
    costs = race.Costs(cfg, loans, race.store_records(here))
    res.set("plan", race.describe(race.simulate(cfg, here, loans, race.store_records(here), later=0)))
    print(res.data["plan"], flush=True)
    race.run_loan(loan, costs, plan_for, known, loans, race=race_piece, screen=screen_piece, speed=speed_piece,
                  make_data=lambda: None, publish=publish, max_pieces=a.pieces)  # fmt: skip
    res.set("runs", bundle(here, before, out / "runs.tar.gz"))
    res.write()
    print(f"[{res.elapsed():6.0f} s] loan finished: {out / 'report.md'}", flush=True)
    return 0


def race_run_times(cfg: dict, spec, record: dict, flops_per_token: float, peak: float | None) -> dict:
    """What the loan's own report keeps of a race run: its times and MFU against the datasheet's `peak` (its losses
    and verdicts are the race report's)."""
    step = record.get("step_time_median")
    out = {"name": spec.name(), "status": record.get("status"), "step_time": step, "wall_s": record.get("wall_s"),
           "first_step_s": record.get("first_step_s"), "model_reused": record.get("model_reused")}  # fmt: skip
    if step and peak:
        out["mfu_datasheet"] = round(flops_per_token * cfg["race"]["batch_tokens"] / step / peak, 4)
    return out


def bundle(store: Path, before: set[Path], path: Path) -> list[str]:
    """The store's run folders this loan added (each run's result, metrics and config; no checkpoint), with the plan,
    as one tar.gz at `path` (what a loan brings back: at most 8 files); returns their names."""
    import tarfile

    new = sorted(p.parent for p in store.glob("runs/**/result.json") if p.parent not in before)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for folder in new:
            for f in sorted(folder.iterdir()):
                if f.is_file() and f.suffix != ".png":  # the loss curve: the report draws its own
                    tar.add(f, arcname=str(f.relative_to(store)))
        if (store / "plan.json").is_file():
            tar.add(store / "plan.json", arcname="plan.json")
    tmp.replace(path)
    return [str(p.relative_to(store)) for p in new]


def take(out: Path, cfg: dict, store: Path | None, root: Path | None) -> int:
    """`--take OUT`: a loan's runs (OUT/runs.tar.gz) into the race's store, never over a run it holds; its record
    (results.json, report.md, kit.log) into ROOT/<date>-<gpu>/; then the race's report, written by the study engine
    from the store (loan.write_race_report)."""
    import tarfile

    import loan as race

    if store is None or root is None:
        print("error: --take needs --store and --race-root (or a cuda profile's defaults)", file=sys.stderr)
        return 2
    record = out / "results.json"
    if not record.is_file() or not (out / "runs.tar.gz").is_file():
        print(f"error: {out} holds no loan (results.json and runs.tar.gz)", file=sys.stderr)
        return 2
    d = json.loads(record.read_text())
    gpu = str((d.get("env") or {}).get("gpu") or d.get("device") or "cpu").split()[-1]
    folder = root / f"{d['started'][:10]}-{gpu}"
    if folder.exists():
        print(f"error: {folder} exists: the loan was taken already (another of that day: rename it)", file=sys.stderr)
        return 2
    with tarfile.open(out / "runs.tar.gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        unsafe = [m.name for m in members if m.name.startswith("/") or ".." in Path(m.name).parts]
        if unsafe or not all(m.name == "plan.json" or m.name.startswith("runs/") for m in members):
            print(f"error: {out / 'runs.tar.gz'} holds files outside a store's runs: nothing taken", file=sys.stderr)
            return 2
        plan = json.loads(tar.extractfile("plan.json").read()) if "plan.json" in tar.getnames() else {}
        mine = (plan.get("data_fingerprint") or {}).get("digest")
        if (store / "plan.json").is_file() and race.store_digest(store) != mine:  # another image: its own store
            store = store.parent / f"store-{mine}"
        members = [m for m in members if m.name != "plan.json"]
        clash = [m.name for m in members if m.name.endswith("result.json") and (store / m.name).is_file()]
        if clash:
            print(f"error: the store holds {clash[0]} already: nothing taken", file=sys.stderr)
            return 2
        store.mkdir(parents=True, exist_ok=True)
        for m in members:
            tar.extract(m, store)
        if not (store / "plan.json").is_file():
            tar.extract("plan.json", store)
    folder.mkdir(parents=True)
    for name in ("results.json", "report.md", "kit.log"):
        if (out / name).is_file():
            shutil.copy(out / name, folder / name)
    print(race.write_race_report(cfg, store))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
