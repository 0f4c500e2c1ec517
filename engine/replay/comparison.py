"""Two suites compared: the difference in pass rate with 95% intervals, per task and overall,
pass@k and pass^k, agreement by layer, and the runs per task a difference needs (power).

What is compared is each suite's `free` condition (today's practice: a fresh seed and the
live clock per run), over the tasks both suites ran; the other tasks are listed and left out.
Runs pair *by run* where run i of a task has the same seed and the same start tree in both
suites (`tttr suite --seed S` for both); otherwise the overall difference is paired by task.
The arithmetic is `errorbars.py`'s; this module reads the runs and names the results.
"""

from __future__ import annotations

from dataclasses import dataclass

from tttr.engine.replay import errorbars as eb
from tttr.engine.replay.suite_runs import SuiteRun
from tttr.engine.replay.suite_stats import SuiteStats, stats_of
from tttr.engine.replay.variance import CONDITIONS, Interval
from tttr.sessions.errors import TTTRError

DELTAS = (0.05, 0.1, 0.2)  # the differences whose power is reported by default


@dataclass(frozen=True, slots=True)
class Side:
    """One of the two suites: where it came from and its runs."""

    name: str  # how the user named it (a file, a label, a suite id)
    suite_id: str
    label: str | None
    runs: tuple[SuiteRun, ...]


@dataclass(frozen=True, slots=True)
class TaskDiff:
    task: str
    runs_a: int
    passed_a: int
    runs_b: int
    passed_b: int
    diff: float
    interval: Interval  # Newcombe's, from the two Wilson intervals
    run_pairs: int  # runs matched by seed and start tree

    def to_json(self) -> dict:
        return {"task": self.task, "runs_a": self.runs_a, "passed_a": self.passed_a, "runs_b": self.runs_b,
                "passed_b": self.passed_b, "pass_rate_a": self.passed_a / self.runs_a,
                "pass_rate_b": self.passed_b / self.runs_b, "difference": self.diff,
                "interval_95": [self.interval.low, self.interval.high], "run_pairs": self.run_pairs}


@dataclass(frozen=True, slots=True)
class Best:
    """The overall difference A - B to read first, and how it was estimated."""

    how: str
    mean: float
    interval: Interval
    n: int
    se: float | None  # None: an interval not built from a standard error (one task's Newcombe)


@dataclass(frozen=True, slots=True)
class Comparison:
    a: Side
    b: Side
    tasks: list[TaskDiff]
    only_a: list[str]
    only_b: list[str]
    mean_a: eb.Estimate          # pass rate, SE clustered by task
    mean_b: eb.Estimate
    naive_se_a: float
    naive_se_b: float
    unpaired: eb.Estimate        # A - B, clustered SEs combined
    naive_unpaired_se: float
    by_task: eb.Estimate | None  # A - B paired by task
    by_run: eb.Estimate | None   # A - B paired by run (seed and start tree equal), clustered by task
    pass_at_k: list[tuple[int, float, float]]  # (k, A, B)
    pass_hat_k: list[tuple[int, float, float]]
    stats_a: SuiteStats
    stats_b: SuiteStats
    power: list[eb.Power]

    @property
    def best(self) -> Best:
        """The overall difference to read first. With one task, that task's Newcombe interval
        (a standard error clustered by task needs two clusters at least); else paired by run
        when every shared run pairs, else paired by task."""
        if len(self.tasks) == 1:
            t = self.tasks[0]
            return Best("one task: Newcombe's interval", t.diff, t.interval, t.runs_a + t.runs_b, None)
        total = sum(min(t.runs_a, t.runs_b) for t in self.tasks)
        if self.by_run is not None and self.by_run.n == total:
            how, e = "paired by run", self.by_run
        else:
            how, e = "paired by task", self.by_task
        return Best(how, e.mean, e.interval, e.n, e.se)

    def to_json(self) -> dict:
        def side(s: Side, st: SuiteStats) -> dict:
            agree = {c: st.overall.by_condition[c].agreement.fraction if c in st.overall.by_condition else None
                     for c in CONDITIONS}
            return {"name": s.name, "suite": s.suite_id, "label": s.label, "agreement": agree,
                    "decomposition": st.overall.decomposition.to_json()}

        best = self.best
        return {
            "a": side(self.a, self.stats_a), "b": side(self.b, self.stats_b),
            "condition": "free", "tasks": [t.to_json() for t in self.tasks],
            "only_in_a": self.only_a, "only_in_b": self.only_b,
            "pass_rate_a": {**self.mean_a.to_json(), "naive_se": self.naive_se_a},
            "pass_rate_b": {**self.mean_b.to_json(), "naive_se": self.naive_se_b},
            "difference": {"best": best.how, "mean": best.mean, "se": best.se, "n": best.n,
                           "interval_95": [best.interval.low, best.interval.high],
                           "unpaired": {**self.unpaired.to_json(), "naive_se": self.naive_unpaired_se},
                           "paired_by_task": self.by_task.to_json() if self.by_task else None,
                           "paired_by_run": self.by_run.to_json() if self.by_run else None},
            "pass_at_k": [{"k": k, "a": x, "b": y} for k, x, y in self.pass_at_k],
            "pass_hat_k": [{"k": k, "a": x, "b": y} for k, x, y in self.pass_hat_k],
            "power": [p.to_json() for p in self.power],
        }


