"""report.md and the plots of the GPU kit, rendered from its results.json (benchmarks/gpu/kit.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

BASELINE = "gpt+"


def _f(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return format(x, fmt) if isinstance(x, (int, float)) else str(x)


def render(d: dict) -> str:
    """The whole report from what results.json holds so far (a step not reached says so)."""
    out = [
        f"# GPU kit report ({d['profile']})",
        "",
        f"- started {d['started']}; {d.get('elapsed_s', 0):.0f} s so far; revision {d.get('revision', 'unknown')}",
        f"- command: `{d['command']}`",
        "",
        "| step | status | seconds | at |",
        "|---|---|---|---|",
    ]
    for t in d["timeline"]:
        status = t["status"] + (f" ({t['error'][:120]})" if t.get("error") else "")
        out.append(f"| {t['step']} | {status} | {t['seconds']:.0f} | {t['at']:.0f} |")
    out += ["", *_data(d.get("data")), *_env(d.get("env")), *_speed(d.get("speed"))]
    out += [*_sweep(d.get("sweep"), _train_tokens(d)), *_race(d.get("race"))]
    return "\n".join(out) + "\n"


def _data(data: dict | None) -> list[str]:
    if not data:
        return []
    tokens = ", ".join(f"{k} {v:,}" for k, v in data["tokens"].items())
    return ["## Data", "", f"{data['source']}, vocab {data['vocab_size']}: {tokens} tokens", ""]


def _env(env: dict | None) -> list[str]:
    if not env:
        return ["## 1. Environment", "", "not reached", ""]
    rows = [f"| {k} | {v} |" for k, v in env.items()]
    return ["## 1. Environment", "", "| what | value |", "|---|---|", *rows, ""]


def _speed(speed: list | None) -> list[str]:
    out = ["## 2. Step time and MFU (one process, arms in turns, medians)", ""]
    if not speed:
        return [*out, "not reached", ""]
    for shape in speed:
        title = f"{shape['preset']}, {shape['batch']} x {shape['seq_len']} tokens, compile={shape['compile']}"
        out.append(f"### {title}: {shape.get('status')} ({shape.get('seconds', '-')} s)")
        out.append("")
        rows = shape.get("rows")
        if not rows:
            out += [shape.get("traceback", "").strip().replace("\n", " / ")[-400:], ""]
            continue
        out += [
            "| arm | params | train ms | vs GPT+ | train TFLOP/s | of measured matmul peak | infer ms | vs GPT+ |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            out.append(
                f"| {r['arch']} | {r['params'] / 1e6:.0f}M | {r['train_ms']:.1f} | {r['train_ratio']:.3f} | "
                f"{r['train_flops'] / 1e12:.0f} | {100 * r['peak_fraction']:.0f}% | {r['infer_ms']:.1f} | "
                f"{r['infer_ratio']:.3f} |"
            )
        by = {r["arch"]: r for r in rows}
        if BASELINE in by and "qwen3" in by:
            ratio = by[BASELINE]["train_ms"] / by["qwen3"]["train_ms"]
            out += ["", f"- GPT+ (ours) / Qwen3 (transformers), training step: {ratio:.3f}x (target <= 0.80x)"]
        for arch, target in (("angpt", 0.95), ("ngpt", 1.00)):
            if arch in by and BASELINE in by:
                ratio = by[arch]["train_ms"] / by[BASELINE]["train_ms"]
                out.append(f"- {arch} / GPT+, training step: {ratio:.3f}x (target <= {target:.2f}x)")
        out.append("")
    return out


def max_residual(run: dict) -> float | None:
    """The largest per-layer residual norm seen in a run (None if none was recorded)."""
    norms = [max(r["residual_norms"]) for r in run.get("records", []) if r.get("residual_norms")]
    return max(norms) if norms else None


def _train_tokens(d: dict) -> int | None:
    """The training split's size in tokens, where the data step recorded it."""
    return ((d.get("data") or {}).get("tokens") or {}).get("train")


def _passes(sweep: list, train_tokens: int | None) -> float:
    """How many times the longest run of the sweep read the training split (0 where unknown)."""
    read = [len(r.get("records", [])) * r.get("batch_tokens", 0) for r in sweep]
    return max(read, default=0) / train_tokens if train_tokens else 0.0


