"""Run configuration: a YAML recipe plus `--section.key value` overrides, resolved into typed dataclasses."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from angpt.errors import ConfigError, did_you_mean
from angpt.models import make_config
from angpt.models.config import PRESETS, ModelConfig


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader plus YAML 1.2's floats: YAML 1.1 reads `4e-3` and `1e5` (no dot) as strings."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """A YAML document or scalar, with `4e-3` a float (see :class:`YamlLoader`)."""
    return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader subclass)


@dataclass
class TrainConfig:
    max_steps: int = 200  # optimizer steps; the LR schedule spans them
    stop_at: int | None = None  # save and exit after this step, as if interrupted (time-limited jobs; tests)
    batch_tokens: int = 16384  # global batch in tokens: split into ranks x micro-batches x accumulation
    micro_batch: int = 16  # sequences per rank per forward
    seq_len: int | None = None  # None -> the model's context length
    lr: float | None = None  # None -> the architecture's recipe (models/registry.py)
    weight_decay: float | None = None  # None -> the recipe's (0.1 on GPT/GPT+ matrices); nGPT/anGPT use none
    warmup_steps: int | None = None  # None -> 5% for GPT/GPT+, 0 for nGPT/anGPT
    min_lr_ratio: float = 0.1  # the schedule's floor, a fraction of the peak LR
    schedule: str = "cosine"  # cosine | wsd (warm-up, stable, decay: train/optim.py's Schedule)
    decay_fraction: float = 0.2  # wsd: the last fraction of max_steps that decays
    decay_shape: str = "1-sqrt"  # wsd: linear | 1-sqrt
    beta1: float = 0.9  # Adam beta1
    beta2: float = 0.95  # Adam beta2
    grad_clip: float = 1.0  # clip the global gradient norm to this (0: off)
    dtype: str = "auto"  # auto: bf16 autocast where the device supports it, else fp32; params stay fp32
    compile: bool | str = "auto"  # torch.compile the forward: auto = on CUDA (where triton is), off on CPUs
    init_any_tokenizer: bool = False  # let --init_from start from weights trained with another tokenizer
    spike_factor: float = 0.0  # stop when a step's loss exceeds this multiple of the running mean (0 disables)
    activation_checkpointing: bool = False  # recompute each block's activations in backward: memory for ~1/3 time
    fused_loss: bool = True  # the loss chunk by chunk without the full logits (models/loss.py)
    device: str = "auto"  # auto, cpu, cuda or cuda:N
    seed: int = 0  # initial weights and data order
    deterministic: bool = False  # torch's deterministic algorithms (slower)
    eval_every: int = 50  # validation every N steps (0: only at the end)
    eval_batches: int = 20  # validation batches of micro_batch sequences each
    log_every: int = 10  # a metrics.jsonl row every N steps
    save_every: int = 100  # a checkpoint every N steps (0: only at the end)
    keep_last: int = 2  # checkpoints kept (older ones of this run are deleted)
    keep_best: bool = True  # keep the weights of the lowest validation loss in checkpoints/best (nanoGPT's habit)
    peak_flops: float | None = None  # per device, for MFU; None -> table lookup
    tensorboard: bool = True  # TensorBoard events in OUT/tb
    wandb: bool = False  # log to Weights & Biases
    wandb_project: str = "angpt"  # its project
    progress: bool = True  # the progress bar
    loss_curve: bool = True  # draw OUT/loss_curve.png when the run finishes (a study's report draws its runs' curves)
    # in-loop lm-eval: comma-separated task names, run every `eval_tasks_every` steps (local YAMLs via include)
    eval_tasks: str | None = None  # lm-eval tasks run during training, comma-separated
    eval_tasks_every: int = 0  # every N steps (0: off)
    eval_tasks_include: str | None = None  # a folder of local task YAMLs
    eval_tasks_limit: int | None = None  # documents per task

    def validate(self) -> None:
        """One-line ConfigErrors naming the field and what it must be, for a wrong type as for a bad value."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            rule = _RULES.get(f.name)
            if not _type_ok(value, _TYPES[f.name]) or (value is not None and rule and not rule[0](value)):
                want = rule[1] if rule else _type_name(_TYPES[f.name])
                raise ConfigError(f"train.{f.name}={value!r} must be {want}")


