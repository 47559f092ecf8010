"""The `angpt` command: one entry point, one verb per job, each a thin layer over a library function."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from angpt.errors import DeadlineReached, UserError
from angpt.invocation import invoked_as

# OpenMP threads that spin while they wait take the cores other work needs: passive waiting, set before torch loads
# (train/hardware.py, "a busy machine"); the user's OMP_WAIT_POLICY, where set, wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# what a command that reads a checkpoint takes (checkpoint.run_checkpoint)
RUN_HELP = "a checkpoint directory, or a run directory (its best checkpoint, lowest validation loss; else its latest)"


# -------------------------------------------------------------------------------------------------- info
def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from angpt.models import PRESETS, build_model, describe_constants, make_config, registry

    if args.preset is None and args.arch is None:
        print(f"presets (parameters of {registry.BASELINE}):")
        for name in PRESETS:
            cfg = make_config(registry.BASELINE, name)
            with torch.device("meta"):  # shapes only: no memory, so the largest presets count instantly
                params = build_model(registry.BASELINE, name).num_params()
            shape = f"L={cfg.n_layers} d={cfg.d_model} H={cfg.n_heads} T={cfg.context_length} V={cfg.vocab_size}"
            print(f"  {name:<11} {shape}  {params / 1e6:.1f}M")
        print("architectures:")
        for name, spec in registry.ARCHITECTURES.items():
            r = spec.recipe
            sizes = "; at " + ", ".join(f"{preset} {lr:g}" for preset, lr in r.lr_at.items()) if r.lr_at else ""
            print(f"  {name:<11} {spec.summary} [{r.optimizer}, lr {r.lr:g}{sizes}]")
        print("variants:")
        width = max(map(len, registry.VARIANTS))
        for name, (arch, overrides) in registry.VARIANTS.items():
            print(f"  {name:<{width}} {arch} with {', '.join(f'{k}={v}' for k, v in overrides.items())}")
        print("a config, its constants and parameters: angpt info --arch angpt [--preset demo]")
        return 0
    from angpt.models.laurel import laurel_params
    from angpt.train.config import TrainConfig

    arch, variant = registry.resolve_arm(args.arch or "angpt")  # an architecture, or a variant (ngpt_frozen_alpha)
    cfg = make_config(arch, args.preset or "demo", **{**variant, **_parse_overrides(args.set or [])})
    constants = describe_constants(cfg)  # first: Monte Carlo constants are computed (and cached) on the CPU
    with torch.device("meta"):  # shapes only
        model = build_model(cfg.arch, cfg)
    params = {"total": model.num_params(), "non_embedding": model.num_params(embeddings=False)}
    if cfg.laurel_parts:
        params["laurel"] = laurel_params(model)
    recipe = registry.get(arch).recipe.used(args.preset or "demo", TrainConfig())  # a run's where train.* is unset
    info = {"config": cfg.to_dict(), "constants": constants, "params": params, "recipe": recipe}
    print(json.dumps(info, indent=2, default=str))
    return 0


def _parse_overrides(items: list[str]) -> dict:
    """KEY=VALUE pairs, values parsed as YAML scalars (numbers, `4e-3` included, booleans, null, strings)."""
    from angpt.train.config import parse_value

    out = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        out[key.strip()] = parse_value(f"model.{key.strip()}", value)
    return out


# ----------------------------------------------------------------------------------------------- prepare
def cmd_prepare(args: argparse.Namespace) -> int:
    from angpt.data import prepare_dataset

    meta = prepare_dataset(
        args.source,
        args.tokenizer,
        args.out,
        val_fraction=args.val_fraction,
        test_fraction=args.test_fraction,
        max_tokens=args.max_tokens,
        text_field=args.text_field,
        doc_separator=args.doc_separator,
        encoding_errors=args.encoding_errors,
        overwrite=args.overwrite,
        workers=args.workers,
        progress=not args.quiet,
    )
    splits = meta.get("splits", {})
    summary = ", ".join(f"{k}: {v.get('tokens', 0):,} tokens" for k, v in splits.items())
    if meta.get("options", {}).get("val_fraction_rule") == "auto":
        summary += f"; held out by --val-fraction auto: {meta['val_fraction']:.3g} (test {meta['test_fraction']:.3g})"
    if meta.get("skipped_files"):
        summary += f"; {len(meta['skipped_files'])} file(s) left out as not UTF-8"
    print(f"{args.out}: {meta.get('tokenizer', {}).get('spec', args.tokenizer)} vocab {meta['vocab_size']}; {summary}")
    return 0


def _fraction_or_auto(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a number such as 0.02") from None


# ------------------------------------------------------------------------------------------------- train
def run_config_from_args(args: argparse.Namespace):
    """The run config `angpt train`'s flags describe: a resumed run's stored settings, then the recipe, then the named
    flags, then --section.key values."""
    from angpt.train.config import load_run_config, parse_overrides
    from angpt.train.record import recipe_settings
    from angpt.train.setup import resumed_settings

    overrides = []
    for key in ("arch", "preset", "data", "out", "dist", "resume"):
        value = getattr(args, key)
        if value is not None:
            overrides.append((key, value))
    if args.device is not None:
        overrides.append(("train.device", args.device))
    overrides += parse_overrides(args.extra)
    base = resumed_settings(dict(overrides).get("out"), args.resume) or []
    if (recorded := recipe_settings(args.config)) is not None:  # a run's config.json as the recipe
        return load_run_config(None, overrides, base=base + recorded)
    return load_run_config(args.config, overrides, base=base)


def cmd_train(args: argparse.Namespace) -> int:
    from angpt.train.loop import train

    if args.help_config:
        from angpt.train.keys import format_reference

        print(format_reference(args.arch))
        return 0
    cfg = run_config_from_args(args)
    if args.dry_run:
        from angpt.train.dryrun import format_report, plan_run, this_machine

        on_cpu = (args.dry_run_gpu or this_machine()[1]).lower() == "cpu" and args.dry_run_mfu is None
        note = _share_cpu() if on_cpu else ""  # read before the step is measured
        report = plan_run(cfg, args.dry_run_gpus, args.dry_run_gpu, args.dry_run_mfu)
        print(format_report(report) + (f"\n  cpu          {note}" if note else ""))
        for warning in (report.data_note, report.warning):
            if warning:
                print(f"angpt train: warning: {warning}", file=sys.stderr)
        return 0
    _check_out(cfg.out, cfg.resume)
    from angpt.train.dist import pick_device

    device = pick_device(cfg.train.device, int(os.environ.get("LOCAL_RANK", "0")))  # before --out is created
    note = _share_cpu() if device.type == "cpu" and int(os.environ.get("WORLD_SIZE", "1")) == 1 else ""
    evaluators = []
    if cfg.train.eval_tasks:
        from angpt.infer.harness import task_evaluator

        evaluators.append(task_evaluator(cfg))
    result = train(cfg, evaluators, cpu_note=note)
    from angpt.train.dist import finish_distributed

    finish_distributed()  # every rank leaves together (a stop or the end; an error exits through torchrun)
    # A run stopped by a signal exits 128 + its number (130 SIGINT, 143 SIGTERM), as the shell reports a killed
    # process, so `angpt train ... && angpt export ...` does not export a half-trained model; train.stop_at exits 0.
    sig = getattr(result, "signal", None) if result.status == "interrupted" else None
    code = 128 + int(sig) if sig else 0
    if int(os.environ.get("RANK", "0")) != 0:
        return code
    print(_train_summary(cfg, result))
    return code


def _train_summary(cfg, result) -> str:
    """`finished at step 24: val_loss 2.1 (1.3 bits/byte); dtype bf16; checkpoint ...; metrics ...` (no empty parts)."""
    from angpt.train.dist import pick_device
    from angpt.train.step import resolve_dtype

    head = f"{result.status} at step {result.step}"
    if result.val_loss is not None:
        head += f": val_loss {result.val_loss:.4f}"
        if result.val_bpb is not None:
            head += f" ({result.val_bpb:.3f} bits/byte)"
    dtype = getattr(result, "dtype", None)
    if dtype is None:  # what the trainer resolved "auto" to on this device (train/loop.py: resolve_dtype)
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        dtype = resolve_dtype(cfg.train.dtype, pick_device(cfg.train.device, rank))
    ckpt = f"checkpoint {result.checkpoint}" if result.checkpoint is not None else "no checkpoint saved"
    if getattr(result, "test_loss", None) is not None:
        head += f"; test_loss {result.test_loss:.4f}"
    parts = [head, f"dtype {dtype}", ckpt]
    if getattr(result, "best", None) is not None:
        parts.append(f"best {result.best} (val_loss {result.best_val_loss:.4f})")
    return "; ".join([*parts, f"metrics {result.out / 'metrics.jsonl'}"])


# ------------------------------------------------------------------------------------ generate / export / eval
def _load(checkpoint: str, device: str | None = None):
    from angpt.checkpoint import load_checkpoint_model
    from angpt.train.dist import pick_device

    if device is not None:
        device = str(pick_device(device))  # a one-line error for a device this machine lacks
    model, tokenizer = load_checkpoint_model(checkpoint, device=device or "cpu")
    if tokenizer is None:
        raise UserError(f"checkpoint {checkpoint} carries no tokenizer (tokenizer.json); re-save it from a run")
    return model, tokenizer


def cmd_generate(args: argparse.Namespace) -> int:
    from angpt.infer import sample_stream

    model, tokenizer = _load(args.checkpoint, args.device)
    if args.prompt is not None:
        prompt = args.prompt
    else:  # `echo "def main(" | angpt generate ...`: the newline echo adds is not part of the prompt
        prompt = sys.stdin.read()
        prompt = prompt[:-1] if prompt.endswith("\n") else prompt
    n_prompt = len(tokenizer.encode(prompt))
    context = model.config.context_length
    if n_prompt >= context:
        raise UserError(f"the prompt is {n_prompt} tokens, the model's context is {context}; shorten it")
    max_new = min(args.max_new_tokens, context - n_prompt)
    if max_new < args.max_new_tokens:
        print(
            f"note: generating {max_new} tokens, not {args.max_new_tokens}: the prompt ({n_prompt} tokens) and the "
            f"continuation must fit the model's context of {context} tokens",
            file=sys.stderr,
        )
    sys.stdout.write(prompt if args.echo else "")
    for piece in sample_stream(
        model,
        tokenizer,
        prompt,
        max_new_tokens=max_new,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        stop=args.stop,
        seed=args.seed,
        use_cache=not args.no_cache,
        compile=args.compile,
    ):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def _share_cpu() -> str:
    """What a CPU run says of a busy machine (train/hardware.py's cpu_share), '' on a quiet one."""
    from angpt.train.hardware import cpu_share

    return cpu_share().note()


def cmd_export(args: argparse.Namespace) -> int:
    if args.format != "hf":
        raise UserError(f"unknown export format {args.format!r}; use: hf")
    from angpt.hf.folder import check_target

    check_target(args.out, args.overwrite)  # before torch, transformers and the checkpoint load: a refusal is at once
    from angpt.hf.export import export_hf

    model, tokenizer = _load(args.checkpoint)
    out = export_hf(model, args.out, tokenizer, dtype=args.dtype, format=args.hf_format, overwrite=args.overwrite)
    print(f"exported {model.config.arch} to {out}; load it with transformers:\n{load_lines(out)}")
    return 0


RUN_FILES = {"config.json", "metrics.jsonl", "checkpoints", ".lock"}  # one at least in a run's folder (.lock: starting)


def _check_out(out: str | None, resume: str | None) -> None:
    """--out names a new folder, an empty one or a run's (angpt compare refuses the same); --resume auto with no
    checkpoint there says, in one line, that the run starts fresh (a misspelled --out would do so silently)."""
    if out is None:
        return
    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--out {out} is a file; pass a folder")
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if names and not names & RUN_FILES:
        raise UserError(
            f"--out {out} is not empty and holds no run (no config.json, metrics.jsonl or checkpoints/); "
            "choose a new or empty folder"
        )
    if resume == "auto" and "checkpoints" not in names and int(os.environ.get("RANK", "0")) == 0:
        print(f"angpt train: nothing to resume in {out}, starting fresh", file=sys.stderr)


def load_lines(folder: Path) -> str:
    """The Python that loads an export, unattended: a folder whose config.json maps to our own modelling code
    (nGPT, anGPT, TokenFormer) needs `trust_remote_code=True` in both lines (or `import angpt.hf.export` first), or
    transformers asks at the terminal before loading the tokenizer; GPT+ is a native Qwen3."""
    remote = "auto_map" in json.loads((Path(folder) / "config.json").read_text())
    trust = ", trust_remote_code=True" if remote else ""
    return (
        "    from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"    model = AutoModelForCausalLM.from_pretrained({str(folder)!r}{trust})\n"
        f"    tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}{trust})"
    )


def cmd_import_hf(args: argparse.Namespace) -> int:
    from angpt.checkpoint import save_checkpoint
    from angpt.hf.export import import_hf

    model = import_hf(args.path)
    if not hasattr(model, "constraint_groups") or model.__class__.__name__ == "FoldedLM":
        raise UserError("only Qwen3/Llama-shaped checkpoints import as trainable GPT+/GPT models")
    state = {"model_config": model.config.to_dict(), "imported_from": str(args.path), "tokens": 0}
    out = save_checkpoint(args.out, 0, model.state_dict(), {}, state, tokenizer_dir=args.path, keep_last=0)
    print(f"imported {args.path} as {model.config.arch} into {out}; continue with angpt train --init_from {out}")
    return 0


def cmd_grow(args: argparse.Namespace) -> int:
    from angpt.train.grow import grow_checkpoint

    out = grow_checkpoint(
        args.checkpoint, args.out, args.add_tokens, args.add_ffn_tokens, freeze_old=args.freeze_old, seed=args.seed
    )
    from angpt.checkpoint import read_state

    state = read_state(out)
    grown, arch = state["grown_from"], state["model_config"]["arch"]
    frozen = "; old tokens frozen" if args.freeze_old else ""
    print(
        f"grew {arch} from {grown['params']:,} to {state['params']:,} parameters (same logits){frozen}: {out}; "
        f"continue with angpt train --arch {arch} --init_from {out} --data DIR --out DIR"
    )
    return 0


def _limit(value: float | None) -> int | float | None:
    """lm-eval's limit: a document count when >= 1, else a fraction."""
    return int(value) if value is not None and value >= 1 else value


def cmd_eval(args: argparse.Namespace) -> int:
    from angpt.infer.harness import evaluate_tasks

    model, tokenizer = _load(args.checkpoint, args.device)
    results = evaluate_tasks(
        model, tokenizer, args.tasks, include_path=args.include, limit=_limit(args.limit), batch_size=args.batch_size
    )
    table = results.get("results", {})
    for task, metrics in table.items():
        shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        print(f"{task}: {shown}")
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(json.dumps({"results": table, "checkpoint": args.checkpoint}, indent=2, default=str))
    return 0


# ------------------------------------------------------------------------------------------------- bench
def cmd_bench(args: argparse.Namespace) -> int:
    import platform

    import torch

    from angpt.bench.step import bench_step, format_table

    if args.what != "step":
        raise UserError(f"unknown benchmark {args.what!r}; use: step")
    if args.device is not None:
        from angpt.train.dist import pick_device

        pick_device(args.device)  # a one-line error for a device this machine lacks
    from angpt.study.arms import split_arms

    rows = bench_step(
        split_arms(args.arch),
        args.preset,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        dtype=args.dtype,
        compile=args.compile,
        warmup=args.warmup,
        reps=args.reps,
        device=args.device,
        fused_loss=args.loss == "fused",
    )
    on_gpu = torch.cuda.is_available() and args.device != "cpu"
    dev = torch.cuda.get_device_name() if on_gpu else platform.processor()
    print(
        f"# step benchmark: preset={args.preset} batch={args.batch_size} dtype={args.dtype} compile={args.compile} "
        f"loss={args.loss} "
        f"reps={args.reps} torch={torch.__version__} device={dev or 'cpu'} threads={torch.get_num_threads()}"
    )
    if not on_gpu:  # the flags and the measurement that decide bf16 here (RESULTS.md rows quote them)
        from angpt.train.hardware import cpu_bf16_summary

        bf16 = cpu_bf16_summary()
        print(
            f"# cpu bf16: instructions {','.join(bf16['cpu_bf16_instructions']) or 'none'}; bf16/fp32 matmul speed "
            f"{bf16['cpu_bf16_matmul_speedup'] or '-'}; train.dtype auto -> {bf16['cpu_auto_dtype']}"
        )
    print(format_table(rows))
    return 0


# -------------------------------------------------------------------------------------------------- main
# Each verb: its one-line help (what `angpt --help` lists) and what adds its parser: a function here, or
# "module:function" for a verb whose code is elsewhere (imported only when that verb runs).
VERBS = {
    "info": ("presets, a resolved config and its constants", "_add_info"),
    "prepare": ("tokenise a corpus into a dataset folder", "_add_prepare"),
    "train": ("train a model (also under torchrun)", "_add_train"),
    "generate": ("sample from a checkpoint (KV cache, streaming)", "_add_generate"),
    "export": ("export a checkpoint (GPT+ as Qwen3; nGPT/anGPT folded)", "_add_export"),
    "import-hf": ("import a Qwen3/Llama-shaped HF checkpoint as a GPT+/GPT checkpoint", "_add_import_hf"),
    "grow": ("append parameter tokens to a TokenFormer checkpoint: a larger model with the same logits", "_add_grow"),
    "eval": ("lm-eval tasks on a checkpoint", "_add_eval"),
    "bench": ("side-by-side benchmarks (step: training step and folded inference)", "_add_bench"),
    "compare": (
        "fair multi-budget, multi-seed comparison of architectures (LR sweeps, speedup, report)",
        "angpt.study.comparison.cli:add_compare_parser",
    ),
    "scaling": (
        "scaling laws per architecture: a size x budget ladder, fits, compute-optimal sizes, batch size",
        "angpt.study.scaling.cli:add_scaling_parser",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line (bad input gets one line, not the 20-line usage) that points
    to --help."""

    def error(self, message: str):
        if "expected one argument" in message:  # `--budgets -16Ki`: argparse takes the value for a flag
            message += f" (a value that starts with '-' is written {message.split()[1].rstrip(':')}=VALUE)"
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The `angpt` parser: every verb named with its help line, and the whole parser of `verb` alone (None: none),
    so that a command loads only its own code (`angpt train --help` loads no study and no torch)."""
    from angpt import __version__

    # allow_abbrev=False on every parser: with prefix matching `--resum auto` silently means `--resume auto`, and a
    # misspelt flag of `train` (whose unknown flags are config overrides) could become another flag.
    p = _Parser(prog="angpt", description=__doc__, allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"angpt {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (help, where) in VERBS.items():
        if name != verb:
            sub.add_parser(name, help=help, add_help=False, allow_abbrev=False)
            continue
        module, _, function = where.rpartition(":")
        add = getattr(importlib.import_module(module), function) if module else globals()[function]
        add(sub, help)
        _show_defaults(sub.choices[name])
    return p


def _add_info(sub, help: str) -> None:
    s = sub.add_parser("info", help=help, allow_abbrev=False)
    s.add_argument("--arch", default=None, help="an architecture or a variant (default angpt when --preset is given)")
    s.add_argument("--preset", default=None, help="a preset (default demo when --arch is given)")
    s.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. --set nu_att=sqrt_pos")
    s.set_defaults(func=cmd_info)


def _add_prepare(sub, help: str) -> None:
    s = sub.add_parser("prepare", help=help, allow_abbrev=False)
    s.add_argument(
        "--source",
        default="stdlib",
        help="stdlib | PATH (a file or folder of .txt/.md/.rst/.py text, .jsonl or .parquet) | hf:NAME "
        "(default: %(default)s)",
    )
    s.add_argument("--tokenizer", default="bpe:4096", help="bytes | bpe:N | hf:NAME_OR_PATH (default: %(default)s)")
    s.add_argument("--out", required=True, help="the dataset folder to write (required)")
    s.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens (default: all)")
    s.add_argument(
        "--val-fraction",
        type=_fraction_or_auto,
        default="auto",
        help="documents for validation (selection): a share such as 0.02, or auto: 0.5%% of the documents but at "
        "least 20 documents and 50,000 byte-tokens, at most 10%% (default: %(default)s)",
    )
    s.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="documents for test: the numbers reported (default: as many as validation; 0: none)",
    )
    s.add_argument("--text-field", default="text", help="the text column of .jsonl/.parquet/hf: (default: %(default)s)")
    s.add_argument(
        "--doc-separator",
        default=None,
        metavar="REGEX",
        help="how .txt files are cut into documents (default: a single .txt file at blank lines, a folder's files "
        "whole; '' keeps files whole)",
    )
    s.add_argument(
        "--encoding-errors",
        choices=("skip", "replace", "strict"),
        default="skip",
        help="a file that is not UTF-8: skip it with a warning, replace its bad bytes with U+FFFD, or strict: stop "
        "with an error naming it (default: %(default)s)",
    )
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the prepared dataset in --out (built beside it, swapped in when complete; any other "
        "non-empty folder is still refused)",
    )
    s.add_argument(
        "--workers",
        type=int,
        default=None,
        help="1: tokenize serially; N >= 2: in N processes (default: the tokenizers thread pool)",
    )
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_prepare)


def _add_train(sub, help: str) -> None:
    s = sub.add_parser(
        "train",
        allow_abbrev=False,
        help=help,
        description="Train from a YAML recipe; any key can be overridden: --train.lr 3e-3 --model.d_model 512. "
        "--help-config lists every key with its default and meaning.",
    )
    s.add_argument("--help-config", action="store_true", help="list every --train.* / --model.* key and exit")
    s.add_argument("--config", default=None, help="YAML recipe (see configs/); flags and keys override it")
    s.add_argument("--arch", default=None, help="gpt | gpt+ | ngpt | angpt | tokenformer | a variant (default angpt)")
    s.add_argument("--preset", default=None, help="tiny | demo | gpt2-small | 0.5B | 1B (default demo)")
    s.add_argument("--data", default=None, help="a folder written by `angpt prepare` (required)")
    s.add_argument("--out", default=None, help="the run folder: checkpoints, metrics.jsonl, config.json (required)")
    s.add_argument("--dist", default=None, choices=["ddp", "fsdp"], help="under torchrun (default ddp)")
    s.add_argument("--resume", default=None, help="auto (the run's newest checkpoint) | a checkpoint PATH")
    s.add_argument("--device", default=None, help="auto | cpu | cuda | cuda:N (the same as --train.device)")
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="print parameters, FLOPs, memory per GPU and time for this config, then exit (no GPU, data or memory)",
    )
    s.add_argument(
        "--dry-run-gpus", type=int, default=None, metavar="N", help="GPUs to plan for (default: this machine's; 8 "
        "for a named GPU, one process for the CPU)"
    )  # fmt: skip
    s.add_argument(
        "--dry-run-gpu", default=None, help="A100 | H100 | H200 | B200 | cpu (default: this machine: its GPUs, else "
        "this CPU, measured)"
    )  # fmt: skip
    s.add_argument(
        "--dry-run-mfu", type=float, default=None, help="model FLOPs utilisation (default: 0.4 on a GPU, assumed; on "
        "the CPU, measured on a block of the model)"
    )  # fmt: skip
    s.set_defaults(func=cmd_train, accepts_extra=True)


def _add_generate(sub, help: str) -> None:
    s = sub.add_parser("generate", help=help, allow_abbrev=False)
    s.add_argument("checkpoint", help=RUN_HELP)
    s.add_argument("--prompt", default=None, help="the prompt (default: read standard input)")
    s.add_argument(
        "--max-new-tokens", type=int, default=200, help="at most, within the model's context (default: %(default)s)"
    )
    s.add_argument("--temperature", type=float, default=0.8, help="0: greedy (default: %(default)s)")
    s.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest tokens (default: all)")
    s.add_argument("--top-p", type=float, default=None, help="nucleus sampling threshold (default: off)")
    s.add_argument("--stop", action="append", default=None, help="stop string (repeatable; default: none)")
    s.add_argument("--seed", type=int, default=None, help="sampling seed (default: unseeded)")
    s.add_argument("--no-cache", action="store_true", help="recompute the prefix every step (reference path)")
    s.add_argument("--compile", action="store_true", help="torch.compile the cached decoding step (long outputs)")
    s.add_argument(
        "--echo",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="print the prompt before the continuation, as a text completion reads (default: on; --no-echo: only "
        "the continuation)",
    )
    s.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cpu)")
    s.set_defaults(func=cmd_generate)


