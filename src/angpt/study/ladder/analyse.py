"""The scaling report's numbers: per-arm fits with bootstrap intervals, compute-optimal sizes, compute multipliers
over the baseline, exponent differences, the LR-transfer check, and warnings."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from angpt.study.comparison.horizon import MIN_STEPS, MIN_TOKENS_PER_PARAM
from angpt.study.ladder.collect import LadderData, Point
from angpt.study.ladder.fit import (
    BOUNDS,
    Bootstrap,
    Fit,
    Law,
    bootstrap_fit,
    compute_multiplier,
    fit_law,
    paired_interval,
    profile_interval,
)
from angpt.study.ladder.plan import MIN_BUDGETS, MIN_SIZES, transfer_check
from angpt.units import format_lr, format_tokens

PARAMS = ("E", "A", "alpha", "B", "beta")
DERIVED = {"n_exponent": lambda law: law.n_exponent, "d_exponent": lambda law: law.d_exponent}
EXTRAPOLATE = (1.0, 10.0, 100.0)  # compute-optimal sizes at the ladder's largest compute and beyond
UNDETERMINED_SPREAD = 100.0  # a compute-multiplier interval wider than this factor says nothing
SPEC_SIZES = 5  # SPEC section 8 asks for at least five sizes


def fit_points(
    points: list[Point], *, bootstrap: int = 200, seed: int = 0
) -> tuple[dict[str, Any], Fit | None, Bootstrap | None]:
    """Fit one arm's finished runs. A fit needs >= 3 sizes with >= 3 budgets each; fewer is said, not fitted."""
    finite = [p for p in points if math.isfinite(p.loss)]
    budgets = defaultdict(set)
    for p in finite:
        budgets[p.N].add(p.D)
    usable = [n for n, ds in budgets.items() if len(ds) >= MIN_BUDGETS]
    entry: dict[str, Any] = {"n_runs": len(finite), "n_diverged": len(points) - len(finite), "n_sizes": len(usable)}
    if len(usable) < MIN_SIZES:
        entry.update(
            ok=False,
            message=f"not fitted: {len(usable)} size(s) with {MIN_BUDGETS}+ finished budgets; a fit needs {MIN_SIZES}",
        )
        return entry, None, None
    fit, boot = _fit_into(entry, *_arrays(finite), bootstrap=bootstrap, seed=seed, with_e=True)
    if e_undetermined(fit):
        # The data want E below anything the search allows: fit the nested law without it (E fixed at 0), whose
        # exponents the report shows apart, labelled as such (the full law stays "not determined").
        add_without_e(entry, points, bootstrap=bootstrap, seed=seed)
    return entry, fit, boot


def add_without_e(entry: dict[str, Any], points: list[Point], *, bootstrap: int = 200, seed: int = 0) -> None:
    """Fit the law without E (E fixed at 0) to an arm's fitted runs into entry["without_e"]."""
    reduced: dict[str, Any] = {}
    entry["without_e"] = reduced
    _fit_into(reduced, *_arrays([p for p in points if math.isfinite(p.loss)]), bootstrap=bootstrap, seed=seed,
              with_e=False)  # fmt: skip


def _arrays(points: list[Point]) -> tuple[list[float], list[float], list[float]]:
    return tuple([getattr(p, k) for p in points] for k in ("N", "D", "loss"))  # type: ignore[return-value]


def e_undetermined(fit: Fit | None) -> bool:
    """True when a fit failed only because E sits on the bottom of its search."""
    return (
        fit is not None
        and not fit.ok
        and fit.at_bound == ["e"]
        and fit.law is not None
        and fit.law.E <= math.exp(BOUNDS["e"][0]) * (1 + 1e-6)
    )


