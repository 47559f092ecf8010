"""Every figure the README's "Results so far" and RESULTS.md's headlines state is recomputed from the committed
report it comes from (benchmarks/claims.yaml): prose and data cannot drift apart.

A claim is a sentence as it appears in a file, and the figures in it: each figure is the text shown, where its value
comes from (a path into a report.json, or a Holm-adjusted p-value over a report's paired tests), and a tolerance.
Editing a number in the prose, or a report, without the other fails here."""

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from angpt.study.stats import holm

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = yaml.safe_load((ROOT / "benchmarks" / "claims.yaml").read_text())


def resolve(data, path: str):
    """`arms.angpt.budgets.-1.difference.mean_diff` into a report: dict keys, list indices (negative too)."""
    node = data
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def holm_adjusted(report: dict, label: str, budget_index: int) -> float:
    """The Holm-adjusted p of `label` against the baseline at a budget, over every paired test in the report."""
    tests = [
        (lab, i, r["difference"]["paired"]["p"])
        for lab, e in report["arms"].items()
        for i, r in enumerate(e["budgets"])
        if (r.get("difference") or {}).get("paired")
    ]
    adjusted = dict(zip([t[:2] for t in tests], holm([p for *_, p in tests])))
    n = len(report["arms"][label]["budgets"])
    return adjusted[(label, budget_index % n)]


def load_report(path: Path):
    """A JSON report, or a JSON-lines file as the list of its records (benchmarks/paper-batch-proxy-cpu)."""
    text = path.read_text()
    return (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else json.loads(text)
    )


def value_of(figure: dict) -> float:
    report = load_report(ROOT / figure["report"])
    if "holm" in figure:
        v = holm_adjusted(report, figure["holm"]["arm"], figure["holm"]["budget"])
    elif "points_below" in figure:
        v = points_below(report, **figure["points_below"])
    elif "paired_p" in figure:
        v = paired_p(report, **figure["paired_p"])
    elif "lr_checks_flagged" in figure:
        v = sum((e.get("lr_check") or {}).get("status") == "flagged" for e in report["arms"].values())
    elif "ladder" in figure:
        v = ladder_loss(report, **figure["ladder"])
    else:
        v = float(resolve(report, figure["path"]))
    return figure.get("scale", 1.0) * v


NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def number(shown: str) -> float:
    """The figure in a shown text: '0.21' -> 0.21, '2.1%' -> 2.1, '5 steps' -> 5, '-0.003' -> -0.003."""
    return float(NUMBER.search(shown).group().replace(",", ""))


def half_unit(shown: str) -> float:
    """Half a unit of the last digit the figure shows: 0.005 for '0.21', 0.5 for '15'."""
    digits = NUMBER.search(shown).group()
    return 0.5 * 10 ** -(len(digits.split(".")[1]) if "." in digits else 0) + 1e-12


def paired_p(report: dict, arm: str, baseline: str, budget: int) -> float:
    """The paired t-test's p of two arms' per-seed final losses at a budget index, by scipy (an independent
    reference, and for reports written before they stored paired tests)."""
    from scipy import stats

    from angpt.study.comparison.analyse import reported

    a, b = (reported(report["arms"][label]["budgets"][budget]) for label in (arm, baseline))
    seeds = sorted(set(a) & set(b))
    return float(stats.ttest_rel([a[k] for k in seeds], [b[k] for k in seeds]).pvalue)


def ladder_loss(report: dict, arm: str, size: str, run: int) -> float:
    """A scaling ladder's loss of `arm` at `size`, its `run`-th budget (by tokens)."""
    runs = sorted((r for r in report["ladder"]["runs"] if r["arm"] == arm and r["size"] == size), key=lambda r: r["D"])
    return runs[run]["loss"]


def points_below(report: dict, arm: str, baseline: str) -> int:
    """A scaling ladder's points (size, tokens) where `arm`'s loss is below `baseline`'s."""
    by: dict = {}
    for r in report["ladder"]["runs"]:
        by.setdefault((r["size"], r["D"]), {})[r["arm"]] = r["loss"]
    return sum(v[arm] < v[baseline] for v in by.values() if arm in v and baseline in v)


def check(claim: dict, root: Path = ROOT) -> None:
    """AssertionError unless the claim's sentence is in each of its files and every figure in it matches its source
    within its tolerance (default: half a unit of the last digit shown)."""
    for file in claim["files"]:
        text = " ".join((root / file).read_text().split())  # line breaks in the prose are not part of a claim
        assert claim["text"] in text, f"{file} no longer says: {claim['text']!r}"
    for figure in claim["figures"]:
        assert figure["shown"] in claim["text"], figure["shown"]
        got = value_of(figure)
        if figure["shown"].startswith("<"):
            assert got < number(figure["shown"]), (claim["id"], figure, got)
            continue
        tol = figure.get("tolerance", half_unit(figure["shown"]))
        assert math.isclose(got, number(figure["shown"]), abs_tol=tol), (claim["id"], figure["shown"], got)


@pytest.mark.parametrize("claim", CLAIMS, ids=[c["id"] for c in CLAIMS])
def test_claim_matches_its_report(claim):
    check(claim)


def test_a_changed_figure_fails(tmp_path):
    """The check itself: the first figure of every claim changed by one in its last digit, in the prose and in the
    claim alike, no longer matches its report."""
    for claim in CLAIMS:
        figure = claim["figures"][0]
        shown = figure["shown"]
        digits = [i for i, ch in enumerate(shown) if ch.isdigit()]
        j = digits[-1]
        wrong = shown[:j] + str((int(shown[j]) + 5) % 10) + shown[j + 1 :]
        text = claim["text"].replace(shown, wrong, 1)
        (tmp_path / "prose.md").write_text(text)
        broken = {**claim, "files": ["prose.md"], "text": text, "figures": [{**figure, "shown": wrong}]}
        with pytest.raises(AssertionError):
            check(broken, tmp_path)


def test_every_report_a_claim_reads_is_committed():
    """A claim read from a file git ignores (a run's metrics.jsonl under benchmarks/*/runs/) passes here and fails on
    every clean checkout: each report must be a file git tracks (in a tree without git, its existence is the check,
    since an ignored file is not there)."""
    import subprocess

    reports = sorted({f["report"] for c in CLAIMS for f in c["figures"]})
    assert all((ROOT / r).is_file() for r in reports)
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"], capture_output=True, text=True)
    if probe.returncode == 0:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "--", *reports],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert sorted(listed) == reports, sorted(set(reports) - set(listed))
