"""A TokenFormer grown in stages against one trained from scratch at its final size, at equal training compute.

Grown arm: a TokenFormer with `--tokens` parameter tokens per attention Pattention (and `--ffn-ratio` times as many
per FFN Pattention) trains `--steps` steps; `angpt grow` appends `--add` tokens per attention Pattention (same
logits) and the grown model trains `--steps` more, for `--stages` stages in all (the paper's progressive scaling,
docs/architectures.md#progressive-growth). Each stage is its own run, with its own warm-up and cosine schedule, from
the previous stage's weights (`--init_from`), and draws its own data order (train.seed = stage index).

Scratch arm: the final-size model from a fresh init, for as many steps as give the same cumulative training FLOPs
(6N + 12LTd per token, `LanguageModel.flops_per_token`, summed over the grown arm's stages; rounded to whole steps;
with `--freeze-old` the frozen tokens' weight gradients are not computed, so the grown arm's count is an upper bound).

Both arms use the library's `train()` (the same TrainStep, evaluation and checkpoints as `angpt train`) and the
recipe's optimizer (AdamW, 1% warm-up, cosine); the final validation loss is measured on the same validation
batches. Prints a markdown table and writes OUT/report.md and OUT/report.json. Usage (a dataset from
`angpt prepare --source stdlib --tokenizer bpe:4096 --out data/stdlib-bpe4096`):

    python benchmarks/grow_vs_scratch.py --data data/stdlib-bpe4096 --out runs/grow-vs-scratch \\
        [--preset demo --tokens 64 --add 64 --stages 4 --steps 100 --batch-tokens 16384]

The defaults end at the demo preset's default TokenFormer (256 tokens per attention Pattention, 1024 per FFN: the
size of GPT+ at that preset). With a freshly drawn data order per stage, a window can recur across stages when the
training split is not much larger than the tokens of all stages together; the report gives both numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from angpt.data import load_meta
from angpt.models import build_model
from angpt.train.config import load_run_config
from angpt.train.grow import grow_checkpoint
from angpt.train.loop import train


def run(args, out: Path, seed: int, steps: int, model: dict, init_from: Path | None = None):
    """One `angpt train` run through the library; returns its TrainResult."""
    overrides = [
        ("arch", "tokenformer"),
        ("preset", args.preset),
        ("data", args.data),
        ("out", str(out)),
        ("train.max_steps", steps),
        ("train.batch_tokens", args.batch_tokens),
        ("train.micro_batch", args.micro_batch),
        ("train.seed", seed),
        ("train.eval_every", 0),  # the final step always evaluates
        ("train.eval_batches", args.eval_batches),
        ("train.save_every", 0),  # the final step always saves
        ("train.log_every", max(1, steps // 10)),
        ("train.dtype", args.dtype),
        ("train.device", args.device),
        ("train.progress", False),
        ("train.tensorboard", False),
    ]
    if args.lr is not None:
        overrides.append(("train.lr", args.lr))
    if init_from is not None:
        overrides.append(("init_from", str(init_from)))  # the model is the checkpoint's
    else:
        overrides += [(f"model.{k}", v) for k, v in model.items()]
    return train(load_run_config(None, overrides))


def shape(args, tokens: int) -> dict:
    return {"param_tokens": tokens, "d_ff": tokens * args.ffn_ratio}


def flops_and_params(args, model: dict, seq_len: int) -> tuple[float, int]:
    """Training FLOPs per token and non-embedding parameters of a TokenFormer of this shape (built on meta)."""
    vocab = -(-int(load_meta(args.data)["vocab_size"]) // 64) * 64  # as `angpt train` pads it
    with torch.device("meta"):
        m = build_model("tokenformer", args.preset, vocab_size=vocab, **model)
    return m.flops_per_token(seq_len), m.num_params(embeddings=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a dataset folder written by `angpt prepare`")
    p.add_argument("--out", required=True, help="a new folder for the runs and the report")
    p.add_argument("--preset", default="demo")
    p.add_argument("--tokens", type=int, default=64, help="parameter tokens per attention Pattention at stage 1")
    p.add_argument("--add", type=int, default=64, help="tokens appended per attention Pattention at each growth")
    p.add_argument("--ffn-ratio", type=int, default=4, help="FFN tokens per attention token (growth keeps it)")
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per stage")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--lr", type=float, default=None, help="peak LR of every run (default: the recipe's)")
    p.add_argument("--freeze-old", action="store_true", help="train only the new tokens after each growth")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if out.exists():
        print(f"grow_vs_scratch: {out} exists; choose a new --out", file=sys.stderr)
        return 2
    meta = load_meta(args.data)

    rows, total_flops, init = [], 0.0, None
    for stage in range(1, args.stages + 1):
        tokens = args.tokens + (stage - 1) * args.add
        model = shape(args, tokens)
        result = run(args, out / "grown" / f"stage{stage}", stage - 1, args.steps, model, init)
        fpt, params = flops_and_params(args, model, _seq_len(result))
        total_flops += fpt * result.tokens
        rows.append(("grown", stage, model, params, result.step, result.tokens, total_flops, result.val_loss))
        if stage < args.stages:
            init = grow_checkpoint(
                result.checkpoint, out / "grown" / f"stage{stage + 1}-init", args.add, freeze_old=args.freeze_old
            )

    final = shape(args, args.tokens + (args.stages - 1) * args.add)
    fpt, params = flops_and_params(args, final, _seq_len(result))
    steps = max(1, round(total_flops / (fpt * args.batch_tokens)))
    scratch = run(args, out / "scratch", 0, steps, final)
    rows.append(("scratch", 1, final, params, scratch.step, scratch.tokens, fpt * scratch.tokens, scratch.val_loss))

    train_tokens = meta.get("splits", {}).get("train", {}).get("tokens")
    report = render(args, rows, train_tokens)
    print(report)
    (out / "report.md").write_text(report + "\n")
    keys = ("arm", "stage", "model", "params_non_embedding", "steps", "tokens", "cumulative_flops", "val_loss")
    data = {"args": vars(args), "train_split_tokens": train_tokens, "rows": [dict(zip(keys, r)) for r in rows]}
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return 0


def _seq_len(result) -> int:
    """The sequence length a run trained at (from its saved config)."""
    cfg = json.loads((result.out / "config.json").read_text())
    return cfg["run"]["train"]["seq_len"] or cfg["model"]["context_length"]


def render(args, rows, train_tokens) -> str:
    lines = [
        f"# TokenFormer grown in {args.stages} stages vs from scratch (preset {args.preset}, "
        f"{args.batch_tokens} tokens/step, {args.steps} steps/stage{', old tokens frozen' if args.freeze_old else ''})",
        "",
        "| arm | stage | tokens (attn / ffn) | non-emb. params | steps | tokens seen | cumulative FLOPs | val loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, stage, model, params, steps, tokens, flops, val in rows:
        shape_ = f"{model['param_tokens']} / {model['d_ff']}"
        lines.append(
            f"| {arm} | {stage} | {shape_} | {params / 1e6:.2f}M | {steps} | {tokens:,} | {flops:.3e} | {val:.4f} |"
        )
    seen = sum(r[5] for r in rows if r[0] == "grown")
    lines += ["", f"Training split: {train_tokens:,} tokens; the grown arm's stages saw {seen:,} in all."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
