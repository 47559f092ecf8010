"""A CPU stand-in for the GPU kit's first steps at the paper's batch: `gpt2-small` on the same kind of corpus.

    python benchmarks/paper_batch_proxy.py --out benchmarks/paper-batch-proxy-cpu --tokens 20000000 \\
        --seq 1024 --micro 4 --accum 16 --steps 3 angpt@2e-3 "angpt[nu_att=none]@2e-3"

The corpus is the GPU kit's (every `.py` file of this Python's site-packages, BPE-8192 trained on it, cut at
`--tokens`), made once in OUT/data. Each ARM@LR runs `--steps` optimizer steps of `--accum` micro-batches of
`--micro` x `--seq` tokens with angpt.bench.firststeps.first_steps (the trainer's step and recipe, fp32), and appends
its records (loss, pre-clip gradient norm, per-layer residual norms on a held-out probe) to OUT/runs.jsonl; the
one-line summary goes to stdout. On two CPU cores a 65K-token step at `gpt2-small` takes ~5 minutes: run it under
nohup. It asks whether a blow-up the GPU saw at 524K tokens per step appears at a batch a CPU can afford.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import torch

from angpt.bench.firststeps import first_steps
from angpt.data import TokenLoader, prepare_dataset

HERE = Path(__file__).resolve().parent


def site_packages_data(out: Path, tokens: int) -> Path:
    """OUT/data: the GPU kit's site-packages corpus at `tokens` tokens, BPE-8192 (made once)."""
    data = out / "data"
    if not (data / "meta.json").exists():
        spec = importlib.util.spec_from_file_location("kit", HERE / "gpu" / "kit.py")
        kit = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kit)
        corpus = kit._site_packages_corpus(out / "corpus.jsonl", 5 * tokens)
        prepare_dataset(str(corpus), "bpe:8192", data, val_fraction=0.01, max_tokens=tokens, progress=False)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="ARM@LR, arms as angpt compare writes them: angpt[nu_att=none]@2e-3")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=20_000_000)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--accum", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    runs = [r.rsplit("@", 1) for r in args.runs]
    if any(len(r) != 2 for r in runs):
        p.error("each run is ARM@LR, e.g. angpt@2e-3")
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = site_packages_data(out, args.tokens)
    T, batch_tokens = args.seq, args.seq * args.micro * args.accum
    probe, _ = TokenLoader(data, "val", 2, T, seed=0).next_batch()
    for arm, lr in runs:
        loader = TokenLoader(data, "train", args.micro, T, seed=0)
        t0 = time.time()
        run = first_steps(
            arm, "gpt2-small", float(lr), args.steps, loader.next_batch, probe,
            batch_tokens=batch_tokens, accum=args.accum, stop_factor=3.0, vocab_size=8192, context_length=T,
        )  # fmt: skip
        d = run.to_dict()
        steps = [
            (r["step"], round(r["loss"], 3), round(r["grad_norm"], 2), round(max(r["residual_norms"]), 2))
            for r in d["records"]
        ]
        summary = {"arm": arm, "lr": lr, "T": T, "tokens": batch_tokens, "status": d["status"]}
        summary.update({"s": round(time.time() - t0), "steps (step, loss, grad, max ||h||)": steps})
        print(json.dumps(summary), flush=True)
        with (out / "runs.jsonl").open("a") as f:
            f.write(json.dumps({"T": T, "micro": args.micro, "accum": args.accum, **d}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
