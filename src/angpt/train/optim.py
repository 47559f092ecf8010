"""Each architecture's optimizer and learning-rate schedule, as its registry entry's `Recipe` says.

See docs/architectures.md#optimizer-recipes.

GPT / GPT+: AdamW, weight decay on matrices only, linear warm-up then cosine decay.
nGPT / anGPT: Adam, no weight decay, no warm-up, cosine decay; their weight constraint runs after every step.
Any recipe may instead use warm-up-stable-decay (``train.schedule: wsd``), for budget ladders that branch short
decays off one long run (a scaling ladder, angpt.study.ladder).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from angpt.errors import ConfigError
from angpt.models import registry
from angpt.models.constraints import attach_constraints, unwrap

SCHEDULES = ("cosine", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")


@dataclass
class Schedule:
    """The LR multiplier after `step` updates: linear warm-up for `warmup_steps`, then by `kind`

    - ``cosine``: cosine from the peak to `min_lr_ratio` * peak at `max_steps`;
    - ``wsd`` (warm-up, stable, decay): the peak until the last `decay_fraction` of `max_steps`, then a decay to
      `min_lr_ratio` * peak, ``linear`` or ``1-sqrt`` (Hägele et al. 2024, arXiv 2405.18392, Sec. 3: a 1-sqrt
      cool-down over ~20% of the run matches cosine). Up to the decay's start the LR does not depend on
      `max_steps`, so a run of a shorter budget is a checkpoint of a longer one plus its own decay.
    """

    max_steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    kind: str = "cosine"
    decay_fraction: float = 0.2
    decay_shape: str = "1-sqrt"

    @property
    def decay_start(self) -> int:
        """The step (updates done) at which the WSD decay begins."""
        return self.max_steps - max(1, round(self.decay_fraction * self.max_steps))

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.kind == "wsd":
            start = self.decay_start
            if step < start:
                return 1.0
            progress = min(1.0, (step - start) / (self.max_steps - start))
            left = 1 - progress if self.decay_shape == "linear" else 1 - math.sqrt(progress)
            return self.min_lr_ratio + (1 - self.min_lr_ratio) * left
        span = max(1, self.max_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(
    model: nn.Module,
    arch: str | None = None,
    lr: float = 1e-3,
    *,
    max_steps: int = 1000,
    weight_decay: float | None = None,
    warmup_steps: int | None = None,
    optimizer: str | None = None,
    **schedule: Any,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimizer and LR scheduler of `arch`'s recipe (default: the model's own), constraints attached: the
    library's entry. `weight_decay`, `warmup_steps` and `optimizer` ("adamw" or "adam") None -> the recipe's; the
    rest as :func:`optimizer_for`. Call `scheduler.step()` after each `optimizer.step()`."""
    recipe = registry.get(arch or unwrap(model).config.arch).recipe
    return optimizer_for(
        model,
        lr,
        max_steps=max_steps,
        optimizer=recipe.optimizer if optimizer is None else optimizer,
        weight_decay=recipe.weight_decay if weight_decay is None else weight_decay,
        warmup_steps=recipe.warmup_steps(max_steps) if warmup_steps is None else warmup_steps,
        **schedule,
    )


def optimizer_for(
    model: nn.Module,
    lr: float,
    *,
    max_steps: int,
    optimizer: str,
    weight_decay: float,
    warmup_steps: int,
    min_lr_ratio: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    constraints: bool = True,
    schedule: str = "cosine",
    decay_fraction: float = 0.2,
    decay_shape: str = "1-sqrt",
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """`optimizer` ("adamw": `weight_decay` on matrices; "adam": none) at peak `lr` with `warmup_steps` and a
    `schedule` ("cosine" or "wsd", see :class:`Schedule`) over `max_steps`, the model's weight constraint attached
    (`constraints`): every value given, as train/setup.py's `build` passes a resolved run's, so nothing is looked
    up."""
    if not lr > 0:
        raise ConfigError(f"train.lr={lr!r} must be positive")
    if max_steps <= 0:
        raise ConfigError(f"train.max_steps={max_steps!r} must be a positive integer")
    params = [p for p in model.parameters() if p.requires_grad]
    fused = {"fused": True} if all(p.device.type in ("cuda", "cpu") for p in params) else {}
    if optimizer == "adamw":
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, **fused)
    elif optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0, **fused)
    else:
        raise ConfigError(f"unknown optimizer {optimizer!r} in the recipe; use adamw or adam")
    if schedule not in SCHEDULES:
        raise ConfigError(f"train.schedule={schedule!r}; use one of: {', '.join(SCHEDULES)}")
    fn = Schedule(max_steps, warmup_steps, min_lr_ratio, schedule, decay_fraction, decay_shape)
    if schedule == "wsd" and warmup_steps > fn.decay_start:
        raise ConfigError(
            f"train.warmup_steps={warmup_steps} runs into the WSD decay, which starts at step {fn.decay_start} of "
            f"{max_steps}; lower the warm-up or train.decay_fraction"
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, fn)
    if constraints:
        attach_constraints(model, opt)
    return opt, scheduler
