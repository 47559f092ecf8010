"""What earlier versions wrote still loads, resumes and renders as it did (issue 38: nothing a user has on disk
breaks with a restructuring).

tests/fixtures/legacy-2026-11-26 was written by the code before the study engine, the start of a run and the
registry were restructured (tests/fixtures/make_legacy.py; its revision is in expected.json): a comparison store, a
scaling ladder store, a stopped run's checkpoint per architecture and its Hugging Face export. Each test works on a
copy, with the copy's path written where the fixture recorded its own (@ROOT@).
"""

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "legacy-2026-11-26"
sys.path.insert(0, str(FIXTURE.parent))
import make_legacy  # noqa: E402

SLUGS = {"gpt+": "gptplus", "angpt": "angpt", "ngpt": "ngpt"}


@pytest.fixture(scope="module")
def legacy(tmp_path_factory):
    root = tmp_path_factory.mktemp("legacy") / "fx"
    shutil.copytree(FIXTURE, root)
    for path in root.rglob("*"):
        if path.suffix in (".json", ".md", ".jsonl") and path.is_file():
            text = path.read_text()
            if "@ROOT@" in text:
                path.write_text(text.replace("@ROOT@", str(root)))
    return root


@pytest.fixture(scope="module")
def expected():
    return json.loads((FIXTURE / "expected.json").read_text())["archs"]


@pytest.fixture(scope="module")
def logits():
    return load_file(str(FIXTURE / "logits.safetensors"))


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

    before = json.loads((legacy / "compare" / "report.json").read_text())
    assert main(["compare", "--out", str(legacy / "compare"), "--report-only"]) == 0
    after = json.loads((legacy / "compare" / "report.json").read_text())
    assert _numbers(after) == _numbers(before) and after["verdicts"] == before["verdicts"]
    assert after["horizon"] == before["horizon"] and after["multiple_comparisons"] == before["multiple_comparisons"]
    capsys.readouterr()
    assert main(["compare", *make_legacy.compare_args(legacy / "data", legacy / "compare")]) == 0
    assert "trained 0 run(s)" in capsys.readouterr().out  # every run is found finished: the store is today's
    assert _numbers(json.loads((legacy / "compare" / "report.json").read_text())) == _numbers(before)


def test_a_stored_ladder_renders_the_same_points_and_resumes_without_training(legacy, capsys):
    from angpt.cli import main

    def points(report):
        ladder = report["ladder"]
        return {label: e.get("points") or e.get("n_runs") for label, e in ladder["arms"].items()}, ladder["verdicts"]

    before = json.loads((legacy / "ladder" / "report.json").read_text())
    assert main(["scaling", "report", str(legacy / "ladder"), "--bootstrap", "0"]) == 0
    after = json.loads((legacy / "ladder" / "report.json").read_text())
    assert points(after) == points(before)
    assert json.dumps(after["ladder"]["arms"], sort_keys=True) == json.dumps(before["ladder"]["arms"], sort_keys=True)
    capsys.readouterr()
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
def test_a_stored_export_loads_in_transformers_with_the_same_logits(legacy, logits, arch):
    from transformers import AutoModelForCausalLM

    slug = SLUGS[arch]
    hf = AutoModelForCausalLM.from_pretrained(legacy / "export" / slug, trust_remote_code=True).eval()
    with torch.no_grad():
        got = hf(input_ids=logits["input"]).logits
    torch.testing.assert_close(got, logits[f"{slug}.export_logits"], rtol=0, atol=1e-6)
    torch.testing.assert_close(got, logits[f"{slug}.logits"], rtol=0, atol=1e-4)  # the export is the model
