"""The statistics of comparing two evaluations: pure arithmetic on pass/fail scores, after
Evan Miller's "Adding Error Bars to Evals" (Anthropic, 2024), with pass@k and pass^k.

Scores are 0/1 (a run's checker failed or passed). A *cluster* is a task: runs of one task are
not independent draws from the space of tasks, so a mean over runs has a clustered standard
error, usually larger than the naive one.

- mean s̄ = Σ s_i / n; naive (CLT) SE = sqrt(Σ (s_i - s̄)² / (n - 1) / n)
- clustered SE = sqrt(SE_CLT² + Σ_c Σ_i Σ_{j≠i} (s_ic - s̄)(s_jc - s̄) / n²)  (the paper's eq. 4)
- paired difference by task: d_t = mean_A(t) - mean_B(t) over the tasks both evaluated;
  d̄ ± z·sqrt(Var(d)/T), Var with T - 1 (the paper's §4: question-level means when each
  question has several samples)
- paired difference by run, where run i of task t has the same seed and start tree in both:
  d_ti = s_A,ti - s_B,ti, its mean with the SE clustered by task
- unpaired difference: SE = sqrt(SE_A² + SE_B²), each clustered
- one task's difference: Newcombe's hybrid score interval from the two Wilson intervals
- pass@k = 1 - C(n-c, k)/C(n, k) (Chen et al. 2021, unbiased); pass^k = C(c, k)/C(n, k)
  (tau-bench: all k of k runs pass), averaged over tasks
- power: runs per task K so that a true difference δ is found at two-sided α with power 1-β,
  for T tasks: Var(d̄) = (ω² + (σ_A² + σ_B²)/K) / T, where σ_X² is the mean within-task
  variance p_t(1 - p_t) and ω² the between-task variance of the true per-task difference;
  K = (σ_A² + σ_B²) / (T δ² / (z_{α/2} + z_β)² - ω²), none when that denominator is <= 0
  (no number of runs is enough: more tasks are needed), and none when the runs measured no
  variance at all (every run of a task had one outcome: nothing to extrapolate from).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from tttr.engine.replay.variance import Interval, wilson

Z95 = NormalDist().inv_cdf(0.975)  # 1.959963984540054


@dataclass(frozen=True, slots=True)
class Estimate:
    """A mean (or a difference of means) with its standard error and 95% interval."""

    mean: float
    se: float
    n: int  # the scores (or pairs, or tasks) it rests on

    @property
    def interval(self) -> Interval:
        return Interval(self.mean - Z95 * self.se, self.mean + Z95 * self.se)

    def to_json(self) -> dict:
        iv = self.interval
        return {"mean": self.mean, "se": self.se, "n": self.n, "interval_95": [iv.low, iv.high]}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _sample_var(xs: Sequence[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def naive_se(scores: Sequence[float]) -> float:
    """The CLT standard error of the mean, treating every score as an independent draw."""
    if not scores:
        raise ValueError("naive_se: no scores")
    return math.sqrt(_sample_var(scores) / len(scores))


def clustered_se(clusters: Mapping[str, Sequence[float]]) -> float:
    """The standard error of the mean of all scores, clustered (the paper's eq. 4)."""
    scores = [s for c in clusters.values() for s in c]
    if not scores:
        raise ValueError("clustered_se: no scores")
    n, m = len(scores), _mean(scores)
    cross = 0.0
    for c in clusters.values():
        r = [s - m for s in c]
        total = sum(r)
        cross += total * total - sum(x * x for x in r)  # Σ_i Σ_{j≠i} r_i r_j
    return math.sqrt(max(0.0, naive_se(scores) ** 2 + cross / (n * n)))


def mean_estimate(clusters: Mapping[str, Sequence[float]]) -> Estimate:
    scores = [s for c in clusters.values() for s in c]
    return Estimate(_mean(scores), clustered_se(clusters), len(scores))


def paired_by_task(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]]) -> Estimate | None:
    """The mean over shared tasks of (A's mean - B's mean); None without a shared task."""
    tasks = sorted(t for t in a if t in b and a[t] and b[t])
    if not tasks:
        return None
    d = [_mean(a[t]) - _mean(b[t]) for t in tasks]
    return Estimate(_mean(d), math.sqrt(_sample_var(d) / len(d)), len(d))


