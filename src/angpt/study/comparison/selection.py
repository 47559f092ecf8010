"""Whether a comparison selects anything, and where an arm's one learning rate came from when it does not.

`make demo` runs each arm once at one rate (--lr-grid 1): nothing is chosen, so the report must not speak of
sweeps or chosen rates, and it names the rate's source instead. The source is read from the value, not from which
option was given: a ladder passes each recipe's rate through --lr, and that rate is still the recipe's default.
"""

from __future__ import annotations

from angpt.errors import ConfigError
from angpt.study.arms import Arm
from angpt.study.plan import Plan, recipe_lr
from angpt.units import format_lr, round_lr


def selects(plan: Plan) -> bool:
    """Whether any arm has more than one candidate (LRs or settings) to choose from."""
    return any(len(plan.initial_grid(a)) > 1 or len(a.settings()) > 1 for a in plan.arms)


def lr_source(plan: Plan, arm: Arm) -> str:
    """Where the arm's one learning rate comes from: "its recipe's default at preset demo", or, for a rate set by
    --lr, --lr-values or --lr-grid, "set for this comparison (its recipe's default: 0.002)"."""
    try:
        at_preset, small = recipe_lr(arm.arch, plan.preset), recipe_lr(arm.arch, None)
    except ConfigError:  # a stored comparison of an architecture no longer registered
        return "given"
    lr = plan.initial_grid(arm)[0]  # its only point where nothing is selected
    if lr == round_lr(at_preset):
        return f"its recipe's default at preset {plan.preset}"
    if lr == round_lr(small):
        return "its recipe's default"
    return f"set for this comparison (its recipe's default: {format_lr(at_preset)})"
