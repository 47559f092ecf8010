"""Everything about each architecture, in one place (as torchtitan's TrainSpec and litgpt's name_to_config do).

An entry names the model class, the config defaults it applies over a preset, the optimizer recipe with its
default learning rate, the constants report, inference folding, growth and the Hugging Face export kind. The weight
constraint and the default softmax scale follow from the model's equations and are class attributes of the model
(``weight_constraint``, ``unit_qk``); the entry reports them. Code elsewhere asks this module and never compares an
architecture's name. Adding an architecture is one model file plus one :func:`register` call (docs/architectures.md).

Named *variants* (``dyt``, ``ln_scaling``, ...) are an architecture with config overrides: the comparison rows of
the paper, usable wherever an architecture name is (``angpt compare --arms gpt+,dyt``).

The review's controls (docs/architectures.md#controls) are entries and variants too: ``gpt+wn``, ``gpt+cos``,
``ngpt_frozen_alpha``, ``angpt_frozen_alpha``. A control option (or LAUREL, ``model.laurel``) set on an architecture
whose model does not implement it is a one-line ConfigError (:func:`check_config`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from angpt.errors import ConfigError
from angpt.models import tokenformer
from angpt.models.angpt import ANGPT, calibrate_during_training
from angpt.models.base import LanguageModel
from angpt.models.config import ARCH_FIELDS, CONTROLS, PRESETS, ModelConfig
from angpt.models.constants import angpt_constants
from angpt.models.folded import FoldedANGPT, FoldedGPT, FoldedNGPT
from angpt.models.gpt import GPT
from angpt.models.layers import COS_TAU_MIN
from angpt.models.ngpt import NGPT


@dataclass(frozen=True)
class Recipe:
    """How an architecture is optimised: the optimizer, its decay and warm-up, a default LR per size.

    See docs/architectures.md#optimizer-recipes.

    `lr` is the default peak learning rate at the small presets (tiny, demo); `lr_at` overrides it for a larger
    preset, where the small models' rate does not train or is not the measured one. A run with train.lr unset
    takes :meth:`lr_for` its preset; `angpt compare` centres its sweep there. Warm-up is `warmup_fraction` of the
    run, at least one step when the fraction is positive, at most `warmup_cap` steps.
    """

    optimizer: str  # "adamw" (weight decay on matrices) or "adam" (none)
    lr: float
    weight_decay: float = 0.0
    warmup_fraction: float = 0.0
    warmup_cap: int = 1000
    lr_at: dict[str, float] = field(default_factory=dict)  # preset -> default peak LR where it is not `lr`

    def lr_for(self, preset: str) -> float:
        """The default peak learning rate of a model built from `preset`."""
        return self.lr_at.get(preset, self.lr)

    def warmup_steps(self, max_steps: int) -> int:
        if self.warmup_fraction <= 0:
            return 0
        return min(self.warmup_cap, max(1, int(max_steps * self.warmup_fraction)))

    def default(self, key: str, preset: str) -> Any:
        """The recipe's value of `key` (lr, weight_decay, ...) for a model built from `preset`."""
        return self.lr_for(preset) if key == "lr" else getattr(self, key)

    def used(self, preset: str, train: Any) -> dict[str, Any]:
        """The recipe's fields a run from `preset` with train settings `train` (a TrainConfig) takes: the optimizer
        always, the learning rate (the preset's) and weight decay where train.lr / train.weight_decay are unset, the
        warm-up's fraction and cap where train.warmup_steps is. A run records them (config.json, every checkpoint),
        so that a recipe changed since (a new default rate) is never taken for the one it was trained with."""
        used: dict[str, Any] = {"optimizer": self.optimizer}
        for key in ("lr", "weight_decay"):
            if getattr(train, key) is None:
                used[key] = self.default(key, preset)
        if train.warmup_steps is None:
            used |= {"warmup_fraction": self.warmup_fraction, "warmup_cap": self.warmup_cap}
        return used


