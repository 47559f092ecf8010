"""anGPT's normalisation constants nu (docs/architectures.md#angpt-constants; Franke et al. 2025, section 3).

Each nu is 1/sqrt(E||g(x)||^2) for the map g that precedes it, with unit-norm inputs and rows, so the output has
norm ~1 by concentration of measure. The closed forms follow from E||W x||^2 = out/in for a matrix whose rows
have unit norm and a random unit-norm input. `nu_act` and `nu_att` have no closed form: they are seeded Monte Carlo
estimates, computed once per config and cached.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from angpt.models.config import ModelConfig
from angpt.models.layers import ACTIVATIONS, softmax_scale


def nu_lerp(alpha: torch.Tensor) -> torch.Tensor:
    """nu(a) = 1/sqrt(a^2 + (1-a)^2): restores unit norm after h + a (x - h) for independent unit h, x."""
    return torch.rsqrt(alpha * alpha + (1.0 - alpha) * (1.0 - alpha))


@functools.lru_cache(maxsize=64)
def activation_constant(activation: str, z_std: float, samples: int, seed: int) -> float:
    """1/sqrt(E[act(z)^2]) for z ~ N(0, z_std^2), by seeded Monte Carlo (the paper's nu_act ~ 3.74 for SiLU)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(samples, generator=gen, dtype=torch.float64, device="cpu") * z_std  # also under a meta default
    return float(ACTIVATIONS[activation](z).pow(2).mean().rsqrt())


@functools.lru_cache(maxsize=16)
def attention_constants(mode: str, seq_len: int, head_dim: int, logit_scale: float, seed: int) -> torch.Tensor:
    """Per-query-position factor nu_att[t] that brings ||o_t|| to ~1 (docs/architectures.md#open-choices).

    - `dense`: 1/sqrt(E||o_t||^2) for causal softmax attention over random unit-norm q, k, v with the given
      logit scale (softmax scale times s_qk^2 at init): the init-time, dense-attention expectation.
    - `none`: 1 (exact when attention is one-hot). `sqrt_pos`: sqrt(t), the uniform-attention limit.
    - `calibrated`: starts as `dense`; `angpt.models.angpt.calibrate_nu_att` replaces it from real data.

    For `dense` the Monte Carlo is one-dimensional: with independent uniform unit vectors, E[v_i . v_j] = 0 for
    i != j, so E||o_t||^2 = E[sum_j p_tj^2]; and the logits scale * (q . k_j) are i.i.d. over j, each a
    coordinate of a random unit vector, i.e. 2B - 1 with B ~ Beta((d_h-1)/2, (d_h-1)/2). Prefix sums over j then
    give every position t from one draw of T logits.
    """
    # on the CPU whatever device a model is built under (a meta-device build must not put meta tensors in the cache)
    t = torch.arange(1, seq_len + 1, dtype=torch.float64, device="cpu")
    if mode == "none":
        return torch.ones(seq_len, device="cpu")
    if mode == "sqrt_pos":
        return t.sqrt().float()
    rng = np.random.default_rng(seed)
    trials = 2048
    a = (head_dim - 1) / 2
    total = np.zeros(seq_len)
    for _ in range(trials // 256):
        x = logit_scale * (2.0 * rng.beta(a, a, size=(256, seq_len)) - 1.0)
        x -= x.max(axis=1, keepdims=True)  # a shift cancels in p_j^2 sums; keeps exp() finite
        e = np.exp(x)
        total += (np.cumsum(e * e, axis=1) / np.cumsum(e, axis=1) ** 2).sum(0)
    return torch.from_numpy(total / trials).rsqrt().float()


@dataclass(frozen=True)
class ANGPTConstants:
    """The scalar constants of one anGPT config (nu_att is the per-position vector)."""

    nu_qkv: float
    nu_p: float
    nu_uz: float
    c_z: float
    nu_act: float
    nu_d: float
    nu_att: torch.Tensor

    def describe(self) -> dict[str, float | str]:
        att = self.nu_att
        return {
            "nu_qkv": self.nu_qkv,
            "nu_p": self.nu_p,
            "nu_uz": self.nu_uz,
            "c_z": self.c_z,
            "nu_act": self.nu_act,
            "nu_d": self.nu_d,
            "nu_att": f"[{att[0].item():.3f}, {att[min(1, len(att) - 1)].item():.3f}, ..., {att[-1].item():.3f}]",
        }


def angpt_constants(cfg: ModelConfig) -> ANGPTConstants:
    """All of anGPT's constants for `cfg`, computed from the config (never hard-coded)."""
    d, dh, dff = cfg.d_model, cfg.head_dim, cfg.ffn_dim
    nu_uz = math.sqrt(d / dff)
    c_z = math.sqrt(d)
    # Gate pre-activations: nu_uz * c_z * (unit row . unit h) has per-element std nu_uz * c_z / sqrt(d).
    z_std = nu_uz * c_z / math.sqrt(d)
    scale = softmax_scale(cfg, unit_qk=True)  # anGPT's q, k have norm ~1
    logit_scale = scale * cfg.s_qk_init**2 if cfg.qk_norm_mode == "exact" else scale
    return ANGPTConstants(
        nu_qkv=math.sqrt(d / dh),
        nu_p=math.sqrt(dh / d),
        nu_uz=nu_uz,
        c_z=c_z,
        nu_act=activation_constant(cfg.activation, z_std, cfg.mc_samples, cfg.mc_seed),
        nu_d=math.sqrt(dff / d),
        nu_att=attention_constants(cfg.nu_att, cfg.context_length, dh, logit_scale, cfg.mc_seed).clone(),
    )
