"""Weight constraints applied after every optimizer step (docs/architectures.md#weight-constraints).

- `unit` (nGPT): every slice along the constrained dim is renormalised to norm exactly 1.
- `bounded` (anGPT): every slice is projected onto the unit ball, w <- w / max(1, ||w||).

Both work a whole matrix at a time (one norm over the dim, then a foreach divide across all matrices), in fp32
even when the weights are stored in lower precision.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def apply_constraints(groups: dict[str, list[tuple[torch.Tensor, int]]]) -> None:
    """Apply each group's constraint in place."""
    for kind, weights in groups.items():
        if kind == "none" or not weights:
            continue
        tensors = [w.data for w, _ in weights]
        fp32 = [t if t.dtype == torch.float32 else t.float() for t in tensors]
        norms = [slice_norms(t, dim) for t, (_, dim) in zip(fp32, weights)]
        if kind == "unit":
            torch._foreach_clamp_min_(norms, 1e-12)
        elif kind == "bounded":
            torch._foreach_clamp_min_(norms, 1.0)
        else:
            raise ValueError(f"unknown weight constraint {kind!r}")
        torch._foreach_div_(fp32, norms)
        for t, f in zip(tensors, fp32):
            if t is not f:
                t.copy_(f)


def slice_norms(t: torch.Tensor, dim: int) -> torch.Tensor:
    """||t|| over `dim`, keepdim. Over a strided dim (nGPT's output projections, dim 0) as sqrt(sum t^2): CPU's
    vector_norm is ~10x slower there than along the contiguous last dim (benchmarks/RESULTS.md, issue 9)."""
    if dim in (-1, t.ndim - 1):
        return torch.linalg.vector_norm(t, dim=dim, keepdim=True)
    return t.square().sum(dim, keepdim=True).sqrt_()


def attach_constraints(model: nn.Module, optimizer: torch.optim.Optimizer):
    """Apply the model's weight constraint after every `optimizer.step()`; returns the hook handle.

    A model without constraints (GPT+) gets no hook. Works on compiled or wrapped models through their
    underlying module.
    """
    base = unwrap(model)
    groups = base.constraint_groups() if hasattr(base, "constraint_groups") else {}
    if not any(w for kind, w in groups.items() if kind != "none"):
        return None
    return optimizer.register_step_post_hook(lambda opt, args, kwargs: apply_constraints(groups))


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under torch.compile / DDP wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        else:
            return model
