"""Run configuration: a YAML recipe plus `--section.key value` overrides, resolved into typed dataclasses."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from angpt.errors import ConfigError
from angpt.models import registry
from angpt.models.config import PRESETS, ModelConfig


@dataclass
class TrainConfig:
    max_steps: int = 200
    stop_at: int | None = None  # save and exit after this step, as if interrupted (time-limited jobs; tests)
    batch_tokens: int = 16384  # global batch in tokens: split into ranks x micro-batches x accumulation
    micro_batch: int = 16  # sequences per rank per forward
    seq_len: int | None = None  # None -> the model's context length
    lr: float | None = None  # None -> the architecture's recipe (models/registry.py)
    weight_decay: float | None = None  # None -> the recipe's (0.1 on GPT/GPT+ matrices); nGPT/anGPT use none
    warmup_steps: int | None = None  # None -> 5% for GPT/GPT+, 0 for nGPT/anGPT
    min_lr_ratio: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    dtype: str = "auto"  # auto: bf16 autocast where the device supports it, else fp32; params stay fp32
    compile: bool = False
    activation_checkpointing: bool = False  # recompute each block's activations in backward: memory for ~1/3 time
    device: str = "auto"
    seed: int = 0
    deterministic: bool = False
    eval_every: int = 50
    eval_batches: int = 20
    log_every: int = 10
    save_every: int = 100
    keep_last: int = 2
    peak_flops: float | None = None  # per device, for MFU; None -> table lookup
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "angpt"
    progress: bool = True
    # in-loop lm-eval: comma-separated task names, run every `eval_tasks_every` steps (local YAMLs via include)
    eval_tasks: str | None = None
    eval_tasks_every: int = 0
    eval_tasks_include: str | None = None
    eval_tasks_limit: int | None = None

    def validate(self) -> None:
        for name in ("max_steps", "batch_tokens", "micro_batch", "eval_batches", "log_every", "keep_last"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"train.{name}={v!r} must be a positive integer")
        for name in ("eval_every", "save_every", "eval_tasks_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"train.{name}={v!r} must be a non-negative integer (0 disables)")
        if self.seq_len is not None and (not isinstance(self.seq_len, int) or self.seq_len <= 0):
            raise ConfigError(f"train.seq_len={self.seq_len!r} must be a positive integer or null")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"train.lr={self.lr!r} must be a positive number")
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ConfigError(f"train.dtype={self.dtype!r}; use auto, bf16 or fp32")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"train.min_lr_ratio={self.min_lr_ratio!r} must be in [0, 1]")
        if self.grad_clip < 0:
            raise ConfigError(f"train.grad_clip={self.grad_clip!r} must be >= 0 (0 disables clipping)")


@dataclass
class RunConfig:
    arch: str = "angpt"
    preset: str = "demo"
    model: dict[str, Any] = field(default_factory=dict)  # overrides of the preset
    data: str | None = None
    out: str | None = None
    dist: str = "ddp"
    resume: str | None = None  # None, "auto" or a checkpoint path
    init_from: str | None = None  # start from these weights (a checkpoint, e.g. from `angpt import-hf`) at step 0
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        registry.get(self.arch)  # a one-line error naming the architectures
        if self.preset not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset!r}; use one of: {', '.join(PRESETS)}")
        if self.dist not in ("ddp", "fsdp"):
            raise ConfigError(f"dist={self.dist!r}; use ddp or fsdp")
        known = {f.name for f in dataclasses.fields(ModelConfig)} - {"arch"}
        unknown = sorted(set(self.model) - known)
        if unknown:
            raise ConfigError(f"unknown model key(s): {', '.join(unknown)}; valid keys: {', '.join(sorted(known))}")
        self.train.validate()

    @property
    def lr(self) -> float:
        return self.train.lr if self.train.lr is not None else registry.get(self.arch).recipe.lr

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_TOP = {f.name for f in dataclasses.fields(RunConfig)} - {"train", "model"}
_TRAIN = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if parts[0] == "train" and (len(parts) != 2 or parts[1] not in _TRAIN):
        raise ConfigError(f"unknown config key {dotted!r}; train keys: {', '.join(sorted(_TRAIN))}")
    if parts[0] not in ("train", "model") and (len(parts) != 1 or parts[0] not in _TOP):
        raise ConfigError(
            f"unknown config key {dotted!r}; top-level keys: {', '.join(sorted(_TOP | {'train', 'model'}))}"
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
        out.append((key.replace("-", "_") if key.startswith("train.") else key, yaml.safe_load(value)))
    return out


def load_run_config(path: str | Path | None = None, overrides: list[tuple[str, Any]] | dict | None = None) -> RunConfig:
    """Read a YAML recipe (optional) and apply overrides; validate everything."""
    tree: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            tree = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {str(e).splitlines()[0]}") from e
        if not isinstance(tree, dict):
            raise ConfigError(f"{p} must hold a mapping of config keys")
        flat: list[tuple[str, Any]] = []
        for k, v in tree.items():
            if k in ("train", "model") and isinstance(v, dict):
                flat += [(f"{k}.{kk}", vv) for kk, vv in v.items()]
            else:
                flat.append((k, v))
        tree = {}
        for k, v in flat:
            _set(tree, k, v)
    items = overrides.items() if isinstance(overrides, dict) else (overrides or [])
    for k, v in items:
        _set(tree, k, v)
    train = TrainConfig(**tree.pop("train", {}))
    cfg = RunConfig(**tree, train=train)
    cfg.validate()
    return cfg


def run_config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Rebuild a RunConfig saved with `to_dict()` (a checkpoint's or run directory's)."""
    data = dict(data)
    train = TrainConfig(**data.pop("train", {}))
    return RunConfig(**data, train=train)
