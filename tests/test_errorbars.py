"""The statistics of `tttr compare` (issue 30) against values worked out by hand from the
formulas of "Adding Error Bars to Evals" (Miller, 2024), Newcombe (1998), Chen et al. (2021)
and tau-bench; the comparison of two hand-built suites."""

from __future__ import annotations

import math

import pytest

from tttr.engine.replay import errorbars as eb
from tttr.engine.replay.comparison import ComparisonError, Side, compare
from tttr.engine.replay.suite import SuiteRun


def test_naive_and_clustered_standard_errors_by_hand():
    clusters = {"t1": [1, 1, 0], "t2": [0, 0, 0]}
    # mean 1/3; Σ(s - s̄)² = 4/3, so SE_CLT² = (4/3)/5/6 = 2/45
    assert eb.naive_se([1, 1, 0, 0, 0, 0]) == pytest.approx(math.sqrt(2 / 45))
    # cross terms: t1's residuals (2/3, 2/3, -1/3) sum to 1 = Σr², so 0; t2's (-1/3 x3): 1 - 1/3 = 2/3
    assert eb.clustered_se(clusters) == pytest.approx(math.sqrt(2 / 45 + (2 / 3) / 36))  # sqrt(17/270)
    est = eb.mean_estimate(clusters)
    assert est.mean == pytest.approx(1 / 3) and est.n == 6
    assert est.interval.low == pytest.approx(1 / 3 - 1.959964 * math.sqrt(17 / 270), abs=1e-6)
    singletons = {"a": [1], "b": [0], "c": [1]}  # one score per cluster: no cross terms
    assert eb.clustered_se(singletons) == pytest.approx(eb.naive_se([1, 0, 1]))
    with pytest.raises(ValueError):
        eb.clustered_se({})


def test_paired_differences_by_task_and_by_run():
    a = {"t1": [1, 1, 0], "t2": [0, 0, 0]}
    b = {"t1": [1, 0, 0], "t2": [1, 0, 0]}
    by_task = eb.paired_by_task(a, b)  # d = (1/3, -1/3): mean 0, Var 2/9, SE sqrt(2/9 / 2) = 1/3
    assert by_task.mean == pytest.approx(0.0) and by_task.se == pytest.approx(1 / 3) and by_task.n == 2
    assert eb.paired_by_task(a, {"other": [1]}) is None
    by_run = eb.paired_by_run({"t1": [(1, 1), (1, 0), (0, 0)], "t2": [(0, 1), (0, 0), (0, 0)]})
    # per-run differences (0, 1, 0 | -1, 0, 0): mean 0; Σd² = 2, SE_CLT² = 2/5/6; cross: t1 1-1=0, t2 1-1=0
    assert by_run.mean == pytest.approx(0.0) and by_run.se == pytest.approx(math.sqrt(2 / 30)) and by_run.n == 6
    un = eb.unpaired(a, b)
    assert un.mean == pytest.approx(0.0)
    assert un.se == pytest.approx(math.hypot(eb.clustered_se(a), eb.clustered_se(b)))


def test_newcombe_matches_the_published_example():
    d, iv = eb.newcombe(56, 70, 48, 80)  # Newcombe (1998), method 10: 0.2000 (0.0524, 0.3339)
    assert d == pytest.approx(0.2)
    assert iv.low == pytest.approx(0.0524, abs=1e-4) and iv.high == pytest.approx(0.3339, abs=1e-4)
    assert eb.newcombe(0, 0, 1, 1) is None


def test_pass_at_k_and_pass_hat_k():
    assert eb.pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    assert eb.pass_hat_k(5, 2, 2) == pytest.approx(1 / 10)
    assert eb.pass_at_k(4, 0, 3) == 0.0 and eb.pass_hat_k(4, 4, 4) == 1.0
    assert eb.pass_at_k(3, 1, 1) == pytest.approx(1 / 3) == eb.pass_hat_k(3, 1, 1)  # k = 1: the pass rate
    assert eb.mean_over_tasks({"a": (5, 2), "b": (5, 5)}, 2, eb.pass_hat_k) == pytest.approx((0.1 + 1) / 2)
    with pytest.raises(ValueError):
        eb.pass_at_k(3, 1, 4)


