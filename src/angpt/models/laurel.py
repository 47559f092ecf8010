"""LAUREL, the learned augmented residual layer (Menghani et al. 2024, arXiv 2411.07501; docs/architectures.md#laurel).

A residual connection around a sub-layer f, x_{i+1} = f(x_i) + x_i, becomes (the paper's section 2, our SPEC §5)

    RW:        x_{i+1} = alpha f(x_i) + beta x_i                  (alpha, beta) = 2 softmax(w), w = 0 at init
    LR:        x_{i+1} = f(x_i) + x_i + B A x_i                   A: d -> r, B: r -> d, B = 0 at init
    PA:        x_{i+1} = f(x_i) + x_i + sum_{j=1..k} gamma_j x_{i-j}       gamma = 0 at init, h_i = identity
    RW+LR(+PA): x_{i+1} = alpha f(x_i) + beta (x_i + B A x_i) (+ the PA sum)

Connections are numbered through the whole stack (i = 2l: layer l's attention, 2l + 1: its MLP), x_i is the
residual stream entering connection i and x_0 the embedding; connection i < k has only the i states before it, and
so min(i, k) gammas (connection 0 has none, but keeps its input for the ones after). Every variant is its base model
at init, bit for bit.

A block holds one connection object per sub-layer and calls it where its residual update was (`connection`): the
architecture's own plain update when `model.laurel` is "none", else LAUREL's. PA's earlier states travel in the
forward's `Context.states` (connection index -> its input); written by index, so recomputing a block under
activation checkpointing reads the same states, and position-wise, so a KV cache needs nothing more.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from angpt.models.config import ModelConfig
from angpt.models.layers import scaled_linear


class Residual(nn.Module):
    """The plain residual connection x_{i+1} = x_i + f(x_i) (GPT+)."""

    def forward(self, x: torch.Tensor, fx: torch.Tensor, ctx) -> torch.Tensor:
        return x + fx

    def reset_parameters(self) -> None:
        pass


def previous(gamma: torch.Tensor | None, index: int, x: torch.Tensor, ctx) -> torch.Tensor | int:
    """PA: sum_{j=1..min(i, k)} gamma_j * x_{i-j} (0 at connection 0, which has no gamma); stores x_i = x."""
    ctx.states[index] = x
    return 0 if gamma is None else sum(g * ctx.states[index - j] for j, g in enumerate(gamma, start=1))


def pa_depth(cfg: ModelConfig, index: int) -> int:
    """How many earlier states connection `index` sums over with PA: min(i, k) (0 without PA)."""
    return min(index, cfg.laurel_pa_depth) if "pa" in cfg.laurel_parts else 0


def low_rank(x: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """B A x, in x's dtype."""
    return F.linear(F.linear(x, A), B).to(x.dtype)


