"""anGPT: the Approximately Normalized Transformer (Franke et al. 2025, arXiv 2505.22014; docs/architectures.md).

nGPT with every exact normalisation of a hidden state replaced by a constant `nu` (constants.py), and every
weight row constrained to ||w|| <= 1 instead of = 1. The forward pass is the paper's equations in its order. A
constant that multiplies a linear map's output is applied to that map's rows (`scaled_linear`), which is exact and
cheaper than scaling the activation; `fold_for_inference` folds every constant into the weights for good.
"""

from __future__ import annotations

import torch
from torch import nn

from angpt.errors import ConfigError
from angpt.models.base import Block, Context, recording
from angpt.models.config import ModelConfig
from angpt.models.constants import ANGPTConstants, angpt_constants, nu_lerp
from angpt.models.laurel import ApproxLaurel, connection
from angpt.models.layers import (
    ACTIVATIONS,
    Scale,
    attend,
    merge_heads,
    scaled_linear,
    split_heads,
    unit_norm,
    unit_qk,
)
from angpt.models.ngpt import SphereLM, _alpha


def approx_residual(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, nu_w: float, alpha: torch.Tensor):
    """h <- nu(a) (h + a (h_X - h)) with the branch output h_X = nu_w W x, a = alpha elementwise.

    Computed as nu(a)(1 - a) h + (nu(a) a nu_w W) x: the branch factor rides on W's rows, one multiply of the
    [out, in] weight instead of two of the [B, T, out] activation (anGPT's step 0.93x GPT+'s instead of 0.98x at
    the demo preset; benchmarks/RESULTS.md).
    """
    n = nu_lerp(alpha)
    return torch.addcmul(scaled_linear(x, weight, n * alpha * nu_w).to(h.dtype), h, (n * (1 - alpha)).to(h.dtype))