def test_power_gives_runs_per_task_or_none():
    a = {"t1": [1, 1, 0, 0], "t2": [1, 1, 1, 1]}
    b = {"t1": [0, 0, 0, 0], "t2": [1, 1, 0, 0]}
    p = eb.runs_needed(a, b, 0.1)
    # σ_A² + σ_B² = mean(.25, 0) + mean(0, .25) = .25; d = (.5, .5): ω² = 0;
    # K = .25 / (2 x .01 / (1.959964 + 0.841621)²) = 98.1 -> 99
    assert p.within_var == pytest.approx(0.25) and p.between_var == 0.0 and p.runs_per_task == 99
    assert eb.runs_needed(a, b, 0.2).runs_per_task == 25  # a quarter, rounded up
    spread = eb.runs_needed({"t1": [1, 1], "t2": [0, 0]}, {"t1": [0, 0], "t2": [1, 1]}, 0.1)
    assert spread.between_var == pytest.approx(2.0) and spread.runs_per_task is None  # more tasks, not runs
    with pytest.raises(ValueError):
        eb.runs_needed(a, b, 0.0)


def _run(i, task, index, passed, seed=None, tree=None, actions=()):
    return SuiteRun(i, task, "free", index, "complete", passed, tuple(actions), seed, tree)


def test_compare_two_suites_pairs_runs_by_seed_and_tree():
    a_runs = [_run(1, "x", 0, True, 7, "T"), _run(2, "x", 1, True, 8, "T"), _run(3, "y", 0, False, 9, "U"),
              _run(4, "y", 1, True, 10, "U"), _run(5, "only-a", 0, True)]
    b_runs = [_run(11, "x", 0, False, 7, "T"), _run(12, "x", 1, True, 8, "T"), _run(13, "y", 0, False, 9, "U"),
              _run(14, "y", 1, False, 10, "U")]
    c = compare(Side("A", "sa", "hot", tuple(a_runs)), Side("B", "sb", None, tuple(b_runs)))
    assert [t.task for t in c.tasks] == ["x", "y"] and c.only_a == ["only-a"] and c.only_b == []
    assert [t.run_pairs for t in c.tasks] == [2, 2]
    best = c.best
    assert best.how == "paired by run" and best.mean == pytest.approx(0.5) and best.n == 4
    assert c.mean_a.mean == pytest.approx(0.75) and c.mean_b.mean == pytest.approx(0.25)
    assert c.pass_at_k[1] == (2, pytest.approx(1.0), pytest.approx(0.5))
    assert c.pass_hat_k[1] == (2, pytest.approx(0.5), pytest.approx(0.0))
    data = c.to_json()
    assert data["difference"]["best"] == "paired by run" and data["a"]["label"] == "hot"
    b_other_seeds = [_run(20 + r.run_id, r.task, r.index, r.passed, (r.seed or 0) + 100, r.start_tree) for r in b_runs]
    c2 = compare(Side("A", "sa", None, tuple(a_runs)), Side("B", "sb", None, tuple(b_other_seeds)))
    assert c2.by_run is None and c2.best.how == "paired by task"
    one = compare(Side("A", "sa", None, tuple(a_runs[:2])), Side("B", "sb", None, tuple(b_runs[:2])))
    assert one.best.how.startswith("one task") and one.best.se is None  # no SE from a single cluster
    assert (one.best.interval.low, one.best.interval.high) == (one.tasks[0].interval.low, one.tasks[0].interval.high)
    with pytest.raises(ComparisonError, match="share no task"):
        compare(Side("A", "sa", None, (a_runs[4],)), Side("B", "sb", None, tuple(b_runs)))


def test_power_without_any_variance_is_no_estimate():
    p = eb.runs_needed({"t": [0, 0]}, {"t": [0, 0]}, 0.1)
    assert p.runs_per_task is None and p.within_var == 0 and p.between_var == 0