@dataclass(frozen=True)
class ArchSpec:
    """One architecture: what builds it, trains it, describes it and ships it."""

    name: str
    model: type[LanguageModel]
    summary: str
    recipe: Recipe
    # "native": Qwen3 / Llama by config (hf/export.py), or our folded custom class for a model with LAUREL;
    # "folded": our folded custom class; "custom": the architecture's own transformers class, written by the module
    # `hf_module` names
    export: str
    config: dict[str, Any] = field(default_factory=dict)  # its defaults of ARCH_DEFAULT fields (models/config.py)
    # The inference form: a class whose classmethod fold(model) returns an equivalent model with every constant or
    # reparameterisation folded into plain weights (FoldedNGPT / FoldedANGPT; FoldedGPT for the GPT family: weight
    # normalisation and LAUREL's weights). None: nothing to fold.
    folded: type[LanguageModel] | None = None
    constants: Callable[[ModelConfig], dict[str, Any]] | None = None  # extra lines for `angpt info`
    # Called by the trainer before every optimizer step: (model, steps done, max_steps, batches) -> a note or None,
    # where batches(n) gives n training batches drawn apart from the training stream (anGPT's nu_att calibration).
    before_step: Callable[..., str | None] | None = None
    # (model, add_tokens, add_ffn_tokens=None, *, freeze_old=False) -> a larger model with the same logits, or
    # None: the architecture cannot grow (see `grow`)
    grow: Callable[..., LanguageModel] | None = None
    hf_module: str | None = None  # export="custom": the angpt.hf module with export_files(model) and register()
    # (cfg, bytes per compute element) -> bytes one block saves for the backward per token (`angpt train
    # --dry-run`); None: the GPT / nGPT / anGPT block's count (train/dryrun.py, activation_bytes)
    saved_per_token: Callable[[ModelConfig, int], float] | None = None
    # The residual-stream norm past which a sudden rise makes the trainer warn of a blow-up's onset (train/watch.py),
    # for an architecture that keeps the stream near unit norm without normalising it exactly; None: no watch.
    residual_bound: float | None = None
    # What else the onset warning advises, beside halving the rate ("" or " or ..."): the architecture's own
    # stabilisers that `cfg` has switched off (anGPT: the MLP input norm, no attention factor).
    onset_remedy: Callable[[ModelConfig], str] | None = None

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
        if cfg.laurel_parts:
            out["laurel"] = f"{cfg.laurel} on each of the {2 * cfg.n_layers} residual connections"
        return out


ARCHITECTURES: dict[str, ArchSpec] = {}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {}  # name -> (architecture, config overrides)