class Laurel(nn.Module):
    """One LAUREL connection of GPT+: x_{i+1} = alpha f(x_i) + beta (x_i + B A x_i) + sum_j gamma_j x_{i-j}.

    Each part is present only when switched on (`w` for RW, `A`, `B` for LR, `pa` and `gamma` for PA). Parameters
    are created without drawing random numbers, so a model with LAUREL starts from the same random weights as without.
    """

    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        d, r, parts = cfg.d_model, cfg.laurel_rank, cfg.laurel_parts
        self.index = index
        self.sigmoid = cfg.laurel_rw_bound == "sigmoid"
        # RW: w = [w_alpha; w_beta], one pair per connection or per channel (stored flat, so it is no "matrix" that
        # GPT+'s weight decay would reach)
        self.w = nn.Parameter(torch.zeros(2 * (d if cfg.laurel_rw_shape == "vector" else 1))) if "rw" in parts else None
        self.A = nn.Parameter(torch.zeros(r, d)) if "lr" in parts else None  # [out, in]: A maps d -> r
        self.B = nn.Parameter(torch.zeros(d, r)) if "lr" in parts else None
        self.pa = "pa" in parts
        self.gamma = nn.Parameter(torch.zeros(pa_depth(cfg, index))) if pa_depth(cfg, index) else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for p in (self.w, self.B, self.gamma):
            if p is not None:
                p.zero_()
        if self.A is not None:
            # column-orthogonal A: A[i, j] = 1/sqrt(r d) where j mod r == i, else 0 (SPEC §5)
            r, d = self.A.shape
            self.A.copy_((torch.arange(d) % r == torch.arange(r)[:, None]).float() / (r * d) ** 0.5)

    def rw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(alpha, beta) = 2 softmax(w) (or 2 sigmoid(w) each): both 1 at w = 0, scalars or vectors in R^d."""
        w = self.w.view(2, -1)
        ab = 2 * (torch.sigmoid(w) if self.sigmoid else torch.softmax(w, dim=0))
        alpha, beta = ab[0], ab[1]
        return (alpha[0], beta[0]) if alpha.numel() == 1 else (alpha, beta)

    def forward(self, x: torch.Tensor, fx: torch.Tensor, ctx) -> torch.Tensor:
        fx = fx.to(x.dtype)
        skip = x if self.A is None else x + low_rank(x, self.A, self.B)  # x + B A x
        if self.w is None:
            y = skip + fx
        else:
            alpha, beta = self.rw()
            y = alpha * fx + beta * skip
        return y + previous(self.gamma, self.index, x, ctx) if self.pa else y


class ApproxLaurel(Laurel):
    """One LAUREL connection of anGPT: LR and PA add terms to h before the normalising factor.

        h <- nu * (c_A h_X + c_h (h + B A h) + sum_j gamma_j x_{i-j}),   h_X = nu_w W x the branch output,
        c_A = alpha a, c_h = beta (1 - a)                                 (alpha = beta = 1 without RW)

    and nu, per channel c, keeps ||h|| ~ 1 (docs/architectures.md#laurel-on-angpt) without an exact norm:

        nu_c = 1 / sqrt(c_A^2 + p^2 + 2 p c_h (B A)_cc + c_h^2 ||(B A)_c||^2),   p = c_h + sum_j gamma_j

    the expectation for h uniform on the sphere and independent of h_X (anGPT's assumptions), with the earlier
    states taken as ~h (anGPT's small steps keep consecutive states within a few degrees). Without LR and PA,
    and at init, nu is anGPT's nu(a) = 1 / sqrt(a^2 + (1 - a)^2).
    """

    def factors(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(nu, c_h, c_A) for the current weights: vectors in R^d (or [1] for a scalar a without LR)."""
        c_h, c_A = 1 - a, a
        if self.w is not None:
            alpha, beta = self.rw()
            c_h, c_A = beta * c_h, alpha * c_A
        p = c_h if self.gamma is None else c_h + self.gamma.sum()
        var = c_A * c_A + p * p
        if self.A is not None:
            A, B = self.A, self.B
            diag = (B * A.t()).sum(1)  # (B A)_cc
            rows = ((B @ (A @ A.t())) * B).sum(1)  # ||(B A)_c||^2 = B_c (A A^T) B_c^T: O(r^2 d), no d x d matrix
            var = var + 2 * p * c_h * diag + c_h * c_h * rows
        return var.rsqrt(), c_h, c_A

    def forward(self, h, x, weight, nu_w, a, ctx) -> torch.Tensor:  # type: ignore[override]
        """h <- nu (c_A nu_w W x + c_h (h + B A h) + PA), the branch factor on W's rows (as approx_residual)."""
        nu, c_h, c_A = self.factors(a)
        skip = h if self.A is None else h + low_rank(h, self.A, self.B)
        y = torch.addcmul(scaled_linear(x, weight, nu * c_A * nu_w).to(h.dtype), skip, (nu * c_h).to(h.dtype))
        return y + nu.to(h.dtype) * previous(self.gamma, self.index, h, ctx) if self.pa else y


def connection(cfg: ModelConfig, index: int, plain: type[nn.Module] = Residual, laurel: type[Laurel] = Laurel):
    """Residual connection `index` of the stack: `laurel` (default `Laurel`) when cfg.laurel is set, else `plain`."""
    return laurel(cfg, index) if cfg.laurel_parts else plain()


class FoldedLaurel(nn.Module):
    """What LAUREL adds to a folded residual update h <- r * h + f' (models/folded.py): B' A h + sum_j G_j * x_{i-j}.

    RW's alpha and any constant on the branch sit in f's output rows, beta in r and B' = diag(s) B, PA's gamma in
    per-channel gains G [min(i, k), d]. Built only where LR or PA is on (`folded_laurel`).
    """

    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        d, r, parts = cfg.d_model, cfg.laurel_rank, cfg.laurel_parts
        self.index = index
        self.A = nn.Parameter(torch.zeros(r, d)) if "lr" in parts else None
        self.B = nn.Parameter(torch.zeros(d, r)) if "lr" in parts else None
        self.pa = "pa" in parts
        self.gamma = nn.Parameter(torch.zeros(pa_depth(cfg, index), d)) if pa_depth(cfg, index) else None

    def forward(self, h: torch.Tensor, ctx) -> torch.Tensor:
        out = 0 if self.A is None else low_rank(h, self.A, self.B)
        if not self.pa:
            return out
        return out + previous(None if self.gamma is None else self.gamma.to(h.dtype), self.index, h, ctx)

    @torch.no_grad()
    def load(self, laurel: Laurel, skip: torch.Tensor, pa: torch.Tensor) -> None:
        """Fill from a training connection whose update is ... + skip * (h + B A h) + pa * sum_j gamma_j x_{i-j}."""
        if self.A is not None:
            self.A.copy_(laurel.A)
            self.B.copy_(laurel.B * skip.expand(self.B.shape[0])[:, None])
        if self.gamma is not None:
            self.gamma.copy_(laurel.gamma[:, None] * pa.expand(self.gamma.shape[1]))


def folded_laurel(cfg: ModelConfig, index: int) -> FoldedLaurel | None:
    """The folded LAUREL terms of connection `index`, or None where there are none (no LAUREL, or RW alone)."""
    return FoldedLaurel(cfg, index) if cfg.laurel_parts & {"lr", "pa"} else None


def laurel_params(model: nn.Module) -> int:
    """How many parameters LAUREL adds to `model`."""
    return sum(p.numel() for m in model.modules() if isinstance(m, (Laurel, FoldedLaurel)) for p in m.parameters())
