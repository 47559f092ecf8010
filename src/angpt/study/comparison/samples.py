"""Text samples from a finished comparison: each arm's model at the largest budget continues one prompt.

A reader of a small comparison learns more from two continuations side by side than from a loss difference of a
few hundredths. Sampling is seeded (temperature 0.8, top-k 40), so re-writing the report gives the same text.
"""

from __future__ import annotations

from pathlib import Path

from angpt.study.plan import Plan
from angpt.study.sweep import Sweeps, chosen

TEMPERATURE = 0.8
TOP_K = 40


def sample_arms(
    plan: Plan, report_dir: Path, sweeps: Sweeps, prompt: str, max_new_tokens: int = 80
) -> dict[str, str | None]:
    """arm label -> the continuation of `prompt` by its first seed's model at the largest budget and chosen point.

    None for an arm without such a finished run (a failed sweep, a diverged run without a finite checkpoint).
    """
    from angpt.checkpoint import load_checkpoint_model
    from angpt.errors import UserError
    from angpt.infer import sample_stream

    out: dict[str, str | None] = {}
    for arm in plan.arms:
        point = chosen(plan, sweeps, arm.label, plan.budgets[-1])  # (LR, tuned setting) or None
        run = plan.run_dir(report_dir, arm, plan.budgets[-1], plan.seeds[0], *point) if point is not None else None
        try:
            if run is None:
                raise UserError("no chosen learning rate")  # handled below: no sample
            model, tokenizer = load_checkpoint_model(run)
        except (UserError, OSError):  # CheckpointError is a UserError
            out[arm.label] = None
            continue
        room = model.config.context_length - len(tokenizer.encode(prompt))
        pieces = sample_stream(
            model,
            tokenizer,
            prompt,
            max_new_tokens=max(0, min(max_new_tokens, room)),
            temperature=TEMPERATURE,
            top_k=TOP_K,
            seed=0,
        )
        out[arm.label] = "".join(pieces)
    return out


def render_samples(plan: Plan, prompt: str, samples: dict[str, str | None]) -> str:
    """The report's "Samples" section (markdown)."""
    lines = [
        "## Samples",
        "",
        f"Each arm's seed-{plan.seeds[0]} model at the largest budget continues the prompt (temperature "
        f"{TEMPERATURE}, top-k {TOP_K}, seed 0). One sample each: an illustration, not a measurement.",
        "",
    ]
    for label, text in samples.items():
        lines.append(f"**{label}**")
        lines.append("")
        if text is None:
            lines += ["(no finished run to sample from)", ""]
            continue
        body = (prompt + text).replace("```", "'''")
        lines += ["```", body, "```", ""]
    return "\n".join(lines)
