"""What earlier versions wrote still loads, resumes and renders as it did (issues 38 and 46: nothing a user has on
disk breaks with a restructuring).

tests/fixtures/legacy-2026-11-26 was written by the code before the study engine, the start of a run and the
registry were restructured (issue 38), tests/fixtures/legacy-2026-11-28 by the code before a run was resolved once
and built in one place (issue 46), tests/fixtures/legacy-2026-11-29 by the code before a run kept one record (issue
54; tests/fixtures/make_legacy.py; each revision is in its expected.json): a comparison store, a scaling ladder
store, a stopped run's checkpoint per architecture, and in the first its Hugging Face export, in the later ones
each paper recipe's dry run. Each test works on a copy, with the copy's path written where the fixture recorded
its own (@ROOT@).
"""

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SETS = ["legacy-2026-11-26", "legacy-2026-11-28", "legacy-2026-11-29"]
FIXTURE = FIXTURES / SETS[0]  # the one with Hugging Face exports
sys.path.insert(0, str(FIXTURES))
import make_legacy  # noqa: E402

SLUGS = {"gpt+": "gptplus", "angpt": "angpt", "ngpt": "ngpt"}


@pytest.fixture(scope="module", params=SETS)
def fixture_set(request):
    return FIXTURES / request.param


def _copy(fixture_set: Path, root: Path) -> Path:
    """A copy of a fixture set at `root`, its recorded paths (@ROOT@) made the copy's."""
    shutil.copytree(fixture_set, root)
    for path in root.rglob("*"):
        if path.suffix in (".json", ".md", ".jsonl") and path.is_file():
            text = path.read_text()
            if "@ROOT@" in text:
                path.write_text(text.replace("@ROOT@", str(root)))
    return root


@pytest.fixture(scope="module")
def legacy(tmp_path_factory, fixture_set):
    return _copy(fixture_set, tmp_path_factory.mktemp("legacy") / "fx")


@pytest.fixture(scope="module")
def expected(fixture_set):
    return json.loads((fixture_set / "expected.json").read_text())["archs"]


@pytest.fixture(scope="module")
def logits(fixture_set):
    return load_file(str(fixture_set / "logits.safetensors"))


def _numbers(report: dict) -> dict:
    """What a comparison report measures: per arm and budget the losses (under the key of their split, or val_loss in
    a report written before keys said their split), the chosen rate and the difference."""
    from angpt.study.comparison.analyse import reported

    out = {}
    for label, e in report["arms"].items():
        for row in e["budgets"]:
            d = row.get("difference") or {}
            paired = d.get("paired") or {}
            out[(label, row["budget"])] = (
                row["lr"],
                reported(row),
                d.get("mean_diff"),
                paired.get("p"),
                paired.get("p_holm"),
            )
    return out


def test_a_stored_comparison_renders_the_same_numbers_and_resumes_without_training(legacy, capsys):
    from angpt.cli import main
    from angpt.study.comparison.analyse import SMOKE_P

    before = json.loads((legacy / "compare" / "report.json").read_text())
    assert main(["compare", "--out", str(legacy / "compare"), "--report-only"]) == 0
    after = json.loads((legacy / "compare" / "report.json").read_text())
    assert _numbers(after) == _numbers(before)
    # the same verdicts, but below the horizon a p-value now says it is no evidence (issue 48)
    assert before["horizon"]["short"] and all(SMOKE_P in v for v in after["verdicts"] if "p=" in v)
    assert [v.replace(SMOKE_P, "") for v in after["verdicts"]] == [v.replace(SMOKE_P, "") for v in before["verdicts"]]
    assert after["multiple_comparisons"] == before["multiple_comparisons"]
    # judged by each arm's non-embedding parameters now, by the largest arm's total ones then: the same label here
    assert after["horizon"]["short"] == before["horizon"]["short"] and "params_counted" in after["horizon"]
    capsys.readouterr()
    assert main(["compare", *make_legacy.compare_args(legacy / "data", legacy / "compare")]) == 0
    assert "trained 0 run(s)" in capsys.readouterr().out  # every run is found finished: the store is today's
    assert _numbers(json.loads((legacy / "compare" / "report.json").read_text())) == _numbers(before)


