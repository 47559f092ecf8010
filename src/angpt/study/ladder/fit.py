"""The scaling law L(N, D) = E + A / N^alpha + B / D^beta: its fit, bootstrap intervals and compute-optimal sizes.

The fit is Chinchilla's third approach (Hoffmann et al. 2022, arXiv 2203.15556, App. D.2) as refitted by
Besiroglu et al. 2024 (arXiv 2404.10102): the Huber loss (delta = 1e-3) between predicted and observed log losses,
with the prediction written as a log-sum-exp of free parameters so that every value of them is a valid law,

    log L(N, D) = LSE(e, a - alpha log N, b - beta log D),     E = exp(e), A = exp(a), B = exp(b),

minimised by L-BFGS-B from the best points of Hoffmann et al.'s grid of starts. Intervals come from a bootstrap
over runs (resample with replacement, refit, percentiles). scipy is needed (``pip install angpt[scaling]``) and
imported only when a fit runs.

Compute-optimal allocation under C = 6 N D (minimise A N^-alpha + B D^-beta with N D = C / 6; setting the
derivative in N to zero gives alpha A N^-alpha = beta B D^-beta):

    G = (alpha A / (beta B))^(1 / (alpha + beta)),
    N*(C) = G (C / 6)^(beta / (alpha + beta)),      D*(C) = G^-1 (C / 6)^(alpha / (alpha + beta)),
    L*(C) = E + (1 + alpha / beta) A N*(C)^-alpha        (the two terms at the optimum are in ratio beta : alpha).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from angpt.errors import UserError

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, App. D.2; kept by Besiroglu et al. 2024
LEAST_SQUARES = 0.1  # a Huber delta above the log residuals of real fits (~0.01): quadratic there (profile_interval)
# Hoffmann et al.'s grid of starting points (App. D.2): 5 x 5 x 5 x 6 x 6 = 4500, in (e, a, alpha, b, beta) order.
START_GRID = {
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
    "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "beta": (0.0, 0.5, 1.0, 1.5, 2.0),
}


def _one_blas_thread():
    """A context with BLAS limited to one thread: scipy's L-BFGS-B calls BLAS on 5-vectors, where thread start-up
    costs ~30x the work on a busy machine (threadpoolctl, from the `scaling` extra; no limit without it)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def require_scipy():
    """scipy.optimize, or a one-line error naming the extra that provides it."""
    try:
        import scipy.optimize

        return scipy.optimize
    except ImportError:
        raise UserError("scaling-law fits need scipy: pip install 'angpt[scaling]'") from None