def paired_by_run(pairs: Mapping[str, Sequence[tuple[float, float]]]) -> Estimate | None:
    """The mean of per-run differences over matched runs (task -> [(A's score, B's score)]),
    its SE clustered by task; None without a pair."""
    diffs = {t: [x - y for x, y in ps] for t, ps in pairs.items() if ps}
    if not diffs:
        return None
    return mean_estimate(diffs)


def unpaired(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]]) -> Estimate:
    ea, eb = mean_estimate(a), mean_estimate(b)
    return Estimate(ea.mean - eb.mean, math.sqrt(ea.se ** 2 + eb.se ** 2), ea.n + eb.n)


def newcombe(passed_a: int, n_a: int, passed_b: int, n_b: int) -> tuple[float, Interval] | None:
    """pA - pB with Newcombe's hybrid score interval (method 10, from the Wilson intervals)."""
    ia, ib = wilson(passed_a, n_a), wilson(passed_b, n_b)
    if ia is None or ib is None:
        return None
    pa, pb = passed_a / n_a, passed_b / n_b
    d = pa - pb
    low = d - math.sqrt((pa - ia.low) ** 2 + (ib.high - pb) ** 2)
    high = d + math.sqrt((ia.high - pa) ** 2 + (pb - ib.low) ** 2)
    return d, Interval(max(-1.0, low), min(1.0, high))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k runs drawn from n (c of which passed) passes."""
    _check_k(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: the chance that all k runs drawn from n (c of which passed) pass."""
    _check_k(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check_k(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k: need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")


def mean_over_tasks(counts: Mapping[str, tuple[int, int]], k: int, how=pass_at_k) -> float:
    """`how` (pass_at_k or pass_hat_k) of each task's (runs, passed), averaged over tasks."""
    return _mean([how(n, c, k) for n, c in counts.values()])


@dataclass(frozen=True, slots=True)
class Power:
    delta: float
    runs_per_task: int | None  # None: no number of runs per task is enough with these tasks
    tasks: int
    within_var: float      # σ_A² + σ_B²
    between_var: float     # ω²

    def to_json(self) -> dict:
        return {"delta": self.delta, "runs_per_task": self.runs_per_task, "tasks": self.tasks,
                "within_variance": self.within_var, "between_task_variance": self.between_var}


def runs_needed(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], delta: float,
                *, alpha: float = 0.05, power: float = 0.8) -> Power | None:
    """Runs per task that a true difference `delta` needs (see the module's note); None
    without a shared task."""
    if not 0 < delta <= 1:
        raise ValueError(f"power: delta {delta} must be in (0, 1]")
    tasks = sorted(t for t in a if t in b and a[t] and b[t])
    if not tasks:
        return None
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    pa = {t: _mean(a[t]) for t in tasks}
    pb = {t: _mean(b[t]) for t in tasks}
    within = _mean([pa[t] * (1 - pa[t]) for t in tasks]) + _mean([pb[t] * (1 - pb[t]) for t in tasks])
    d = [pa[t] - pb[t] for t in tasks]
    noise = _mean([pa[t] * (1 - pa[t]) / len(a[t]) + pb[t] * (1 - pb[t]) / len(b[t]) for t in tasks])
    between = max(0.0, _sample_var(d) - noise)
    room = len(tasks) * delta * delta / (z * z) - between
    if room <= 0 or within + between == 0:  # or no variance measured at all: nothing to extrapolate from
        k = None
    else:
        k = max(1, math.ceil(within / room - 1e-9))
    return Power(delta, k, len(tasks), within, between)