def _fit_into(
    entry: dict[str, Any], N, D, L, *, bootstrap: int, seed: int, with_e: bool
) -> tuple[Fit, Bootstrap | None]:
    """Fit (and bootstrap) one arm's runs, writing ok, message, fit, point, intervals and bootstrap into `entry`.
    The fit and its bootstrap are kept in entry under the private key "_law" for analyse_ladder's comparisons."""
    fit = fit_law(N, D, L, with_e=with_e)
    entry.update(ok=fit.ok, message=fit.message, fit=fit.to_dict())
    if not fit.ok or fit.law is None:
        return fit, None
    law = fit.law
    entry["point"] = {**law.to_dict(), **{k: f(law) for k, f in DERIVED.items()}, "G": law.G}
    boot = None
    if bootstrap > 0:
        boot = bootstrap_fit(N, D, L, n=bootstrap, seed=seed, with_e=with_e)  # from grid starts, as the fit
        getters = {**{k: (lambda law, k=k: getattr(law, k)) for k in PARAMS}, **DERIVED}
        entry["intervals"] = {k: boot.interval(f) for k, f in getters.items()}
        entry["bootstrap"] = {"n": boot.n, "failed": boot.failed, "seed": boot.seed, "level": 0.95}
        # The exponents' profile intervals beside the bootstrap's: a percentile bootstrap over a few runs is itself
        # uncertain, and the profile says plainly when the data leave an exponent unbounded (an open end).
        entry["profile"] = {k: profile_interval(N, D, L, k, with_e=with_e) for k in ("alpha", "beta")}
    entry["_law"] = (law, boot)
    return fit, boot


def analyse_ladder(data: LadderData, *, bootstrap: int = 200, seed: int = 0) -> dict[str, Any]:
    """Everything the scaling report shows, as plain data (report.json)."""
    ladder = data.ladder
    by_arm: dict[str, list[Point]] = defaultdict(list)
    for p in data.points:
        by_arm[p.arm].append(p)
    arms: dict[str, Any] = {}
    laws: dict[str, Law] = {}
    boots: dict[str, Bootstrap | None] = {}
    for a in ladder.arms:
        entry, fit, boot = fit_points(by_arm.get(a.label, []), bootstrap=bootstrap, seed=seed)
        arms[a.label] = entry
        if fit is not None and fit.ok and fit.law is not None:
            laws[a.label], boots[a.label] = fit.law, boot
    if any("without_e" in e for e in arms.values()):  # like for like: every fitted arm gets the law without E
        for a in ladder.arms:
            e = arms[a.label]
            if "fit" in e and "without_e" not in e:
                add_without_e(e, by_arm[a.label], bootstrap=bootstrap, seed=seed)

    finite = [p for p in data.points if math.isfinite(p.loss)]
    c_max = max((p.compute for p in finite), default=None)
    base = laws.get(ladder.baseline)
    target = base.optimal_loss(c_max) if base is not None and c_max else None
    for label, law in laws.items():
        entry = arms[label]
        if c_max:
            entry["optimal"] = [
                {
                    "C": c_max * m,
                    "N": law.optimal(c_max * m)[0],
                    "D": law.optimal(c_max * m)[1],
                    "loss": law.optimal_loss(c_max * m),
                    "extrapolated": m > 1,
                }
                for m in EXTRAPOLATE
            ]
        if base is None or label == ladder.baseline or target is None:
            continue
        entry["vs_baseline"] = _versus(base, law, boots.get(ladder.baseline), boots.get(label), target)
    _compare_without_e(ladder.baseline, arms, c_max)
    diverged = diverged_runs(data.points)
    others = [label for label in arms if label != ladder.baseline]
    verdicts = [(label, _verdict(ladder.baseline, label, arms[label])) for label in others]
    verdicts += [
        (label, f"(E not determined; with E fixed at 0) {_verdict(ladder.baseline, label, arms[label]['without_e'])}")
        for label in others
        if arms[label].get("without_e", {}).get("vs_baseline")
    ]
    for e in arms.values():  # the private fit objects do not go into report.json
        e.pop("_law", None)
        e.get("without_e", {}).pop("_law", None)

    return {
        "baseline": ladder.baseline,
        "arms": arms,
        "target_loss": target,
        "max_compute": c_max,
        "lr": _lr_table(data),
        "transfer": _transfer(data),
        "runs": [vars(p) for p in sorted(data.points, key=lambda p: (p.arm, p.N, p.D, p.seed))],
        "unfinished": data.unfinished,
        "diverged": diverged,
        "warnings": _warnings(data, arms),
        "verdicts": [_with_diverged(v, [ladder.baseline, label], diverged) for label, v in verdicts],
    }


