"""Everything about each architecture, in one place (as torchtitan's TrainSpec and litgpt's name_to_config do).

An entry names the model class, the config defaults it applies over a preset, the optimizer recipe with its
default learning rate, the constants report, inference folding and the Hugging Face export kind. The weight
constraint and the default softmax scale follow from the model's equations and are class attributes of the model
(``weight_constraint``, ``unit_qk``); the entry reports them. Code elsewhere asks this module and never compares an
architecture's name. Adding an architecture is one model file plus one :func:`register` call (docs/architectures.md).

Named *variants* (``dyt``, ``ln_scaling``, ...) are an architecture with config overrides: the comparison rows of
the paper, usable wherever an architecture name is (``angpt compare --arms gpt+,dyt``).

The review's controls (docs/architectures.md#controls) are entries and variants too: ``gpt+wn``, ``gpt+cos``,
``ngpt_frozen_alpha``, ``angpt_frozen_alpha``. A control option set on an architecture whose model does not
implement it is a one-line ConfigError (:func:`check_config`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from angpt.errors import ConfigError
from angpt.models.angpt import ANGPT, calibrate_during_training
from angpt.models.base import LanguageModel
from angpt.models.config import CONTROLS, PRESETS, ModelConfig
from angpt.models.constants import angpt_constants
from angpt.models.folded import FoldedANGPT, FoldedNGPT
from angpt.models.gpt import GPT
from angpt.models.layers import COS_TAU_MIN
from angpt.models.ngpt import NGPT


@dataclass(frozen=True)
class Recipe:
    """How an architecture is optimised: the optimizer, its decay and warm-up, a default LR.

    See docs/architectures.md#optimizer-recipes.

    `lr` is the default peak learning rate at the demo scale; `angpt compare` tunes it per arm by a sweep.
    Warm-up is `warmup_fraction` of the run, at least one step when the fraction is positive, at most
    `warmup_cap` steps.
    """

    optimizer: str  # "adamw" (weight decay on matrices) or "adam" (none)
    lr: float
    weight_decay: float = 0.0
    warmup_fraction: float = 0.0
    warmup_cap: int = 1000

    def warmup_steps(self, max_steps: int) -> int:
        if self.warmup_fraction <= 0:
            return 0
        return min(self.warmup_cap, max(1, int(max_steps * self.warmup_fraction)))


@dataclass(frozen=True)
class ArchSpec:
    """One architecture: what builds it, trains it, describes it and ships it."""

    name: str
    model: type[LanguageModel]
    summary: str
    recipe: Recipe
    export: str  # "native": Qwen3 / Llama by config (hf/export.py); "folded": our folded custom class
    config: dict[str, Any] = field(default_factory=dict)  # defaults applied over the preset, before overrides
    # The inference form: a class whose classmethod fold(model) returns an equivalent model with every constant or
    # reparameterisation folded into plain weights (FoldedNGPT / FoldedANGPT; GPT for gpt+wn). None: nothing to fold.
    folded: type[LanguageModel] | None = None
    constants: Callable[[ModelConfig], dict[str, Any]] | None = None  # extra lines for `angpt info`
    # Called by the trainer before every optimizer step: (model, steps done, max_steps, batches) -> a note or None,
    # where batches(n) gives n training batches drawn apart from the training stream (anGPT's nu_att calibration).
    before_step: Callable[..., str | None] | None = None

    @property
    def weight_constraint(self) -> str:
        """The row constraint applied after every optimizer step by default ("none", "unit" or "bounded")."""
        return self.model.weight_constraint

    def softmax_scale(self, cfg: ModelConfig) -> float:
        return self.model.default_softmax_scale(cfg) if cfg.softmax_scale is None else cfg.softmax_scale

    def describe(self, cfg: ModelConfig) -> dict[str, Any]:
        """The constants and effective defaults of `cfg`, for `angpt info` and reports."""
        out: dict[str, Any] = {
            "softmax_scale": self.softmax_scale(cfg),
            "weight_constraint": self.model.constraint_of(cfg),
            "optimizer": self.recipe.optimizer,
        }
        if self.constants is not None:
            out.update(self.constants(cfg))
        return out


ARCHITECTURES: dict[str, ArchSpec] = {}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (architecture, config overrides)


def register(spec: ArchSpec) -> ArchSpec:
    """Add an architecture (a name may be registered once)."""
    if spec.name in ARCHITECTURES or spec.name in VARIANTS:
        raise ValueError(f"architecture {spec.name!r} is already registered")
    ARCHITECTURES[spec.name] = spec
    return spec


def register_variant(name: str, arch: str, **overrides: Any) -> None:
    """A named comparison row: architecture `arch` with config `overrides`."""
    if name in ARCHITECTURES or name in VARIANTS:
        raise ValueError(f"{name!r} is already registered")
    get(arch)
    VARIANTS[name] = (arch, overrides)


def get(arch: str) -> ArchSpec:
    """The entry of `arch`; a one-line ConfigError naming the choices for an unknown name."""
    try:
        return ARCHITECTURES[arch]
    except KeyError:
        raise ConfigError(f"unknown architecture {arch!r}; use one of: {', '.join(ARCHITECTURES)}") from None


def of(model_or_config: nn.Module | ModelConfig) -> ArchSpec:
    """The entry of a model (or its config)."""
    cfg = model_or_config if isinstance(model_or_config, ModelConfig) else model_or_config.config
    return get(cfg.arch)


def resolve_arm(name: str) -> tuple[str, dict[str, Any]]:
    """An architecture or variant name -> (architecture, config overrides)."""
    if name in ARCHITECTURES:
        return name, {}
    if name in VARIANTS:
        arch, overrides = VARIANTS[name]
        return arch, dict(overrides)
    choices = ", ".join([*ARCHITECTURES, *VARIANTS])
    raise ConfigError(f"unknown architecture or variant {name!r}; use one of: {choices}")


# ------------------------------------------------------------------------------------------- configs, models
def check_config(cfg: ModelConfig) -> ModelConfig:
    """`cfg`, after checking that its architecture implements every control it sets (one-line ConfigError)."""
    model = get(cfg.arch).model
    for name, off in CONTROLS.items():
        value = getattr(cfg, name)
        if value != off and name not in model.controls:
            having = ", ".join(a for a, s in ARCHITECTURES.items() if name in s.model.controls)
            raise ConfigError(f"model.{name}={value!r} does not apply to arch {cfg.arch!r}; it applies to: {having}")
    model.check_config(cfg)
    return cfg


def make_config(arch: str, preset: str | ModelConfig | dict[str, Any] = "demo", **overrides: Any) -> ModelConfig:
    """A validated config for `arch` from a preset name, a dict, or an existing config, plus overrides.

    The entry's config defaults go over the preset (e.g. "gpt" sets qk_norm=False), then the overrides.
    """
    spec = get(arch)
    if isinstance(preset, ModelConfig):
        base = preset.to_dict()
    elif isinstance(preset, dict):
        base = dict(preset)
    elif preset in PRESETS:
        base = dict(PRESETS[preset])
    else:
        raise ConfigError(f"unknown preset {preset!r}; use one of: {', '.join(PRESETS)}")
    base.update(spec.config)
    base["arch"] = arch
    base.update(overrides)
    return check_config(ModelConfig.from_dict(base))


def build_model(arch: str, config: str | ModelConfig | dict[str, Any] = "demo", **overrides: Any) -> LanguageModel:
    """Build architecture `arch` from a preset name or config, plus overrides.

    >>> model = build_model("angpt", "tiny", n_layers=4)
    """
    cfg = make_config(arch, config, **overrides)
    return get(cfg.arch).model(cfg)


def model_from_config(cfg: ModelConfig) -> LanguageModel:
    """The model of a resolved config (a checkpoint's, say), without re-applying defaults."""
    return get(cfg.arch).model(check_config(cfg))


def fold_for_inference(model: nn.Module) -> nn.Module:
    """An equivalent fp32, eval-mode inference model with every constant folded into the weights.

    Architectures with nothing to fold (GPT+) come back as an eval-mode fp32 copy.
    """
    from angpt.models.constraints import unwrap

    model = unwrap(model)
    folded = of(model).folded
    if folded is None:
        return copy.deepcopy(model).float().eval()
    return folded.fold(model)


def describe_constants(cfg: ModelConfig) -> dict[str, Any]:
    """The constants of `cfg` as a printable dict (anGPT's nu; nGPT's effective scales; the softmax scale)."""
    return of(cfg).describe(cfg)


# ------------------------------------------------------------------------------------------------ entries
def _ngpt_constants(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "alpha_init": cfg.alpha_init,
        "s_qk_init": cfg.s_qk_init,
        "s_uz_effective_init": cfg.s_uz_init * math.sqrt(cfg.d_model),
        "s_z_init": cfg.s_z_init,
    }


_GPT_RECIPE = Recipe("adamw", lr=2e-3, weight_decay=0.1, warmup_fraction=0.05)

register(
    ArchSpec(
        "gpt",
        GPT,
        "GPT+ without QK-norm (Llama block)",
        _GPT_RECIPE,
        export="native",
        config={"qk_norm": False},
        constants=lambda cfg: {"init_std": cfg.init_std},
    )
)
register(
    ArchSpec(
        "gpt+",
        GPT,
        "pre-norm Transformer with QK-norm (Qwen3 block); the paper's baseline",
        _GPT_RECIPE,
        export="native",
        constants=lambda cfg: {"init_std": cfg.init_std},
    )
)
register(
    ArchSpec(
        "ngpt",
        NGPT,
        "normalized Transformer: exact norms on the hypersphere (Loshchilov et al. 2024)",
        Recipe("adam", lr=8e-3),
        export="folded",
        folded=FoldedNGPT,
        constants=_ngpt_constants,
    )
)
register(
    ArchSpec(
        "angpt",
        ANGPT,
        "approximately normalized Transformer: constants nu for norms, rows ||w|| <= 1 (Franke et al. 2025)",
        Recipe("adam", lr=4e-3),
        export="folded",
        folded=FoldedANGPT,
        constants=lambda cfg: angpt_constants(cfg).describe(),
        before_step=calibrate_during_training,
    )
)

# The review's controls (seed 003; docs/architectures.md#controls): GPT+ given one ingredient of normalisation.
register(
    ArchSpec(
        "gpt+wn",
        GPT,
        "control: GPT+ with weight normalisation W = g V/||V|| per row of every linear map (Salimans & Kingma 2016)",
        _GPT_RECIPE,
        export="native",  # folded to a plain GPT+ first (GPT.fold), then a Qwen3 checkpoint
        config={"weight_norm": True},
        folded=GPT,
        constants=lambda cfg: {"init_std": cfg.init_std, "weight_norm": "W = g V/||V|| per row, g = ||V|| at init"},
    )
)
register(
    ArchSpec(
        "gpt+cos",
        GPT,
        "control: GPT+ with scaled cosine attention, logits cos(q, k)/tau, learned tau >= 0.01 per head (Swin v2)",
        _GPT_RECIPE,
        export="native",  # refused by hf/export.resolve_format: no transformers class has per-head tau
        config={"attention": "cosine", "qk_norm": False},
        constants=lambda cfg: {"init_std": cfg.init_std, "cos_tau_init": cfg.cos_tau_init, "cos_tau_min": COS_TAU_MIN},
    )
)

register_variant("dyt", "gpt+", norm="dyt")  # DyT in place of every RMSNorm (Zhu et al. 2025)
register_variant("ln_scaling", "gpt+", norm="ln_scaling")  # pre-norm outputs times 1/sqrt(l) (Sun et al. 2025)
register_variant("ngpt_bounded", "ngpt", weight_constraint="bounded")  # the paper's "nGPT with <= 1" row
register_variant("ngpt_frozen_alpha", "ngpt", freeze_alpha=True)  # control: eigen learning rates fixed at init
register_variant("angpt_frozen_alpha", "angpt", freeze_alpha=True)  # control: eigen learning rates fixed at init

ARCHS: tuple[str, ...] = tuple(ARCHITECTURES)
BASELINE = "gpt+"  # what comparisons measure against unless told otherwise (the paper's baseline)