def register(spec: ArchSpec) -> ArchSpec:
    """Add an architecture (a name may be registered once). Its config defaults are what `make_config(name)`
    gives the ARCH_DEFAULT fields (models/config.py)."""
    if spec.name in ARCHITECTURES or spec.name in VARIANTS:
        raise ValueError(f"architecture {spec.name!r} is already registered")
    unknown = sorted(set(spec.config) - set(ARCH_FIELDS))
    if unknown:
        raise ValueError(f"{spec.name}: config default {unknown[0]!r} is not an ARCH_DEFAULT field (models/config.py)")
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

    Fields not given take `arch`'s defaults (its entry's config; e.g. "gpt" has qk_norm=False). A config already
    made for `arch` keeps every value (its choices over those defaults, e.g. anGPT's nu_att=dense, stay); one made
    for another architecture keeps its shape and takes `arch`'s defaults.
    """
    spec = get(arch)
    if isinstance(preset, ModelConfig):
        base = preset.to_dict()
        if preset.arch != arch:
            base = {k: v for k, v in base.items() if k not in ARCH_FIELDS}
    elif isinstance(preset, dict):
        base = dict(preset)
    elif preset in PRESETS:
        base = dict(PRESETS[preset])
    else:
        raise ConfigError(f"unknown preset {preset!r}; use one of: {', '.join(PRESETS)}")
    return check_config(ModelConfig.create({**base, **overrides, "arch": arch}, spec.config))


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

    A model with nothing to fold (GPT+ without LAUREL, say) comes back as an eval-mode fp32 copy.
    """
    from angpt.models.constraints import unwrap

    model = unwrap(model)
    folded = of(model).folded
    if folded is None:
        return copy.deepcopy(model).float().eval()
    return folded.fold(model)


def grow(model: nn.Module, add_tokens: int, add_ffn_tokens: int | None = None, *, freeze_old: bool = False):
    """A larger model with the same logits: `add_tokens` parameter tokens appended to every token-parameter layer
    (TokenFormer's progressive scaling, docs/architectures.md#progressive-growth); ConfigError for an
    architecture that cannot grow. `model` itself is unchanged."""
    from angpt.models.constraints import unwrap

    model = unwrap(model)
    spec = of(model)
    if spec.grow is None:
        growable = ", ".join(n for n, s in ARCHITECTURES.items() if s.grow is not None)
        raise ConfigError(f"a {spec.name} model cannot grow; growth appends parameter tokens, which {growable} has")
    return spec.grow(model, add_tokens, add_ffn_tokens, freeze_old=freeze_old)


def describe_constants(cfg: ModelConfig) -> dict[str, Any]:
    """The constants of `cfg` as a printable dict (anGPT's nu; nGPT's effective scales; the softmax scale)."""
    return of(cfg).describe(cfg)


# ------------------------------------------------------------------------------------------------ entries
def _ngpt_constants(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "alpha_init": cfg.alpha_init,
        "alpha_speed": cfg.alpha_speed,
        "s_qk_init": cfg.s_qk_init,
        "s_uz_effective_init": cfg.s_uz_init * math.sqrt(cfg.d_model),
        "s_z_init": cfg.logits_init_scale,
    }


def _tokenformer_constants(cfg: ModelConfig) -> dict[str, Any]:
    (n, norm, frozen), (n_ffn, norm_ffn, frozen_ffn) = cfg.pattention_sizes(False), cfg.pattention_sizes(True)
    return {
        "key_init_std": cfg.init_std,
        "value_init_std": 2.0 / (cfg.n_layers * math.sqrt(cfg.d_model)),
        "theta": cfg.pattention,
        "attn_tokens": n,
        "attn_theta_n": norm,
        "attn_frozen_tokens": frozen,
        "ffn_tokens": n_ffn,
        "ffn_theta_n": norm_ffn,
        "ffn_frozen_tokens": frozen_ffn,
    }


def _angpt_onset_remedy(cfg: ModelConfig) -> str:
    """anGPT's stabilisers that `cfg` has switched off, for the trainer's onset warning."""
    out = ""
    if cfg.input_norm == "none":
        out += " or normalise the MLP input (model.input_norm=mlp, anGPT's default)"
    if cfg.nu_att != "none":
        # the paper's factor grows with the position: what blew up the first steps at the paper's batch
        out += " or drop the attention factor (model.nu_att=none, anGPT's default)"
    return out + " (docs/open_choices.md#stability-at-width, #nu_att-none-at-the-papers-batch)"


# At 0.5B and 1B the rates of configs/paper/gptplus-*.yaml: the nGPT reference's GPT baseline (docs/recipes.md).
_GPT_RECIPE = Recipe("adamw", lr=2e-3, weight_decay=0.1, warmup_fraction=0.05, lr_at={"0.5B": 1.5e-3, "1B": 1.2e-3})

register(
    ArchSpec(
        "gpt",
        GPT,
        "GPT+ without QK-norm (Llama block)",
        _GPT_RECIPE,
        export="native",
        config={"qk_norm": False},
        folded=FoldedGPT,
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
        folded=FoldedGPT,
        constants=lambda cfg: {"init_std": cfg.init_std},
    )
)
register(
    ArchSpec(
        "ngpt",
        NGPT,
        "normalized Transformer: exact norms on the hypersphere (Loshchilov et al. 2024)",
        Recipe("adam", lr=8e-3, lr_at={"0.5B": 2e-3, "1B": 1.6e-3}),  # at 0.5B, 1B: configs/paper/ngpt-*.yaml's
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
        # gpt2-small: 2e-3 (ours), 200 steps stable at the paper's batch (0.5M tokens per step) with nu_att none on
        # one H100, and 30 at 4e-3 (docs/open_choices.md#nu_att-none-at-the-papers-batch); with nu_att dense 2e-3
        # diverged there in three steps. 0.5B and 1B: the rates of configs/paper/angpt-*.yaml (halved under dense,
        # not measured at their width on a GPU).
        Recipe("adam", lr=4e-3, lr_at={"gpt2-small": 2e-3, "0.5B": 1e-3, "1B": 8e-4}),
        export="folded",
        folded=FoldedANGPT,
        # Trains from step 0 at gpt2-small without warm-up, at 4e-3 at 8 x 256 tokens per step and at 2e-3 at the
        # paper's batch (docs/open_choices.md#stability-at-width): the paper's alpha init s_a,init = 0.01, learned 5x
        # faster than nGPT's reparameterisation of it would (ours: as fast as an alpha started at 0.05;
        # #alphas-speed); GPT+'s logit scale at init (ours; nGPT's s_z = 1 gives logits of std 1/sqrt(d)); an exact
        # norm of the MLP input (ours; the paper adds none); no attention-output factor (nu_att none, ours: the
        # paper's dense-attention factor grows with the position and over-scales attention on text, which blew up
        # the first steps at the paper's batch and context; #nu_att-none-at-the-papers-batch).
        config={"alpha_init": 0.01, "alpha_speed": 5.0, "s_z_init": None, "input_norm": "mlp", "nu_att": "none"},
        constants=lambda cfg: {**_ngpt_constants(cfg), "input_norm": cfg.input_norm, **angpt_constants(cfg).describe()},
        before_step=calibrate_during_training,
        residual_bound=4.0,  # gpt2-small: stable runs stay below ~2.5, blow-ups jump past 4 in a step (train/watch.py)
        onset_remedy=_angpt_onset_remedy,
    )
)

# The review's controls (seed 003; docs/architectures.md#controls): GPT+ given one ingredient of normalisation.
register(
    ArchSpec(
        "gpt+wn",
        GPT,
        "control: GPT+ with weight normalisation W = g V/||V|| per row of every linear map (Salimans & Kingma 2016)",
        _GPT_RECIPE,
        export="native",  # folded to a plain GPT+ first (FoldedGPT.fold, via GPT.fold), then a Qwen3 checkpoint
        config={"weight_norm": True},
        folded=FoldedGPT,
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
        folded=FoldedGPT,  # LAUREL's weights, 1/tau onto q's gain (no export, but a folded inference form)
        constants=lambda cfg: {"init_std": cfg.init_std, "cos_tau_init": cfg.cos_tau_init, "cos_tau_min": COS_TAU_MIN},
    )
)

register(
    ArchSpec(
        "tokenformer",
        tokenformer.TokenFormer,
        "Transformer whose linear maps attend over learnable parameter tokens; grows in place (Wang et al. 2024)",
        # The paper's AdamW, weight decay 0.1 and 1% warm-up (official configs, 150M-1.5B, where the peak LR is
        # 6e-4, the default from gpt2-small up); the demo-scale peak LR 2e-3 is ours (GPT+'s; compare sweeps it).
        Recipe(
            "adamw",
            lr=2e-3,
            weight_decay=0.1,
            warmup_fraction=0.01,
            lr_at=dict.fromkeys(("gpt2-small", "0.5B", "1B"), 6e-4),
        ),
        export="custom",
        config={"norm_eps": 1e-5},  # the official LayerNorm epsilon
        constants=_tokenformer_constants,
        grow=tokenformer.grow,
        hf_module="angpt.hf.tokenformer",
        saved_per_token=tokenformer.saved_per_token,
    )
)

register_variant("dyt", "gpt+", norm="dyt")  # DyT in place of every RMSNorm (Zhu et al. 2025)
register_variant("ln_scaling", "gpt+", norm="ln_scaling")  # pre-norm outputs times 1/sqrt(l) (Sun et al. 2025)
register_variant("ngpt_bounded", "ngpt", weight_constraint="bounded")  # the paper's "nGPT with <= 1" row
register_variant("ngpt_frozen_alpha", "ngpt", freeze_alpha=True)  # control: eigen learning rates fixed at init
register_variant("angpt_frozen_alpha", "angpt", freeze_alpha=True)  # control: eigen learning rates fixed at init

ARCHS: tuple[str, ...] = tuple(ARCHITECTURES)
BASELINE = "gpt+"  # what comparisons measure against unless told otherwise (the paper's baseline)