def _add_export(sub, help: str) -> None:
    s = sub.add_parser("export", help=help, allow_abbrev=False)
    s.add_argument("checkpoint", help=RUN_HELP)
    s.add_argument("out", help="the export folder: new, empty, or a previous export with --overwrite")
    s.add_argument("--format", default="hf", help="hf: Hugging Face transformers (default: %(default)s)")
    s.add_argument(
        "--hf-format", default="auto", help="auto (by architecture) | qwen3 | llama | folded (default: %(default)s)"
    )
    s.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default: %(default)s)")
    s.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a previous export in OUT (its own files only; other files stay)",
    )
    s.set_defaults(func=cmd_export)


def _add_import_hf(sub, help: str) -> None:
    s = sub.add_parser("import-hf", help=help, allow_abbrev=False)
    s.add_argument("path")
    s.add_argument("out", help="run directory to write checkpoints/step_000000 into")
    s.set_defaults(func=cmd_import_hf)


def _add_grow(sub, help: str) -> None:
    s = sub.add_parser("grow", help=help, allow_abbrev=False)
    s.add_argument("checkpoint", help=RUN_HELP)
    s.add_argument("out", help="the new checkpoint folder (must not exist); then: angpt train --init_from OUT")
    s.add_argument("--add-tokens", type=int, required=True, help="tokens appended to each Q, K, V, output Pattention")
    s.add_argument(
        "--add-ffn-tokens", type=int, default=None, help="tokens appended to each FFN Pattention (default: pro rata)"
    )
    s.add_argument("--freeze-old", action="store_true", help="keep the old tokens fixed in the continued training")
    s.add_argument("--seed", type=int, default=0, help="seed of the new value tokens")
    s.set_defaults(func=cmd_grow)


