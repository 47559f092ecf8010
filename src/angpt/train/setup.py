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

import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from angpt import checkpoint as ckpt
from angpt.checkpoint import RunState
from angpt.errors import ConfigError, UserError
from angpt.models import ModelConfig, registry, unwrap
from angpt.models.registry import ArchSpec, Recipe
from angpt.train.config import RunConfig, TrainConfig, check_batch_geometry, resolve_model_config
from angpt.train.dist import DistInfo, parallelize
from angpt.train.optim import optimizer_for
from angpt.train.record import read_config_json, read_state_record, record_settings
from angpt.train.resume import check_resume
from angpt.train.step import TrainStep, compile_for_training, resolve_compile, resolve_dtype

FRESH, RESUME, INIT_FROM = "fresh", "resume", "init_from"


@dataclass
class Start:
    """How a run starts (see the module docstring)."""

    mode: str  # FRESH | RESUME | INIT_FROM
    model: ModelConfig
    model_from: str  # where the model config comes from, in words (the dry run says it)
    run_id: str  # the id its checkpoints carry (rotation deletes only its own)
    checkpoint: Path | None = None  # RESUME: the checkpoint; INIT_FROM: the weights
    state: RunState | None = None  # RESUME, INIT_FROM: the checkpoint's state, read once
    recorded: dict[str, Any] | None = None  # RESUME: the run the checkpoint recorded (train/record.py), read once
    notes: list[str] = field(default_factory=list)  # what resuming changes (a longer max_steps, say)


def resumed_settings(out: str | Path | None, resume: str | None) -> list[tuple[str, Any]] | None:
    """The settings a resume starts from: the run's own, as its folder's config.json recorded them when it last
    started (train/record.py's settings: less what belongs to one invocation, and with what the run derived left to
    derive again; a run started --init_from keeps it, its model came from there). None when there is nothing to
    resume from (no --resume, no --out, or a folder without a run yet)."""
    if resume is None or out is None:
        return None
    recorded = read_config_json(Path(out))
    return None if recorded is None else record_settings(recorded)


def model_config(cfg: RunConfig, meta: dict | None, init_model: ModelConfig | None = None) -> tuple[ModelConfig, str]:
    """The model a run of `cfg` builds, and where its config comes from: the checkpoint's for init_from (its
    `init_model`, read once), else the preset plus overrides with the dataset's vocabulary (`meta`, None when the
    data is not prepared yet)."""
    if cfg.init_from is not None:
        mcfg = init_model if init_model is not None else ckpt.read_weights_start(cfg.init_from)[1]
        if mcfg.arch != cfg.arch:
            raise ConfigError(f"--train.init_from holds a {mcfg.arch} model; pass --arch {mcfg.arch}")
        return registry.check_config(mcfg), f"checkpoint {cfg.init_from}"
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
    meta: dict | None,
    data_identity: dict[str, Any] | None = None,
    *,
    clean: bool = False,
    restart_unsaved: bool = False,
) -> Start:
    """How the run of `cfg` starts (see the module docstring); a one-line UserError where it cannot.

    `meta` is the dataset's meta.json, `data_identity` its fingerprint (an init_from checks its tokenizer). `clean`
    removes what a killed save left in the folder first (the trainer's rank 0); the dry run reads only. A resume's
    checkpoint and the run it recorded are read here, once; whether today's settings may continue it is decided once
    the run is resolved (train/resume.py's check_resume)."""
    out = Path(cfg.out) if cfg.out is not None else None
    if clean and out is not None and out.is_dir():  # a killed save may have left step_N aside: restore it first
        for p in ckpt.clean_stale_tmp(out):
            print(f"removed {p}, left by an interrupted save", file=sys.stderr)
    found = ckpt.resolve_resume(out, cfg.resume)  # the checkpoint and its state.json, read once
    recorded = read_state_record(found[1], found[0]) if found is not None else None
    if cfg.resume and cfg.init_from and found is not None:
        _check_same_start(cfg, recorded or {})
    init_state, init_model = ckpt.read_weights_start(cfg.init_from) if cfg.init_from is not None else (None, None)
    mcfg, model_from = model_config(cfg, meta, init_model)
    if found is not None:
        state = RunState.from_dict(found[1])
        return Start(RESUME, mcfg, model_from, state.run_id or ckpt.new_run_id(), found[0], state, recorded)
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
        return Start(INIT_FROM, mcfg, model_from, ckpt.new_run_id(), Path(cfg.init_from), init_state)
    return Start(FRESH, mcfg, model_from, ckpt.new_run_id())


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
    """Everything a run is, decided once (see the module docstring): the invocation's settings, with `train` holding
    every train.* value as the run uses it (the rate, weight decay, warm-up, context, dtype and compiling the recipe,
    the model or the device decide filled in), and what was derived beside them. `*_from` say where a derived value
    comes from ("" where train.* set it), in the words the start-up summary, the dry run and a refused resume print.
    What config.json and every checkpoint keep is :meth:`to_dict`: the run, once."""

    arch: str
    preset: str
    data: str | None
    out: str | None
    dist: str
    resume: str | None
    init_from: str | None
    model: ModelConfig
    model_overrides: dict[str, Any]  # the model.* settings as given: what a model default changed since rebuilds
    model_from: str
    train: TrainConfig
    lr_from: str
    weight_decay_from: str
    warmup_from: str
    optimizer: str  # adamw | adam
    recipe: dict[str, Any]  # the recipe's fields the run takes (a resumed run keeps its record)
    accum: int
    world_size: int
    meta: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # the dataset's meta.json, read once
    data_identity: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    spec: ArchSpec | None = field(default=None, compare=False, repr=False)  # the registry entry: its hooks, read once
    start: Start | None = field(default=None, compare=False, repr=False)  # how the run starts, and from where

    def to_dict(self) -> dict[str, Any]:
        """The run's record (config.json, every checkpoint's state.json): what a resume compares and restarts from,
        and what a study checks a model default against; the invocation's own (out, resume) left out."""
        dropped = ("out", "resume", "meta", "data_identity", "spec", "start")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in dropped}
        return out | {"model": self.model.to_dict(), "train": asdict(self.train), "recipe": dict(self.recipe)}


