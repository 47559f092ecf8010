"""Every figure the README, RESULTS.md and the docs state about a result is recomputed from the committed report it
comes from (benchmarks/claims.yaml), and so is every verdict word: prose and data cannot drift apart.

A claim is a sentence as it appears in a file, the figures in it and its verdicts. Each figure is the text shown,
where its value comes from (a path into a report.json, or a Holm-adjusted p-value over a report's paired tests), and
a tolerance. Each verdict is the word the report supports by docs/protocol.md's rules (see `supported`), recomputed
here from the per-seed losses, and the part of the sentence that says it; a word the verdict does not allow
("level", "significant", "faster", "behind", "does not regress", ...) anywhere in the sentence fails. Editing a
number or a word in the prose, or a report, without the other fails here."""

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from angpt.stats import holm

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = yaml.safe_load((ROOT / "benchmarks" / "claims.yaml").read_text())


def resolve(data, path: str):
    """`arms.angpt.budgets.-1.difference.mean_diff` into a report: dict keys, list indices (negative too)."""
    node = data
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def holm_adjusted(report: dict, label: str, budget_index: int) -> float:
    """The Holm-adjusted p of `label` against the baseline at a budget, over every distinct paired test in the
    report: two arm names whose per-seed losses at a budget are the same runs are one test (issue 48)."""
    from angpt.study.comparison.analyse import reported

    family: dict = {}
    for lab, e in report["arms"].items():
        for i, r in enumerate(e["budgets"]):
            if (r.get("difference") or {}).get("paired"):
                family.setdefault(same_runs(r), []).append((lab, i, r["difference"]["paired"]["p"]))
    keys = list(family)
    adjusted = dict(zip(keys, holm([family[k][0][2] for k in keys])))
    n = len(report["arms"][label]["budgets"])
    row = report["arms"][label]["budgets"][budget_index % n]
    assert reported(row)
    return adjusted[same_runs(row)]


def same_runs(row: dict) -> tuple:
    """A budget's runs, told by what they measured: the budget and the per-seed losses."""
    from angpt.study.comparison.analyse import reported

    return row["budget"], tuple(sorted(reported(row).items()))


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
    elif "holm_p" in figure:  # recomputed from the per-seed losses, for pairs the report did not test
        v = adjusted(report, **figure["holm_p"])[3]
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
    """Half a unit of the last digit the figure shows: 0.005 for '0.21', 0.5 for '15', 0.00005 for '2.5e-4'."""
    digits = NUMBER.search(shown).group()
    mantissa, _, exponent = digits.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return 0.5 * 10 ** (int(exponent or 0) - decimals) + 1e-12


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


# Verdicts (docs/protocol.md#verdict-words). The word a difference earns, from the arm's and the baseline's
# per-seed final losses at one budget: a comparison below the horizon is a smoke test whatever the numbers; fewer
# than three seeds is a screen; a Holm-adjusted paired p < 0.05 is "established" (the arm lower) or "behind"
# (higher); an interval inside +-0.02 nats is "level"; anything else is "not distinguishable".
LEVEL, ALPHA = 0.02, 0.05
HORIZON_STEPS, HORIZON_TOKENS_PER_PARAM = 1000, 10  # docs/protocol.md#horizon
SMOKE = "smoke test"
SCREENS = {1: "one-seed screen", 2: "two-seed screen"}
VERDICTS = {"established", "behind", "level", "not distinguishable", SMOKE, *SCREENS.values()}

# A word in a claim's sentence -> the verdicts that allow it. "not significant" and "not level" are no claims.
WORDS = {
    r"(?<!not )\blevel\b": {"level"},
    r"does not regress|no regression|\bties?\b": {"level"},
    r"\bestablished\b": {"established"},
    r"(?<!not )(?:\bfaster\b|\bbeats?\b|speeds? up|\bahead\b)": {"established"},
    r"(?<!not )\bsignificant(ly)?\b|\bmatters?\b": {"established", "behind"},
    r"\bbehind\b": {"behind"},
    r"\bcould not\b|\bcannot train\b": {"established", "behind"},
    r"\bnot distinguishable\b": {"not distinguishable"},
}


