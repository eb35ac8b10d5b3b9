"""Waiting times at a queue of sidecar workers (or shared CPUs), by direct simulation.

A *station* is ``servers`` identical servers fed in arrival order (FCFS) by jobs arriving at
``rate`` per second with independent interarrival times of squared coefficient of variation
``ca2`` (1: Poisson arrivals, the default for independent clients; 0: evenly spaced, as a
load generator that spreads its calls uniformly) and independent service times drawn from
:class:`ServiceMix` (a mixture of job classes, each a mean times one shared shape).

Why a simulation rather than a formula: the profile gives a service-time *distribution*
(a quantile sketch), not a family, and the tail of the waiting time is what is asked for.
The usual closed forms are exact only for Poisson arrivals and exponential (M/M/c) or
deterministic (M/D/1) service; M/G/c approximations (Allen–Cunneen, Kingman) give a good
*mean* but their tails are an assumed shape (exponential or gamma), which misses p99 by tens
of per cent when service times are skewed. The waiting time of the n-th job obeys an exact
recursion instead, whatever the distributions:

* one server (Lindley): ``W[n+1] = max(0, W[n] + S[n] − A[n+1])``; with
  ``U[k] = Σ_{i<k} (S[i] − A[i+1])`` this is ``W[k] = U[k] − min_{j≤k} U[j]``, one cumulative
  sum and one running minimum — fully vectorized;
* ``c`` servers (Kiefer–Wolfowitz): the vector of the servers' remaining work, sorted; the
  job waits for the least loaded, adds its service there, and time advances by the next
  interarrival — a short sequential loop, compiled with numba.

``jobs`` simulated jobs after a warm-up give the stationary distribution (to a sampling error
the tests bound against M/M/1, M/D/1 and M/M/c). At utilisation ≥ 1 the queue has no
stationary distribution: :func:`waiting_times` refuses, and callers report the station as
saturated. Times are µs, rates per second.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "SaturatedError",
    "Shape",
    "ServiceMix",
    "Station",
    "erlang_c",
    "md1_cdf",
    "mm1_tail",
    "waiting_times",
]


class SaturatedError(ValueError):
    """A station at utilisation ≥ 1: its queue grows without bound."""


#: where :meth:`Shape.gamma` keeps its quantiles: evenly, then densely in the upper tail
GAMMA_PROBS = np.concatenate([np.linspace(0.0, 0.99, 199), 1.0 - np.logspace(-2.05, -5, 30), [1.0]])


@dataclass(frozen=True)
class Shape:
    """A positive distribution with mean 1, as a quantile sketch: ``values[k]`` is the
    ``probs[k]`` quantile (``probs`` from 0 to 1, both values non-decreasing), linear in
    between. ``Shape.constant()`` is a point mass at 1."""

    probs: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        p = np.asarray(self.probs, dtype=np.float64)
        v = np.asarray(self.values, dtype=np.float64)
        if p.shape != v.shape or p.size < 2 or p[0] != 0.0 or p[-1] != 1.0:
            raise ValueError("a shape needs quantiles at probabilities 0 … 1, one value each")
        if np.any(np.diff(p) <= 0) or np.any(np.diff(v) < 0) or v[0] < 0:
            raise ValueError("shape quantiles must increase with their probabilities, from ≥ 0")

    @classmethod
    def constant(cls) -> Shape:
        return cls((0.0, 1.0), (1.0, 1.0))

    @classmethod
    def gamma(cls, scv: float) -> Shape:
        """Mean 1 and squared coefficient of variation ``scv`` (a gamma distribution; 0: the
        constant), as quantiles of a fixed sample (the same shape on every call)."""
        return cls.constant() if scv <= 0 else _gamma(float(scv))

    @classmethod
    def from_quantiles(cls, probs: npt.ArrayLike, values: npt.ArrayLike) -> Shape:
        """Normalised to mean 1 from quantiles of any scale; values are made non-decreasing
        (a running maximum: differences of two measured quantile curves need not be) and
        non-negative. A sketch without mass (all zero) is a constant."""
        p = np.asarray(probs, dtype=np.float64)
        v = np.maximum.accumulate(np.maximum(np.asarray(values, dtype=np.float64), 0.0))
        m = float(np.sum(np.diff(p) * (v[1:] + v[:-1]) / 2))
        if not m > 0:
            return cls.constant()
        return cls(tuple(float(x) for x in p), tuple(float(x) / m for x in v))

    def mean(self) -> float:
        p, v = np.asarray(self.probs), np.asarray(self.values)
        return float(np.sum(np.diff(p) * (v[1:] + v[:-1]) / 2))

    def second_moment(self) -> float:
        """E[X²] of the piecewise-linear quantile function (exact per segment)."""
        p, v = np.asarray(self.probs), np.asarray(self.values)
        a, b = v[:-1], v[1:]
        return float(np.sum(np.diff(p) * (a * a + a * b + b * b) / 3))

    def scv(self) -> float:
        """Squared coefficient of variation."""
        m = self.mean()
        return self.second_moment() / (m * m) - 1.0

    def quantile(self, u: FloatArray) -> FloatArray:
        return np.asarray(np.interp(u, self.probs, self.values), dtype=np.float64)


@functools.lru_cache(maxsize=16)
def _gamma(scv: float) -> Shape:
    k = 1.0 / scv
    x = np.random.default_rng(12345).gamma(k, 1.0 / k, 400_000)
    return Shape.from_quantiles(GAMMA_PROBS, np.quantile(x, GAMMA_PROBS))


@dataclass(frozen=True)
class ServiceMix:
    """Service time of a job (µs): class ``k`` with probability ``weights[k]`` (normalised),
    then ``means[k]`` × a draw of ``shapes[shape_of[k]]`` (``shape_of`` empty: the first)."""

    means: tuple[float, ...]
    weights: tuple[float, ...]
    shapes: tuple[Shape, ...] = (Shape.constant(),)
    shape_of: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.means) != len(self.weights) or not self.means or not self.shapes:
            raise ValueError("a service mix needs one weight per class, at least one class")
        if min(self.means) < 0 or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError("service means and weights must be ≥ 0, weights not all 0")
        if self.shape_of and (
            len(self.shape_of) != len(self.means)
            or not all(0 <= k < len(self.shapes) for k in self.shape_of)
        ):
            raise ValueError("shape_of: one index into shapes per class")

    def _w(self) -> FloatArray:
        w = np.asarray(self.weights, dtype=np.float64)
        return np.asarray(w / w.sum(), dtype=np.float64)

    def _of(self) -> IntArray:
        return np.asarray(self.shape_of or (0,) * len(self.means), dtype=np.int64)

    def mean(self) -> float:
        sm = np.array([s.mean() for s in self.shapes])[self._of()]
        return float(self._w() @ (np.asarray(self.means) * sm))

    def second_moment(self) -> float:
        m = np.asarray(self.means)
        s2 = np.array([s.second_moment() for s in self.shapes])[self._of()]
        return float(self._w() @ (m * m * s2))

    def sample(self, n: int, rng: np.random.Generator) -> FloatArray:
        k = rng.choice(len(self.means), size=n, p=self._w())
        u = rng.random(n)
        out = np.asarray(self.means, dtype=np.float64)[k]
        of = self._of()[k]
        for j, shape in enumerate(self.shapes):
            sel = of == j
            out[sel] *= shape.quantile(u[sel])
        return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True)
class Station:
    """``servers`` FCFS servers, jobs arriving at ``rate``/s (interarrival SCV ``ca2``);
    ``clients``: at most that many jobs in the station (a load generator's connections: a
    job due while all are in flight enters when the oldest leaves, and waits from then on);
    None: an open station. ``jitter_us``: instead of ``ca2``, a paced load generator's
    schedule — job i due at i / rate, sent an Exp(``jitter_us``) lag late (evenly spaced at
    0; Poisson-like once the lag is several spacings). ``relief`` (with ``clients``): a job's
    service × ``relief[q]`` when it starts with ``q`` jobs in the station, itself included
    (``q`` beyond the table: its last entry) — work that gets cheaper as the queue grows
    (a sidecar handling several ready requests per wake-up). ``wakeup_us`` (with ``clients``):
    the load generator sends only when it is awake — a job due at ``t`` leaves at the client's
    first wake-up from then on: a response coming back (the completion of an earlier job), or
    else its idle timer, ``wakeup_us`` after its last wake-up (Go's netpoller sleeps in whole
    milliseconds: an idle fortio sends what fell due in the last millisecond at once); the
    job's wait counts from when it left, as the client's latency does. ``response_us``: how
    long after a job's service starts its response reaches the client (its unloaded
    latency; 0: when its service ends)."""

    rate: float
    servers: int
    service: ServiceMix
    ca2: float = 1.0
    clients: int | None = None
    jitter_us: float | None = None
    relief: tuple[float, ...] | None = None
    wakeup_us: float | None = None
    response_us: float = 0.0

    def __post_init__(self) -> None:
        if self.rate < 0 or self.servers < 1 or self.ca2 < 0:
            raise ValueError("a station needs rate ≥ 0, at least one server and ca2 ≥ 0")
        if self.jitter_us is not None and not 0 <= self.jitter_us < math.inf:
            raise ValueError(f"jitter_us must be finite and ≥ 0, got {self.jitter_us}")
        if self.clients is not None and self.clients < 1:
            raise ValueError(f"clients must be at least 1, got {self.clients}")
        if self.relief is not None and (
            not self.relief or not all(0 < x <= 1 for x in self.relief) or self.clients is None
        ):
            raise ValueError("relief: factors within (0, 1], and only with clients")
        if self.wakeup_us is not None and (
            not 0 < self.wakeup_us < math.inf or self.clients is None
        ):
            raise ValueError("wakeup_us: finite and > 0, and only with clients")
        if not 0 <= self.response_us < math.inf:
            raise ValueError(f"response_us must be finite and ≥ 0, got {self.response_us}")

    @property
    def utilisation(self) -> float:
        """Busy share of each server: rate × mean service / servers."""
        return self.rate * self.service.mean() * 1e-6 / self.servers


def _interarrivals(
    n: int, rate: float, ca2: float, rng: np.random.Generator, jitter_us: float | None = None
) -> FloatArray:
    mean = 1e6 / rate
    if jitter_us == 0 or (jitter_us is None and ca2 == 0):
        return np.full(n, mean)
    if jitter_us is not None:  # a paced schedule, each send late by an exponential lag
        t = np.sort(np.arange(n + 1) * mean + rng.exponential(jitter_us, n + 1))
        return np.asarray(np.diff(t), dtype=np.float64)
    k = 1.0 / ca2  # gamma with shape 1/ca2 has SCV ca2 (exponential at 1)
    return np.asarray(rng.gamma(k, mean / k, size=n), dtype=np.float64)


@numba.njit(cache=True, nogil=True)
def _kiefer_wolfowitz(s: FloatArray, a: FloatArray, c: int) -> FloatArray:
    """Waits of FCFS jobs on ``c`` servers: ``s`` services, ``a[i]`` the time from job i's
    arrival to job i+1's."""
    n = s.shape[0]
    v = np.zeros(c)  # remaining work of each server, ascending
    w = np.empty(n)
    for i in range(n):
        w[i] = v[0]
        x = v[0] + s[i]
        # re-insert the loaded server (v[1:] is sorted)
        j = 1
        while j < c and v[j] < x:
            v[j - 1] = v[j]
            j += 1
        v[j - 1] = x
        for k in range(c):
            v[k] = max(v[k] - a[i], 0.0)
    return w