def _compare_without_e(baseline: str, arms: dict[str, Any], c_max: float | None) -> None:
    """The arms' laws without E against the baseline's, where both were fitted that way (as _versus, at the
    baseline's reduced law's compute-optimal loss at the ladder's largest compute)."""
    base = arms.get(baseline, {}).get("without_e", {}).get("_law")
    if base is None or not c_max:
        return
    target = base[0].optimal_loss(c_max)
    arms[baseline]["without_e"]["target_loss"] = target
    for label, e in arms.items():
        mine = e.get("without_e", {}).get("_law")
        if label != baseline and mine is not None:
            e["without_e"]["vs_baseline"] = _versus(base[0], mine[0], base[1], mine[1], target)


def _versus(base: Law, law: Law, bb: Bootstrap | None, ba: Bootstrap | None, target: float) -> dict[str, Any]:
    diffs = {
        "alpha": lambda b, a: a.alpha - b.alpha,
        "beta": lambda b, a: a.beta - b.beta,
        "n_exponent": lambda b, a: a.n_exponent - b.n_exponent,
    }
    out: dict[str, Any] = {
        "multiplier": compute_multiplier(base, law, target),
        "difference": {k: f(base, law) for k, f in diffs.items()},
    }
    if bb is not None and ba is not None:
        out["multiplier_interval"] = paired_interval(bb, ba, lambda b, a: compute_multiplier(b, a, target))
        out["difference_interval"] = {k: paired_interval(bb, ba, f) for k, f in diffs.items()}
    return out


def _lr_table(data: LadderData) -> list[dict[str, Any]]:
    rows = []
    for i, size in enumerate(data.ladder.sizes):
        sweeps = data.sweeps.get(size.name)
        for a in data.ladder.arms:
            sw = sweeps.get(a.label) if sweeps else None
            rows.append(
                {
                    "size": size.name,
                    "arm": a.label,
                    "best_lr": sw.best_lr if sw else None,
                    "grid": sw.grid if sw else None,
                    "at_edge": sw.at_edge if sw else None,
                    "transferred": bool(data.ladder.lr_transfer and i > 0),
                }
            )
    return rows


def _transfer(data: LadderData) -> dict[str, Any] | None:
    """The LR-transfer check on the two smallest sizes (per-size tuning: their own sweeps; --lr-transfer: the
    smallest size's sweep against the check sweep at the second size)."""
    sizes = data.ladder.sizes
    if len(sizes) < 2:
        return None
    small = data.sweeps.get(sizes[0].name)
    large = data.check if data.ladder.lr_transfer else data.sweeps.get(sizes[1].name)
    if not small or not large:
        return {
            "sizes": [sizes[0].name, sizes[1].name],
            "arms": {},
            "note": "the sweeps of both sizes are not finished",
        }
    return {
        "sizes": [sizes[0].name, sizes[1].name],
        "arms": {a.label: transfer_check(small[a.label], large[a.label]) for a in data.ladder.arms},
    }