def _add_eval(sub, help: str) -> None:
    s = sub.add_parser("eval", help=help, allow_abbrev=False)
    s.add_argument("checkpoint", help=RUN_HELP)
    s.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    s.add_argument("--include", default=None, help="folder of local task YAMLs (works offline; default: none)")
    s.add_argument(
        "--limit", type=float, default=None, help="documents per task: a count >= 1 or a fraction (default: all)"
    )
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--out", default=None, help="write the results as JSON (default: print them only)")
    s.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cpu)")
    s.set_defaults(func=cmd_eval)


def _add_bench(sub, help: str) -> None:
    s = sub.add_parser("bench", help=help, allow_abbrev=False)
    s.add_argument("what", choices=["step"])
    s.add_argument(
        "--arch",
        default="gpt+,ngpt,angpt",
        help="comma-separated arms, e.g. gpt+,gpt+[laurel=lr] (as in compare); ratios are against the first",
    )
    s.add_argument("--preset", default="demo")
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the preset's context)")
    s.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    s.add_argument("--compile", action="store_true")
    s.add_argument(
        "--loss",
        choices=["fused", "logits"],
        default="fused",
        help="our models' training loss: chunked without the logits (as train.fused_loss) or on them "
        "(default: %(default)s)",
    )
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--reps", type=int, default=10)
    s.add_argument("--device", default=None, help="cpu | cuda | cuda:N (default: cuda where there is one, else cpu)")
    s.set_defaults(func=cmd_bench)


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Append "(default: X)" to the help of each option that takes a value and has a default its help does not
    already name, as argparse.ArgumentDefaultsHelpFormatter would (but only where there is a value to show: a None
    default means "not given", which each help says in its own words)."""
    for action in parser._actions:
        takes_value = action.option_strings and action.nargs != 0 and not action.required
        if not takes_value or action.help == argparse.SUPPRESS or "default" in (action.help or ""):
            continue
        if action.default is None or action.default is argparse.SUPPRESS:
            continue
        action.help = f"{action.help} (default: %(default)s)" if action.help else "(default: %(default)s)"


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    parser = build_parser(next((a for a in given if not a.startswith("-")), None))
    args, extra = parser.parse_known_args(argv)
    args.extra = extra
    if extra and not getattr(args, "accepts_extra", False):
        _verb_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with invoked_as(sys.argv[1:] if argv is None else argv):
            return args.func(args) or 0
    except UserError as e:
        print(f"angpt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except DeadlineReached:  # the study said where it stopped and how to go on
        return 0
    except KeyboardInterrupt:
        print(f"angpt {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `angpt ... | head`: the reader left; say nothing more
        sys.stderr.close()
        return 0


def _verb_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one verb: an error about that verb's flags prints its usage line, not the top level's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


if __name__ == "__main__":
    sys.exit(main())