_POSITIVE = (lambda v: v > 0, "a positive integer")
_SWITCH = (lambda v: v >= 0, "a non-negative integer (0 disables)")
_POSITIVE_OR_NULL = (lambda v: v > 0, "a positive integer or null")
# Value rules of TrainConfig's fields (types come from the annotations): (predicate, what the field must be).
_RULES: dict[str, tuple[Any, str]] = {
    **dict.fromkeys(("max_steps", "batch_tokens", "micro_batch", "eval_batches", "log_every", "keep_last"), _POSITIVE),
    **dict.fromkeys(("eval_every", "save_every", "eval_tasks_every"), _SWITCH),
    **dict.fromkeys(("seq_len", "stop_at", "eval_tasks_limit"), _POSITIVE_OR_NULL),
    "warmup_steps": (lambda v: v >= 0, "a non-negative integer, or null for the architecture's recipe"),
    "lr": (lambda v: v > 0, "a positive number, or null for the architecture's recipe"),
    "weight_decay": (lambda v: v >= 0, "a number >= 0, or null for the architecture's recipe"),
    "min_lr_ratio": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "schedule": (lambda v: v in ("cosine", "wsd"), "cosine or wsd"),
    "decay_fraction": (lambda v: 0 < v <= 1, "a number in (0, 1], e.g. 0.2"),
    "decay_shape": (lambda v: v in ("linear", "1-sqrt"), "linear or 1-sqrt"),
    "beta1": (lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.9"),
    "beta2": (lambda v: 0 < v < 1, "a number in (0, 1), e.g. 0.95"),
    "grad_clip": (lambda v: v >= 0, "a number >= 0 (0 disables clipping)"),
    "spike_factor": (lambda v: v == 0 or v > 1, "0 (off) or a number > 1, e.g. 3"),
    "peak_flops": (lambda v: v > 0, "a positive number (FLOP/s per device) or null"),
    "dtype": (lambda v: v in ("auto", "bf16", "fp32"), "auto, bf16 or fp32"),
    "compile": (lambda v: v is True or v is False or v == "auto", "true, false or auto"),
}


_TYPES = typing.get_type_hints(TrainConfig)


def _kinds(tp: Any) -> set:
    """The plain types an annotation admits: `float | None` -> {float, NoneType}."""
    args = typing.get_args(tp)
    return set(args) if args else {tp}


def _type_ok(value: Any, tp: Any) -> bool:
    """Whether `value` fits annotation `tp` (an int fits a float field; a bool is no number; numbers are finite)."""
    kinds = _kinds(tp)
    return (
        (value is None and type(None) in kinds)
        or (bool in kinds and isinstance(value, bool))
        or (int in kinds and isinstance(value, int) and not isinstance(value, bool))
        or (float in kinds and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))
        or (str in kinds and isinstance(value, (str, os.PathLike)))
    )


def _type_name(tp: Any) -> str:
    kinds = _kinds(tp)
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "text"}
    want = " or ".join(names[k] for k in (bool, int, float, str) if k in kinds and not (k is int and float in kinds))
    return want + (" (or null)" if type(None) in kinds else "")


def _coerce(value: Any, tp: Any) -> Any:
    """A value as its field's type where that is lossless: "4e-3" -> 0.004 for a float, "1e3" or 1000.0 -> 1000 for an
    int (YAML 1.1, and so `yaml.safe_load`, reads `4e-3` as a string). Anything else is left for `validate`."""
    kinds = _kinds(tp)
    if str in kinds or isinstance(value, bool) or not ({int, float} & kinds):
        return value
    number = value
    if isinstance(value, str):
        try:
            number = float(value.strip().replace("_", ""))
        except ValueError:
            return value
    if not isinstance(number, (int, float)) or not math.isfinite(number):
        return value
    if float in kinds:
        return float(number)
    return int(number) if float(number).is_integer() else value


