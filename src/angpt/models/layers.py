"""Parts shared by every architecture: RoPE, the attention call with its KV cache, norms, scales, init."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# ----------------------------------------------------------------------------------------------------- RoPE
class RoPE(nn.Module):
    """Rotary position embedding (Su et al. 2021), rotate-half layout as in Qwen3 / Llama."""

    def __init__(self, head_dim: int, max_len: int, theta: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate `x` of shape [B, H, T, d_h] for positions start .. start+T-1, row b shifted back by offsets[b]."""
        T = x.shape[-2]
        if offsets is None:
            cos, sin = self.cos[start : start + T], self.sin[start : start + T]
        else:  # left-padded rows: [B, 1, T, d_h] tables at each row's own positions
            pos = row_positions(offsets, start, T)
            cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def row_positions(offsets: torch.Tensor, start: int, T: int) -> torch.Tensor:
    """[B, T] positions start + t - offsets[b] of a left-padded batch; padding (negative) clamps to 0, unattended."""
    pos = torch.arange(start, start + T, device=offsets.device)[None] - offsets[:, None]
    return pos.clamp_min(0)


# ------------------------------------------------------------------------------------------------ attention
class KVCache:
    """Pre-allocated keys and values of every layer, for incremental decoding.

    `pos` is the number of positions already written; a forward with a cache writes the new positions and
    attends over everything written so far.
    """

    def __init__(
        self, n_layers: int, batch: int, n_heads: int, max_len: int, head_dim: int, device=None, dtype=torch.float32
    ) -> None:
        shape = (batch, n_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layers)]
        self.max_len = max_len
        self.pos = 0
        # Optional key mask [B, max_len] (True = attend), for left-padded batches.
        self.key_mask: torch.Tensor | None = None
        # Optional left padding [B] of each row: its positions (RoPE, anGPT's nu_att[t]) start after the padding.
        self.offsets: torch.Tensor | None = None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        T = k.shape[-2]
        end = self.pos + T
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; cannot append {T} at {self.pos}")
        self.k[layer][:, :, self.pos : end] = k.to(self.k[layer].dtype)
        self.v[layer][:, :, self.pos : end] = v.to(self.v[layer].dtype)
        return self.k[layer][:, :, :end].to(k.dtype), self.v[layer][:, :, :end].to(v.dtype)


def attend(q, k, v, scale: float, cache: KVCache | None, layer: int) -> torch.Tensor:
    """Causal scaled dot-product attention over [B, H, T, d_h], through the KV cache when given one."""
    if cache is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    start, T = cache.pos, q.shape[-2]
    k, v = cache.update(layer, k, v)
    mask = None
    if T > 1 or cache.key_mask is not None:
        # Query t (absolute start + t) sees keys 0 .. start + t; SDPA's is_causal would align top-left instead.
        qpos = torch.arange(start, start + T, device=q.device)[:, None]
        mask = torch.arange(start + T, device=q.device)[None, :] <= qpos
        if cache.key_mask is not None:
            mask = mask[None, None] & cache.key_mask[:, None, None, : start + T]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, H*d_h] -> [B, H, T, d_h]."""
    B, T, _ = x.shape
    return x.view(B, T, n_heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, d_h] -> [B, T, H*d_h]."""
    B, H, T, dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * dh)


def unit_norm(x: torch.Tensor) -> torch.Tensor:
    """Norm(x) = x / ||x|| over the last dim (nGPT's exact normalisation), in fp32 for low-precision x.

    Computed as x rsqrt(x.x + n eps) by `UnitNorm`, whose hand-written backward takes two passes over x where
    autograd took five; in a training step ~3x faster on CPU than through `F.rms_norm`, which autograd decomposes
    into pow-mean-add-rsqrt-mul (benchmarks/RESULTS.md, issue 9). eps is small enough that only a zero vector
    notices it.
    """
    return UnitNorm.apply(x.float()).to(x.dtype)


