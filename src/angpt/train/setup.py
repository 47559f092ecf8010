"""A run: how it starts, what it is, and its working parts, each decided once and built in one place.

`resolve(cfg, ...)` reads the registry once and the run folder once, and returns a :class:`ResolvedRun`: a frozen
record of everything the run is (the model config, the optimizer recipe's rate, weight decay and warm-up with where
each comes from, the dtype, whether it compiles, the batch geometry and the schedule), with the architecture's
registry entry (`spec`: its hooks) and how the run starts (`start`). `build(resolved, info)` makes the model,
optimizer, scheduler, training step and data loader from it, and nothing downstream asks the registry or the config
again. `angpt train` (train/loop.py), its dry run (train/dryrun.py), the study's estimate, both bench tools and the
GPU race (benchmarks/gpu/race.py) all resolve and build here.

How a run starts (:func:`decide`, as nanoGPT reads one `init_from` string and torchtitan's checkpointer decides in
one place), with the model it builds, the dtype it computes in, the optimizer recipe it takes and the id its
checkpoints carry:

- **resume**: ``--resume auto`` (the folder's newest checkpoint) or ``--resume PATH``. The checkpoint's state is
  read once; the run's settings are checked against it (train/resume.py: a changed rate, batch, dtype, model or
  data refuses in one line), and the run keeps its dtype, its recipe record and its id.
- **init_from**: ``--init_from PATH``, weights from elsewhere (an import, a grown model) at step 0. The model is the
  checkpoint's; weights trained with another tokenizer are refused unless ``train.init_any_tokenizer``.
- **fresh**: anything else. A folder that already holds a run is refused (resume it, or choose a new --out), unless
  the caller asks to restart one that crashed before its first checkpoint (`restart_unsaved`: a study re-running a
  run it owns).

A resume takes the run's stored settings (its folder's config.json): flags given explicitly override them and are
checked like any other change, so ``angpt train --out runs/x --resume auto`` continues the run as it was started
(:func:`resumed_settings`).

``--resume`` together with ``--init_from`` continues a run only if it started from those same weights (the same
command again, with --resume auto); otherwise it is refused in one line, as litgpt refuses resuming and an initial
checkpoint together: the model would come from one and the weights from the other. The dry run makes the same
decision without touching the folder (`clean=False`).

A run that reuses a model already built (and compiled) for an earlier run of the same shape passes it to `build` as
`model=`: its weights are set, in place, to what a fresh build gives under the run's seed, so the run trains exactly
as a fresh one would while its compiled graphs stay valid (tests/test_setup.py checks both against `angpt train`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from angpt import checkpoint as ckpt
from angpt.checkpoint import RunState
from angpt.errors import ConfigError, UserError
from angpt.models import ModelConfig, registry, unwrap
from angpt.models.registry import ArchSpec, Recipe
from angpt.train.config import RunConfig, check_batch_geometry, resolve_model_config, stored_settings
from angpt.train.dist import DistInfo, parallelize
from angpt.train.optim import optimizer_for
from angpt.train.resume import check_resolved, check_resume, recipe_value
from angpt.train.step import TrainStep, compile_for_training, resolve_compile, resolve_dtype

FRESH, RESUME, INIT_FROM = "fresh", "resume", "init_from"


@dataclass
class Start:
    """How a run starts (see the module docstring)."""

    mode: str  # FRESH | RESUME | INIT_FROM
    model: ModelConfig
    model_from: str  # where the model config comes from, in words (the dry run says it)
    dtype: str  # the compute dtype, resolved ("bf16" or "fp32"): a resumed run keeps its own
    recipe: dict[str, Any]  # the optimizer recipe's values the run takes (a resumed run keeps its record)
    run_id: str  # the id its checkpoints carry (rotation deletes only its own)
    checkpoint: Path | None = None  # RESUME: the checkpoint; INIT_FROM: the weights
    state: RunState | None = None  # RESUME, INIT_FROM: the checkpoint's state, read once
    notes: list[str] = field(default_factory=list)  # what resuming changes (a longer max_steps, say)


def resumed_settings(out: str | Path | None, resume: str | None) -> list[tuple[str, Any]] | None:
    """The settings a resume starts from: the run's own, as its folder's config.json recorded them when it last
    started (less what belongs to one invocation: --resume and train.stop_at; a run started --init_from keeps it, its
    model came from there). None when there is nothing to resume from (no --resume, no --out, or a folder without a
    run yet)."""
    if resume is None or out is None:
        return None
    path = Path(out) / "config.json"
    if not path.is_file():
        return None
    try:
        run = json.loads(path.read_text())["run"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{path} is not a run's config.json ({type(e).__name__}); resume with --config RECIPE") from e
    return stored_settings(run)


def resumed_dtype(requested: str, state: RunState | None, device: torch.device) -> str:
    """The compute dtype a run uses on `device`: with `auto`, the one a resumed run has computed in (its state's
    `compute_dtype`), so that a run keeps its dtype wherever it resumes; otherwise what `requested` resolves to."""
    recorded = state.compute_dtype if state is not None else None
    if requested == "auto" and recorded in ("bf16", "fp32"):
        return recorded
    return resolve_dtype(requested, device)


def model_config(cfg: RunConfig, meta: dict | None, init_model: ModelConfig | None = None) -> tuple[ModelConfig, str]:
    """The model a run of `cfg` builds, and where its config comes from: the checkpoint's for init_from (its
    `init_model`, read once), else the preset plus overrides with the dataset's vocabulary (`meta`, None when the
    data is not prepared yet)."""
    if cfg.init_from is not None:
        mcfg = init_model if init_model is not None else ckpt.read_weights_start(cfg.init_from)[1]
        if mcfg.arch != cfg.arch:
            raise ConfigError(f"--train.init_from holds a {mcfg.arch} model; pass --arch {mcfg.arch}")
        return mcfg, f"checkpoint {cfg.init_from}"
    mcfg = resolve_model_config(cfg, meta)
    if "vocab_size" in cfg.model:
        return mcfg, "model.vocab_size"
    if meta is not None:
        return mcfg, f"{cfg.data}/meta.json ({meta['vocab_size']} tokens, padded to a multiple of 64)"
    if not cfg.data:
        why = "no data folder given"
    else:
        why = f"{cfg.data} is not prepared yet" if Path(cfg.data).is_dir() else f"{cfg.data} does not exist"
    return mcfg, f"the preset ({why})"


def decide(
    cfg: RunConfig,
    recipe: Recipe,
    meta: dict | None,
    device: torch.device,
    data_identity: dict[str, Any] | None = None,
    *,
    clean: bool = False,
    restart_unsaved: bool = False,
    report: bool = False,
) -> Start:
    """How the run of `cfg` starts (see the module docstring); a one-line UserError where it cannot.

    `recipe` is the architecture's optimizer recipe (its registry entry's, as :func:`resolve` read it), `meta` the
    dataset's meta.json, `data_identity` its fingerprint (a resume checks it), `device` where the run computes (its
    `auto` dtype). `clean` removes what a killed save left in the folder first (the trainer's rank 0); the dry run
    reads only. `report` prints where a resume continues from (the trainer says it once the checkpoint is restored:
    `resuming`).
    """
    out = Path(cfg.out) if cfg.out is not None else None
    if clean and out is not None and out.is_dir():  # a killed save may have left step_N aside: restore it first
        for p in ckpt.clean_stale_tmp(out):
            print(f"removed {p}, left by an interrupted save", file=sys.stderr)
    found = ckpt.resolve_resume(out, cfg.resume)  # the checkpoint and its state.json, read once
    if cfg.resume and cfg.init_from and found is not None:
        _check_same_start(cfg, found[1].get("run_config") or {})
    init_state, init_model = ckpt.read_weights_start(cfg.init_from) if cfg.init_from is not None else (None, None)
    mcfg, model_from = model_config(cfg, meta, init_model)
    state = RunState.from_dict(found[1]) if found is not None else init_state
    dtype = resumed_dtype(cfg.train.dtype, state if found is not None else None, device)
    used = (state.recipe if found is not None and state.recipe else None) or recipe.used(cfg.preset, cfg.train)
    if found is not None:
        resume_from = found[0]
        notes = check_resume(resume_from, state, cfg, mcfg, data_identity, dtype, recipe=recipe)
        run_id = state.run_id or ckpt.new_run_id()
        decided = Start(RESUME, mcfg, model_from, dtype, used, run_id, resume_from, state, notes)
        if report:
            resuming(decided)
        return decided
    if out is not None and (out / "metrics.jsonl").exists() and not restart_unsaved:
        found_ckpts = ckpt.list_checkpoints(out)
        if found_ckpts:  # not resuming because --resume was not given, not because there is nothing to resume
            raise UserError(
                f"{out} already holds a run (latest checkpoint {found_ckpts[-1].name}); "
                "pass --resume auto to continue it, or choose a new --out"
            )
        raise UserError(
            f"{out} already holds a run (metrics.jsonl) but no checkpoint to continue from; "
            "choose a new --out, or delete that folder to start over"
        )
    if cfg.init_from is not None:
        _check_tokenizer(cfg, data_identity)
        return Start(INIT_FROM, mcfg, model_from, dtype, used, ckpt.new_run_id(), Path(cfg.init_from), state)
    return Start(FRESH, mcfg, model_from, dtype, used, ckpt.new_run_id())


def resuming(decided: Start) -> None:
    """Say where a resume continues from, and what resuming changes (on stderr)."""
    print(f"resuming from step {decided.state.step} ({decided.checkpoint})", file=sys.stderr)
    for note in decided.notes:
        print(f"  {note}", file=sys.stderr)


def _check_same_start(cfg: RunConfig, recorded: dict[str, Any]) -> None:
    """--resume with --init_from continues the run only when the run started from those same weights (the same
    command run again with --resume auto); otherwise the model would come from one and the weights from the other,
    and it is refused in one line, as litgpt refuses a resume with an initial checkpoint."""
    started = recorded.get("init_from")
    if started is not None and Path(started).resolve() == Path(cfg.init_from).resolve():
        return
    origin = f"started from {started}" if started else "started fresh"
    raise UserError(
        f"--resume {cfg.resume} continues the run in {cfg.out}, which {origin}; --init_from {cfg.init_from} would "
        "start another from other weights: give one (or a new --out)"
    )


def _check_tokenizer(cfg: RunConfig, data_identity: dict[str, Any] | None) -> None:
    """--init_from's weights were trained with some tokenizer: refuse other data unless told to."""
    from angpt.data.format import tokenizer_hash

    folder = Path(cfg.init_from)
    recorded = tokenizer_hash(folder)  # the checkpoint carries a copy of its dataset's tokenizer
    now = (data_identity or {}).get("tokenizer_hash")
    if recorded is None or now is None or recorded == now or cfg.train.init_any_tokenizer:
        return
    raise UserError(
        f"--init_from {folder} was trained with another tokenizer than {cfg.data}'s: its token ids would "
        "mean other text; prepare the data with that tokenizer, or pass --train.init_any_tokenizer true"
    )


@dataclass(frozen=True)
class ResolvedRun:
    """Everything a run is, decided once (see the module docstring). `*_from` say where a value comes from, in the
    words the start-up summary and the dry run print."""

    arch: str
    preset: str
    model: ModelConfig
    model_from: str
    lr: float
    lr_from: str  # "" where train.lr sets it, else " (the ARCH recipe's at PRESET; train.lr unset)" and the like
    optimizer: str  # adamw | adam
    weight_decay: float
    weight_decay_from: str
    warmup_steps: int
    warmup_from: str
    recipe: dict[str, Any]  # the recipe's fields the run takes (recorded in config.json and every checkpoint)
    dtype: str  # bf16 | fp32, resolved
    compile: bool  # resolved from train.compile on this device
    seq_len: int
    micro_batch: int
    batch_tokens: int
    accum: int
    world_size: int
    max_steps: int
    schedule: str
    min_lr_ratio: float
    decay_fraction: float
    decay_shape: str
    betas: tuple[float, float]
    grad_clip: float
    seed: int
    fused_loss: bool
    activation_checkpointing: bool
    data: str | None
    spec: ArchSpec = field(compare=False, repr=False)  # the architecture's registry entry: its hooks, read once
    start: Start = field(compare=False, repr=False)  # how the run starts (fresh, resume, init_from) and from where

    def to_dict(self) -> dict[str, Any]:
        """The record a checkpoint keeps (and a resume compares): every field but the entry and the start."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("spec", "start")}
        return out | {"model": self.model.to_dict(), "betas": list(self.betas), "recipe": dict(self.recipe)}


def resolve(
    cfg: RunConfig,
    *,
    device: torch.device,
    world_size: int = 1,
    meta: dict | None = None,
    data_identity: dict[str, Any] | None = None,
    clean: bool = False,
    restart_unsaved: bool = False,
) -> ResolvedRun:
    """The run `cfg` describes, on `device` with `world_size` ranks: how it starts (:func:`decide`, from the run
    folder read once where `cfg.out` names one; `meta` and `data_identity` are its dataset's, None where there is
    none yet), the start's model, dtype and recipe record (a resumed run keeps its own), the recipe's rate, weight
    decay and warm-up where train.* leaves them unset, with the words that say where each comes from (the start-up
    summary, the dry run and a refused resume print them). The one place that reads the registry and the recipe's
    rate. One-line ConfigErrors for a context longer than the model's and a batch that does not divide."""
    entry = registry.get(cfg.arch)
    start = decide(
        cfg, entry.recipe, meta, device, data_identity, clean=clean, restart_unsaved=restart_unsaved, report=False
    )
    tc, model, spec = cfg.train, registry.check_config(start.model), entry.recipe
    recipe = dict(start.recipe)
    recorded = start.mode == RESUME and start.state is not None and bool(start.state.recipe)
    seq_len = tc.seq_len or model.context_length
    if seq_len > model.context_length:
        raise ConfigError(f"train.seq_len={seq_len} exceeds the model's context length {model.context_length}")
    accum = check_batch_geometry(tc.batch_tokens, seq_len, tc.micro_batch, world_size)

    kept = recipe if recorded else None  # a resumed run's record: what it took when it started
    lr, lr_from = recipe_value("lr", tc.lr, cfg.arch, cfg.preset, spec, kept)
    wd, wd_from = recipe_value("weight_decay", tc.weight_decay, cfg.arch, cfg.preset, spec, kept)
    optimizer = recipe.get("optimizer", spec.optimizer)
    if optimizer == "adam":
        wd, wd_from = 0.0, f" (the {cfg.arch} recipe's Adam decays nothing)"
    if tc.warmup_steps is not None:
        warmup, warmup_from = tc.warmup_steps, ""
    else:
        fraction = recipe.get("warmup_fraction", spec.warmup_fraction)
        cap = recipe.get("warmup_cap", spec.warmup_cap)
        warmup = replace(spec, warmup_fraction=fraction, warmup_cap=cap).warmup_steps(tc.max_steps)
        warmup_from = f" ({fraction:.0%} of the run, at most {cap} steps: the {cfg.arch} recipe's)"
    run = ResolvedRun(
        arch=cfg.arch,
        preset=cfg.preset,
        model=model,
        model_from=start.model_from,
        lr=float(lr),
        lr_from=lr_from,
        optimizer=optimizer,
        weight_decay=float(wd),
        weight_decay_from=wd_from,
        warmup_steps=int(warmup),
        warmup_from=warmup_from,
        recipe=recipe,
        dtype=start.dtype,
        compile=resolve_compile(tc.compile, device),
        seq_len=seq_len,
        micro_batch=tc.micro_batch,
        batch_tokens=tc.batch_tokens,
        accum=accum,
        world_size=world_size,
        max_steps=tc.max_steps,
        schedule=tc.schedule,
        min_lr_ratio=tc.min_lr_ratio,
        decay_fraction=tc.decay_fraction,
        decay_shape=tc.decay_shape,
        betas=(tc.beta1, tc.beta2),
        grad_clip=tc.grad_clip,
        seed=tc.seed,
        fused_loss=tc.fused_loss,
        activation_checkpointing=tc.activation_checkpointing,
        data=cfg.data,
        spec=entry,
        start=start,
    )
    if start.mode == RESUME and start.state is not None and start.state.resolved:
        check_resolved(start.checkpoint, start.state.resolved, run)  # the run as it was: what a resume continues
    return run


@dataclass
class Built:
    """A run's working parts, made by :func:`build`."""

    model: nn.Module  # wrapped for data parallelism where there are ranks
    base: nn.Module  # the plain model under any wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    step: TrainStep
    loader: Any  # angpt.data.TokenLoader over the train split (None without data)
    forward: Any  # what the step calls: the model, or its compiled form
    flops_per_token: float


def build(
    run: ResolvedRun,
    info: DistInfo,
    *,
    dist: str = "ddp",
    model: nn.Module | None = None,
    forward: Any = None,
    fresh_compile: bool = True,
    compile_options: dict[str, Any] | None = None,
    reinit: bool = True,
) -> Built:
    """The model, optimizer, scheduler, training step and loader of `run` on `info`'s device and ranks.

    A new model is initialised under `run.seed` (on the CPU, then moved: the same weights on every device). With
    `model` (one this function built before, for a run of the same model config), its parameters and buffers are
    set in place to what a new one would hold, and `forward` (its compiled form, if any) is reused: nothing is
    compiled again; with `reinit` False the model is taken as it is (a peer implementation the bench times).
    Otherwise a compiled run compiles here (`fresh_compile` resets Dynamo first: one run of many in a process, see
    compile_for_training; `compile_options` go to torch.compile)."""
    device = info.device
    if model is None:
        torch.manual_seed(run.seed)
        base = run.spec.model(run.model).to(device)
        base.fused_loss = run.fused_loss
        model = parallelize(base, info, dist, dtype=run.dtype, activation_checkpointing=run.activation_checkpointing)
    elif reinit:
        reinitialise(model, run)
    base = unwrap(model)
    optimizer, scheduler = optimizer_for(
        model,
        run.lr,
        max_steps=run.max_steps,
        weight_decay=run.weight_decay,
        warmup_steps=run.warmup_steps,
        min_lr_ratio=run.min_lr_ratio,
        betas=run.betas,
        schedule=run.schedule,
        decay_fraction=run.decay_fraction,
        decay_shape=run.decay_shape,
        optimizer=run.optimizer,
    )
    if forward is None:
        forward = (
            compile_for_training(model, optimizer, fresh=fresh_compile, **(compile_options or {}))
            if run.compile
            else model
        )
    elif run.compile:
        hook = getattr(optimizer, "weight_constraint", None)
        if hook is not None:  # the new optimizer's constraint: the same projection, compiled once already
            hook.compile()
    loader = None
    if run.data is not None:
        from angpt.data import TokenLoader

        loader = TokenLoader(
            run.data, "train", run.micro_batch, run.seq_len, rank=info.rank, world_size=info.world_size, seed=run.seed
        )
    step = TrainStep(
        model,
        optimizer,
        scheduler,
        device=device,
        dtype=run.dtype,
        accum=run.accum,
        grad_clip=run.grad_clip,
        forward=forward,
        dist=info,
    )
    flops = base.flops_per_token(run.seq_len) if hasattr(base, "flops_per_token") else 0.0
    return Built(model, base, optimizer, scheduler, step, loader, forward, flops)


@torch.no_grad()
def reinitialise(model: nn.Module, run: ResolvedRun) -> None:
    """Set `model`'s parameters and buffers, in place, to those of a new model of `run` initialised under
    `run.seed`: the tensors keep their identity (a compiled forward's guards hold), their values become a fresh
    run's. Refused (ValueError) for a model of another config."""
    base = unwrap(model)
    if base.config.to_dict() != run.model.to_dict():
        raise ValueError("reinitialise: the model was built for another model config")
    torch.manual_seed(run.seed)
    fresh = run.spec.model(run.model)
    for (name, p), (other, q) in zip(base.named_parameters(), fresh.named_parameters(), strict=True):
        if name != other:
            raise ValueError(f"reinitialise: parameter {name} where a new model has {other}")
        p.copy_(q)
    for (name, b), (other, c) in zip(base.named_buffers(), fresh.named_buffers(), strict=True):
        if name != other:
            raise ValueError(f"reinitialise: buffer {name} where a new model has {other}")
        b.copy_(c)
    for p in base.parameters():
        p.grad = None
