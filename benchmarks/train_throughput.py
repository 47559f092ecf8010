"""Tokens/s of `angpt train` per architecture, and the data-loading share of the step time.

Runs short training runs of each architecture in turn, for `--rounds` rounds (A, B, C, A, B, C, ...), on a
prepared dataset, and reports the median over all rounds of each run's median step time. Usage:

    python benchmarks/train_throughput.py --data data/stdlib-bpe4096 [--preset demo] [--steps 12] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from angpt.train.config import load_run_config
from angpt.train.loop import train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--preset", default="demo")
    p.add_argument("--arch", default="gpt+,ngpt,angpt")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--compile", action="store_true")
    args = p.parse_args()
    archs = args.arch.split(",")
    step_times: dict[str, list[float]] = {a: [] for a in archs}
    data_share: dict[str, list[float]] = {a: [] for a in archs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arch in archs:
                out = Path(tmp) / f"{arch}-{r}"
                cfg = load_run_config(
                    None,
                    [
                        ("arch", arch),
                        ("preset", args.preset),
                        ("data", args.data),
                        ("out", str(out)),
                        ("train.max_steps", args.steps),
                        ("train.batch_tokens", args.batch_tokens),
                        ("train.micro_batch", args.micro_batch),
                        ("train.eval_every", 0),
                        ("train.save_every", 0),
                        ("train.log_every", 1),
                        ("train.progress", False),
                        ("train.tensorboard", False),
                        ("train.dtype", args.dtype),
                        ("train.compile", args.compile),
                        ("train.eval_batches", 1),
                    ],
                )
                train(cfg)
                rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][2:]
                step_times[arch].append(statistics.median(r["step_time"] for r in rows))
                data_share[arch].append(statistics.median(r["data_time"] / r["step_time"] for r in rows))
    base = statistics.median(step_times[archs[0]])
    print(f"| arch | ms/step | tokens/s | ratio to {archs[0]} | data-loading share |")
    print("|---|---|---|---|---|")
    for a in archs:
        t = statistics.median(step_times[a])
        print(
            f"| {a} | {1e3 * t:.0f} | {args.batch_tokens / t:.0f} | {t / base:.3f} | "
            f"{100 * statistics.median(data_share[a]):.3f}% |"
        )


if __name__ == "__main__":
    main()