def _warnings(data: LadderData, arms: dict[str, Any]) -> list[str]:
    ladder = data.ladder
    out = []
    if len(ladder.sizes) < SPEC_SIZES:
        out.append(f"{len(ladder.sizes)} sizes: SPEC section 8 asks for at least {SPEC_SIZES} before a law counts")
    finite = [p for p in data.points if math.isfinite(p.loss)]
    if finite:
        longest = max(finite, key=lambda p: p.D)
        steps = ladder.steps(longest.D)
        ratio = max(p.D / p.N for p in finite)
        if steps < MIN_STEPS or ratio < MIN_TOKENS_PER_PARAM:
            out.append(
                f"smoke test, not evidence: the longest run has {steps} steps and the most tokens per parameter is "
                f"{ratio:.1f} (evidence needs >= {MIN_STEPS} steps and ~{MIN_TOKENS_PER_PARAM:g} tokens per "
                "parameter; docs/protocol.md#horizon)"
            )
    for row in _lr_table(data):
        if row["at_edge"] and not row["transferred"]:
            out.append(
                f"{row['arm']} at {row['size']}: best LR {format_lr(row['best_lr'] or 0)} sits at an edge of its "
                "grid (sweep unfinished: raise --max-extensions)"
            )
    transfer = _transfer(data)
    if ladder.lr_transfer and transfer:
        for label, chk in transfer["arms"].items():
            if chk.get("holds") is False:
                out.append(
                    f"{label}: the transferred LR is {chk['steps_apart']:.1f} grid steps from the best LR at "
                    f"{transfer['sizes'][1]}: the transfer claim fails; tune per size (drop --lr-transfer)"
                )
    for size, why in data.unfinished.items():
        out.append(f"size {size} is not finished ({why}); re-run the scaling command to finish it")
    for size, sweeps in data.sweeps.items():
        for label, sw in (sweeps or {}).items():
            if sw.best is None:  # every run diverged: the arm has no LR, hence no runs and no points at this size
                lrs = ", ".join(format_lr(lr) for lr in sw.grid)
                hint = "the transferred LR is unstable at this size: tune per size" if ladder.lr_transfer else ""
                out.append(
                    f"{label} at {size}: every run at LR {lrs} diverged, so it has no points at this size"
                    + (f" ({hint})" if hint else "")
                )
    for label, e in arms.items():
        for which, sub in (("", e), (" without E", e.get("without_e") or {})):
            b = sub.get("bootstrap")
            if b and b["failed"] > 0.1 * b["n"]:
                out.append(
                    f"{label}{which}: {b['failed']} of {b['n']} bootstrap refits did not converge (left out of the "
                    "intervals)"
                )
    for label, where in diverged_runs(data.points).items():
        out.append(f"{label}: {len(where)} run(s) diverged and are left out of the fit: {', '.join(where)}")
    return out


def diverged_runs(points: list[Point]) -> dict[str, list[str]]:
    """Each arm's diverged runs, 'L2_d16 1Ki seed 1' (size, tokens, seed): a fit cannot take them, so the report
    names them wherever it shows the fit, never only counts them."""
    out: dict[str, list[str]] = {}
    for p in sorted(points, key=lambda p: (p.arm, p.N, p.D, p.seed)):
        if not math.isfinite(p.loss):
            out.setdefault(p.arm, []).append(f"{p.size} {format_tokens(p.D)} seed {p.seed}")
    return out


def _with_diverged(verdict: str, labels: list[str], diverged: dict[str, list[str]]) -> str:
    """A verdict with the diverged runs of its arms that its fits leave out, if any."""
    left_out = [f"{len(diverged[label])} diverged run(s) of {label}" for label in labels if diverged.get(label)]
    return f"{verdict} (left out of the fits: {', '.join(left_out)})" if left_out else verdict


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _verdict(baseline: str, label: str, entry: dict[str, Any]) -> str:
    if not entry.get("ok"):
        return f"{label}: {entry.get('message')}"
    vs = entry.get("vs_baseline")
    if vs is None:
        return f"{label}: fitted, but the baseline {baseline} was not, so nothing is compared"
    diff = vs["difference"]
    iv = vs.get("difference_interval", {})
    parts = []
    for k, name in (("alpha", "alpha"), ("beta", "beta")):
        lo_hi = iv.get(k)
        same = lo_hi is not None and lo_hi[0] <= 0 <= lo_hi[1]
        span = f" [{_fmt(lo_hi[0])}, {_fmt(lo_hi[1])}]" if lo_hi else ""
        parts.append(f"{name} differs by {diff[k]:+.3g}{span}" + (" (consistent with equal)" if same else ""))
    m = vs["multiplier"]
    mi = vs.get("multiplier_interval")
    span = f" [{_fmt(mi[0])}, {_fmt(mi[1])}]" if mi else ""
    if mi and not (mi[0] > 0 and mi[1] / mi[0] < UNDETERMINED_SPREAD):
        return f"{label} vs {baseline}: {'; '.join(parts)}; the compute multiplier is not determined ({_fmt(m)}x{span})"
    return (
        f"{label} vs {baseline}: {'; '.join(parts)}; at {baseline}'s compute-optimal loss at the ladder's largest "
        f"compute, {label} needs {1 / m:.3g}x the compute (multiplier {m:.3g}x{span})"
        if math.isfinite(m) and m > 0
        else f"{label} vs {baseline}: {'; '.join(parts)}; the compute multiplier is undefined at this loss"
    )
