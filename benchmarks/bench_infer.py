"""Inference speed: folded anGPT and nGPT against GPT+ at the same shape, and angpt's `generate` against
transformers' `.generate()` on the exported checkpoints.

    python benchmarks/bench_infer.py                      # demo preset and the GPT-2 small shape (V=4096)
    python benchmarks/bench_infer.py --shapes demo --reps 5 --threads 2

Prefill: one forward over a [batch, prompt_len] prompt into an empty KV cache. Decode: `new_tokens` single-token
steps through the cache after that prefill. Both use the model's own forward (greedy next token). Arms are run
interleaved (GPT+, nGPT, anGPT, GPT+, ...) so that drift in the machine's speed hits all alike; each figure is
the median over `reps`, and ratios are throughput relative to GPT+ (above 1 = faster than GPT+).
Weights are random (speed does not depend on them); all in fp32.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

import angpt  # noqa: E402
from angpt.infer import generate  # noqa: E402

SHAPES = {
    "demo": ("demo", {}),
    # GPT-2 small's body (12 x 768, 12 heads) with a small vocabulary, so that CPU time goes to the blocks
    "gpt2-small-v4k": ("gpt2-small", {"vocab_size": 4096}),
}
ARMS = [("gpt+", "GPT+"), ("ngpt", "nGPT (folded)"), ("angpt", "anGPT (folded)"), ("angpt-train", "anGPT (unfolded)")]


def build_arms(shape: str, arms: list[str]) -> list[tuple[str, torch.nn.Module]]:
    preset, overrides = SHAPES[shape]
    out = []
    for key, label in ARMS:
        if key not in arms:
            continue
        torch.manual_seed(0)
        arch = "angpt" if key == "angpt-train" else key
        model = angpt.build_model(arch, preset, **overrides).eval()
        out.append((label, model if key == "angpt-train" else angpt.fold_for_inference(model)))
    return out


@torch.inference_mode()
def time_prefill_decode(model, prompt: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(prefill seconds, decode seconds for new_tokens steps)."""
    cache = model.make_cache(prompt.shape[0], prompt.shape[1] + new_tokens)
    t0 = time.perf_counter()
    logits, _ = model(prompt, cache=cache)
    t1 = time.perf_counter()
    tok = logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(new_tokens):
        logits, _ = model(tok, cache=cache)
        tok = logits[:, -1].argmax(-1, keepdim=True)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def bench_model_speed(shape: str, arms: list[str], args) -> list[str]:
    runs = build_arms(shape, arms)
    vocab = runs[0][1].config.vocab_size
    prompt = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    times = {label: ([], []) for label, _ in runs}
    for rep in range(args.warmup + args.reps):
        for label, model in runs:
            p, d = time_prefill_decode(model, prompt, args.new_tokens)
            if rep >= args.warmup:
                times[label][0].append(p)
                times[label][1].append(d)
    rows = []
    base_p = base_d = None
    for label, model in runs:
        p, d = statistics.median(times[label][0]), statistics.median(times[label][1])
        pre, dec = args.batch * args.prompt_len / p, args.batch * args.new_tokens / d
        base_p, base_d = base_p or pre, base_d or dec
        params = model.num_params(embeddings=False) / 1e6
        rows.append(
            f"| {shape} | {label} | {params:.1f}M | {pre:,.0f} | {pre / base_p:.3f} | {dec:,.1f} | {dec / base_d:.3f} |"
        )
    return rows


def bench_vs_transformers(shape: str, args) -> list[str]:
    """Greedy generation: angpt `generate` (KV cache) vs transformers `.generate()` on the exported model."""
    import transformers

    from angpt.hf.export import export_hf

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    rows = []
    preset, overrides = SHAPES[shape]
    for arch, label in [("gpt+", "GPT+ -> Qwen3ForCausalLM"), ("angpt", "anGPT -> AngptFoldedForCausalLM")]:
        torch.manual_seed(0)
        model = angpt.build_model(arch, preset, **overrides).eval()
        ours = angpt.fold_for_inference(model)
        with tempfile.TemporaryDirectory() as tmp:
            hf = transformers.AutoModelForCausalLM.from_pretrained(export_hf(model, Path(tmp) / "m")).eval()
        prompt = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len))
        n = args.new_tokens
        t_ours, t_hf = [], []
        for rep in range(args.warmup + args.reps):
            t0 = time.perf_counter()
            a = generate(ours, prompt, max_new_tokens=n, temperature=0)
            t1 = time.perf_counter()
            with torch.inference_mode():
                b = hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
            t2 = time.perf_counter()
            if rep >= args.warmup:
                t_ours.append(t1 - t0)
                t_hf.append(t2 - t1)
        same = "yes" if torch.equal(a, b) else "no"
        ours_tps = args.batch * n / statistics.median(t_ours)
        hf_tps = args.batch * n / statistics.median(t_hf)
        rows.append(f"| {shape} | {label} | {ours_tps:,.1f} | {hf_tps:,.1f} | {ours_tps / hf_tps:.3f} | {same} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="demo,gpt2-small-v4k", help=f"comma-separated: {', '.join(SHAPES)}")
    p.add_argument("--arms", default="gpt+,ngpt,angpt,angpt-train")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--skip-hf", action="store_true", help="skip the transformers .generate() comparison")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [s for s in args.shapes.split(",") if s]
    arms = [a for a in args.arms.split(",") if a]
    print(
        f"# inference benchmark: batch={args.batch} prompt={args.prompt_len} new={args.new_tokens} "
        f"reps={args.reps} (median) fp32 torch={torch.__version__} threads={torch.get_num_threads()} "
        f"cpu={platform.processor() or platform.machine()} cores={os.cpu_count()}"
    )
    print()
    print("| shape | model | non-emb params | prefill tok/s | vs GPT+ | decode tok/s | vs GPT+ |")
    print("|---|---|---|---|---|---|---|")
    for shape in shapes:
        for row in bench_model_speed(shape, arms, args):
            print(row, flush=True)
    if not args.skip_hf:
        print()
        print("| shape | export | angpt generate tok/s | HF .generate() tok/s | angpt / HF | same tokens |")
        print("|---|---|---|---|---|---|")
        for shape in shapes:
            for row in bench_vs_transformers(shape, args):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