@numba.njit(cache=True, nogil=True)
def _release(t: float, prev: float, back: FloatArray, i: int, window: int, q: float) -> float:
    """When a job due at ``t`` leaves a client that wakes on responses (``back``: when those
    of the jobs before ``i`` reached it, the last ``window`` of them) and otherwise every
    ``q`` after its last wake-up (``prev``: the previous job's release, itself a wake-up)."""
    if prev >= t:
        return prev  # the client was already late: the wake-up that sent the previous one
    last = prev
    nxt = np.inf
    for j in range(max(0, i - window), i):
        d = back[j]
        if d <= t:
            last = max(last, d)
        elif d < nxt:
            nxt = d
    if last == -np.inf:
        return t
    return min(last + (math.floor((t - last) / q) + 1.0) * q, nxt)


@numba.njit(cache=True, nogil=True)
def _closed(
    s: FloatArray,
    t: FloatArray,
    c: int,
    clients: int,
    relief: FloatArray,
    q: float,
    response: float,
) -> FloatArray:
    """Waits of FCFS jobs on ``c`` servers with at most ``clients`` in the station: job i,
    due at ``t[i]`` (with a wake-up quantum ``q`` > 0: released at the client's next wake-up,
    :func:`_release`; a response reaches the client ``response`` after its job's service
    starts, at least when it ends), enters when job ``i − clients`` has left (exact for one server; with
    several, jobs leave nearly in order), then waits for the earliest free server. Its
    service ``s[i]`` × ``relief[m]``, ``m`` the jobs in the station when it starts (itself
    and those due by then, at most ``clients``); ``s`` is overwritten with what was served."""
    n = s.shape[0]
    free = np.zeros(c)  # when each server is next free
    done = np.empty(n)
    back = np.empty(n)
    w = np.empty(n)
    top = relief.shape[0] - 1
    prev = -np.inf
    for i in range(n):
        enter = t[i]
        if q > 0:
            enter = _release(t[i], prev, back, i, 2 * clients + c, q)
            prev = enter
        if i >= clients and done[i - clients] > enter:
            enter = done[i - clients]
        k = 0
        for j in range(1, c):
            if free[j] < free[k]:
                k = j
        start = max(enter, free[k])
        w[i] = start - enter
        if top > 0:
            m = min(np.searchsorted(t, start, side="right") - i, clients)
            s[i] *= relief[min(max(m, 1), top)]
        done[i] = start + s[i]
        back[i] = max(done[i], start + response)
        free[k] = done[i]
    return w


