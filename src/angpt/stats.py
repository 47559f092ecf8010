"""The numbers behind `angpt compare`: paired and Welch t-tests with 95% intervals, loss spikes, and the
token-budget speedup of docs/protocol.md.

Pure Python (``math`` only): scipy is optional for this package, and the few functions needed are short.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# ------------------------------------------------------------------------------------------ descriptive


def mean(xs: Sequence[float]) -> float | None:
    """Arithmetic mean; None for an empty sequence."""
    return sum(xs) / len(xs) if xs else None


def std(xs: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1 in the denominator); None with fewer than two values."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def median(xs: Sequence[float]) -> float | None:
    """Median (mean of the middle two for an even count); None for an empty sequence."""
    if not xs:
        return None
    s = sorted(xs)
    k = len(s) // 2
    return s[k] if len(s) % 2 else 0.5 * (s[k - 1] + s[k])


# ------------------------------------------------------------------------------------------------ t tests


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    # The number of terms needed grows like sqrt(max(a, b)); 10000 covers any df a t-test will meet.
    for m in range(1, 10001):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a, b > 0 (got a={a}, b={b})")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1 (got {x})")
    if x == 0.0 or x == 1.0:
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    # The continued fraction converges fast only on this side of the mean; use the symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf_two_sided(t: float, df: float) -> float:
    """Two-sided p-value P(|T| >= |t|) of Student's t distribution with `df` (possibly fractional) degrees."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive (got {df})")
    if math.isinf(t):
        return 0.0
    return min(1.0, betainc(0.5 * df, 0.5, df / (df + t * t)))


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with `df` degrees of freedom (the inverse of its CDF), for 0 < q < 1.

    Found by bisection on :func:`t_sf_two_sided` (monotone in |t|) to ~1e-12 relative: scipy is not needed.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_quantile needs 0 < q < 1 (got {q})")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be positive (got {df})")
    if q == 0.5:
        return 0.0
    target = 2.0 * min(q, 1.0 - q)  # the two-sided tail mass beyond |t|
    lo, hi = 0.0, 1.0
    while t_sf_two_sided(hi, df) > target:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf_two_sided(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    t = 0.5 * (lo + hi)
    return t if q > 0.5 else -t


@dataclass
class TTest:
    """A two-sided t-test of a mean difference, with its 95% confidence interval.

    kind "paired": the mean of per-pair differences a_i - b_i (df = n - 1); "welch": mean(a) - mean(b) of two
    independent samples (Welch–Satterthwaite df). `n` is the number of pairs (paired) or min(len(a), len(b)).
    """

    kind: str
    mean_diff: float
    se: float
    t: float
    df: float
    p: float
    ci_low: float
    ci_high: float
    n: int

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "mean_diff": self.mean_diff,
            "se": self.se,
            "t": self.t,
            "df": self.df,
            "p": self.p,
            "ci95": [self.ci_low, self.ci_high],
            "n": self.n,
        }


WelchResult = TTest  # the name this result had when Welch's was the only test


def _ttest(kind: str, diff: float, se: float, df: float, n: int) -> TTest:
    half = t_quantile(0.975, df) * se
    t = diff / se
    return TTest(kind, diff, se, t, df, t_sf_two_sided(t, df), diff - half, diff + half, n)


def paired_ttest(a: Sequence[float], b: Sequence[float]) -> TTest | None:
    """The paired t-test (two-sided) of a_i - b_i over pairs i, with a 95% interval; None when it is undefined.

    docs/protocol.md#paired-statistics: every arm shares the seeds (init and data order), so seed i's difference
    removes that seed's common noise. Undefined: fewer than two pairs, a non-finite value, or differences that do
    not vary (no standard error).
    """
    if len(a) != len(b):
        raise ValueError(f"paired_ttest needs equally long samples (got {len(a)} and {len(b)})")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    if len(d) < 2 or not all(math.isfinite(x) for x in d):
        return None
    se = std(d) / math.sqrt(len(d))  # type: ignore[operator]
    if se == 0.0:
        return None
    return _ttest("paired", sum(d) / len(d), se, len(d) - 1, len(d))