@dataclass
class RunConfig:
    arch: str = "angpt"  # gpt, gpt+, ngpt, angpt, tokenformer or a variant (angpt info)
    preset: str = "demo"  # tiny, demo, gpt2-small, 0.5B or 1B
    model: dict[str, Any] = field(default_factory=dict)  # overrides of the preset
    data: str | None = None  # a folder written by angpt prepare
    out: str | None = None  # the run folder: checkpoints, metrics.jsonl, config.json
    dist: str = "ddp"  # ddp or fsdp under torchrun
    resume: str | None = None  # None, "auto" or a checkpoint path
    init_from: str | None = None  # start from these weights (a checkpoint, e.g. from `angpt import-hf`) at step 0
    train: TrainConfig = field(default_factory=TrainConfig)  # the train.* settings

    def validate(self) -> None:
        """One-line ConfigErrors for a bad value; an unknown architecture is one as its model is made."""
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; use one of: {', '.join(PRESETS)}")
        if self.dist not in ("ddp", "fsdp"):
            raise ConfigError(f"dist={self.dist!r}; use ddp or fsdp")
        known = {f.name for f in dataclasses.fields(ModelConfig)} - {"arch"}
        unknown = sorted(set(self.model) - known)
        if unknown:
            named = ", ".join(k + did_you_mean(f"model.{k}", _KEYS) for k in unknown)
            raise ConfigError(f"unknown model key(s): {named}; valid keys: {', '.join(sorted(known))}")
        if self.out is not None:
            existing = next((p for p in (Path(self.out), *Path(self.out).parents) if p.exists()), None)
            if existing is not None and not existing.is_dir():
                where = "" if existing == Path(self.out) else f" (in --out {self.out})"
                raise ConfigError(f"{existing}{where} is a file; --out must be a directory (new or a run's)")
        self.train.validate()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_TOP = {f.name for f in dataclasses.fields(RunConfig)} - {"train", "model"}
_TRAIN = {f.name: f for f in dataclasses.fields(TrainConfig)}
_TOP_TYPES = typing.get_type_hints(RunConfig)
_MODEL_TYPES = typing.get_type_hints(ModelConfig)
# Every key a recipe or a flag may set, dotted: what a mistyped one is matched against.
_KEYS = sorted(_TOP | {f"train.{k}" for k in _TRAIN} | {f"model.{k}" for k in _MODEL_TYPES if k != "arch"})


def _field_type(dotted: str) -> Any:
    """The annotation of a config key (`train.lr`, `model.d_model`, `out`), or None for an unknown key."""
    section, _, name = dotted.rpartition(".")
    table = {"train": _TYPES, "model": _MODEL_TYPES, "": _TOP_TYPES}.get(section, {})
    return None if name in ("train", "model") and not section else table.get(name)


def _set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if parts[0] == "train" and (len(parts) != 2 or parts[1] not in _TRAIN):
        hint = did_you_mean(dotted, _KEYS)
        raise ConfigError(f"unknown config key {dotted!r}{hint}; train keys: {', '.join(sorted(_TRAIN))}")
    if parts[0] not in ("train", "model") and (len(parts) != 1 or parts[0] not in _TOP):
        hint = did_you_mean(dotted, _KEYS)
        raise ConfigError(
            f"unknown config key {dotted!r}{hint}; top-level keys: {', '.join(sorted(_TOP | {'train', 'model'}))}"
        )
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key {dotted!r}: {p} is not a section")
    node[parts[-1]] = value