def horizon_of(report, arm: str | None = None) -> tuple[int, float | None]:
    """The optimizer steps and tokens per parameter of a report's longest run, read from what it ran, not from its
    own "short" flag: a comparison's recorded horizon (since 2026-11-28 each arm's own, over its non-embedding
    parameters: `arm`'s and its baseline's, the fewer tokens per parameter), else its largest budget's steps (a report
    written before horizons were recorded: tokens per parameter unknown); a growth study's rows, each arm and seed
    summed over its stages (its tokens over its final non-embedding parameters)."""
    if isinstance(report, dict) and report.get("horizon", {}).get("arms"):
        hz = report["horizon"]
        pair = [hz["arms"][a] for a in dict.fromkeys([arm or hz["baseline"], hz["baseline"]])]
        return int(hz["steps"]), min(h["tokens"] / h["params_non_embedding"] for h in pair)
    if isinstance(report, dict) and report.get("horizon"):
        return int(report["horizon"]["steps"]), float(report["horizon"]["tokens_per_param"])
    if isinstance(report, dict) and "arms" in report:
        return max(int(b["steps"]) for e in report["arms"].values() for b in e["budgets"]), None
    if isinstance(report, dict) and "rows" in report:
        runs: dict = {}
        for r in report["rows"]:
            steps, tokens, params = runs.get((r["arm"], r["seed"]), (0, 0, 0))
            params = max(params, r["params_non_embedding"])
            runs[(r["arm"], r["seed"])] = (steps + r["steps"], tokens + r["tokens"], params)
        steps, tokens, params = max(runs.values())
        return steps, tokens / params
    raise AssertionError("a claim's verdict reads a report whose horizon this test cannot tell")


def below_horizon(report, arm: str | None = None) -> bool:
    """Shorter than 1,000 optimizer steps or ~10 tokens per parameter: a smoke test (docs/protocol.md#horizon)."""
    steps, per_param = horizon_of(report, arm)
    return steps < HORIZON_STEPS or (per_param is not None and per_param < HORIZON_TOKENS_PER_PARAM)


def supported(n: int, ci: tuple[float, float], mean_diff: float, p_adjusted: float) -> str:
    """The verdict a paired difference (arm - baseline, lower is better) supports."""
    if n < 3:
        return SCREENS[n]
    if p_adjusted < ALPHA:
        return "established" if mean_diff < 0 else "behind"
    if -LEVEL < ci[0] and ci[1] < LEVEL:
        return "level"
    return "not distinguishable"


def paired(a: dict, b: dict) -> tuple[int, tuple[float, float], float, float]:
    """n, 95% interval, mean and p of the paired difference a - b over the seeds both finished, by scipy."""
    from scipy import stats

    seeds = sorted(k for k in set(a) & set(b) if a[k] is not None and b[k] is not None)
    diffs = [a[k] - b[k] for k in seeds if math.isfinite(a[k]) and math.isfinite(b[k])]
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return n, (mean, mean), mean, float("nan")
    test = stats.ttest_rel(diffs, [0.0] * n)
    half = stats.t.ppf(0.975, n - 1) * stats.tstd(diffs) / math.sqrt(n)
    return n, (mean - half, mean + half), mean, float(test.pvalue)


def adjusted(report: dict, arm: str, budget: int, baseline: str | None = None) -> tuple[int, tuple, float, float]:
    """n, 95% interval, mean and Holm-adjusted p of `arm` against the report's baseline (or `baseline`) at a budget
    index, adjusted over every arm against the baseline at every budget of the report (the family the report
    corrects over), plus this test where it compares another pair."""
    from angpt.study.comparison.analyse import reported

    base, own = baseline or report["baseline"], report["baseline"]
    family, seen = {}, set()
    for label, entry in report["arms"].items():
        if label == own:
            continue
        for i, row in enumerate(entry["budgets"]):
            n, ci, mean, p = paired(reported(row), reported(report["arms"][own]["budgets"][i]))
            if n >= 2 and (same_runs(row) not in seen or (label, i) == (arm, budget % len(entry["budgets"]))):
                family[(label, own, i)] = (n, ci, mean, p)  # the same runs under two arm names: one test
                seen.add(same_runs(row))
    key = (arm, base, budget % len(report["arms"][arm]["budgets"]))
    if key not in family:  # another pair than the report's own tests (another baseline): one test more in the family
        family[key] = paired(*(reported(report["arms"][x]["budgets"][key[2]]) for x in (arm, base)))
        if family[key][0] < 2:
            return family[key]
    keys = list(family)
    n, ci, mean, _ = family[key]
    return n, ci, mean, dict(zip(keys, holm([family[k][3] for k in keys])))[key]