class ComparisonError(TTTRError, ValueError):
    pass


def _scores(runs: list[SuiteRun]) -> dict[str, list[SuiteRun]]:
    by: dict[str, list[SuiteRun]] = {}
    for r in sorted(runs, key=lambda r: (r.task, r.index, r.run_id)):
        if r.condition == "free" and r.status == "complete":
            by.setdefault(r.task, []).append(r)
    return by


def _run_pairs(ra: list[SuiteRun], rb: list[SuiteRun]) -> list[tuple[float, float]]:
    """Runs of one task with the same index, seed and start tree in both suites."""
    index = {(r.index, r.seed, r.start_tree): r for r in rb if r.seed is not None and r.start_tree}
    pairs = []
    for r in ra:
        other = index.get((r.index, r.seed, r.start_tree))
        if other is not None and r.seed is not None and r.start_tree:
            pairs.append((float(r.passed is True), float(other.passed is True)))
    return pairs


def compare(a: Side, b: Side, deltas: tuple[float, ...] = DELTAS) -> Comparison:
    """The comparison of two suites' free runs; ComparisonError when they share no task."""
    fa, fb = _scores(list(a.runs)), _scores(list(b.runs))
    shared = sorted(set(fa) & set(fb))
    if not shared:
        raise ComparisonError(
            f"the suites share no task with complete free runs ({a.name}: {', '.join(sorted(fa)) or 'none'}; "
            f"{b.name}: {', '.join(sorted(fb)) or 'none'}): compare suites of the same tasks")
    sa = {t: [float(r.passed is True) for r in fa[t]] for t in shared}
    sb = {t: [float(r.passed is True) for r in fb[t]] for t in shared}
    pairs = {t: _run_pairs(fa[t], fb[t]) for t in shared}
    tasks = []
    for t in shared:
        na, ca, nb, cb = len(sa[t]), int(sum(sa[t])), len(sb[t]), int(sum(sb[t]))
        d, iv = eb.newcombe(ca, na, cb, nb)
        tasks.append(TaskDiff(t, na, ca, nb, cb, d, iv, len(pairs[t])))
    kmax = min(min(len(sa[t]), len(sb[t])) for t in shared)
    counts_a = {t: (len(sa[t]), int(sum(sa[t]))) for t in shared}
    counts_b = {t: (len(sb[t]), int(sum(sb[t]))) for t in shared}
    at_k = [(k, eb.mean_over_tasks(counts_a, k, eb.pass_at_k), eb.mean_over_tasks(counts_b, k, eb.pass_at_k))
            for k in range(1, kmax + 1)]
    hat_k = [(k, eb.mean_over_tasks(counts_a, k, eb.pass_hat_k), eb.mean_over_tasks(counts_b, k, eb.pass_hat_k))
             for k in range(1, kmax + 1)]
    all_a, all_b = [s for t in shared for s in sa[t]], [s for t in shared for s in sb[t]]
    naive_a, naive_b = eb.naive_se(all_a), eb.naive_se(all_b)
    shared_set = set(shared)
    return Comparison(
        a=a, b=b, tasks=tasks, only_a=sorted(set(fa) - set(fb)), only_b=sorted(set(fb) - set(fa)),
        mean_a=eb.mean_estimate(sa), mean_b=eb.mean_estimate(sb), naive_se_a=naive_a, naive_se_b=naive_b,
        unpaired=eb.unpaired(sa, sb), naive_unpaired_se=(naive_a ** 2 + naive_b ** 2) ** 0.5,
        by_task=eb.paired_by_task(sa, sb), by_run=eb.paired_by_run(pairs),
        pass_at_k=at_k, pass_hat_k=hat_k,
        stats_a=stats_of(a.suite_id, [r for r in a.runs if r.task in shared_set]),
        stats_b=stats_of(b.suite_id, [r for r in b.runs if r.task in shared_set]),
        power=[p for p in (eb.runs_needed(sa, sb, d) for d in deltas) if p is not None],
    )