def _rounded(x):
    """`x` with every float to six significant figures."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def test_a_stored_ladder_renders_the_same_points_and_resumes_without_training(legacy, capsys, monkeypatch):
    from angpt.cli import main
    from angpt.study.comparison import report
    from angpt.study.scaling import plots

    def points(report):
        ladder = report["ladder"]
        return {label: e.get("points") or e.get("n_runs") for label, e in ladder["arms"].items()}, ladder["verdicts"]

    before = json.loads((legacy / "ladder" / "report.json").read_text())
    assert main(["scaling", "report", str(legacy / "ladder"), "--bootstrap", "0"]) == 0
    after = json.loads((legacy / "ladder" / "report.json").read_text())
    assert points(after) == points(before)
    # the fits' parameters to six figures: L-BFGS's last digits differ between CPUs (AVX-512 then, AMD AVX2 now)
    assert _rounded(after["ladder"]["arms"]) == _rounded(before["ladder"]["arms"])
    capsys.readouterr()
    # the resume draws no plots: the report above drew them from this ladder (half this test's time)
    monkeypatch.setattr(report, "write_plots", lambda *a, **k: ({}, []))
    monkeypatch.setattr(plots, "write_plots", lambda *a, **k: {})
    assert main(["scaling", *make_legacy.ladder_args(legacy / "data", legacy / "ladder")]) == 0
    assert "trained 0 run(s)" in capsys.readouterr().out


@pytest.mark.parametrize("arch", list(SLUGS))
def test_a_stored_checkpoint_gives_the_same_logits_and_resumes_to_the_same_losses(legacy, expected, logits, arch):
    from angpt.checkpoint import load_checkpoint_model
    from angpt.cli import main

    slug = SLUGS[arch]
    model, _ = load_checkpoint_model(legacy / expected[arch]["checkpoint"], device="cpu")
    with torch.no_grad():
        got = model(logits["input"])[0]
    torch.testing.assert_close(got, logits[f"{slug}.logits"], rtol=0, atol=1e-6)
    run = legacy / "runs" / slug
    assert main(["train", *make_legacy.train_args(arch, legacy / "data"), "--out", str(run), "--resume", "auto"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {str(r["step"]): r["loss"] for r in rows if r.get("step") in (3, 4) and "loss" in r}
    want = expected[arch]["losses_after_resume"]
    assert set(losses) == set(want) and all(math.isclose(losses[k], want[k], rel_tol=0, abs_tol=1e-6) for k in want)
    val = next(r["val_loss"] for r in reversed(rows) if "val_loss" in r)
    assert math.isclose(val, expected[arch]["val_loss_at_4"], abs_tol=1e-6)


@pytest.mark.parametrize("arch", list(SLUGS))
def test_a_stored_export_loads_in_transformers_with_the_same_logits(arch):
    from transformers import AutoModelForCausalLM

    slug = SLUGS[arch]
    logits = load_file(str(FIXTURE / "logits.safetensors"))
    hf = AutoModelForCausalLM.from_pretrained(FIXTURE / "export" / slug, trust_remote_code=True).eval()
    with torch.no_grad():
        got = hf(input_ids=logits["input"]).logits
    torch.testing.assert_close(got, logits[f"{slug}.export_logits"], rtol=0, atol=1e-6)
    torch.testing.assert_close(got, logits[f"{slug}.logits"], rtol=0, atol=1e-4)  # the export is the model


def _dry_run_lines(text: str) -> list[str]:
    """A dry run's lines that do not depend on the machine: all but the time line, the line on how busy its CPU is,
    the machine's memory beside the estimate, and the warnings that compare the estimate with its memory."""
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith(("time ", "cpu ")) or "warning: estimated" in line:
            continue
        out.append(line.split("   (cpu:")[0].split("   (this machine:")[0].split("   (cuda")[0].rstrip())
    return out


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (FIXTURES / SETS[-1] / "dryrun").glob("*.txt")))
def test_each_paper_recipes_dry_run_gives_the_same_numbers(recipe, capsys, monkeypatch):
    """The dry run of each paper recipe, as the code before issue 46 (ebb0919) and before issue 54 (92fcf9f) printed
    it: model, parameters, FLOPs, batch, the optimizer with its rate, warm-up and their sources, the memory estimate
    (a CPU plan's row for its own process, added since by issue 48, set aside). One dry run, against each set."""
    from angpt.cli import main
    from angpt.train import dryrun

    monkeypatch.setattr(dryrun, "process_resident", lambda: 0.0)

    repo = Path(__file__).resolve().parents[1]
    recipe_path = str(repo / "configs" / "paper" / f"{recipe}.yaml")
    assert main(["train", "--config", recipe_path, "--dry-run", "--dry-run-mfu", "0.5"]) == 0  # the time line aside
    got = capsys.readouterr()
    for fixture_set in SETS[1:]:
        want = (FIXTURES / fixture_set / "dryrun" / f"{recipe}.txt").read_text()
        assert _dry_run_lines(got.out + got.err) == _dry_run_lines(want), fixture_set
        assert len(_dry_run_lines(want)) >= 10


@pytest.mark.parametrize("fixture_set", SETS[1:])
def test_a_stored_comparisons_report_renders_line_for_line_as_it_was_written(fixture_set, tmp_path):
    """report.md rendered today from the stored report.json equals the report.md the code before issues 46 and 54
    wrote from it (the rendering was split into sections, not changed; the 2026-11-26 fixture's has the wording of
    its day, and its numbers are checked above)."""
    from angpt.study.comparison.render import render_markdown
    from angpt.study.stored import load_plan

    legacy = _copy(FIXTURES / fixture_set, tmp_path / "fx")
    plan = load_plan(legacy / "compare")
    report = json.loads((legacy / "compare" / "report.json").read_text())
    written = (legacy / "compare" / "report.md").read_text()
    plots = {name: legacy / "compare" / f"{name}.png" for name in report.get("plots", {})}
    for old, new in REWORDED if fixture_set == SETS[1] else ():
        assert old in written
        written = written.replace(old, new)
    assert render_markdown(plan, report, plots).rstrip("\n") == written.rstrip("\n")


# The words issue 48 changed in a report's prose (no verdict word on losses outside a claim; a smoke test's p-values
# say they are no evidence), as (before, after): nothing else of the rendering may change.
REWORDED = [
    ("(negative: the arm is better)", "(negative: the arm's loss is lower)"),
    ("(positive: the arm is better)", "(positive: the arm's loss is lower)"),
    (
        "Read significance from the Holm value (family-wise 5%).",
        "This comparison is a smoke test (below the horizon): its p-values describe these runs only, and no "
        "difference here is evidence, however small its p.",
    ),
]