def parse_overrides(args: list[str]) -> list[tuple[str, Any]]:
    """`--train.lr 3e-3 --model.d_model=512` -> [("train.lr", 0.003), ("model.d_model", 512)] (YAML scalars)."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ConfigError(f"unexpected argument {a!r}; overrides look like --train.lr 3e-3")
        if "=" in a:
            key, value = a[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"override {a} needs a value")
            key, value = a[2:], args[i + 1]
            i += 2
        key = key.replace("-", "_") if key.startswith("train.") else key
        out.append((key, parse_value(key, value)))
    return out


def parse_value(key: str, text: str) -> Any:
    """A command-line value: a YAML scalar (`4e-3` a float), except that a text field keeps the text as typed."""
    try:
        value = load_yaml(text)
    except yaml.YAMLError:
        return text
    tp = _field_type(key)
    if tp is not None and str in _kinds(tp) and value is not None and not isinstance(value, str):
        if bool in _kinds(tp) and isinstance(value, bool):
            return value  # --train.compile true (true, false or auto)
        return text  # --train.wandb_project 2024, --out 1e3: names, not numbers
    return value


def flatten(run: dict[str, Any]) -> list[tuple[str, Any]]:
    """A recipe's nested keys as dotted ones: {"train": {"lr": ...}} -> [("train.lr", ...)]."""
    flat = []
    for k, v in run.items():
        if k in ("train", "model") and isinstance(v, dict):
            flat += [(f"{k}.{kk}", vv) for kk, vv in v.items()]
        else:
            flat.append((k, v))
    return flat


def load_run_config(
    path: str | Path | None = None,
    overrides: list[tuple[str, Any]] | dict | None = None,
    base: list[tuple[str, Any]] | None = None,
) -> RunConfig:
    """Read a YAML recipe (optional) and apply overrides; validate everything. `base` (a resumed run's stored
    settings, a run's config.json given as the recipe: train/record.py's recipe_settings) comes first, the recipe
    over it, the overrides last."""
    tree: dict[str, Any] = {}
    for k, v in base or []:
        _set(tree, k, v)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            read = load_yaml(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {str(e).splitlines()[0]}") from e
        if not isinstance(read, dict):
            raise ConfigError(f"{p} must hold a mapping of config keys")
        for k, v in flatten(read):
            _set(tree, k, v)
    items = overrides.items() if isinstance(overrides, dict) else (overrides or [])
    for k, v in items:
        _set(tree, k, v)
    for section, types in (("train", _TYPES), ("model", _MODEL_TYPES)):
        values = tree.get(section, {})
        for k, v in values.items():
            if k in types:
                values[k] = _coerce(v, types[k])
    train = TrainConfig(**tree.pop("train", {}))
    cfg = RunConfig(**tree, train=train)
    cfg.validate()
    return cfg


# ------------------------------------------------------------------------------------------------ the model
def resolve_model_config(cfg: RunConfig, data_meta: dict | None) -> ModelConfig:
    """Preset + overrides; the vocabulary follows the dataset unless given, and must cover it."""
    overrides = dict(cfg.model)
    if cfg.train.seq_len is not None and "context_length" not in overrides:
        overrides["context_length"] = max(cfg.train.seq_len, PRESETS[cfg.preset]["context_length"])
    if data_meta is not None:
        data_vocab = int(data_meta["vocab_size"])
        if "vocab_size" not in overrides:
            overrides["vocab_size"] = -(-data_vocab // 64) * 64  # padded to a multiple of 64 for fast matmuls
        elif overrides["vocab_size"] < data_vocab:
            raise ConfigError(
                f"the dataset's vocabulary ({data_vocab}) is larger than model.vocab_size={overrides['vocab_size']}; "
                f"set model.vocab_size >= {data_vocab} or drop the override"
            )
    return make_config(cfg.arch, cfg.preset, **overrides)


def check_batch_geometry(batch_tokens: int, seq_len: int, micro_batch: int, world_size: int) -> int:
    """Gradient-accumulation steps of a global batch; a one-line ConfigError when it does not divide evenly."""
    seqs, rem = divmod(batch_tokens, seq_len)
    per_step = micro_batch * world_size
    if rem or seqs % per_step:
        raise ConfigError(
            f"train.batch_tokens={batch_tokens} must be a multiple of seq_len x micro_batch x ranks = "
            f"{seq_len} x {micro_batch} x {world_size} = {seq_len * per_step}; e.g. --train.batch_tokens "
            f"{max(1, round(batch_tokens / (seq_len * per_step))) * seq_len * per_step}"
        )
    return seqs // per_step