def recipe_rate(arch: str, preset: str | None) -> float:
    """The peak rate a run of `arch` from `preset` takes where train.lr is unset: its recipe's (None: the small
    presets', what a study's dial-made sizes take); what a study centres an arm's sweep on (study/plan.py)."""
    recipe = registry.get(arch).recipe
    return recipe.lr if preset is None else recipe.lr_for(preset)


def recipe_values(
    arch: str, preset: str, train: TrainConfig, recipe: Recipe, kept: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(values, words, record): the rate, weight decay, warm-up and optimizer a run of `train` takes, each from
    train.* where set, else from its architecture's `recipe` at `preset`; the words saying where each comes from (""
    where train.* set it); and the recipe's fields the run records: `kept` (a resumed run's record of what it took
    when it started, so that a resume compares today's recipe with it, train/resume.py), else what it takes now. The
    one place the recipe is read."""
    used = recipe.used(preset, train)
    values, words = {"optimizer": used["optimizer"]}, {}
    for key in ("lr", "weight_decay"):
        values[key] = getattr(train, key) if key not in used else used[key]
        when = "when the run started" if kept and kept.get(key) == values[key] else f"at {preset}"
        words[key] = "" if key not in used else f" (the {arch} recipe's {when}; train.{key} unset)"
    if used["optimizer"] == "adam":
        values["weight_decay"], words["weight_decay"] = 0.0, f" (the {arch} recipe's Adam decays nothing)"
    values["warmup_steps"], words["warmup_steps"] = train.warmup_steps, ""
    if train.warmup_steps is None:
        share, cap = recipe.warmup_fraction, recipe.warmup_cap
        values["warmup_steps"] = recipe.warmup_steps(train.max_steps)
        words["warmup_steps"] = f" ({share:.0%} of the run, at most {cap} steps: the {arch} recipe's)"
    return values, words, dict(kept) if kept else used


def resumed_dtype(requested: str, recorded: dict[str, Any] | None, device: torch.device) -> str:
    """The compute dtype a run uses on `device`: with `auto`, the one a resumed run has computed in (its record's),
    so that a run keeps its dtype wherever it resumes; otherwise what `requested` resolves to."""
    was = ((recorded or {}).get("train") or {}).get("dtype")
    if requested == "auto" and was in ("bf16", "fp32"):
        return was
    return resolve_dtype(requested, device)


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
    none yet), its model, its recipe's rate, weight decay and warm-up where train.* leaves them unset (a resumed run
    keeps its record), the words that say where each comes from, the batch geometry, the dtype and compiling. The one
    place that reads the registry. A resume is then checked once, the recorded run against this one
    (train/resume.py's check_resume). One-line ConfigErrors for a context longer than the model's and a batch that
    does not divide."""
    entry = registry.get(cfg.arch)
    start = decide(cfg, meta, data_identity, clean=clean, restart_unsaved=restart_unsaved)
    tc, model = cfg.train, start.model
    recorded = start.recorded
    seq_len = tc.seq_len or model.context_length
    if seq_len > model.context_length:
        raise ConfigError(f"train.seq_len={seq_len} exceeds the model's context length {model.context_length}")
    accum = check_batch_geometry(tc.batch_tokens, seq_len, tc.micro_batch, world_size)
    kept = (recorded or {}).get("recipe") or None
    values, words, used = recipe_values(cfg.arch, cfg.preset, tc, entry.recipe, kept)
    train = replace(
        tc,
        lr=float(values["lr"]),
        weight_decay=float(values["weight_decay"]),
        warmup_steps=int(values["warmup_steps"]),
        seq_len=seq_len,
        dtype=resumed_dtype(tc.dtype, recorded, device),
        compile=resolve_compile(tc.compile, device),
    )
    run = ResolvedRun(
        arch=cfg.arch,
        preset=cfg.preset,
        data=cfg.data,
        out=cfg.out,
        dist=cfg.dist,
        resume=cfg.resume,
        init_from=cfg.init_from,
        model=model,
        model_overrides=dict(cfg.model),
        model_from=start.model_from,
        train=train,
        lr_from=words["lr"],
        weight_decay_from=words["weight_decay"],
        warmup_from=words["warmup_steps"],
        optimizer=values["optimizer"],
        recipe=used,
        accum=accum,
        world_size=world_size,
        meta=meta,
        data_identity=data_identity,
        spec=entry,
        start=start,
    )
    if start.mode == RESUME:
        start.notes[:] = check_resume(start.checkpoint, recorded, run, start.state)
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
        torch.manual_seed(run.train.seed)
        base = run.spec.model(run.model).to(device)
        base.fused_loss = run.train.fused_loss
        checkpointing = run.train.activation_checkpointing
        model = parallelize(base, info, dist, dtype=run.train.dtype, activation_checkpointing=checkpointing)
    elif reinit:
        reinitialise(model, run)
    base = unwrap(model)
    tc = run.train
    optimizer, scheduler = optimizer_for(
        model,
        tc.lr,
        max_steps=tc.max_steps,
        weight_decay=tc.weight_decay,
        warmup_steps=tc.warmup_steps,
        min_lr_ratio=tc.min_lr_ratio,
        betas=(tc.beta1, tc.beta2),
        schedule=tc.schedule,
        decay_fraction=tc.decay_fraction,
        decay_shape=tc.decay_shape,
        optimizer=run.optimizer,
    )
    if forward is None:
        forward = (
            compile_for_training(model, optimizer, fresh=fresh_compile, **(compile_options or {}))
            if tc.compile
            else model
        )
    elif tc.compile:
        hook = getattr(optimizer, "weight_constraint", None)
        if hook is not None:  # the new optimizer's constraint: the same projection, compiled once already
            hook.compile()
    loader = None
    if run.data is not None:
        from angpt.data import TokenLoader

        loader = TokenLoader(
            run.data,
            "train",
            tc.micro_batch,
            tc.seq_len,
            rank=info.rank,
            world_size=info.world_size,
            seed=tc.seed,
            meta=run.meta,
        )
    step = TrainStep(
        model,
        optimizer,
        scheduler,
        device=device,
        dtype=tc.dtype,
        accum=run.accum,
        grad_clip=tc.grad_clip,
        forward=forward,
        dist=info,
    )
    flops = base.flops_per_token(tc.seq_len) if hasattr(base, "flops_per_token") else 0.0
    return Built(model, base, optimizer, scheduler, step, loader, forward, flops)


@torch.no_grad()
def reinitialise(model: nn.Module, run: ResolvedRun) -> None:
    """Set `model`'s parameters and buffers, in place, to those of a new model of `run` initialised under
    `run.seed`: the tensors keep their identity (a compiled forward's guards hold), their values become a fresh
    run's. Refused (ValueError) for a model of another config."""
    base = unwrap(model)
    if base.config.to_dict() != run.model.to_dict():
        raise ValueError("reinitialise: the model was built for another model config")
    torch.manual_seed(run.train.seed)
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
