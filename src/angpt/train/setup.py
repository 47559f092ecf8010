"""A run, resolved once and built in one place.

`resolve(cfg, ...)` turns a RunConfig into a :class:`ResolvedRun`: a frozen record of everything the run is (the
model config, the optimizer recipe's rate, weight decay and warm-up with where each comes from, the dtype, whether
it compiles, the batch geometry and the schedule). `build(resolved, info)` makes the model, optimizer, scheduler,
training step and data loader from it, and nothing downstream asks the registry or the config again.

`angpt train` (train/loop.py) and the GPU race (benchmarks/gpu/race.py) build through here. A run that reuses a
model already built (and compiled) for an earlier run of the same shape passes it as `model=`: its weights are set,
in place, to what a fresh build gives under the run's seed, so the run trains exactly as a fresh one would while its
compiled graphs stay valid (tests/test_setup.py checks both against `angpt train`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from angpt.errors import ConfigError
from angpt.models import ModelConfig, model_from_config, registry, unwrap
from angpt.train.config import RunConfig, check_batch_geometry
from angpt.train.dist import DistInfo, parallelize
from angpt.train.optim import make_optimizer
from angpt.train.resume import check_resolved
from angpt.train.step import TrainStep, compile_for_training, resolve_compile

if TYPE_CHECKING:
    from angpt.train.start import Start


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

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model"] = self.model.to_dict()
        out["betas"] = list(self.betas)
        return out


def resolve(cfg: RunConfig, start: Start, *, device: torch.device, world_size: int = 1) -> ResolvedRun:
    """The run `cfg` describes as its `start` (train/start.py: fresh, resume or init_from) decided it, on `device`
    with `world_size` ranks: the start's model, dtype and recipe record (a resumed run keeps its own), the recipe's
    rate, weight decay and warm-up where train.* leaves them unset, with the words that say where each comes from
    (the start-up summary, the dry run and a refused resume print them). The one place that reads the recipe's
    rate. One-line ConfigErrors for a context longer than the model's and a batch that does not divide."""
    tc, model = cfg.train, start.model
    spec = registry.get(cfg.arch).recipe
    recipe = dict(start.recipe)
    recorded = start.mode == "resume" and start.state is not None and bool(start.state.recipe)
    seq_len = tc.seq_len or model.context_length
    if seq_len > model.context_length:
        raise ConfigError(f"train.seq_len={seq_len} exceeds the model's context length {model.context_length}")
    accum = check_batch_geometry(tc.batch_tokens, seq_len, tc.micro_batch, world_size)

    def recipe_value(key: str, given: Any) -> tuple[Any, str]:
        """(the value, where it comes from): "" where train.KEY sets it."""
        if given is not None:
            return given, ""
        if recorded and key in recipe:
            return recipe[key], f" (the {cfg.arch} recipe's when the run started; train.{key} unset)"
        return recipe.get(
            key, spec.default(key, cfg.preset)
        ), f" (the {cfg.arch} recipe's at {cfg.preset}; train.{key} unset)"

    lr, lr_from = recipe_value("lr", tc.lr)
    wd, wd_from = recipe_value("weight_decay", tc.weight_decay)
    optimizer = recipe.get("optimizer", spec.optimizer)
    if optimizer == "adam":
        wd, wd_from = 0.0, f" (the {cfg.arch} recipe's Adam decays nothing)"
    if tc.warmup_steps is not None:
        warmup, warmup_from = tc.warmup_steps, ""
    else:
        fraction = recipe.get("warmup_fraction", spec.warmup_fraction)
        cap = recipe.get("warmup_cap", spec.warmup_cap)
        warmup = dataclasses.replace(spec, warmup_fraction=fraction, warmup_cap=cap).warmup_steps(tc.max_steps)
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
    )
    if start.mode == "resume" and start.state is not None and start.state.resolved:
        check_resolved(start.checkpoint, start.state.resolved, run)  # the run as it was: what a resume continues
    return run


def resolve_fresh(
    cfg: RunConfig, *, device: torch.device, world_size: int = 1, meta: dict | None = None
) -> ResolvedRun:
    """`cfg` resolved as a fresh run (no run folder read: `cfg.out` None), its vocabulary from the dataset's `meta`
    where given: what the study's time estimate, the benches and the GPU race build."""
    from angpt.train.start import decide

    return resolve(cfg, decide(cfg, meta, device, clean=False, report=False), device=device, world_size=world_size)


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
        base = model_from_config(run.model).to(device)
        base.fused_loss = run.fused_loss
        model = parallelize(base, info, dist, dtype=run.dtype, activation_checkpointing=run.activation_checkpointing)
    elif reinit:
        reinitialise(model, run)
    base = unwrap(model)
    optimizer, scheduler = make_optimizer(
        model,
        run.arch,
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
    fresh = model_from_config(run.model)
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
