"""`angpt compare --sample PROMPT`: the report ends with each arm's continuation, from the right run."""

import json

from angpt.checkpoint import load_checkpoint_model
from angpt.infer import sample_stream
from angpt.study import make_plan, run_comparison
from angpt.study.comparison.samples import TEMPERATURE, TOP_K


def test_report_ends_with_each_arms_sample_from_its_largest_budget_run(data_dir, tmp_path, one_thread):
    plan = make_plan(
        data_dir,
        arms=["gpt+", "angpt"],
        budgets=[1024, 2048],
        seeds=[1, 0],
        lr_grid=[1],
        preset="tiny",
        batch_tokens=512,
        eval_batches=1,
        eval_points=1,
        dtype="fp32",
    )
    out = tmp_path / "rep"
    run_comparison(plan, out, threads=1, progress=False, sample="the quick", sample_tokens=12)
    md = (out / "report.md").read_text()
    samples = json.loads((out / "report.json").read_text())["samples"]
    assert samples["prompt"] == "the quick" and set(samples["text"]) == {"gpt+", "angpt"}
    assert md.index("## Samples") > md.index("## Verdict")
    for arm in plan.arms:
        # Independently: the first seed's model (seed 1 here) at the largest budget, sampled the documented way.
        run = plan.run_dir(out, arm, 2048, 1, plan.initial_grid(arm)[0])
        model, tok = load_checkpoint_model(run)
        text = "".join(
            sample_stream(model, tok, "the quick", max_new_tokens=12, temperature=TEMPERATURE, top_k=TOP_K, seed=0)
        )
        assert text and samples["text"][arm.label] == text
        assert f"**{arm.label}**\n\n```\nthe quick{text}\n```" in md
