"""A suite's statistics: per task and overall, each condition's pass rate and agreement, and
the decomposition of the free condition's disagreement by layer (the arithmetic is
`variance.py`'s; the runs are read by `suite_runs.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from tttr.engine.replay.suite_runs import SuiteError, SuiteRun, suite_ids, suite_runs
from tttr.engine.replay.variance import CONDITIONS, Decomposition, Outcomes, decompose, outcomes


@dataclass(frozen=True, slots=True)
class TaskStats:
    task: str  # or "overall"
    by_condition: dict[str, Outcomes]
    decomposition: Decomposition


@dataclass(frozen=True, slots=True)
class SuiteStats:
    suite_id: str
    tasks: list[TaskStats]
    overall: TaskStats
    left_out: int  # runs of the suite that are not complete

    def to_json(self) -> dict:
        def task_json(t: TaskStats) -> dict:
            conds = {}
            for c, o in t.by_condition.items():
                iv = o.interval
                conds[c] = {"runs": o.runs, "passed": o.passed, "pass_rate": o.pass_rate,
                            "pass_interval_95": [iv.low, iv.high] if iv else None,
                            "pairs": o.agreement.pairs, "agreeing_pairs": o.agreement.agreeing,
                            "agreement": o.agreement.fraction, "outcome_agreement": o.verdicts.fraction,
                            "model_call_agreement": o.calls.fraction if o.calls.pairs else None}
            return {"task": t.task, "conditions": conds, "decomposition": t.decomposition.to_json()}

        return {"suite": self.suite_id, "tasks": [task_json(t) for t in self.tasks],
                "overall": task_json(self.overall), "incomplete_runs_left_out": self.left_out,
                "residual_ok": self.overall.decomposition.residual_ok
                and all(t.decomposition.residual_ok for t in self.tasks)}


def suite_stats(store, suite_id: str | None = None) -> SuiteStats:
    """The statistics of one suite of a store (the latest, unless named); SuiteError if the
    store holds none (or not that one)."""
    ids = suite_ids(store)
    if not ids:
        raise SuiteError("the database holds no suite runs: record some with `tttr suite --runs N --db FILE`")
    if suite_id is None:
        suite_id = ids[-1]
    elif suite_id not in ids:
        raise SuiteError(f"no suite {suite_id!r} in the database: it holds {', '.join(ids)}")
    return stats_of(suite_id, suite_runs(store, suite_id))


def stats_of(suite_id: str, runs: list[SuiteRun]) -> SuiteStats:
    """Pass rates, agreement and decomposition per task and overall, from complete runs only."""
    complete = [r for r in runs if r.status == "complete"]
    tasks = sorted({r.task for r in complete})
    per_task = []
    pooled: dict[str, Outcomes] = {}
    for task in tasks:
        by_cond = {}
        for cond in CONDITIONS:
            these = [r for r in complete if r.task == task and r.condition == cond]
            rs = [(r.passed, r.actions) for r in these]
            if rs:
                calls = [r.calls for r in these] if all(r.calls is not None for r in these) else None
                by_cond[cond] = outcomes(rs, calls)
                pooled[cond] = pooled[cond] + by_cond[cond] if cond in pooled else by_cond[cond]
        per_task.append(TaskStats(task, by_cond, decompose(by_cond)))
    overall = TaskStats("overall", pooled, decompose(pooled))
    return SuiteStats(suite_id, per_task, overall, len(runs) - len(complete))
