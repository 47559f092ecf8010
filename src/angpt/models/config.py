"""Typed model configuration and named presets.

One dataclass covers every architecture (litgpt-style): fields that an architecture does not use are ignored by
it. An architecture's own defaults live in one place, its registry entry (models/registry.py, `ArchSpec.config`):
a field whose default differs between architectures defaults to ARCH_DEFAULT here, and the registry's `make_config`
gives it the entry's value (else the field's BASE value) through `ModelConfig.create(data, defaults)`; this module
holds no architecture's values and the registry writes nothing into it. A config built directly that leaves such a
field to the architecture is refused in one line (build it with `make_config`). A stored config (`from_dict`: a
checkpoint's, a run's) reads a field it predates as its BASE value: the field did not exist, so the run had it off.
Every open choice (docs/architectures.md#open-choices) is a field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from angpt.errors import ConfigError, did_you_mean

_CHOICES: dict[str, tuple[Any, ...]] = {
    "norm": ("rmsnorm", "dyt", "ln_scaling"),
    "qk_norm_mode": ("exact", "none"),
    "nu_att": ("dense", "none", "sqrt_pos", "calibrated"),
    "input_norm": ("none", "mlp", "block"),
    "alpha_shape": ("vector", "scalar"),
    "gate_scale": ("fixed", "learnable"),
    "weight_constraint": ("auto", "unit", "bounded", "none"),
    "activation": ("silu", "gelu"),
    "attention": ("dot", "cosine"),
    "pattention": ("l2_norm_gelu", "softmax"),
    "laurel": ("none", "rw", "lr", "pa", "rw+lr", "rw+lr+pa"),
    "laurel_rw_shape": ("scalar", "vector"),
    "laurel_rw_bound": ("softmax", "sigmoid"),
}

# The review's controls (docs/architectures.md#controls) and LAUREL (#laurel), each with its "off" value. An
# architecture implements a subset (its model class's `controls`); setting one that it does not implement is a
# ConfigError (registry.check_config), never silently ignored.
CONTROLS: dict[str, Any] = {
    "weight_norm": False,
    "attention": "dot",
    "freeze_alpha": False,
    "freeze_scales": False,
    "laurel": "none",
}


class _ArchDefault:
    """The default of a field whose default depends on the architecture (see the module docstring)."""

    def __repr__(self) -> str:
        return "<the architecture's>"


ARCH_DEFAULT: Any = _ArchDefault()
# The value of each ARCH_DEFAULT field for an architecture whose entry does not set it, and for a stored config
# written before the field existed: the value that keeps it off (or the paper's choice, for anGPT's open choices).
BASE: dict[str, Any] = {
    "qk_norm": True,
    "norm_eps": 1e-6,
    "alpha_init": 0.05,
    "alpha_speed": 1.0,
    "s_z_init": 1.0,
    "nu_att": "dense",
    "input_norm": "none",
    "weight_norm": False,
    "attention": "dot",
}


@dataclass
class ModelConfig:
    """Shape and options of one model. Construct through :func:`make_config` or a preset."""

    arch: str = "angpt"  # a registry name (models/registry.py)
    vocab_size: int = 4096  # token ids (the demo preset's); angpt train sets it from the data (padded to 64)
    d_model: int = 256  # width of the residual stream
    n_layers: int = 6  # blocks
    n_heads: int = 4  # attention heads (head dim = d_model / n_heads)
    d_ff: int | None = None  # width of each SwiGLU branch; None -> 4 * d_model (docs/architectures.md#notation)
    context_length: int = 256  # longest sequence; RoPE tables and nu_att are built for it
    rope_theta: float = 10000.0  # RoPE base
    activation: str = "silu"  # MLP gate: silu (SwiGLU) or gelu

    # GPT / GPT+ (docs/architectures.md#gpt-baseline): pre-norm, QK-norm, init std 0.02.
    qk_norm: bool = ARCH_DEFAULT  # GPT+: RMSNorm of q and k per head (false: the GPT row)
    norm: str = "rmsnorm"  # GPT's normalisation: rmsnorm, dyt (tanh) or ln_scaling
    norm_eps: float = ARCH_DEFAULT  # RMSNorm epsilon (TokenFormer: LayerNorm's 1e-5)
    dyt_alpha_init: float = 0.5  # DyT: initial tanh slope
    init_std: float = 0.02  # GPT init std of every matrix (residual projections / sqrt(2 L))

    # nGPT / anGPT learnable scales, reparameterised: stored starts at `scale`, effective = stored * init / scale.
    # A scale of None means 1/sqrt(d_model), the NVIDIA reference default.
    alpha_init: float = ARCH_DEFAULT  # initial residual step alpha (nGPT 0.05; anGPT 0.01)
    alpha_scale: float | None = None  # alpha's reparameterisation scale (None: 1/sqrt(d))
    # Adam moves alpha by ~lr * alpha_init / scale per step: its scale is alpha_scale / alpha_speed, so 5 with
    # alpha_init 0.01 learns alpha as fast as nGPT's alpha started at 0.05 (docs/open_choices.md#alphas-speed).
    alpha_speed: float = ARCH_DEFAULT  # multiplies alpha's learning speed (nGPT: 1; anGPT: 5)
    alpha_shape: str = "vector"  # alpha per channel (vector) or one per sub-layer (scalar)
    s_qk_init: float = 1.0  # initial q, k scale under exact QK-norm
    s_qk_scale: float | None = None  # its reparameterisation scale (None: 1/sqrt(d))
    s_uz_init: float = 1.0  # nGPT's initial MLP scales s_u, s_z (anGPT's learnable c_z too)
    s_uz_scale: float = 1.0  # their reparameterisation scale
    s_z_init: float | None = ARCH_DEFAULT  # None: GPT+'s logit scale at init, init_std * d_model (anGPT's)
    s_z_scale: float | None = None  # the logit scale's reparameterisation scale (None: 1/sqrt(d))
    # Softmax scale: None -> the architecture's default (1/sqrt(d_h); sqrt(d_h) for unit-norm q, k).
    softmax_scale: float | None = None  # attention logit scale (None: the architecture's)
    # Row constraint after each step: auto -> the architecture's (unit for nGPT, <= 1 for anGPT, none for GPT).
    weight_constraint: str = "auto"  # row constraint after each step: auto, unit, bounded or none

    # anGPT open choices (docs/architectures.md#open-choices).
    qk_norm_mode: str = "exact"  # anGPT: exact QK-norm with s_qk, or none (nu_qkv alone)
    nu_att: str = ARCH_DEFAULT  # anGPT attention factor: dense (the paper's), none (anGPT's), sqrt_pos, calibrated
    gate_scale: str = "fixed"  # anGPT gate scale c_z: fixed sqrt(d) or learnable
    # An exact L2 normalisation of a branch's input (ours, not the paper's, which adds no normalisation layer): of
    # the MLP's ("mlp"), or of the attention's and the MLP's ("block"). docs/open_choices.md#stability-at-width.
    input_norm: str = ARCH_DEFAULT  # anGPT: exact norm of the mlp input (anGPT's), of both (block), or none
    # nu_att = "calibrated": measured on training data once this fraction of the run has passed, then frozen.
    nu_att_calibrate_at: float = 0.05  # nu_att=calibrated: fraction of the run after which it is measured
    nu_att_calibrate_batches: int = 8  # nu_att=calibrated: training batches it is measured on
    mc_samples: int = 1 << 20  # Monte Carlo samples behind nu_act and nu_att
    mc_seed: int = 0  # their seed

    # Controls (docs/architectures.md#controls; off by default). GPT family: weight normalisation of every linear
    # map (gpt+wn) and scaled cosine attention with a learned per-head tau (gpt+cos; initial tau: Swin v2's 0.1).
    # nGPT / anGPT: alpha_A, alpha_M (freeze_alpha) or every learned scale (freeze_scales) fixed at init.
    weight_norm: bool = ARCH_DEFAULT  # control: W = g V/||V|| on every GPT+ linear map (gpt+wn)
    attention: str = ARCH_DEFAULT  # control: dot, or cosine (scaled cosine attention, gpt+cos)
    cos_tau_init: float = 0.1  # cosine attention: initial temperature tau (Swin v2's 0.1)
    freeze_alpha: bool = False  # control: alpha_A, alpha_M fixed at init
    freeze_scales: bool = False  # control: every learned scale fixed at init

    # TokenFormer (docs/architectures.md#tokenformer): the key-value parameter tokens of each Pattention. The FFN's
    # count is d_ff (None -> 4 d_model). Theta's sqrt(n) uses a stored n, so that growth preserves the function.
    pattention: str = "l2_norm_gelu"  # Theta: GeLU(A sqrt(n) / ||A||), or softmax(A) * n
    param_tokens: int | None = None  # tokens of the Q, K, V and output Pattentions; None -> d_model
    norm_tokens: int | None = None  # the n in Theta of those; None -> param_tokens (growth keeps the old value)
    ffn_norm_tokens: int | None = None  # the n in Theta of the FFN Pattention; None -> d_ff
    frozen_tokens: int = 0  # leading tokens of each Q, K, V, output Pattention not trained (grown with freeze_old)
    frozen_ffn_tokens: int = 0  # the same for the FFN Pattention

    # LAUREL on every residual connection (docs/architectures.md#laurel; GPT+ family and anGPT): its parts
    # rw (residual weights), lr (low rank, rank laurel_rank), pa (previous activations, depth laurel_pa_depth).
    laurel: str = "none"  # LAUREL parts on every residual: none, rw, lr, pa or a + of them
    laurel_rank: int = 32  # LAUREL-LR rank
    laurel_pa_depth: int = 3  # LAUREL-PA: earlier states mixed in
    laurel_rw_shape: str = "scalar"  # (alpha, beta) per connection, or one pair per channel ("vector", in R^d)
    laurel_rw_bound: str = "softmax"  # (alpha, beta) = 2 softmax(w); "sigmoid": 2 sigmoid(w) each

    extra: dict[str, Any] = field(default_factory=dict)  # free-form notes kept with the config

    def __post_init__(self) -> None:
        left = [name for name in ARCH_FIELDS if getattr(self, name) is ARCH_DEFAULT]
        if left:
            raise ConfigError(
                f"ModelConfig(arch={self.arch!r}) leaves model.{left[0]} to the architecture: build it with "
                f"angpt.make_config({self.arch!r}, preset, **overrides), which applies the registry entry's defaults"
            )
        self.validate()

    # ----------------------------------------------------------------------------------------------- derived
    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ffn_dim(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def attn_tokens(self) -> int:
        """TokenFormer: key-value tokens of each Q, K, V and output Pattention."""
        return self.param_tokens if self.param_tokens is not None else self.d_model

    def pattention_sizes(self, ffn: bool) -> tuple[int, int, int]:
        """TokenFormer: (tokens, the n of Theta's normalisation, frozen leading tokens) of one Pattention."""
        if ffn:
            norm = self.ffn_norm_tokens if self.ffn_norm_tokens is not None else self.ffn_dim
            return self.ffn_dim, norm, self.frozen_ffn_tokens
        norm = self.norm_tokens if self.norm_tokens is not None else self.attn_tokens
        return self.attn_tokens, norm, self.frozen_tokens

    @property
    def laurel_parts(self) -> frozenset[str]:
        """The LAUREL parts switched on: a subset of {"rw", "lr", "pa"} (empty for "none")."""
        return frozenset() if self.laurel == "none" else frozenset(self.laurel.split("+"))

    @property
    def logits_init_scale(self) -> float:
        """s_z at init: `s_z_init`, or for None the value that gives the logits GPT+'s spread at init. GPT+'s head
        sees RMSNorm(h), of norm sqrt(d), through rows of std init_std: logit std init_std * sqrt(d). Ours sees
        ||h|| ~ 1 through unit rows (std 1/sqrt(d)): s_z / sqrt(d). Equal for s_z = init_std * d (15.4 at d = 768)."""
        return self.s_z_init if self.s_z_init is not None else self.init_std * self.d_model

    def scale_or_default(self, value: float | None) -> float:
        """A reparameterisation scale, where None means 1/sqrt(d_model)."""
        return value if value is not None else 1.0 / math.sqrt(self.d_model)

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(
                    f"model.{name}={value!r} is not a valid choice; use one of: {', '.join(map(str, choices))}"
                )
        if not isinstance(self.nu_att_calibrate_at, (int, float)) or not 0 <= self.nu_att_calibrate_at < 1:
            raise ConfigError(
                f"model.nu_att_calibrate_at={self.nu_att_calibrate_at!r} must be a fraction of the run in [0, 1)"
            )
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "context_length",
            "mc_samples",
            "nu_att_calibrate_batches",
            "laurel_rank",
            "laurel_pa_depth",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name}={value!r} must be a positive integer")
        if self.d_ff is not None and (not isinstance(self.d_ff, int) or self.d_ff <= 0):
            raise ConfigError(f"model.d_ff={self.d_ff!r} must be a positive integer (or null for 4 * d_model)")
        for name in ("param_tokens", "norm_tokens", "ffn_norm_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise ConfigError(f"model.{name}={value!r} must be a positive integer (or null for the default)")
        for name, total, count in (
            ("frozen_tokens", self.attn_tokens, "param_tokens"),
            ("frozen_ffn_tokens", self.ffn_dim, "d_ff"),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < total:
                raise ConfigError(
                    f"model.{name}={value!r} must be an integer in [0, {total}): fewer than the {total} tokens "
                    f"(model.{count}), so that some stay trainable"
                )
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                f"choose n_heads dividing d_model (e.g. {_divisor_hint(self.d_model, self.n_heads)})"
            )
        if "lr" in self.laurel_parts and self.laurel_rank > self.d_model:
            raise ConfigError(
                f"model.laurel_rank={self.laurel_rank} exceeds model.d_model={self.d_model}; "
                "choose a rank between 1 and d_model (LAUREL uses 32-64)"
            )
        if self.head_dim % 2:
            raise ConfigError(
                f"head dim d_model/n_heads = {self.head_dim} is odd, but RoPE rotates pairs; "
                "change model.d_model or model.n_heads so that the head dim is even"
            )
        positive = ("rope_theta", "norm_eps", "init_std", "s_uz_scale", "dyt_alpha_init", "alpha_speed")
        for name in positive + ("alpha_scale", "s_qk_scale", "s_z_scale", "softmax_scale"):
            value = getattr(self, name)
            if value is None and name not in positive:
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"model.{name}={value!r} must be a positive number")
        for name in ("qk_norm", "weight_norm", "freeze_alpha", "freeze_scales"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={getattr(self, name)!r} must be true or false")
        tau = self.cos_tau_init
        if not isinstance(tau, (int, float)) or isinstance(tau, bool) or not (0.01 <= tau < math.inf):
            raise ConfigError(f"model.cos_tau_init={tau!r} must be a number >= 0.01 (tau is clamped at 0.01)")
        for name in ("alpha_init", "s_qk_init", "s_uz_init", "s_z_init"):
            value = getattr(self, name)
            if value is None and name == "s_z_init":
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise ConfigError(
                    f"model.{name}={value!r} must be a finite number"
                    + (" (or null: GPT+'s logit scale at init)" if name == "s_z_init" else "")
                )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """A stored config (a checkpoint's, a run's): a field it predates takes its BASE value, not the
        architecture's default of today (the run was trained without it)."""
        return cls.create(data)

    @classmethod
    def create(cls, data: dict[str, Any], defaults: dict[str, Any] | None = None) -> ModelConfig:
        """A new config from a dict (a preset with overrides): an ARCH_DEFAULT field not given takes `defaults`'
        value (the architecture's, as the registry's make_config passes them), else its BASE one; an unknown key is
        a one-line ConfigError naming the valid ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            named = ", ".join(k + did_you_mean(k, known) for k in unknown)
            raise ConfigError(f"unknown model config key(s): {named}; valid keys: {', '.join(sorted(known))}")
        given = defaults or {}
        return cls(**{**{k: given.get(k, BASE[k]) for k in ARCH_FIELDS}, **data})


ARCH_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.default is ARCH_DEFAULT)
assert set(ARCH_FIELDS) == set(BASE), "every field that defaults to ARCH_DEFAULT needs a BASE value"


def _divisor_hint(d: int, h: int) -> int:
    divisors = [k for k in range(1, d + 1) if d % k == 0 and (d // k) % 2 == 0]
    return min(divisors, key=lambda k: abs(k - h)) if divisors else 1


# Named presets: shapes only; the architecture is chosen separately.
PRESETS: dict[str, dict[str, Any]] = {
    # unit tests: runs in milliseconds
    "tiny": dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, context_length=64),
    # ~6M non-embedding parameters: trains on 2 CPU cores in minutes
    "demo": dict(vocab_size=4096, d_model=256, n_layers=6, n_heads=4, context_length=256),
    # GPT-2 small shape (~125M with a 50k vocabulary)
    "gpt2-small": dict(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, context_length=1024),
    # the paper's sizes (nGPT's 0.5B and 1B shapes: 24x1024x16 and 36x1280x20), GPT-NeoX vocabulary, T = 2048
    "0.5B": dict(vocab_size=50304, d_model=1024, n_layers=24, n_heads=16, context_length=2048),
    "1B": dict(vocab_size=50304, d_model=1280, n_layers=36, n_heads=20, context_length=2048),
}