class ApproxResidual(nn.Module):
    """anGPT's residual update as a connection object (`approx_residual`); LAUREL's is models/laurel.py's."""

    def forward(self, h, x, weight, nu_w, alpha, ctx) -> torch.Tensor:
        return approx_residual(h, x, weight, nu_w, alpha)

    def factors(self, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(nu, c_h, c_A) of h <- nu (c_A h_A + c_h h), as ApproxLaurel.factors: (nu(a), 1 - a, a)."""
        return nu_lerp(alpha), 1 - alpha, alpha


class ANGPTBlock(Block):
    def __init__(self, cfg: ModelConfig, layer: int, nu: ANGPTConstants, scale: float) -> None:
        super().__init__()
        self.layer = layer
        d, dff = cfg.d_model, cfg.ffn_dim
        self.n_heads, self.head_dim, self.d_ff = cfg.n_heads, cfg.head_dim, dff
        self.scale = scale
        self.nu = nu
        self.scale_att = cfg.nu_att != "none"
        self.norm_attn_input, self.norm_mlp_input = cfg.input_norm == "block", cfg.input_norm in ("mlp", "block")
        self.act = ACTIVATIONS[cfg.activation]
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * dff, bias=False)  # [u; z]
        self.down = nn.Linear(dff, d, bias=False)
        # Default QK normalisation: exact, with nGPT's learnable s_qk (docs/architectures.md#open-choices).
        self.s_qk = (
            Scale(d, cfg.s_qk_init, cfg.scale_or_default(cfg.s_qk_scale)) if cfg.qk_norm_mode == "exact" else None
        )
        # Gate scale c_z: fixed sqrt(d), or learnable like nGPT's s_uz (starting at the same value).
        self.c_z = Scale(dff, cfg.s_uz_init, cfg.s_uz_scale) if cfg.gate_scale == "learnable" else None

        self.alpha_A = _alpha(cfg)
        self.alpha_M = _alpha(cfg)
        # the residual updates: approx_residual, or with LAUREL's terms (models/laurel.py)
        self.residual_A = connection(cfg, 2 * layer, ApproxResidual, ApproxLaurel)
        self.residual_M = connection(cfg, 2 * layer + 1, ApproxResidual, ApproxLaurel)

    def uz_rows(self) -> torch.Tensor:
        """[nu_uz] * d_ff for u's rows, then nu_uz c_z for z's rows."""
        nu, w = self.nu, self.up.weight
        c_z = self.c_z() * nu.c_z if self.c_z is not None else w.new_full((self.d_ff,), nu.c_z)
        return torch.cat([w.new_full((self.d_ff,), nu.nu_uz), nu.nu_uz * c_z])

    def forward(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        nu = self.nu
        # q, k, v = nu_qkv W_q h, nu_qkv W_k h, nu_qkv W_v h
        x = unit_norm(h) if self.norm_attn_input else h  # input_norm=block: x = Norm(h) (ours)
        q, k, v = split_heads(scaled_linear(x, self.qkv.weight, nu.nu_qkv), 3 * self.n_heads).chunk(3, dim=1)
        self.record(q=q, k=k, v=v)
        q, k = ctx.rotate(q), ctx.rotate(k)
        scale = self.scale
        if self.s_qk is not None:
            # q, k = s_qk Norm(q), s_qk Norm(k). Only the product enters the logits, (s q^).(s k^) = (s^2 q^).k^,
            # so s_qk^2 and the softmax scale go onto q alone.
            s_qk = self.s_qk().view(self.n_heads, 1, self.head_dim)
            (q, k), scale = unit_qk(q, k, s_qk * s_qk * self.scale), 1.0
        # o = nu_att[t] SDPA(q, k, v)
        o = attend(q, k, v, scale, ctx.cache, self.layer)
        if self.scale_att:  # nu_att: none is 1 at every position: no [B, H, T, dh] multiply there and back
            o = o * ctx.att_factor(q.shape[-2]).to(q.dtype)
        # h_A = nu_p W_p o;  h = nu(a_A) (h + a_A (h_A - h))
        if self.recorder is not None:
            self.record(attn_out=o, h_A=scaled_linear(merge_heads(o), self.proj.weight, nu.nu_p))
        h = self.residual_A(h, merge_heads(o), self.proj.weight, nu.nu_p, self.alpha_A(), ctx)
        # u = nu_uz W_u h;  z = nu_uz c_z W_z h
        x = unit_norm(h) if self.norm_mlp_input else h  # input_norm=mlp|block: x = Norm(h) (ours)
        u, z = scaled_linear(x, self.up.weight, self.uz_rows()).split(self.d_ff, dim=-1)
        # m = nu_act u silu(z);  h_M = nu_d W_d m = (nu_d nu_act) W_d (u silu(z))
        m = u * self.act(z)
        if self.recorder is not None:
            self.record(h_M=scaled_linear(m, self.down.weight, nu.nu_act * nu.nu_d))
        # h = nu(a_M) (h + a_M (h_M - h))
        h = self.residual_M(h, m, self.down.weight, nu.nu_act * nu.nu_d, self.alpha_M(), ctx)
        self.record(h=h)
        return h


class ANGPT(SphereLM):
    weight_constraint = "bounded"
    # LAUREL's A, B are not constrained: not unit maps (docs/architectures.md#laurel)
    controls = SphereLM.controls | {"laurel"}

    @classmethod
    def check_config(cls, cfg: ModelConfig) -> None:
        if (cfg.freeze_alpha or cfg.freeze_scales) and "rw" in cfg.laurel_parts:
            # RW's learned weights multiply the branch and the stream, h <- nu (c_A h_A + c_h h): they take over
            # the step size the frozen alpha fixes, so the control would not control anything.
            frozen = "freeze_alpha" if cfg.freeze_alpha else "freeze_scales"
            raise ConfigError(
                f"model.{frozen} with model.laurel={cfg.laurel}: LAUREL's RW weights learn the step size that the "
                "frozen alphas fix; freeze alpha without RW (model.laurel none, lr, pa)"
            )

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.nu = angpt_constants(config)  # one set of constants, shared by every block
        scale = self.default_softmax_scale(config)
        self.blocks = nn.ModuleList(ANGPTBlock(config, i, self.nu, scale) for i in range(config.n_layers))
        # nu_att is a persistent buffer so that a checkpoint carries the constants it was trained with
        # (needed for `calibrated`; harmless otherwise).
        self.register_buffer("nu_att", self.nu.nu_att.clone())
        self.reset_parameters()
        self.freeze_controls()

    @property
    def att_scale(self) -> torch.Tensor:
        """nu_att as the [T, 1] column the blocks multiply attention outputs by."""
        return self.nu_att.unsqueeze(-1)

    def constraint_groups(self) -> dict[str, list[tuple[torch.Tensor, int]]]:
        # Rows along the input dimension, dim 1 of every [out, in] matrix and of the embedding
        # (docs/architectures.md#weight-constraints).
        rows = [(self.embed.weight, 1), (self.lm_head.weight, 1)]
        for b in self.blocks:
            rows += [(b.qkv.weight, 1), (b.proj.weight, 1), (b.up.weight, 1), (b.down.weight, 1)]
        return {self.constraint_of(self.config): rows}


def calibration_step(cfg: ModelConfig, max_steps: int) -> int | None:
    """The step after which a `calibrated` run measures nu_att (None for the other nu_att choices)."""
    if cfg.nu_att != "calibrated":
        return None
    return min(max_steps - 1, int(cfg.nu_att_calibrate_at * max_steps))


def calibrate_during_training(model: ANGPT, step: int, max_steps: int, batches) -> str | None:
    """The training recipe's hook for nu_att = "calibrated" (registry `before_step`).

    Called before every optimizer step with the number of steps done; once `model.nu_att_calibrate_at` of the run
    has passed, measures nu_att on `batches(n)` (n training batches the trainer draws apart from its own stream, the
    same on every rank) and freezes it: the persistent `nu_att` buffer carries it into checkpoints, so a resumed
    run neither loses it nor measures it again.
    """
    if step != calibration_step(model.config, max_steps):
        return None
    was_training = model.training
    model.eval()
    try:
        nu_att = calibrate_nu_att(model, batches(model.config.nu_att_calibrate_batches))
    finally:
        model.train(was_training)
    return f"nu_att calibrated at step {step}: {float(nu_att[0]):.3f} at position 1 .. {float(nu_att[-1]):.3f} at T"


@torch.no_grad()
def calibrate_nu_att(model: ANGPT, batches) -> torch.Tensor:
    """Measure 1/sqrt(E||o_t||^2) per position on real data and freeze it as nu_att (the `calibrated` choice).

    The mean is over layers, heads and sequences of the un-scaled attention output nu_qkv * SDPA(q, k, v).
    """
    T = model.config.context_length
    total = torch.zeros(T, dtype=torch.float64)
    count = torch.zeros(T, dtype=torch.float64)

    def recorder(name: str, x: torch.Tensor) -> None:
        if name == "attn_out":
            scale = model.nu_att[: x.shape[-2]].to(x.dtype).view(1, 1, -1, 1)
            sq = (x / scale).double().pow(2).sum(-1).mean((0, 1)).cpu()
            total[: sq.shape[0]] += sq
            count[: sq.shape[0]] += 1

    with recording(model.blocks, lambda _layer: recorder):
        for x in batches:
            model(x)
    seen = count > 0
    nu_att = model.nu_att.clone()
    nu_att[seen] = (total[seen] / count[seen]).rsqrt().float().to(nu_att.device)
    model.nu_att.copy_(nu_att)
    return nu_att