# --------------------------------------------------------------------------------------------- the law
@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    @classmethod
    def from_theta(cls, theta: Sequence[float]) -> Law:
        e, a, alpha, b, beta = (float(x) for x in theta)
        return cls(math.exp(e), math.exp(a), alpha, math.exp(b), beta)

    def theta(self) -> np.ndarray:
        return np.array([math.log(self.E), math.log(self.A), self.alpha, math.log(self.B), self.beta])

    def loss(self, N, D):
        """The predicted loss (works on numpy arrays)."""
        return self.E + self.A / np.power(N, self.alpha) + self.B / np.power(D, self.beta)

    @property
    def G(self) -> float:
        return (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))

    @property
    def n_exponent(self) -> float:
        """N*(C) grows as C to this power: beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def d_exponent(self) -> float:
        """D*(C) grows as C to this power: alpha / (alpha + beta)."""
        return self.alpha / (self.alpha + self.beta)

    def optimal(self, C: float) -> tuple[float, float]:
        """(N*, D*): the split of compute C = 6 N D with the lowest predicted loss."""
        n = self.G * (C / 6.0) ** self.n_exponent
        return n, C / (6.0 * n)

    def optimal_loss(self, C: float) -> float:
        """L*(C), the loss of the compute-optimal split of C."""
        n, _ = self.optimal(C)
        return self.E + (1.0 + self.alpha / self.beta) * self.A * n**-self.alpha

    def compute_for_loss(self, loss: float) -> float:
        """The least compute C (= 6 N D) that reaches `loss` at the optimal split; inf at or below E.

        Inverts L*(C): L* - E = (1 + alpha/beta) A G^-alpha (C/6)^(-alpha beta / (alpha + beta)).
        """
        log_c = self.log_compute_for_loss(loss)
        return math.inf if log_c > 709.0 else math.exp(log_c)

    def log_compute_for_loss(self, loss: float) -> float:
        """log of compute_for_loss (inf at or below E): finite where C itself under- or overflows a float, as it
        does for a bootstrap refit with a tiny exponent."""
        excess = loss - self.E
        if not excess > 0:
            return math.inf
        log_coeff = math.log1p(self.alpha / self.beta) + math.log(self.A) - self.alpha * math.log(self.G)
        power = self.alpha * self.beta / (self.alpha + self.beta)
        return math.log(6.0) - (math.log(excess) - log_coeff) / power

    def to_dict(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha, "B": self.B, "beta": self.beta}


def compute_multiplier(base: Law, arm: Law, loss: float) -> float:
    """How many times the compute the baseline needs to reach `loss` compared with the arm (both at their optimal
    split): C_base(loss) / C_arm(loss). Above 1: the arm is cheaper. inf when only the arm can reach it."""
    c_arm = arm.log_compute_for_loss(loss)
    c_base = base.log_compute_for_loss(loss)
    if math.isinf(c_arm):
        return math.nan if math.isinf(c_base) else 0.0
    if math.isinf(c_base):
        return math.inf
    return math.exp(min(709.0, c_base - c_arm))  # in logs: each C alone may under- or overflow


# ------------------------------------------------------------------------------------------ the objective
# The search runs in centred coordinates phi = (e, c, alpha, d, beta) with c = a - alpha mean(log N) and
# d = b - beta mean(log D): the same law, but c and alpha are no longer almost collinear (a and alpha are, since
# log N varies little relative to its mean), which L-BFGS otherwise crawls along. exp(c) and exp(d) are the two
# reducible terms at the runs' (geometric) mean N and D.
NAMES = ("e", "c", "alpha", "d", "beta")
BOUNDS = {"e": (-5.0, 5.0), "c": (-30.0, 5.0), "alpha": (0.0, 3.0), "d": (-30.0, 5.0), "beta": (0.0, 3.0)}
E_ABSENT = -50.0  # e pinned here (E = 2e-22) fits the law without its irreducible term: E fixed at 0
_SHOWN = {"e": "E", "c": "A N^-alpha at the mean N", "alpha": "alpha", "d": "B D^-beta at the mean D", "beta": "beta"}


def _objective(phi: np.ndarray, x: np.ndarray, y: np.ndarray, logL: np.ndarray, delta: float):
    """Mean Huber loss of the log-space residuals, over delta^2 (so that it is O(1)), and its gradient.

    `x`, `y` are log N and log D minus their means; phi is one vector (5,) in centred coordinates, or a batch
    (k, 5), for which only the values are returned.
    """
    phi = np.asarray(phi, dtype=float)
    batch = phi.ndim == 2
    e, c, alpha, d, beta = (phi[:, i : i + 1] for i in range(5)) if batch else phi
    t1 = c - alpha * x
    t2 = d - beta * y
    top = np.maximum(np.maximum(t1, t2), e)
    w0, w1, w2 = np.exp(e - top), np.exp(t1 - top), np.exp(t2 - top)
    total = w0 + w1 + w2
    r = top + np.log(total) - logL  # predicted minus observed log loss
    absr = np.abs(r)
    huber = np.where(absr <= delta, 0.5 * r * r, delta * (absr - 0.5 * delta))
    f = huber.mean(axis=-1) / delta**2
    if batch:
        return f
    dh = np.clip(r, -delta, delta) / (x.size * delta**2 * total)  # d f / d term_k = dh * w_k
    g1, g2 = dh * w1, dh * w2
    return float(f), np.array([np.sum(dh * w0), g1.sum(), -(g1 @ x), g2.sum(), -(g2 @ y)])


def _to_phi(theta: np.ndarray, mN: float, mD: float) -> np.ndarray:
    """(e, log A, alpha, log B, beta) -> centred coordinates (works on a batch)."""
    theta = np.array(theta, dtype=float)
    theta[..., 1] -= theta[..., 2] * mN
    theta[..., 3] -= theta[..., 4] * mD
    return theta


def _to_law(phi: np.ndarray, mN: float, mD: float) -> Law:
    e, c, alpha, d, beta = (float(v) for v in phi)
    return Law.from_theta([e, c + alpha * mN, alpha, d + beta * mD, beta])


@dataclass
class Fit:
    """One fit: the law when it converged to an interior optimum; otherwise `message` says what went wrong."""

    law: Law | None
    ok: bool
    message: str  # "" when ok
    objective: float
    n_points: int
    at_bound: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "message": self.message,
            "objective": self.objective,
            "n_points": self.n_points,
            "at_bound": self.at_bound,
            "params": self.law.to_dict() if self.law else None,
        }


def _as_arrays(N, D, L) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    N, D, L = (np.asarray(v, dtype=float).ravel() for v in (N, D, L))
    if not (N.size == D.size == L.size):
        raise UserError(f"fit: N, D and L differ in length ({N.size}, {D.size}, {L.size})")
    if N.size == 0 or not (np.all(N > 0) and np.all(D > 0) and np.all(L > 0)):
        raise UserError("fit: every N, D and loss must be a positive number")
    if not np.all(np.isfinite(L)):
        raise UserError("fit: losses must be finite (leave diverged runs out)")
    return N, D, L


_GRID = np.array(list(itertools.product(*START_GRID.values())), dtype=float)  # (e, a, alpha, b, beta) rows


def fit_law(
    N: Sequence[float],
    D: Sequence[float],
    L: Sequence[float],
    *,
    delta: float = HUBER_DELTA,
    starts: int = 8,
    extra_starts: Sequence[Law] = (),
    with_e: bool = True,
    fixed: dict[str, float] | None = None,
) -> Fit:
    """Fit L(N, D) to final losses `L` of runs with `N` parameters and `D` tokens.

    `fixed` holds exponents at given values ({"alpha": 0.3}: the profile of :func:`profile_interval`).

    `with_e=False` fits the nested law without the irreducible term (E fixed at 0: A / N^alpha + B / D^beta), for
    data whose full fit drives E to the bottom of its search, i.e. that do not determine E.

    The objective is evaluated at all 4500 grid starts; L-BFGS-B runs from the best `starts` of them (and from the
    laws in `extra_starts`), keeping the lowest optimum, which is then restarted until it stops improving (the
    Huber loss is piecewise, and a line search can stop at a kink short of the optimum). A fit that still
    improves after the restarts, or that ends on a bound of the search, is reported as such (``ok`` False).
    """
    opt = require_scipy()
    N, D, L = _as_arrays(N, D, L)
    logN, logD, logL = np.log(N), np.log(D), np.log(L)
    mN, mD = float(logN.mean()), float(logD.mean())
    x, y = logN - mN, logD - mD
    lo = np.array([BOUNDS[n][0] for n in NAMES])
    hi = np.array([BOUNDS[n][1] for n in NAMES])
    if not with_e:
        lo[0] = hi[0] = E_ABSENT  # L-BFGS-B keeps a variable with equal bounds fixed
    for name, value in (fixed or {}).items():
        if name not in ("alpha", "beta"):
            raise ValueError(f"fit_law: only the exponents can be fixed, not {name!r}")
        i = NAMES.index(name)  # exponents are the same in centred coordinates
        lo[i] = hi[i] = value
    grid = np.clip(_to_phi(_GRID, mN, mD), lo, hi)  # clipping makes some starts equal: each is tried once
    values = _objective(grid, x, y, logL, delta)
    x0s = [np.clip(_to_phi(law.theta(), mN, mD), lo, hi) for law in extra_starts]
    picked: set[bytes] = set()
    for i in np.argsort(values, kind="stable"):
        if len(picked) >= max(1, starts):
            break
        if grid[i].tobytes() not in picked:
            picked.add(grid[i].tobytes())
            x0s.append(grid[i])

    def run(x0: np.ndarray):
        return opt.minimize(
            _objective,
            x0,
            args=(x, y, logL, delta),
            jac=True,
            method="L-BFGS-B",
            bounds=list(zip(lo, hi)),
            options={"maxiter": 1000, "ftol": 1e-13, "gtol": 1e-9},
        )

    with _one_blas_thread():
        best = min((run(x0) for x0 in x0s), key=lambda r: r.fun)
        settled = False
        for _ in range(5):  # restart from the optimum until a restart no longer lowers it
            again = run(best.x)
            settled = again.fun >= best.fun - 1e-9 * max(1.0, abs(best.fun))
            if again.fun < best.fun:
                best = again
            if settled:
                break
    free = [n for n, a, b in zip(NAMES, lo, hi) if b > a]
    at_bound = [n for n, v, a, b in zip(NAMES, best.x, lo, hi) if n in free and min(v - a, b - v) <= 1e-6 * (b - a)]
    message = ""
    if at_bound:
        shown = ", ".join(f"{_SHOWN[n]} = {_bound_value(n, v)}" for n, v in zip(NAMES, best.x) if n in at_bound)
        message = f"the fit ends on a bound of its search ({shown}): the data do not determine the law"
    elif not settled:
        message = f"L-BFGS-B did not converge ({_scipy_message(best)}; restarts kept lowering the loss)"
    return Fit(
        law=_to_law(best.x, mN, mD),
        ok=not message,
        message=message,
        objective=float(best.fun),
        n_points=int(N.size),
        at_bound=at_bound,
    )


def _bound_value(name: str, v: float) -> str:
    return f"{math.exp(v):.3g}" if name in ("e", "c", "d") else f"{v:.3g}"


def _scipy_message(res) -> str:
    msg = res.message.decode() if isinstance(res.message, bytes) else str(res.message)
    return msg.strip().rstrip(".")


# ---------------------------------------------------------------------------------------- profile intervals
def _rss(law: Law, N: np.ndarray, D: np.ndarray, L: np.ndarray) -> float:
    return float(np.sum((np.log(law.loss(N, D)) - np.log(L)) ** 2))


def profile_interval(
    N: Sequence[float],
    D: Sequence[float],
    L: Sequence[float],
    name: str,
    *,
    level: float = 0.95,
    with_e: bool = True,
    step: float = 0.1,
    starts: int = 4,
) -> dict[str, Any]:
    """The profile interval of exponent `name` ("alpha" or "beta"): the values at which the law, refitted with that
    exponent held fixed, is not significantly worse than the free fit.

    The profile is of least squares on log L (Gaussian errors; Bates & Watts 1988, ch. 6, profile t / F):
    (RSS(v) - RSS_min) / (RSS_min / (n - k)) <= F(1, n - k; level), where RSS(v) is the least sum of squared log
    residuals with the exponent held at v, RSS_min the least over every fit tried and k the law's free parameters.
    Its fits are least squares, not the Huber fit of fit_law: Huber at delta 1e-3 is nearly L1 at the noise of real
    runs, and scoring such fits by squared residuals makes the interval too narrow (70% coverage of alpha at a
    nominal 95% on synthetic 5 x 4 ladders; 95% as written here).
    Unlike a percentile bootstrap it needs no resampling of few points, and it says plainly when the data do not
    bound the exponent: an end that reaches the search bound (0 or 3) is reported as open (`lo_open`, `hi_open`).

    The exponent is scanned on a grid of `step`, outwards from the free fit's value until the first grid point outside
    (the interval is taken to be connected), and each end refined by bisection. Only the points the walk reaches are
    fitted.
    """
    require_scipy()
    from scipy.stats import f as f_dist

    N, D, L = _as_arrays(N, D, L)
    lo_b, hi_b = BOUNDS[name]
    free = fit_law(N, D, L, with_e=with_e, delta=LEAST_SQUARES)
    if free.law is None:
        raise UserError(f"profile_interval: the free fit failed ({free.message})")
    centre = float(getattr(free.law, name))
    cache: dict[float, float] = {}

    def rss(v: float) -> float:
        if v not in cache:
            fit = fit_law(N, D, L, with_e=with_e, fixed={name: v}, starts=starts, delta=LEAST_SQUARES)
            cache[v] = _rss(fit.law, N, D, L) if fit.law is not None else math.inf
        return cache[v]

    grid = [float(v) for v in np.round(np.arange(lo_b, hi_b + step / 2, step), 10)]
    dof = N.size - (5 if with_e else 4)
    if dof < 1:
        raise UserError(f"profile_interval: {N.size} runs leave no degree of freedom for the noise")
    limit = float(f_dist.ppf(level, 1, dof))
    best = _rss(free.law, N, D, L)

    def inside(v: float) -> bool:
        return (rss(v) - best) / max(best / dof, 1e-300) <= limit

    def end(direction: int) -> tuple[float, bool]:
        """Walk the grid from the free optimum outwards; bisect the first crossing (or stop open at the bound)."""
        ahead = [v for v in grid if (v - centre) * direction > 0]
        last = centre
        for v in sorted(ahead, key=lambda v: abs(v - centre)):
            if not inside(v):
                a, b = last, v
                for _ in range(12):
                    m = (a + b) / 2
                    a, b = (m, b) if inside(m) else (a, m)
                return (a + b) / 2, False
            last = v
        return (hi_b if direction > 0 else lo_b), True

    while True:  # RSS_min is the least over every fit tried: walk again should a fit of the walk fall below it
        (lo, lo_open), (hi, hi_open) = end(-1), end(1)
        least = min(cache.values(), default=best)
        if least >= best:
            break
        best = least
    return {"lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open, "level": level, "centre": centre}


# -------------------------------------------------------------------------------------------- bootstrap
@dataclass
class Bootstrap:
    """Refits on resampled runs: the converged ones, and how many did not converge."""

    laws: list[Law]
    failed: int
    n: int
    seed: int

    def interval(self, fn: Callable[[Law], float], level: float = 0.95) -> tuple[float, float] | None:
        """The percentile interval of `fn` over the converged refits (None without any)."""
        return _percentiles([fn(law) for law in self.laws], level)


def bootstrap_fit(
    N: Sequence[float],
    D: Sequence[float],
    L: Sequence[float],
    *,
    n: int = 200,
    seed: int = 0,
    delta: float = HUBER_DELTA,
    start: Law | None = None,
    with_e: bool = True,
    starts: int = 8,
) -> Bootstrap:
    """Resample the runs with replacement `n` times (numpy generator seeded with `seed`) and refit each.

    Each refit searches as the full-data fit does, from the best `starts` points of the grid, and from `start` only
    if one is given: starting every refit at the full-data fit keeps refits near it where the data pin nothing
    down, and so understates the intervals (on the 5-size CPU ladder alpha's upper end moved from ~0.3 to ~2.5).
    Refits that do not converge (or end on a bound) are left out and counted in `failed`. `with_e` as in fit_law.
    """
    N, D, L = _as_arrays(N, D, L)
    rng = np.random.default_rng(seed)
    laws, failed = [], 0
    extra = [start] if start is not None else []
    with _one_blas_thread():
        for _ in range(n):
            idx = rng.integers(0, N.size, N.size)
            fit = fit_law(N[idx], D[idx], L[idx], delta=delta, starts=starts, extra_starts=extra, with_e=with_e)
            if fit.ok and fit.law is not None:
                laws.append(fit.law)
            else:
                failed += 1
    return Bootstrap(laws=laws, failed=failed, n=n, seed=seed)


def paired_interval(
    base: Bootstrap, arm: Bootstrap, fn: Callable[[Law, Law], float], level: float = 0.95
) -> tuple[float, float] | None:
    """The percentile interval of fn(base_i, arm_i) over the pairs of both arms' i-th converged refits.

    The two arms' runs are resampled independently, so pairing replicates by index is a valid draw of both."""
    k = min(len(base.laws), len(arm.laws))
    return _percentiles([fn(b, a) for b, a in zip(base.laws[:k], arm.laws[:k])], level)


def _percentiles(values: Sequence[float], level: float) -> tuple[float, float] | None:
    """The central `level` percentile interval of the finite `values` (None without any)."""
    finite = np.array(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return None
    lo, hi = np.quantile(finite, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
