"""The horizon rule of docs/protocol.md#horizon: is the largest budget long enough for the comparison to count?

Evidence needs at least 1,000 optimizer steps and about 10 tokens per parameter at the largest budget; shorter
comparisons are smoke tests. Parameters are counted in total, embedding table included (the convention of
Chinchilla, Hoffmann et al. 2022, arXiv 2203.15556; Kaplan et al. 2020 leave embeddings out): the stricter count
for the small-vocabulary models compared here, and the one a reader checks against `angpt info`. The largest arm
counts, since every arm must meet the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from angpt.study.plan import Plan
from angpt.units import format_tokens

MIN_STEPS = 1000
MIN_TOKENS_PER_PARAM = 10.0
SMOKE = "smoke test, not evidence"  # what a report below either minimum is, said once at the top of its report


@dataclass
class Horizon:
    """The largest budget's length in optimizer steps and in tokens per parameter of the largest arm."""

    steps: int
    tokens: int
    params: int  # total parameters of the largest arm, embeddings included
    params_non_embedding: int
    arm: str

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params

    @property
    def short(self) -> bool:
        return self.steps < MIN_STEPS or self.tokens_per_param < MIN_TOKENS_PER_PARAM

    @property
    def message(self) -> str:
        """One line: what falls short, by how much, and what it means."""
        if not self.short:
            return (
                f"horizon: the largest budget is {self.steps:,} steps and {self.tokens_per_param:.3g} tokens per "
                f"parameter ({self.params:,} parameters of {self.arm}, embeddings included)"
            )
        short = []
        if self.steps < MIN_STEPS:
            short.append(f"{self.steps:,} optimizer steps (< {MIN_STEPS:,})")
        if self.tokens_per_param < MIN_TOKENS_PER_PARAM:
            short.append(
                f"{self.tokens_per_param:.3g} tokens per parameter (< {MIN_TOKENS_PER_PARAM:g}; {self.params:,} "
                f"parameters of {self.arm}, embeddings included)"
            )
        return (
            f"{SMOKE}: the largest budget ({format_tokens(self.tokens)} tokens) is "
            f"{' and '.join(short)}; evidence needs >= {MIN_STEPS:,} steps and >= {MIN_TOKENS_PER_PARAM:g} tokens "
            "per parameter (docs/protocol.md#horizon)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "params": self.params,
            "params_non_embedding": self.params_non_embedding,
            "params_counted": "total (embeddings included)",
            "arm": self.arm,
            "tokens_per_param": self.tokens_per_param,
            "min_steps": MIN_STEPS,
            "min_tokens_per_param": MIN_TOKENS_PER_PARAM,
            "short": self.short,
            "message": self.message,
        }


# Models below about this many parameters are built on the CPU to be counted (milliseconds); larger ones on the
# meta device (no memory, no init), whose first use costs a second or two of one-off set-up in a process.
CPU_COUNT_LIMIT = 50_000_000


def count_params(plan: Plan) -> dict[str, tuple[int, int]]:
    """Every arm's (total, non-embedding) parameter count, from a build of its model."""
    import torch

    from angpt.data import load_meta
    from angpt.models import model_from_config
    from angpt.models.registry import describe_constants
    from angpt.train.config import load_run_config, resolve_model_config

    meta = load_meta(plan.data)
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


def horizon(plan: Plan) -> Horizon:
    """The plan's horizon (see the module docstring)."""
    params = count_params(plan)
    arm = max(params, key=lambda label: params[label][0])
    total, non_embedding = params[arm]
    return Horizon(plan.steps(plan.budgets[-1]), plan.budgets[-1], total, non_embedding, arm)