def _sweep(sweep: list | None, train_tokens: int | None = None) -> list[str]:
    out = [
        "## 3. First steps at the paper's batch",
        "",
        "Stable: after step 5 the loss never exceeds 1.3x its running minimum and no pre-clip gradient norm exceeds "
        "100x the run's median. Final loss: the mean training loss of the last 10 steps.",
        "",
    ]
    if not sweep:
        return [*out, "not reached", ""]
    passes = _passes(sweep, train_tokens)
    if passes > 1:
        out[-2] += (
            f" The longest run read the {train_tokens / 1e6:.1f}M-token training split {passes:.1f} times, so its "
            "last steps saw windows it had trained on: a stability check, whose final loss is not comparable with "
            "a run on new tokens."
        )
    elif passes:
        out[-2] += " Each step's tokens are new to the model."
    out += [
        "| arm | lr | seed | status | steps | final loss | stable | worst loss / running min | worst grad / median "
        "| first spike | max residual norm | s/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sweep:
        st = run.get("stability", {})
        recs = run.get("records", [])
        out.append(
            f"| {run['arm']} | {run['lr']:g} | {run.get('seed', 0)} | {run['status']} | {len(recs)} | "
            f"{_f(run.get('final_loss'))} | "
            f"{_f(st.get('stable'))} | {_f(st.get('loss_ratio'), '.3g')} | {_f(st.get('grad_ratio'), '.3g')} | "
            f"{_f(st.get('first_spike'))} | {_f(max_residual(run), '.3g')} | {_f(run.get('step_time'), '.3g')} |"
        )
    return [*out, ""]


def _race(race: dict | None) -> list[str]:
    out = ["## 4. Race (same tokens, same order; each arm at its best stable rate of step 3)", ""]
    if not race:
        return [*out, "not reached", ""]
    for arm, why in race.get("skipped", {}).items():
        out.append(f"- {arm}: not raced ({why})")
    out += [
        "",
        "| arm | lr | why this rate | status | steps | final val loss | s/step |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in race.get("arms", []):
        out.append(
            f"| {a['arm']} | {a['lr']:g} | {a['why']} | {a.get('status')} | {a['steps']} | "
            f"{_f(a.get('val_loss'))} | {_f(a.get('step_time'), '.3g')} |"
        )
    return [*out, "", "A few hundred steps at most: a smoke test of training speed, not evidence.", ""]


def plots(d: dict, out: Path) -> list[str]:
    """sweep.png (loss and max residual norm per step) and race.png (val loss against tokens and time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    sweep = [r for r in d.get("sweep") or [] if r.get("records")]
    if sweep:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for run in sweep:
            label = f"{run['arm']} @ {run['lr']:g}" + (f" seed {run['seed']}" if run.get("seed") else "")
            steps = [r["step"] for r in run["records"]]
            ax1.plot(steps, [min(r["loss"], 1e4) for r in run["records"]], label=label)
            norms = [(r["step"], max(r["residual_norms"])) for r in run["records"] if r.get("residual_norms")]
            if norms:
                ax2.plot(*zip(*norms), label=label)
        ax1.set(xlabel="optimizer step", ylabel="training loss", yscale="log", title="loss (clipped at 1e4)")
        ax2.set(xlabel="optimizer step", ylabel="max over layers of ||h||", yscale="log", title="residual norm")
        ax1.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=110)
        plt.close(fig)
        written.append("sweep.png")
    race = [a for a in (d.get("race") or {}).get("arms", []) if a.get("curve")]
    if race:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for a in race:
            wall, pts = 0.0, []
            for r in a["curve"]:
                wall += r.get("step_time", 0.0)
                if "val_loss" in r:
                    pts.append((r["tokens"], wall, r["val_loss"]))
            if pts:
                label = f"{a['arm']} @ {a['lr']:g}"
                ax1.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
                ax2.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=label)
        ax1.set(xlabel="tokens", ylabel="validation loss", title="against tokens")
        ax2.set(xlabel="training seconds (sum of step times)", ylabel="validation loss", title="against time")
        ax1.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "race.png", dpi=110)
        plt.close(fig)
        written.append("race.png")
    return written
