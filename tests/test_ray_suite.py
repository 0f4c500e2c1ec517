"""`tttr suite --ray ADDRESS` on a real local Ray cluster of two nodes (ray.cluster_utils.Cluster;
issue 30): the suite's tasks run as Ray tasks, each into a database of its own, merged into the
suite's database; the runs are those of the single-machine suite given the same seed (free
runs take the same actions and verdicts, pinned runs agree 100%); an address that does not
answer is refused in one line before anything is written; a shard whose worker is killed mid-run
is run again and arrives once; `triage` and `bisect --ray` give the local reports, for the
built-in agent and for a recorded program."""

from __future__ import annotations

import pytest

from tttr.app.cli import main
from tttr.sessions.store import Store

ray = pytest.importorskip("ray", reason="Ray is the optional extra tttr[ray] (.ci/install --tests installs it)")
pytestmark = pytest.mark.slow  # a Ray cluster and the default model's runs


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _runs(db) -> dict:
    with Store.open(db, readonly=True, create=False) as store:
        out = {}
        for r in store.runs():
            s = r.meta["suite"]
            tools = [e.value["cmd"] for e in store.events(r.id, kind="tool")]
            out[(r.task, s["condition"], s["index"])] = (r.status, r.seed, r.outcome.get("passed"), tools, r.parent)
        return out


def test_a_suite_over_two_ray_nodes_matches_the_local_suite(cluster, tmp_path, capsys):
    argv = ["suite", "--runs", "2", "--tasks", "write-line,make-dir", "--max-steps", "1", "--seed", "5"]
    assert main([*argv, "--db", str(tmp_path / "ray.db"), "--ray", cluster.address]) == 0
    assert "[16/16]" in capsys.readouterr().err
    assert main([*argv, "--db", str(tmp_path / "local.db")]) == 0
    on_ray, local = _runs(tmp_path / "ray.db"), _runs(tmp_path / "local.db")
    assert set(on_ray) == set(local) and len(on_ray) == 16
    assert all(v[0] == "complete" for v in on_ray.values())
    for key, (_, seed, passed, tools, _) in on_ray.items():
        if key[1] in ("free", "pinned", "token-pinned"):  # same seeds: the same actions and verdicts
            assert (seed, passed, tools) == local[key][1:4], key
    with Store.open(tmp_path / "ray.db", readonly=True, create=False) as store:
        runs = store.runs()
        assert len({r.meta["merged_from"]["db"] for r in runs}) == 2  # one database per shard
        ids = {r.id for r in runs}
        assert all(r.parent in ids for r in runs if r.parent is not None)  # lineage remapped
    assert main(["stats", "--db", str(tmp_path / "ray.db"), "--json"]) == 0
    assert '"residual_ok": true' in capsys.readouterr().out


