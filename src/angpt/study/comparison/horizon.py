"""The horizon rule of docs/protocol.md#horizon: is a comparison long enough to count?

Evidence needs at least 1,000 optimizer steps at the largest budget and at least 10 training tokens per parameter,
each arm's own: its tokens over its own parameters, counted without the embedding table (the LM head counted, as
Kaplan et al. 2020, arXiv 2001.08361, count non-embedding parameters; the GPU race was sized this way). An arm below
the rule makes its own comparisons smoke tests (its comparison with the baseline, and every comparison when it is
the baseline), never another arm's: nGPT at 9.999 tokens per parameter does not make anGPT's comparison a smoke test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from angpt.study.plan import Plan
from angpt.units import format_tokens

MIN_STEPS = 1000
MIN_TOKENS_PER_PARAM = 10.0
SMOKE = "smoke test, not evidence"  # what a comparison below either minimum is, said once where it is reported
COUNTED = "non-embedding (each arm's own; the LM head counted)"


@dataclass
class Horizon:
    """One arm at the largest budget: its length in optimizer steps and its tokens per non-embedding parameter."""

    arm: str
    steps: int
    tokens: int
    params: int  # all of the arm's parameters, embedding table included (stated beside, never judged)
    params_non_embedding: int

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params_non_embedding

    @property
    def short(self) -> bool:
        return self.steps < MIN_STEPS or self.tokens_per_param < MIN_TOKENS_PER_PARAM

    def shortfall(self) -> str:
        """What falls short, in words ("" when nothing does)."""
        out = []
        if self.steps < MIN_STEPS:
            out.append(f"{self.steps:,} optimizer steps (< {MIN_STEPS:,})")
        if self.tokens_per_param < MIN_TOKENS_PER_PARAM:
            out.append(f"{self.tokens_per_param:.4g} tokens per non-embedding parameter (< {MIN_TOKENS_PER_PARAM:g}; "
                       f"{self.params_non_embedding:,} of {self.arm})")  # fmt: skip
        return " and ".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "tokens": self.tokens, "params": self.params,
                "params_non_embedding": self.params_non_embedding, "tokens_per_param": self.tokens_per_param,
                "short": self.short}  # fmt: skip


@dataclass
class Horizons:
    """Every arm's :class:`Horizon`, and which comparisons (an arm against the baseline) they make smoke tests."""

    baseline: str
    arms: dict[str, Horizon]

    def short(self, label: str) -> bool:
        """Whether `label`'s comparison with the baseline is a smoke test: either arm falls short."""
        return self.arms[label].short or self.arms[self.baseline].short

    @property
    def compared(self) -> list[str]:
        return [label for label in self.arms if label != self.baseline] or [self.baseline]

    @property
    def any_short(self) -> bool:
        return any(self.short(label) for label in self.compared)

    @property
    def all_short(self) -> bool:
        """Every comparison of the report is a smoke test (what its title says)."""
        return all(self.short(label) for label in self.compared)

    @property
    def message(self) -> str:
        """One line: the horizon, and which comparisons fall short of it, why, and what that means."""
        steps = next(iter(self.arms.values())).steps
        tokens = next(iter(self.arms.values())).tokens
        ratios = ", ".join(f"{a} {h.tokens_per_param:.4g}" for a, h in self.arms.items())
        head = (f"the largest budget ({format_tokens(tokens)} tokens) is {steps:,} optimizer steps; tokens per "
                f"non-embedding parameter: {ratios}")  # fmt: skip
        short = [h for h in self.arms.values() if h.short]
        if not short:
            return f"horizon: {head}"
        why = "; ".join(h.shortfall() for h in short) if steps >= MIN_STEPS else short[0].shortfall()
        who = ("every comparison" if self.all_short else
               ", ".join(f"{a} against {self.baseline}" for a in self.compared if self.short(a)))  # fmt: skip
        return (f"{SMOKE}: {who}: {why}; evidence needs >= {MIN_STEPS:,} steps and >= {MIN_TOKENS_PER_PARAM:g} tokens "
                "per non-embedding parameter, each arm's own (docs/protocol.md#horizon)")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        first = next(iter(self.arms.values()))
        return {
            "rule": f">= {MIN_STEPS} steps and >= {MIN_TOKENS_PER_PARAM:g} tokens per parameter, each arm's own",
            "params_counted": COUNTED,
            "steps": first.steps,
            "tokens": first.tokens,
            "baseline": self.baseline,
            "arms": {label: h.to_dict() for label, h in self.arms.items()},
            "short_comparisons": [label for label in self.compared if self.short(label)],
            "short": self.all_short,
            "min_steps": MIN_STEPS,
            "min_tokens_per_param": MIN_TOKENS_PER_PARAM,
            "message": self.message,
        }


def short_comparison(horizon: dict[str, Any] | None, label: str) -> bool:
    """Whether a report's recorded horizon (Horizons.to_dict, or a report's from before 2026-11-28, which judged
    the whole report by its largest arm's total parameters) makes `label`'s comparison a smoke test."""
    if not horizon:
        return False
    if "short_comparisons" in horizon:
        return label in horizon["short_comparisons"]
    return bool(horizon.get("short"))


# Models below about this many parameters are built on the CPU to be counted (milliseconds); larger ones on the
# meta device (no memory, no init), whose first use costs a second or two of one-off set-up in a process.
CPU_COUNT_LIMIT = 50_000_000


def count_params(plan: Plan) -> dict[str, tuple[int, int]]:
    """Every arm's (total, non-embedding) parameter count, from a build of its model at the dataset's vocabulary
    (its meta.json, else the plan's fingerprint of it: a store read where its data is not)."""
    import torch

    from angpt.data import load_meta
    from angpt.errors import UserError
    from angpt.models import model_from_config
    from angpt.models.registry import describe_constants
    from angpt.train.config import load_run_config, resolve_model_config

    try:
        meta = load_meta(plan.data)
    except (UserError, OSError):
        meta = {"vocab_size": plan.data_fingerprint["vocab_size"]}
    out = {}
    for arm in plan.arms:
        cfg = load_run_config(None, plan.run_overrides(arm, plan.budgets[0], plan.seeds[0], 1e-3, "unused"))
        mcfg = resolve_model_config(cfg, meta)
        d, ffn = mcfg.d_model, mcfg.ffn_dim
        rough = mcfg.n_layers * (4 * d * d + 3 * d * ffn) + 2 * mcfg.vocab_size * d  # attention, SwiGLU, embed+head
        device = "cpu" if rough < CPU_COUNT_LIMIT else "meta"
        describe_constants(mcfg)  # computes (and caches) any Monte Carlo constant on the CPU: meta holds no values
        with torch.device(device):
            model = model_from_config(mcfg)
        out[arm.label] = (model.num_params(), model.num_params(embeddings=False))
    return out


def horizon(plan: Plan) -> Horizons:
    """The plan's horizons (see the module docstring)."""
    steps, tokens = plan.steps(plan.budgets[-1]), plan.budgets[-1]
    arms = {label: Horizon(label, steps, tokens, total, non_embedding)
            for label, (total, non_embedding) in count_params(plan).items()}  # fmt: skip
    return Horizons(plan.baseline, arms)