def unit_qk(q: torch.Tensor, k: torch.Tensor, gain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(gain * Norm(q), Norm(k)): the attention logits are exactly gain * Norm(q).Norm(k), the gain (per
    coordinate, or one number) on q alone. Computed in fp32 for low-precision q, k."""
    return (UnitNorm.apply(q.float()) * gain).to(q.dtype), UnitNorm.apply(k.float()).to(k.dtype)


def _inv_norm(x: torch.Tensor) -> torch.Tensor:
    """1 / sqrt(||x||^2 + n eps) over the last dim, keepdim, eps = 1e-30 (zero vectors map to zero), in x's dtype
    (autocast would run the dot product in bf16)."""
    with torch.autocast(x.device.type, enabled=False):
        return torch.rsqrt(torch.linalg.vecdot(x, x).unsqueeze(-1) + x.shape[-1] * 1e-30)


class UnitNorm(torch.autograd.Function):
    """y = x r with r = 1/sqrt(x.x + n eps) over the last dim. Backward: dx = r (g - y (g.y)), the Jacobian of
    x/||x|| (I - y y^T)/||x|| applied to g, with y and r saved from the forward (the eps term only changes r)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        r = _inv_norm(x)
        y = x * r
        ctx.save_for_backward(y, r)
        return y

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:
        y, r = ctx.saved_tensors
        with torch.autocast(g.device.type, enabled=False):
            return torch.addcmul(g, y, torch.linalg.vecdot(g, y).unsqueeze(-1), value=-1) * r


# ------------------------------------------------------------------------------------------------ norms
class RMSNorm(nn.Module):
    """RMSNorm (Zhang and Sennrich 2019) with a learnable gain, computed in fp32 like Qwen3."""

    def __init__(self, dim: int, eps: float = 1e-6, scale: float = 1.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.scale = scale  # LN-scaling (Sun et al. 2025): 1/sqrt(layer index); 1 otherwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight.to(x.dtype)
        return y * self.scale if self.scale != 1.0 else y


class DyT(nn.Module):
    """Dynamic tanh (Zhu et al. 2025): gamma * tanh(a * x) + beta, a learnable scalar in place of a norm."""

    def __init__(self, dim: int, alpha_init: float = 0.5) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias


# ----------------------------------------------------------------------------------------------- scales
class Scale(nn.Module):
    """A learnable vector reparameterised as in nGPT: stored starts at `scale`, effective = stored * init/scale.

    Every stored scale then has a magnitude near its `scale`, so Adam's per-coordinate steps (~lr) move the
    effective value by ~lr * init / scale, alike for all scales (Loshchilov et al. 2024, section 2.6).
    """

    def __init__(self, shape: int | tuple[int, ...], init: float, scale: float, absolute: bool = False) -> None:
        super().__init__()
        self.init, self.scale, self.absolute = float(init), float(scale), absolute
        self.param = nn.Parameter(torch.full((shape,) if isinstance(shape, int) else shape, self.scale))

    def forward(self) -> torch.Tensor:
        value = self.param * (self.init / self.scale)
        return value.abs() if self.absolute else value

    def extra_repr(self) -> str:
        return f"shape={tuple(self.param.shape)}, init={self.init:g}, scale={self.scale:g}, abs={self.absolute}"


# --------------------------------------------------------------------------------------- control layers
class WNLinear(nn.Module):
    """A bias-free linear map with weight normalisation (Salimans and Kingma 2016, arXiv 1602.07868, eq. 2).

    Each row of the effective weight (one output unit's input weights, [out, in] layout) is `W_i = g_i V_i /
    ||V_i||`: the direction `v` and the length `g` are separate parameters. `weight` is that effective W,
    computed from them on every read, so code that reads a linear map's `.weight` (export, inspection) sees the
    map itself; write through `v` and `g`. The norm is taken in fp32 whatever the storage dtype.
    """

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.v = nn.Parameter(torch.empty(out_features, in_features))
        self.g = nn.Parameter(torch.ones(out_features))
        # nn.Linear's default init (the model overwrites it): it also draws what nn.Linear draws, so a model built
        # with WNLinear in place of nn.Linear consumes the random stream alike and, seeded alike, starts alike.
        nn.init.kaiming_uniform_(self.v, a=math.sqrt(5))
        self.match_gain()

    @property
    def weight(self) -> torch.Tensor:
        v = self.v.float()
        return (v * (self.g.float() / torch.linalg.vector_norm(v, dim=1)).unsqueeze(1)).to(self.v.dtype)

    @torch.no_grad()
    def match_gain(self) -> None:
        """g = ||V|| per row, so that the effective W equals V (the init of the same map without normalisation)."""
        self.g.copy_(torch.linalg.vector_norm(self.v.float(), dim=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, W = g * V / ||V|| per row"


def stored_matrix(linear: nn.Module) -> nn.Parameter:
    """The parameter a linear map keeps its matrix in: V of a weight-normalised map, else its weight."""
    return linear.v if isinstance(linear, WNLinear) else linear.weight


COS_TAU_MIN = 0.01  # Swin v2 (Liu et al. 2022, arXiv 2111.09883, eq. 2): "tau is set larger than 0.01"


class CosineLogitScale(nn.Module):
    """1/tau of scaled cosine attention (Swin v2): one learned temperature per head, tau >= COS_TAU_MIN.

    Stored as Swin v2's code stores it, the log of the inverse, `logit_scale = log(1/tau)` (a vector [H], so no
    weight decay), clamped at log(1/COS_TAU_MIN) before the exp. Init `tau_init` (Swin v2: 0.1, logit scale 10).
    """

    def __init__(self, n_heads: int, tau_init: float) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.full((n_heads,), math.log(1.0 / tau_init)))
        self.max_log = math.log(1.0 / COS_TAU_MIN)

    def forward(self) -> torch.Tensor:
        """1/tau per head, [H]; at most 1/COS_TAU_MIN (gradient zero where clamped, as in Swin v2)."""
        return self.logit_scale.clamp(max=self.max_log).exp()


# ------------------------------------------------------------------------------------------------- init
@torch.no_grad()
def init_unit_rows(weight: torch.Tensor, dim: int = 1) -> None:
    """Random normal init, then every slice along `dim` scaled to exactly unit norm."""
    weight.normal_()
    weight.div_(torch.linalg.vector_norm(weight, dim=dim, keepdim=True))


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}  # the gate activation of the gated MLP (SwiGLU with silu)


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, scale: float | torch.Tensor) -> torch.Tensor:
    """scale * (W x) computed as (diag(scale) W) x: a constant or per-output-unit vector applied to the [out, in]
    weight rather than the [..., out] activation (cheaper whenever tokens outnumber input features)."""
    if isinstance(scale, torch.Tensor):
        return F.linear(x, weight * scale.unsqueeze(-1).to(weight.dtype))
    return F.linear(x, weight * scale)


def swiglu_dims(d_ff: int) -> tuple[slice, slice]:
    """Slices of the fused [u; z] up-projection: u (value branch) first, z (gate) second."""
    return slice(0, d_ff), slice(d_ff, 2 * d_ff)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)


def softmax_scale(cfg, unit_qk: bool) -> float:
    """The configured softmax scale, else the default: sqrt(d_h) for unit-norm q, k (nGPT, anGPT), else 1/sqrt(d_h)."""
    if cfg.softmax_scale is not None:
        return cfg.softmax_scale
    return math.sqrt(cfg.head_dim) if unit_qk else 1.0 / math.sqrt(cfg.head_dim)


def inv_sqrt(x: float) -> float:
    return 1.0 / math.sqrt(x)