def report_verdict(report: dict, arm: str, budget: int, baseline: str | None = None) -> str:
    """The verdict of `arm` against the baseline at a budget index (`adjusted`)."""
    return supported(*adjusted(report, arm, budget, baseline))


def verdict_of(v: dict, claim: dict) -> str:
    """The verdict a claim's entry `v` is owed: from a comparison report's per-seed losses (`arm`, `budget`), from a
    single paired test the report stores (`difference`: its path), or, for runs that are no comparison (a GPU kit's
    first steps, one timing), a screen of the seeds it declares (`seeds`, at most two)."""
    if "seeds" in v:
        assert v["seeds"] in SCREENS, (claim["id"], "a claim over three or more seeds needs its test computed")
        return SCREENS[v["seeds"]]
    report = load_report(ROOT / v.get("report", claim["figures"][0]["report"]))
    if below_horizon(report, v.get("arm")):
        return SMOKE
    if "difference" in v:
        d = resolve(report, v["difference"])
        return supported(d["n"], tuple(d["ci95"]), d["mean_diff"], d.get("p_holm", d["p"]))
    return report_verdict(report, v["arm"], v["budget"], v.get("baseline"))


def words_allowed(text: str, allowed: set[str]) -> list[str]:
    """The verdict words in `text` that none of the `allowed` verdicts permits."""
    return [m.group() for pattern, ok in WORDS.items() if not ok & allowed for m in re.finditer(pattern, text, re.I)]


