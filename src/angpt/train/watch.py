"""An early warning of a residual stream that grows layer over layer, before the loss is NaN.

anGPT keeps the residual stream near unit norm by constants alone, so a coherent early update that makes each
layer's output larger than its input compounds with depth (docs/open_choices.md#stability-at-width): at the
paper's batch ||h|| went 1, 1.1, 1.2, ... 106 from the first to the last of 12 layers one step before the loss
exploded. The trainer looks at the per-layer norms on one held-out sequence after every step of the first
`EARLY` and every logged step after that, and warns once when an architecture's bound (registry
`residual_bound`) is passed, naming the layer, the growth per layer and what to change.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from angpt.models import inspect_norms
from angpt.train.step import autocast


class ResidualWatch:
    EARLY = 50  # steps checked one by one: where the blow-ups measured so far began

    def __init__(self, bound: float, probe: torch.Tensor, dtype: str, remedy: str) -> None:
        self.bound, self.probe, self.dtype, self.remedy = bound, probe, dtype, remedy
        self.warned = False

    def due(self, step: int, log_every: int) -> bool:
        return not self.warned and (step <= self.EARLY or step % log_every == 0)

    @torch.no_grad()
    def check(self, model: nn.Module, step: int) -> str | None:
        """The warning once the largest layer's ||h|| passes the bound (then never again), else None."""
        was_training = model.training
        model.eval()
        try:
            with autocast(self.probe.device, self.dtype):
                norms = inspect_norms(model, self.probe)
        finally:
            model.train(was_training)
        per_layer = [float(norms[f"layer{i}.h"]) for i in range(len(model.blocks))]
        per_layer = [x if math.isfinite(x) else math.inf for x in per_layer]  # a NaN is past any bound
        top = max(range(len(per_layer)), key=per_layer.__getitem__)
        if per_layer[top] <= self.bound:
            return None
        self.warned = True
        growth = (per_layer[top] / per_layer[0]) ** (1 / max(1, top))
        return (
            f"step {step}: the residual stream grows layer over layer, ||h|| {per_layer[0]:.2f} at layer 0 to "
            f"{per_layer[top]:.3g} at layer {top} (x{growth:.2f} per layer; this architecture keeps it near 1, "
            f"warning above {self.bound:g}); a blow-up usually follows within a few steps: {self.remedy}"
        )