def waiting_times(
    station: Station,
    jobs: int = 200_000,
    *,
    seed: int | np.random.Generator = 0,
    served: list[float] | None = None,
) -> FloatArray:
    """Sorted stationary waiting times (µs, before service starts) of ``jobs`` simulated jobs
    after a warm-up of a fifth as many (and at least enough for the queue to forget its empty
    start: a hundred of its relaxation times ``E[S] / (1 − √ρ)²``). A station without arrivals
    never waits (zeros). Raises :class:`SaturatedError` at utilisation ≥ 1 unless the station
    has ``clients`` (then at most that many queue: the rate it serves falls short instead).
    ``served``: gets the mean service the stationary jobs had (with ``relief``: less than the
    mix's mean)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    if station.rate == 0 or station.service.mean() == 0:
        return np.zeros(jobs)
    rho = station.utilisation
    if rho >= 1.0 and station.clients is None:
        raise SaturatedError(f"utilisation {rho:.2f} ≥ 1: the queue grows without bound")
    r = min(rho, 1.0 - 1.0 / (4 * (station.clients or 1)) ** 2)  # bounded by the clients
    relax = 1.0 / (1.0 - math.sqrt(r)) ** 2 / max(r, 1e-9)  # in interarrival times
    warm = int(min(max(jobs // 5, 100 * relax), 5 * jobs))
    n = jobs + warm
    s = station.service.sample(n, rng)
    a = _interarrivals(n, station.rate, station.ca2, rng, station.jitter_us)
    if station.clients is not None:
        t = np.concatenate(([0.0], np.cumsum(a[:-1])))
        relief = np.asarray(station.relief or (1.0,), dtype=np.float64)
        q = station.wakeup_us or 0.0
        w = _closed(s, t, station.servers, station.clients, relief, q, station.response_us)
    elif station.servers == 1:
        u = np.concatenate(([0.0], np.cumsum(s[:-1] - a[:-1])))
        w = u - np.minimum(np.minimum.accumulate(u), 0.0)
    else:
        w = _kiefer_wolfowitz(s, a, station.servers)
    if served is not None:
        served.append(float(s[warm:].mean()))
    return np.sort(w[warm:])


# ---- closed forms (the simulation's tests; small checks of a result) ------------------------


def mm1_tail(t: npt.ArrayLike, rate: float, mean_service: float) -> FloatArray:
    """M/M/1: P(W > t) = ρ·exp(−(μ − λ)·t) (t and the mean service in µs, rate per s)."""
    lam = rate * 1e-6
    mu = 1.0 / mean_service
    return np.asarray(lam / mu * np.exp(-(mu - lam) * np.asarray(t, dtype=np.float64)))


def md1_cdf(t: float, rate: float, service: float) -> float:
    """M/D/1: P(W ≤ t), Erlang's exact series ``(1−ρ) Σ_{k≤t/D} (ρ(k − t/D))^k / k! ·
    e^{−ρ(k − t/D)}`` (alternating; fine for t up to a few tens of D)."""
    rho = rate * 1e-6 * service
    x = t / service
    total = 0.0
    for k in range(int(math.floor(x)) + 1):
        y = rho * (k - x)
        total += y**k / math.factorial(k) * math.exp(-y)
    return (1.0 - rho) * total


def erlang_c(servers: int, rate: float, mean_service: float) -> float:
    """M/M/c: the probability that a job waits (Erlang's C formula)."""
    a = rate * 1e-6 * mean_service  # offered load in servers
    rho = a / servers
    if rho >= 1:
        return 1.0
    term = 1.0
    total = 1.0
    for k in range(1, servers):
        term *= a / k
        total += term
    last = term * a / servers / (1.0 - rho)
    return last / (total + last)