def test_a_ray_address_that_does_not_answer_is_one_line(tmp_path, capsys):
    db = tmp_path / "never.db"
    assert main(["suite", "--runs", "2", "--tasks", "write-line", "--db", str(db), "--ray", "127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "nothing answers there" in err and err.count("\n") == 1 and not db.exists()


AGENT = '''
import os
from openai import OpenAI

client = OpenAI()
r = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4, temperature=1.0,
                                   messages=[{"role": "user", "content": os.environ["TTTR_TASK_INSTRUCTION"]}])
open("answer.txt", "w").write((r.choices[0].message.content or "-") + "\\n")
'''


def test_a_program_suite_over_ray_and_a_program_no_worker_has(cluster, tmp_path, monkeypatch, capsys):
    task = tmp_path / "tasks" / "say"
    task.mkdir(parents=True)
    (task / "instruction.md").write_text("Say one word.\n")
    (task / "check.sh").write_text("[ -s answer.txt ]\n")
    (tmp_path / "agent.py").write_text(AGENT)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "p.db"
    assert main(["suite", "--tasks-dir", str(tmp_path / "tasks"), "--runs", "2", "--db", str(db), "--ray",
                 cluster.address, "--", "python3", "agent.py"]) == 0
    with Store.open(db, readonly=True, create=False) as store:
        runs = store.runs()
        assert len(runs) == 8 and all(r.status == "complete" and r.outcome["passed"] for r in runs)
        assert {r.meta["suite"]["condition"] for r in runs} == {"free", "token-pinned", "trace-pinned", "pinned"}
    capsys.readouterr()
    assert main(["suite", "--tasks-dir", str(tmp_path / "tasks"), "--runs", "2", "--db", str(tmp_path / "q.db"),
                 "--ray", cluster.address, "--", "no-such-agent-anywhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("tttr: error: on a worker: program 'no-such-agent-anywhere'"), err


SLOW_AGENT = AGENT.replace("open(", "import time\ntime.sleep(1.0)\nopen(", 1)  # a window to be killed in


def _kill_one_shard_worker(seen: list, stop) -> None:
    """Once: SIGKILL the Ray worker process (`ray::run_shard`) that is running the program
    `agent.py` of some shard, mid-run."""
    import psutil

    while not stop.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if not any(a.endswith("agent.py") for a in proc.info["cmdline"] or ()):
                    continue
                worker = next((p for p in proc.parents() if " ".join(p.cmdline()).startswith("ray::run_shard")), None)
            except psutil.Error:
                continue
            if worker is not None:
                seen.append(worker.pid)
                worker.kill()
                return
        stop.wait(0.05)


def test_a_shard_whose_worker_dies_runs_again_and_merges_once(cluster, tmp_path, monkeypatch, capsys):
    import threading

    task = tmp_path / "tasks" / "say"
    task.mkdir(parents=True)
    (task / "instruction.md").write_text("Say one word.\n")
    (task / "check.sh").write_text("[ -s answer.txt ]\n")
    (tmp_path / "agent.py").write_text(SLOW_AGENT)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "d.db"
    killed: list = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_one_shard_worker, args=(killed, stop), daemon=True)
    killer.start()
    try:
        assert main(["suite", "--tasks-dir", str(tmp_path / "tasks"), "--runs", "2", "--db", str(db), "--ray",
                     cluster.address, "--", "python3", "agent.py"]) == 0
    finally:
        stop.set()
        killer.join()
    assert len(killed) == 1  # a worker was killed while its program ran
    err = capsys.readouterr().err
    assert "its worker died" in err and "attempt 2 of 3" in err, err
    with Store.open(db, readonly=True, create=False) as store:
        runs = store.runs()
        keys = [(r.meta["suite"]["task"], r.meta["suite"]["condition"], r.meta["suite"]["index"]) for r in runs]
        assert len(keys) == len(set(keys)) == 8  # every run once: the dead shard's runs are not in it
        assert all(r.status == "complete" and r.outcome["passed"] for r in runs)
        assert len({r.meta["merged_from"]["db"] for r in runs}) == 1  # only the shard that finished was merged
        ids = {r.id for r in runs}
        assert all(r.meta["suite"]["anchor"] in ids for r in runs if r.meta["suite"]["condition"] != "free")


def _count(db) -> int:
    with Store.open(db, readonly=True, create=False) as store:
        return len(store.runs())


def _without_ids(value):
    """A triage's or bisect's report less what names the stored runs (their ids, the batch note)."""
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ("run_id", "batch_note")}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def test_triage_and_bisect_over_ray_give_the_local_reports(cluster, tmp_path, capsys):
    """today-report's BAD run, and GOOD = BAD with its first clock moved (harmless) and its last
    one a day back (the checker then passes): the same experiment here and over two Ray nodes."""
    import json

    from tttr.engine.replay.agent import AgentLimits
    from tttr.engine.replay.runs import fork, record
    from tttr.engine.replay.runtime import Runtime

    db = tmp_path / "t.db"
    runtime = Runtime(kernel_mode="invariant")
    with Store.open(db, create=True) as store:
        bad = record(store, "today-report", runtime=runtime, seed=2, limits=AgentLimits(max_steps=3))
        steps = sorted({e.step for e in store.events(bad.run_id) if e.kind == "tool"})
        moved = fork(store, bad.run_id, f"{steps[0]}:clock", "+1h", runtime=runtime)
        good = fork(store, moved.run_id, f"{steps[-1]}:clock", "-1d", runtime=runtime)
        assert bad.passed is False and good.passed is True
    runtime.close()
    reports = {}
    for verb in ("triage", "bisect"):
        for where in ("here", "ray"):
            before = _count(db)
            extra = ["--ray", cluster.address] if where == "ray" else []
            assert main([verb, str(good.run_id), str(bad.run_id), "--db", str(db), "--json", *extra]) == 0
            reports[verb, where] = json.loads(capsys.readouterr().out)
            with Store.open(db, readonly=True, create=False) as store:
                new = store.runs()[before:]
                report = reports[verb, where]
                tested = {t["run_id"] for t in report["tests"]} if verb == "bisect" else \
                    {r["replay"]["run_id"] for r in report["layers"] if r["replay"]}
                assert {r.id for r in new} == tested  # each replay stored once, under the id the report gives
                assert all(r.status == "complete" and r.parent in (good.run_id, bad.run_id) for r in new)
                assert all(("merged_from" in r.meta) == (where == "ray") for r in new)
        assert _without_ids(reports[verb, "ray"]) == _without_ids(reports[verb, "here"]), verb
        assert "Ray task" in reports[verb, "ray"]["batch_note"]
    assert reports["triage", "ray"]["culprits"] == ["trace"]
    assert [d["site"] for d in reports["bisect", "ray"]["minimal"]] == [f"{steps[-1]}:clock"]
    assert main(["bisect", str(good.run_id), str(bad.run_id), "--db", str(db), "--ray", "127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "nothing answers there" in err and err.count("\n") == 1

    # Stopped as its first round starts (Ctrl-C): no Ray task is started, nothing stored.
    import threading

    from tttr.engine.kinds import ray_tests
    from tttr.engine.replay.bisect import bisect

    stop, before = threading.Event(), _count(db)
    runtime = Runtime(kernel_mode="invariant")
    with Store.open(db, create=False) as store, pytest.raises(KeyboardInterrupt):
        bisect(store, good.run_id, bad.run_id, runtime=runtime, ray=ray_tests(cluster.address), cancel=stop,
               on_round=lambda *_: stop.set())
    runtime.close()
    assert _count(db) == before


def test_a_programs_triage_and_bisect_over_ray_give_the_local_reports(cluster, tmp_path, capsys):
    """tests/test_program_triage.py's pair (an innocent token fork, a planted tool result): each
    replay a program in a sandbox on a Ray worker, the same reports and stored tokens as here."""
    from tests.program_helpers import cli_json
    from tests.test_program_triage import record_pair, stored

    db, good, bad = record_pair(capsys, tmp_path)
    for verb in ("triage", "bisect"):
        here = cli_json(capsys, [verb, str(good), str(bad), "--db", str(db), "--json"])
        there = cli_json(capsys, [verb, str(good), str(bad), "--db", str(db), "--json", "--ray", cluster.address])
        assert _without_ids(there) == _without_ids(here), verb
        assert "Ray task" in there["batch_note"]
        if verb == "bisect":
            assert [d["site"] for d in there["minimal"]] == ["2:tool"]
            pairs = zip(here["tests"], there["tests"])
        else:
            assert there["culprits"] == ["trace"]
            pairs = ((a["replay"], b["replay"]) for a, b in zip(here["layers"], there["layers"]) if a["replay"])
        with Store.open(db, readonly=True) as store:
            for a, b in pairs:  # the same tokens and logits digests, here and on a worker
                assert stored(store, a["run_id"]) == stored(store, b["run_id"])
                assert store.run(b["run_id"]).meta["merged_from"] and store.run(b["run_id"]).status == "complete"
