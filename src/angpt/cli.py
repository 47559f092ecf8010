"""The `angpt` command: one entry point, one verb per job, each a thin layer over a library function."""

from __future__ import annotations

import argparse
import json
import sys

from angpt.errors import UserError


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


# -------------------------------------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    from angpt.models import ARCHS, PRESETS, build_model, describe_constants, make_config

    if args.preset is None:
        print("presets:")
        for name in PRESETS:
            cfg = make_config("gpt+", name)
            params = build_model("gpt+", name).num_params() if name in ("tiny", "demo") else None
            shape = f"L={cfg.n_layers} d={cfg.d_model} H={cfg.n_heads} T={cfg.context_length} V={cfg.vocab_size}"
            size = f"  ({params / 1e6:.1f}M params with GPT+)" if params else ""
            print(f"  {name:<11} {shape}{size}")
        print(f"architectures: {', '.join(ARCHS)}")
        print("constants: angpt info --arch angpt --preset demo")
        return 0
    cfg = make_config(args.arch, args.preset, **_parse_overrides(args.set or []))
    print(json.dumps({"config": cfg.to_dict(), "constants": describe_constants(cfg)}, indent=2, default=str))
    return 0


def _parse_overrides(items: list[str]) -> dict:
    """KEY=VALUE pairs, values parsed as YAML scalars (numbers, booleans, null, strings)."""
    import yaml

    out = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


# ------------------------------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    import platform

    import torch

    from angpt.bench.step import bench_step, format_table

    if args.what != "step":
        raise UserError(f"unknown benchmark {args.what!r}; use: step")
    rows = bench_step(
        _csv(args.arch),
        args.preset,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        dtype=args.dtype,
        compile=args.compile,
        warmup=args.warmup,
        reps=args.reps,
        device=args.device,
    )
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else platform.processor()
    print(
        f"# step benchmark: preset={args.preset} batch={args.batch_size} dtype={args.dtype} compile={args.compile} "
        f"reps={args.reps} torch={torch.__version__} device={dev or 'cpu'} threads={torch.get_num_threads()}"
    )
    print(format_table(rows))
    return 0


# -------------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="angpt", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("info", help="presets, a resolved config and its constants")
    s.add_argument("--arch", default="angpt")
    s.add_argument("--preset", default=None)
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. --set nu_att=sqrt_pos")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("bench", help="side-by-side benchmarks (step: training step and folded inference)")
    s.add_argument("what", choices=["step"])
    s.add_argument("--arch", default="gpt+,ngpt,angpt", help="comma-separated; ratios are against the first")
    s.add_argument("--preset", default="demo")
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--seq-len", type=int, default=None)
    s.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    s.add_argument("--compile", action="store_true")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--reps", type=int, default=10)
    s.add_argument("--device", default=None)
    s.set_defaults(func=cmd_bench)

    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    args.extra = extra
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"angpt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"angpt {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
