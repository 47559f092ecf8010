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
        [--preset demo --tokens 64 --add 64 --stages 4 --steps 100 --batch-tokens 16384] \\
        [--set d_model=128 n_layers=4 n_heads=2 context_length=128] [--seeds 0,1,2]

With several `--seeds` both arms run once per seed (init and data order; stage s of seed k draws its data with
train.seed = 1000 k + s - 1) and the report ends with the paired t-test of grown - scratch final validation loss
over seeds (the statistics of `angpt compare`, docs/protocol.md#paired-statistics).

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
from angpt.stats import mean, paired_ttest, std
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
    """The model overrides of one size: `--set` plus the parameter tokens of every Pattention."""
    return {**args.model, "param_tokens": tokens, "d_ff": tokens * args.ffn_ratio}


def parse_set(items: list[str]) -> dict:
    """`--set KEY=VALUE ...` as model overrides (ints where they parse)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"grow_vs_scratch: --set takes KEY=VALUE, got {item!r}")
        key = key.removeprefix("model.")
        if key in ("param_tokens", "d_ff"):
            raise SystemExit("grow_vs_scratch: the Pattention sizes come from --tokens, --add and --ffn-ratio")
        try:
            out[key] = int(value)
        except ValueError:
            out[key] = value
    return out


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
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model overrides, e.g. d_model=128")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; both arms run at each")
    args = p.parse_args()
    args.model = parse_set(args.set)
    args.seeds = [int(x) for x in args.seeds.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    if out.exists():
        print(f"grow_vs_scratch: {out} exists; choose a new --out", file=sys.stderr)
        return 2
    meta = load_meta(args.data)

    rows = []
    for seed in args.seeds:
        rows += run_seed(args, out / f"seed{seed}" if len(args.seeds) > 1 else out, seed)

    train_tokens = meta.get("splits", {}).get("train", {}).get("tokens")
    report = render(args, rows, train_tokens)
    print(report)
    (out / "report.md").write_text(report + "\n")
    keys = ("seed", "arm", "stage", "model", "params_non_embedding", "steps", "tokens", "cumulative_flops", "val_loss")
    data = {"args": vars(args), "train_split_tokens": train_tokens, "rows": [dict(zip(keys, r)) for r in rows]}
    test = paired(rows)
    data["paired_grown_minus_scratch"] = test.to_dict() if test else None
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n")
    return 0


def run_seed(args, out: Path, seed: int) -> list[tuple]:
    """Both arms at one seed: the grown model's stages, then the final size from scratch at equal FLOPs."""
    rows, total_flops, init = [], 0.0, None
    for stage in range(1, args.stages + 1):
        tokens = args.tokens + (stage - 1) * args.add
        model = shape(args, tokens)
        result = run(args, out / "grown" / f"stage{stage}", 1000 * seed + stage - 1, args.steps, model, init)
        fpt, params = flops_and_params(args, model, _seq_len(result))
        total_flops += fpt * result.tokens
        rows.append((seed, "grown", stage, model, params, result.step, result.tokens, total_flops, result.val_loss))
        if stage < args.stages:
            init = grow_checkpoint(
                result.checkpoint, out / "grown" / f"stage{stage + 1}-init", args.add, freeze_old=args.freeze_old
            )

    final = shape(args, args.tokens + (args.stages - 1) * args.add)
    fpt, params = flops_and_params(args, final, _seq_len(result))
    steps = max(1, round(total_flops / (fpt * args.batch_tokens)))
    scratch = run(args, out / "scratch", 1000 * seed, steps, final)
    flops = fpt * scratch.tokens
    rows.append((seed, "scratch", 1, final, params, scratch.step, scratch.tokens, flops, scratch.val_loss))
    return rows


def finals(rows, arm: str) -> list[float]:
    """Each seed's final validation loss of one arm (the grown arm's last stage), in seed order."""
    last = {}
    for seed, arm_, _stage, *_, val in rows:
        if arm_ == arm:
            last[seed] = val  # stages come in order, so the last one wins
    return [last[k] for k in sorted(last)]


def paired(rows):
    """The paired t-test of grown - scratch final validation loss over seeds (None with one seed)."""
    return paired_ttest(finals(rows, "grown"), finals(rows, "scratch"))


def _seq_len(result) -> int:
    """The sequence length a run trained at (from its saved config)."""
    cfg = json.loads((result.out / "config.json").read_text())
    run = cfg["run"]  # the run's record: train.seq_len resolved, never None (issue 54)
    return run["train"]["seq_len"] or run["model"]["context_length"]


def render(args, rows, train_tokens) -> str:
    shape_note = ", ".join(f"{k}={v}" for k, v in args.model.items())
    lines = [
        f"# TokenFormer grown in {args.stages} stages vs from scratch (preset {args.preset}"
        f"{', ' + shape_note if shape_note else ''}, {args.batch_tokens} tokens/step, {args.steps} steps/stage"
        f"{', old tokens frozen' if args.freeze_old else ''})",
        "",
        "| seed | arm | stage | tokens (attn / ffn) | non-emb. params | steps | tokens seen | cumulative FLOPs "
        "| val loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for seed, arm, stage, model, params, steps, tokens, flops, val in rows:
        shape_ = f"{model['param_tokens']} / {model['d_ff']}"
        lines.append(
            f"| {seed} | {arm} | {stage} | {shape_} | {params / 1e6:.2f}M | {steps} | {tokens:,} | {flops:.3e} "
            f"| {val:.4f} |"
        )
    seen = max(sum(r[6] for r in rows if r[1] == "grown" and r[0] == s) for s in args.seeds)
    lines += ["", f"Training split: {train_tokens:,} tokens; the grown arm's stages saw {seen:,} per seed."]
    grown, scratch = finals(rows, "grown"), finals(rows, "scratch")
    if len(grown) > 1:
        lines.append(
            f"Final validation loss over {len(grown)} seeds: grown {mean(grown):.4f} +- {std(grown):.4f}, "
            f"scratch {mean(scratch):.4f} +- {std(scratch):.4f}."
        )
        test = paired(rows)
        if test is None:
            lines.append("Paired t-test: undefined (the differences do not vary).")
        else:
            lines.append(
                f"Paired difference grown - scratch: {test.mean_diff:+.4f} nats, 95% CI "
                f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}], p = {test.p:.3g} (t = {test.t:.2f}, df = {test.df:g})."
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