def sentences_around(text: str, part: str) -> str:
    """The whole sentences of `text` (one paragraph, list item or table row, whitespace joined) that `part` touches."""
    i = text.index(part)
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s+[A-Z*(`\[])", text)]
    start = max([e for e in ends if e <= i], default=0)
    stop = min([e for e in ends if e >= i + len(part)], default=len(text))
    return text[start:stop]


def blocks(path: Path) -> list[str]:
    """A markdown file's paragraphs, list items and table rows, each with its line breaks joined."""
    return blocks_of(path.read_text())


def blocks_of(text: str) -> list[str]:
    """A markdown text's paragraphs, list items and table rows, each with its line breaks joined."""
    out, cur = [], []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("- ", "|", "#")):
            out.append(" ".join(cur))
            cur = []
        if line.lstrip().startswith(("|", "#")):
            out.append(line.strip())
        elif line.strip():
            cur.append(line.strip())
    out.append(" ".join(cur))
    return [" ".join(b.split()) for b in out if b.strip()]


def section_of(path: Path, text: str) -> str:
    """The section of a markdown file (from its heading to the next) that holds `text`, whitespace joined: where a
    smoke test's label, said once for its table or paragraphs, covers the claim."""
    sections = re.split(r"(?m)^#+ ", path.read_text())
    return next((" ".join(sec.split()) for sec in sections if text in " ".join(sec.split())), "")


def check_words(claim: dict, root: Path = ROOT) -> None:
    """AssertionError unless each verdict is what its report supports, each is said where the claim says it, and no
    sentence of the claim uses a word its verdicts do not allow (a part's own words: its own verdict only)."""
    verdicts = claim.get("verdicts")
    assert verdicts, f"{claim['id']}: a claim carries its verdict (docs/protocol.md#verdict-words)"
    owed = []
    for v in verdicts:
        assert v["word"] in VERDICTS, (claim["id"], v["word"])
        got = verdict_of(v, claim)
        assert got == v["word"], f"{claim['id']}: {v['says']!r} is {got!r} by its report, not {v['word']!r}"
        assert v["says"] in claim["text"], (claim["id"], v["says"])
        bad = words_allowed(v["says"], {v["word"]})
        assert not bad, f"{claim['id']}: {bad} in {v['says']!r}, which is {v['word']!r}"
        owed.append(v["word"])
    for file in claim["files"]:
        paragraph = next((b for b in blocks(root / file) if claim["text"] in b), None)
        assert paragraph is not None, f"{file} no longer says: {claim['text']!r}"
        assert SMOKE not in owed or re.search(r"smoke[- ]test", section_of(root / file, claim["text"]), re.I), (
            f"{claim['id']}: a comparison below the horizon says it is a smoke test ({file})"
        )
        around = sentences_around(paragraph, claim["text"])
        for v in verdicts + [v for c in CLAIMS if c is not claim and c["text"] in paragraph for v in c["verdicts"]]:
            around = around.replace(v["says"], " ")  # another claim's part in the same sentence is its own business
        bad = words_allowed(around, set(owed))
        assert not bad, f"{claim['id']}: {bad} in the sentence of {claim['text']!r} ({file}), which is {owed}"


@pytest.mark.parametrize("claim", CLAIMS, ids=[c["id"] for c in CLAIMS])
def test_claim_matches_its_report(claim):
    check(claim)


@pytest.mark.parametrize("claim", CLAIMS, ids=[c["id"] for c in CLAIMS])
def test_claim_words_match_their_verdict(claim):
    check_words(claim)


OVERCLAIMS = yaml.safe_load((ROOT / "tests" / "fixtures" / "overclaims.yaml").read_text())


@pytest.mark.parametrize("old", OVERCLAIMS, ids=[f"{o['claim']}:{o.get('word') or o['figure']}" for o in OVERCLAIMS])
def test_the_sentences_the_audit_found_fail(old, tmp_path):
    """Each sentence the audit of 2026-11-26 found saying more than its numbers (issue 39), as it was written, fails
    the check of the claim that now says it: its verdict word (`word`) or a figure it showed (`figure`, where the
    claim now shows `replaces`). The claim as written today passes both checks."""
    claim = next(c for c in CLAIMS if c["id"] == old["claim"])
    check(claim)
    check_words(claim)
    (tmp_path / "prose.md").write_text(old["was"])
    wrong = {**claim, "files": ["prose.md"], "text": old["was"]}
    if "word" in old:
        wrong["verdicts"] = [{**v, "says": old["was"]} for v in claim["verdicts"] if v["says"] == old["says"]]
        assert wrong["verdicts"], old
        with pytest.raises(AssertionError, match=re.escape(repr(old["word"]))):
            check_words(wrong, tmp_path)
    else:
        assert old["figure"] in old["was"]
        figures = [{**f, "shown": old["figure"]} for f in claim["figures"] if f["shown"] == old["replaces"]]
        assert figures, old
        with pytest.raises(AssertionError, match=re.escape(old["figure"])):
            check({**wrong, "figures": figures}, tmp_path)


def test_a_word_beside_the_claim_in_its_sentence_fails(tmp_path):
    """The whole sentence is checked, not only the claim's text: "level" added after a not-distinguishable claim, in
    the same sentence, fails; in the next sentence it is another claim's business."""
    claim = next(c for c in CLAIMS if c["id"] == "oc-controls")
    check_words(claim)
    same, next_one = claim["text"][:-1] + ", and both are level.", claim["text"] + " Both are level."
    for prose, fails in ((same, True), (next_one, False)):
        (tmp_path / "prose.md").write_text(prose)
        moved = {**claim, "files": ["prose.md"]}
        if fails:
            moved["text"] = claim["text"][:-1]
            with pytest.raises(AssertionError, match="'level'"):
                check_words(moved, tmp_path)
        else:
            check_words(moved, tmp_path)


def test_verdict_rules():
    """The rules themselves, on made-up differences: the seed count first, then Holm, then the +-0.02 interval."""
    assert supported(2, (-0.01, 0.01), 0.0, 0.9) == "two-seed screen"  # a tight interval is no level on 2 seeds
    assert supported(3, (-0.019, 0.019), 0.0, 0.9) == "level"
    assert supported(3, (-0.030, 0.021), -0.0045, 0.53) == "not distinguishable"  # README's old "level"
    assert supported(5, (0.034, 0.085), 0.06, 0.046) == "behind"
    assert supported(5, (-0.3, -0.1), -0.2, 0.01) == "established"
    assert supported(3, (-0.04, -0.01), -0.025, 0.30) == "not distinguishable"  # p 0.02 unadjusted, 0.30 after Holm
    assert words_allowed("both significant, and level at 1,024", {"not distinguishable"}) == ["level", "significant"]
    assert words_allowed("not significant after Holm", {"not distinguishable"}) == []


def test_a_changed_figure_fails(tmp_path):
    """The check itself: the first figure of every claim changed by one in its last digit, in the prose and in the
    claim alike, no longer matches its report."""
    for claim in (c for c in CLAIMS if c["figures"]):
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


# Every sentence of the pages that states a verdict on a comparison of losses is a claim (and so checked above) or
# does without the word (issue 48). A verdict word is one of these, not negated; a comparison of losses is a sentence
# that speaks of losses, nats, perplexity, a signed difference, a percentage or a p-value. Words in quotes, in code,
# and in the protocol's own definitions of the words are mentions, not uses.
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")), "benchmarks/RESULTS.md"]
VERDICT_USE = re.compile(
    r"(?<!not )(?<!no )\b(better|worse|ahead|behind|wins?|won|helps?|helped|level|match(?:es|ed)?|faster|slower"
    r"|significant(?:ly)?|established|reproduced|outperforms?)\b",
    re.I,
)
LOSS_TALK = re.compile(r"\bloss(?:es)?\b|\bnats?\b|perplexity|\bp\s*[=<]", re.I)
DIFFERENCE = re.compile(r"(?<![\d.])[-+−]\d*\.\d+|\d%")  # a signed difference or a percentage: of losses unless
TIMING = re.compile(r"\bms\b|\btimes?\b|TFLOP|MFU|throughput|tokens/s|\bGEMMs?\b", re.I)  # it speaks of time
MENTIONS = re.compile(r'"[^"]*"|`[^`]*`|\*[^*\s][^*]*\*(?!\*)')
DEFINITIONS = {"docs/protocol.md": "Verdict words"}  # the section that defines the words


def sentences(block: str) -> list[tuple[int, int]]:
    """The spans of a block's sentences, split as `sentences_around` splits them."""
    ends = [0, *(m.end() for m in re.finditer(r"[.!?](?=\s+[A-Z*(`\[])", block)), len(block)]
    return [(a, b) for a, b in zip(ends, ends[1:]) if block[a:b].strip()]


def page_blocks(root: Path, name: str) -> list[str]:
    """A page's blocks (`blocks`, whitespace joined) outside fenced code and outside the section that defines the
    verdict words."""
    lines, keep, fenced, skipping = (root / name).read_text().splitlines(), [], False, False
    for line in lines:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if line.startswith("#"):
            skipping = DEFINITIONS.get(name, "\0") in line
        if not fenced and not skipping:
            keep.append(line)
    return blocks_of("\n".join(keep))


def unclaimed_verdicts(root: Path, name: str, claims: list[dict]) -> list[tuple[str, str]]:
    """(word, sentence) for each sentence of a page that uses a verdict word on a comparison of losses and that no
    claim of `claims` in that page covers."""
    texts = [c["text"] for c in claims if name in c["files"]]
    out = []
    for block in page_blocks(root, name):
        covered = [(m.start(), m.start() + len(t)) for t in texts for m in re.finditer(re.escape(t), block)]
        for a, b in sentences(block):
            if any(x < b and a < y for x, y in covered):
                continue
            sentence = block[a:b].strip()
            bare = MENTIONS.sub(" ", sentence)
            word = VERDICT_USE.search(bare)
            if word and (LOSS_TALK.search(bare) or (DIFFERENCE.search(bare) and not TIMING.search(bare))):
                out.append((word.group(), sentence))
    return out


def test_the_scan_reads_every_page_that_states_results():
    """The verdict scan's pages are README.md, every page of docs/ and RESULTS.md, as git lists them (issue 55:
    RESULTS.md left out of the scan passed every test)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "README.md", "docs/*.md",
         "benchmarks/RESULTS.md"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert {"README.md", "benchmarks/RESULTS.md"} <= set(listed) and any(p.startswith("docs/") for p in listed)
    assert sorted(PAGES) == sorted(listed)


@pytest.mark.parametrize("page", PAGES)
def test_every_verdict_on_losses_is_a_claim(page):
    """No sentence of README, docs/ or RESULTS.md states a verdict on losses outside benchmarks/claims.yaml."""
    found = unclaimed_verdicts(ROOT, page, CLAIMS)
    assert not found, "\n".join(f"{page}: {w!r} in: {s}" for w, s in found)


UNCLAIMED = yaml.safe_load((ROOT / "tests" / "fixtures" / "unclaimed_verdicts.yaml").read_text())


@pytest.mark.parametrize("old", UNCLAIMED, ids=[f"{o['page']}:{o['word']}:{i}" for i, o in enumerate(UNCLAIMED)])
def test_the_verdicts_the_page_scan_found_fail(old, tmp_path):
    """Each sentence that stated a verdict on losses outside claims.yaml (issue 48), as it was written, is found by
    the scan on a page of its name, and its page no longer says it."""
    page = tmp_path / old["page"]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(old["was"] + "\n")
    assert (old["word"], old["was"]) in unclaimed_verdicts(tmp_path, old["page"], CLAIMS)
    assert old["was"] not in " ".join((ROOT / old["page"]).read_text().split())


def test_the_scan_reads_uses_not_mentions(tmp_path):
    """A word in quotes or code, in fenced code, in the protocol's definitions, negated, or in a sentence about time
    is no verdict; the same word stating one on losses is. A claim covers its sentence, not the next one."""
    (tmp_path / "docs").mkdir()
    page = "docs/protocol.md"
    mentions = (
        'A verdict is "level" only when the interval lies inside +-0.02 nats.\n\n'
        "```\nanGPT is better, loss 0.3 lower\n```\n\n"
        "## Verdict words\n\nanGPT is significantly better in loss, p = 0.01.\n\n## Next\n\n"
        "nGPT is not better: loss +0.01.\n\nThe bf16 step is 1.6x slower, 43 vs 24 ms (+0.5%).\n"
    )
    (tmp_path / page).write_text(mentions)
    assert unclaimed_verdicts(tmp_path, page, []) == []
    (tmp_path / page).write_text(mentions + "\nanGPT is better: its loss is 0.3 nats lower.\n")
    assert [w for w, _ in unclaimed_verdicts(tmp_path, page, [])] == ["better"]
    claim = {"files": [page], "text": "anGPT is better: its loss is 0.3 nats lower."}
    assert unclaimed_verdicts(tmp_path, page, [claim]) == []
    (tmp_path / page).write_text(mentions + "\nanGPT is better: its loss is 0.3 nats lower. GPT+ ends level, -0.001.\n")
    assert [w for w, _ in unclaimed_verdicts(tmp_path, page, [claim])] == ["level"]


def test_below_the_horizon_a_claim_is_a_smoke_test_and_says_so(tmp_path):
    """The horizon of each kind of report a claim reads, and the label: the README's LAUREL row with its old word
    fails, and so does its row without "smoke test" anywhere in its section."""
    assert horizon_of({"horizon": {"steps": 1024, "tokens_per_param": 0.48}}) == (1024, 0.48)
    assert below_horizon({"horizon": {"steps": 1024, "tokens_per_param": 0.48}})
    assert not below_horizon({"horizon": {"steps": 1024, "tokens_per_param": 14.6}})
    assert below_horizon({"arms": {"a": {"budgets": [{"steps": 32}, {"steps": 128}]}}})
    rows = [
        {"arm": "grown", "seed": 0, "steps": 500, "tokens": 512000, "params_non_embedding": p}
        for p in (786432, 1048576, 1310720, 1572864)
    ]
    assert horizon_of({"rows": rows}) == (2000, 2048000 / 1572864) and below_horizon({"rows": rows})
    claim = next(c for c in CLAIMS if c["id"] == "readme-table-laurel")
    check_words(claim)
    was = claim["text"].replace("| smoke test |", "| established |")
    (tmp_path / "prose.md").write_text("## Rows\n\n" + was + "\n")
    old = {**claim, "files": ["prose.md"], "text": was}
    old["verdicts"] = [{**v, "says": "| established |"} for v in claim["verdicts"]]
    with pytest.raises(AssertionError, match="'established'"):
        check_words(old, tmp_path)
    (tmp_path / "prose.md").write_text("## Rows\n\n" + claim["text"].replace("| smoke test |", "| - |") + "\n")
    unlabelled = {**claim, "files": ["prose.md"], "text": claim["text"].replace("| smoke test |", "| - |")}
    unlabelled["verdicts"] = [{**v, "says": "| - |"} for v in claim["verdicts"]]
    with pytest.raises(AssertionError, match="says it is a smoke test"):
        check_words(unlabelled, tmp_path)
