"""Weight constraints applied after every optimizer step (docs/architectures.md#weight-constraints).

- `unit` (nGPT): every slice along the constrained dim is renormalised to norm exactly 1.
- `bounded` (anGPT): every slice is projected onto the unit ball, w <- w / max(1, ||w||).

Both work a whole matrix at a time (one norm over the dim, then a foreach divide across all matrices), in fp32
even when the weights are stored in lower precision.
"""

from __future__ import annotations

import torch
from torch import nn

# The least norm each constraint divides by: `unit` renormalises every slice (the floor only guards a zero one),
# `bounded` leaves slices inside the unit ball as they are.
FLOORS = {"unit": 1e-12, "bounded": 1.0}


def floor_of(kind: str) -> float:
    if kind not in FLOORS:
        raise ValueError(f"unknown weight constraint {kind!r}")
    return FLOORS[kind]


@torch.no_grad()
def apply_constraints(groups: dict[str, list[tuple[torch.Tensor, int]]]) -> None:
    """Apply each group's constraint in place."""
    for kind, weights in groups.items():
        if kind == "none" or not weights:
            continue
        tensors = [w.data for w, _ in weights]
        fp32 = [t if t.dtype == torch.float32 else t.float() for t in tensors]
        norms = [slice_norms(t, dim) for t, (_, dim) in zip(fp32, weights)]
        torch._foreach_clamp_min_(norms, floor_of(kind))
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


def project(tensors: list[torch.Tensor], dims: tuple[int, ...], kind: str) -> None:
    """One group's constraint, matrix by matrix (`apply_constraints` without the foreach calls): the form that
    torch.compile fuses into one norm-and-divide kernel per matrix."""
    floor = floor_of(kind)
    for t, dim in zip(tensors, dims):
        f = t.float()
        t.copy_(f / slice_norms(f, dim).clamp_min(floor))


class ConstraintHook:
    """The post-step hook `attach_constraints` registers (`optimizer.weight_constraint`). Eager, the constraint is
    a norm and a division per matrix, ~100 small kernels launched from Python after every step: on the H200 of
    2026-11-27 anGPT's host spent 1.4 ms a step more than GPT+'s, about its whole excess when compiled.
    `compile()` (`compile_for_training` calls it for a compiled forward) runs `project` through torch.compile."""

    def __init__(self, groups: dict[str, list[tuple[torch.Tensor, int]]]) -> None:
        self.groups = {k: w for k, w in groups.items() if k != "none" and w}
        self.dims = {k: tuple(d for _, d in w) for k, w in self.groups.items()}  # fixed: not rebuilt every step
        self.compiled = None

    def compile(self) -> None:
        """Compile the projection, unless a weight is sharded (FSDP's DTensors stay eager)."""
        if any(type(w.data) is not torch.Tensor for ws in self.groups.values() for w, _ in ws):
            return
        self.compiled = torch.compile(project, dynamic=False)

    @torch.no_grad()
    def __call__(self, optimizer=None, args=None, kwargs=None) -> None:
        if self.compiled is None:
            apply_constraints(self.groups)
            return
        for kind, weights in self.groups.items():
            self.compiled([w.data for w, _ in weights], self.dims[kind], kind)


def attach_constraints(model: nn.Module, optimizer: torch.optim.Optimizer):
    """Apply the model's weight constraint after every `optimizer.step()`; returns the hook handle, and keeps the
    hook as `optimizer.weight_constraint` (a `ConstraintHook`).

    A model without constraints (GPT+) gets no hook. Works on compiled or wrapped models through their
    underlying module.
    """
    base = unwrap(model)
    groups = base.constraint_groups() if hasattr(base, "constraint_groups") else {}
    hook = ConstraintHook(groups)
    if not hook.groups:
        return None
    optimizer.weight_constraint = hook
    return optimizer.register_step_post_hook(hook)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under torch.compile / DDP wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        else:
            return model