def welch_ttest(a: Sequence[float], b: Sequence[float]) -> TTest | None:
    """Welch's t-test (two-sided) of two independent samples, with a 95% interval; None when it is undefined.

    Undefined means fewer than two values in a sample, or zero variance in both (then no t exists).
    """
    a, b = [float(x) for x in a], [float(x) for x in b]
    if len(a) < 2 or len(b) < 2 or not all(math.isfinite(x) for x in a + b):
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va, vb = std(a) ** 2, std(b) ** 2  # type: ignore[operator]
    sa, sb = va / len(a), vb / len(b)
    se2 = sa + sb
    if se2 == 0.0:
        return None
    # Welch–Satterthwaite: the df of a t variable whose variance is the sum of two scaled chi-squares.
    df = se2 * se2 / (sa * sa / (len(a) - 1) + sb * sb / (len(b) - 1))
    return _ttest("welch", ma - mb, math.sqrt(se2), df, min(len(a), len(b)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): control of the family-wise error rate at
    any level, without assuming the tests independent. Sorted ascending, the i-th (0-based) of m becomes
    max over j <= i of min(1, (m - j) p_(j)), returned in the input order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def mean_ci95(xs: Sequence[float]) -> tuple[float, float] | None:
    """The t-based 95% interval of the mean of `xs` (None for fewer than two values or no spread)."""
    if len(xs) < 2:
        return None
    m, s = sum(xs) / len(xs), std(xs)
    if not s:
        return None
    half = t_quantile(0.975, len(xs) - 1) * s / math.sqrt(len(xs))
    return m - half, m + half


def detectable_difference(sd: float, n: int, power: float = 0.8) -> float | None:
    """The smallest true mean difference a two-sided paired t-test at alpha 0.05 detects with `power`, given the
    per-pair differences' standard deviation `sd` over `n` pairs (the usual (t_{.975} + t_power) sd / sqrt(n))."""
    if n < 2 or not sd:
        return None
    return (t_quantile(0.975, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


# ------------------------------------------------------------------------------------------- stability


def loss_spikes(losses: Sequence[float], factor: float, warmup: int = 10, decay: float = 0.9) -> list[int]:
    """Indices of the losses above `factor` x the running mean (an EMA) of the losses before them.

    The rule of the trainer's spike stop (train.spike_factor, train/loop.py SpikeDetector), applied after the
    fact: the first `warmup` losses only start the mean, and a spike does not enter it.
    """
    out: list[int] = []
    avg: float | None = None
    for i, x in enumerate(losses):
        if avg is not None and i >= warmup and x > factor * avg:
            out.append(i)
            continue
        avg = x if avg is None else decay * avg + (1 - decay) * x
    return out


# --------------------------------------------------------------------------------------------- speedup


@dataclass
class Reach:
    """Where a candidate reaches a target loss on its budget curve.

    status:
      "exact":        reached inside the budget range; `tokens` interpolated log-linearly.
      "below_range":  already at or below the target at the smallest budget; `tokens` is that budget, an
                      upper bound on the tokens needed (so a speedup computed from it is a lower bound).
      "not_reached":  above the target at every budget; `tokens` is the largest budget, a lower bound on the
                      tokens needed (a speedup from it is an upper bound).
      "extrapolated": outside the range, extrapolated log-linearly from the end segment (only on request).
    """

    tokens: float
    status: str

    @property
    def exact(self) -> bool:
        return self.status == "exact"


def _log_interp(d0: float, l0: float, d1: float, l1: float, target: float) -> float:
    """The budget where the line through (log d0, l0) and (log d1, l1) has loss `target`."""
    x0, x1 = math.log(d0), math.log(d1)
    return math.exp(x0 + (target - l0) * (x1 - x0) / (l1 - l0))


def tokens_to_reach(
    budgets: Sequence[float], losses: Sequence[float], target: float, *, extrapolate: bool = False
) -> Reach:
    """The token budget at which a curve of final losses reaches `target` (docs/protocol.md#convergence-speedup).

    `budgets` ascending, `losses[i]` the final loss of a full run at `budgets[i]`. The loss is interpolated
    linearly in log(tokens) between adjacent budgets; the first crossing from above is taken (a noisy,
    non-monotonic curve can cross more than once). Non-finite losses (a diverged run) never reach a target.
    Outside the range the answer is a bound (see :class:`Reach`), extrapolated only with `extrapolate=True`.
    """
    if len(budgets) != len(losses) or not budgets:
        raise ValueError("tokens_to_reach needs equally long, non-empty budgets and losses")
    if any(b1 <= b0 for b0, b1 in zip(budgets, budgets[1:])):
        raise ValueError("budgets must be strictly ascending")
    finite = [math.isfinite(x) for x in losses]
    if finite[0] and losses[0] <= target:
        if losses[0] == target:
            return Reach(float(budgets[0]), "exact")
        if extrapolate and len(budgets) > 1 and finite[1] and losses[1] < losses[0]:
            return Reach(_log_interp(budgets[0], losses[0], budgets[1], losses[1], target), "extrapolated")
        return Reach(float(budgets[0]), "below_range")
    for j in range(len(budgets) - 1):
        if not finite[j + 1]:
            continue
        above = not finite[j] or losses[j] > target
        if above and losses[j + 1] <= target:
            if not finite[j]:  # a diverged smaller run: the crossing lies somewhere below budgets[j + 1]
                return Reach(float(budgets[j + 1]), "exact" if losses[j + 1] == target else "below_range")
            return Reach(_log_interp(budgets[j], losses[j], budgets[j + 1], losses[j + 1], target), "exact")
    n = len(budgets)
    if extrapolate and n > 1 and all(finite[-2:]) and losses[-1] < losses[-2]:
        return Reach(_log_interp(budgets[-2], losses[-2], budgets[-1], losses[-1], target), "extrapolated")
    return Reach(float(budgets[-1]), "not_reached")


@dataclass
class BudgetSpeedup:
    """One baseline budget D_i: its loss L_i, where the candidate reaches it, and D_i / D'_i."""

    budget: int
    target: float
    reach: Reach
    speedup: float  # D_i / D'_i; a bound unless reach.status is "exact" (or "extrapolated")

    def to_dict(self) -> dict:
        return {
            "budget": self.budget,
            "target_loss": self.target,
            "tokens_needed": self.reach.tokens,
            "status": self.reach.status,
            "speedup": self.speedup,
        }


def speedups(
    budgets: Sequence[int],
    base_losses: Sequence[float],
    cand_losses: Sequence[float],
    *,
    extrapolate: bool = False,
) -> list[BudgetSpeedup]:
    """Speedup_i = D_i / D'_i for every baseline budget whose loss is finite (docs/protocol.md#convergence-speedup).

    Both curves are over the same `budgets`. A speedup whose reach is "below_range" is a lower bound,
    "not_reached" an upper bound.
    """
    out = []
    for d, target in zip(budgets, base_losses):
        if not math.isfinite(target):
            continue  # a diverged baseline run sets no target
        reach = tokens_to_reach(budgets, cand_losses, target, extrapolate=extrapolate)
        out.append(BudgetSpeedup(budget=int(d), target=target, reach=reach, speedup=d / reach.tokens))
    return out


def usable(s: BudgetSpeedup, extrapolate: bool = False) -> bool:
    """Whether a per-budget speedup is a value (not a bound) that may enter a mean."""
    return s.reach.status == "exact" or (extrapolate and s.reach.status == "extrapolated")
