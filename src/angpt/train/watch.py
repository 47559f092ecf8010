"""An early warning of a residual stream that grows layer over layer, before the loss is NaN.

anGPT keeps the residual stream near unit norm by constants alone, so a coherent early update that makes each
layer's output larger than its input compounds with depth (docs/open_choices.md#stability-at-width): at the
paper's batch ||h|| went 1, 1.1, 1.2, ... 106 from the first to the last of 12 layers one step before the loss
exploded. The trainer measures the per-layer norms on one held-out sequence before the first step, after every
step of the first `EARLY` and at every logged step after that, and warns once when the largest passes the
architecture's bound (registry `residual_bound`) *and* is at least `JUMP` times the previous measurement: a sudden
rise, not the growth of a small model that is learning (at d = 32-48 a healthy run's last layer reaches 5-10
within 40 steps, up to 1.9x a step). Replayed on 104 runs at five shapes (benchmarks/watch-calibration-cpu): it
warns before a spike in the same 50 of 56 runs as the bound alone, and in 5 of the 48 runs without a spike, where
the bound alone warned in 27.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch
from torch import nn

from angpt.models import inspect_norms
from angpt.train.step import autocast


class ResidualWatch:
    EARLY = 50  # steps checked one by one: where the blow-ups measured so far began
    JUMP = 2.0  # how much larger than the previous measurement the largest norm must be
    WINDOW = 1  # measurements it is compared with (the least of them): the previous one

    def __init__(
        self,
        bound: float,
        probe: torch.Tensor | None,
        dtype: str,
        remedy: Any,  # what to change, or a function of nothing that says it (asked only when warning)
        *,
        jump: float | None = JUMP,
        window: int = WINDOW,
    ) -> None:
        self.bound, self.probe, self.dtype, self.remedy, self.jump = bound, probe, dtype, remedy, jump
        self.recent: deque[float] = deque(maxlen=window)
        self.warned = False
        self.last: list[float] | None = None  # the latest measurement of every layer's ||h|| (metrics.jsonl logs it)

    def due(self, step: int, log_every: int) -> bool:
        return not self.warned and (step <= self.EARLY or step % log_every == 0)

    @torch.no_grad()
    def measure(self, model: nn.Module) -> list[float]:
        """Each layer's ||h|| on the probe sequence (eval mode, the run's autocast); a NaN reads as inf."""
        was_training = model.training
        model.eval()
        try:
            with autocast(self.probe.device, self.dtype):
                norms = inspect_norms(model, self.probe)
        finally:
            model.train(was_training)
        per_layer = [float(norms[f"layer{i}.h"]) for i in range(len(model.blocks))]
        return [x if math.isfinite(x) else math.inf for x in per_layer]

    def start(self, model: nn.Module) -> None:
        """Measure before the first step (or at a resumed run's first), the baseline the first rise is judged by."""
        self.last = self.measure(model)
        self.recent.append(max(self.last))

    def check(self, model: nn.Module, step: int) -> str | None:
        """The warning once the largest layer's ||h|| rises past the bound (then never again), else None."""
        return self.observe(step, self.measure(model))

    def observe(self, step: int, per_layer: list[float]) -> str | None:
        """Judge one measurement of every layer's ||h|| (the warning or None) and remember its largest."""
        self.last = per_layer
        top = max(range(len(per_layer)), key=per_layer.__getitem__)
        largest = per_layer[top]
        rose = self.jump is None or not self.recent or largest >= self.jump * min(self.recent)
        self.recent.append(largest)
        if self.warned or largest <= self.bound or not rose:
            return None
        self.warned = True
        growth = (largest / per_layer[0]) ** (1 / max(1, top))
        return (
            f"step {step}: the residual stream grows layer over layer, ||h|| {per_layer[0]:.2f} at layer 0 to "
            f"{largest:.3g} at layer {top} (x{growth:.2f} per layer; this architecture keeps it near 1, "
            f"warning above {self.bound:g} after a sudden rise); a loss spike or a blow-up often follows within a "
            f"few steps: {self.remedy() if callable(self.remedy) else self.remedy}"
        )
