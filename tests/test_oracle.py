"""The oracle's policy logic, one piece at a time: a scripted stand-in for the model (so each
test controls exactly which tokens come out and counts every call for logits), with the
real store, the real sandbox and a real task."""

import hashlib
from datetime import datetime

import pytest

from tttr.engine.replay.agent import AgentLimits, run_agent
from tttr.engine.replay.oracle import Oracle, Source
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.runtime import Runtime
from tttr.engine.inference.sequence import TokenRecord
from tttr.recorders.sandbox import Executor
from tttr.recorders.tasks import load_task
from tttr.sessions.store import Store

TASK = "write-line"
CLOCK = datetime(2026, 3, 2, 9, 0, 0)


@pytest.fixture(scope="module")
def tokenizer():
    return Runtime().tokenizer


class ScriptedModel:
    """Writes the given message at each step, one token per position, and counts positions."""

    def __init__(self, tokenizer, messages):
        self.tk = tokenizer
        self.messages = messages
        self.positions = 0

    def make_sequence(self, prompt_ids, seed, step, first_position, max_tokens, stops):
        return (prompt_ids, seed, step, first_position)

    def generate(self, seq):
        prompt_ids, seed, step, first = seq
        ids = self.tk.encode(self.messages[min(step, len(self.messages) - 1)])
        out = []
        for pos in range(first, len(ids)):
            digest = hashlib.blake2b(bytes([step, pos]), digest_size=16).hexdigest()
            out.append(TokenRecord(position=pos, token_id=ids[pos], forced=False, logprob=-0.1,
                                   topk=((ids[pos], -0.1), (0, -5.0)), digest=digest, batch_rows=1,
                                   rows=(0,), row=0, kernel_mode="invariant", rng=(seed, step, pos)))
        self.positions += len(out)
        return out


def _oracle(store, tokenizer, model, *, run_id, policy, source=None, mutation=None, fork_seq=0, seed=7):
    return Oracle(store=store, run_id=run_id, task=load_task(TASK), tokenizer=tokenizer,
                  generate=model.generate, make_sequence=model.make_sequence, policy=policy, seed=seed,
                  kernel_mode="invariant", clock_base=CLOCK,
                  executor_factory=lambda tree, seed: Executor(tree, seed=seed),
                  source=source, mutation=mutation, fork_seq=fork_seq, max_steps=3)


def _begin(store, **kw):
    return store.begin_run(task=TASK, model_id="scripted", kernel_mode="invariant",
                           sampling={"temperature": 0.7}, seed=7, fingerprint={}, meta={}, **kw)


SCRIPT = ["echo 'hello world' > greeting.txt\n```", "cat greeting.txt\n```", "done\n```"]


@pytest.fixture()
def recording(tmp_path, tokenizer):
    store = Store.open(tmp_path / "s.db", create=True)
    model = ScriptedModel(tokenizer, SCRIPT)
    run = _begin(store)
    oracle = _oracle(store, tokenizer, model, run_id=run, policy=Policy.record())
    run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
    yield store, run, oracle
    store.close()


def test_recording_is_every_layer_live(recording):
    store, run, oracle = recording
    assert oracle.actions == ["echo 'hello world' > greeting.txt", "cat greeting.txt", "done"]
    assert oracle.commands_run == 2 and oracle.logits_computed > 0
    assert oracle.outcome["passed"] is True
    assert store.event_at(run, "1:tool").value["stdout"].strip() == "hello world"


def test_faithful_replay_takes_every_value_from_the_record(recording, tokenizer):
    store, run, _ = recording
    model = ScriptedModel(tokenizer, ["rm -rf /work\n```"])  # would be wrong if ever asked
    child = _begin(store, parent=run, fork_seq=0)
    oracle = _oracle(store, tokenizer, model, run_id=child, policy=Policy(), source=Source(store, run))
    run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
    assert model.positions == 0 and oracle.commands_run == 0
    assert oracle.divergence is None
    strip = lambda evs: [(e.site, e.value) for e in evs]
    assert strip(store.events(child)) == strip(store.events(run))


def test_freed_token_layer_runs_off_record_commands_live(recording, tokenizer):
    store, run, _ = recording
    model = ScriptedModel(tokenizer, ["echo 'hello world' > greeting.txt\n```", "ls\n```", "done\n```"])
    child = _begin(store, parent=run, fork_seq=0)
    oracle = _oracle(store, tokenizer, model, run_id=child, policy=Policy(frozenset({"token"})),
                     source=Source(store, run), seed=99)
    run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
    assert model.positions > 0
    # Step 0 matched the cassette (same command, same tree, same clock); step 1 did not.
    assert "off_record" not in store.event_at(child, "0:tool").value
    tool1 = store.event_at(child, "1:tool").value
    assert tool1["off_record"] and tool1["cmd"] == "ls" and "greeting.txt" in tool1["stdout"]
    assert oracle.commands_run == 1
    assert oracle.divergence.site == "1:token:0" and oracle.divergence.layer == "token"
    # The RNG coordinates of the freed token layer carry the fresh seed.
    assert store.event_at(child, "0:token:0").value["rng"][0] == 99


def test_a_setup_clock_fork_moves_every_later_clock_with_it(recording, tokenizer):
    """The setup clock is when the run happened: +1d there is +1d at every step (time never
    runs backwards inside the fork), where an edit of one step's clock moves that step alone."""
    from datetime import timedelta

    from tttr.engine.replay.mutation import parse_mutation

    store, run, _ = recording
    mutation = parse_mutation(store, run, "setup:clock", "+1d", tokenizer=tokenizer)
    source = Source(store, run)
    child = _begin(store, parent=run, fork_seq=0, fork_site="setup:clock", mutation=mutation.to_json())
    model = ScriptedModel(tokenizer, ["never asked\n```"])
    oracle = _oracle(store, tokenizer, model, run_id=child, policy=Policy(), source=source, mutation=mutation)
    run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
    clocks = lambda r: [datetime.fromisoformat(e.value["t"]) for e in store.events(r) if e.kind == "clock"]
    parent, forked = clocks(run), clocks(child)
    assert len(forked) == len(parent) >= 3
    assert [f - p for p, f in zip(parent, forked)] == [timedelta(days=1)] * len(parent)
    assert forked == sorted(forked)
    assert oracle.divergence is not None and oracle.divergence.site == "setup:setup"  # the tree was set up a day later


def test_clock_mutation_keeps_later_clocks_pinned_and_shares_the_prefix(recording, tokenizer):
    from tttr.engine.replay.mutation import parse_mutation

    store, run, _ = recording
    mutation = parse_mutation(store, run, "0:clock", "+1d", tokenizer=tokenizer)
    source = Source(store, run)
    fork_seq = source.seq_of("0:clock")
    child = _begin(store, parent=run, fork_seq=fork_seq, fork_site="0:clock", mutation=mutation.to_json())
    model = ScriptedModel(tokenizer, ["never asked\n```"])
    oracle = _oracle(store, tokenizer, model, run_id=child, policy=Policy(), source=source,
                     mutation=mutation, fork_seq=fork_seq)
    run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
    rec_clock = lambda r, s: store.event_at(r, f"{s}:clock").value["t"]
    assert rec_clock(child, 0) == "2026-03-03T" + rec_clock(run, 0)[11:]
    assert rec_clock(child, 1) == rec_clock(run, 1)  # not downstream of the change: still pinned
    # The changed clock made step 0's command run live. Its output was the same, so step 1's
    # context was the recording's again and its tokens came from the record; but the file it
    # wrote carries the new time, so the world before step 1 is not the recording's and the
    # cassette does not answer for it: step 1's command ran live too.
    assert model.positions == 0 and oracle.commands_run == 2
    assert store.event_at(child, "0:tool").value["tree_after"] != store.event_at(run, "0:tool").value["tree_after"]
    assert store.event_at(child, "1:tool").value.get("off_record")
    parent_events = [(e.seq, e.site) for e in store.events(run)]
    child_events = [(e.seq, e.site) for e in store.events(child)]
    assert child_events[:fork_seq] == parent_events[:fork_seq]


def test_a_command_with_a_nul_byte_is_a_failed_tool_call_not_the_end_of_the_run(tmp_path, tokenizer):
    """No shell command line can hold a NUL; a model that writes one gets a failed command back."""
    with Store.open(tmp_path / "nul.db", create=True) as store:
        model = ScriptedModel(tokenizer, ["echo a\x00b > x.txt\n```", "done\n```"])
        run = _begin(store)
        oracle = _oracle(store, tokenizer, model, run_id=run, policy=Policy.record())
        run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
        assert oracle.status == "complete" and store.run(run).status == "complete"
        tool = store.event_at(run, "0:tool")
        assert tool.problem is None and tool.value["cmd"] == "echo a\x00b > x.txt"
        assert tool.value["exit_code"] == 126 and "NUL byte" in tool.value["stderr"]
        assert tool.value["tree_after"] == tool.value["tree_before"] and oracle.commands_run == 0
        assert oracle.actions == ["echo a\x00b > x.txt", "done"]


def test_a_hit_sandbox_limit_is_recorded_with_the_tool_call(tmp_path, tokenizer):
    """A command stopped by the tree's quota says so in the recording, not only on its stderr."""
    from tttr.recorders.sandbox import Limits

    with Store.open(tmp_path / "quota.db", create=True) as store:
        model = ScriptedModel(tokenizer, ["head -c 3000000 /dev/zero > big.bin\n```", "done\n```"])
        run = _begin(store)
        oracle = Oracle(store=store, run_id=run, task=load_task(TASK), tokenizer=tokenizer,
                        generate=model.generate, make_sequence=model.make_sequence,
                        policy=Policy.record(), seed=7, kernel_mode="invariant", clock_base=CLOCK,
                        executor_factory=lambda tree, seed: Executor(tree, seed=seed, limits=Limits(tree_mb=1)),
                        max_steps=3)
        run_agent(oracle, load_task(TASK).instruction, AgentLimits(max_steps=3))
        tool = store.event_at(run, "0:tool")
        assert tool.problem is None and tool.value["exit_code"] != 0
        assert tool.value["limit_hit"] in ("tree-quota", "file-size")
        ok = store.event_at(run, "1:tool")
        assert ok is None or ok.value["limit_hit"] is None


def test_every_prompt_is_rebuilt_from_the_record_and_verified(recording, tokenizer):
    """The prompt's text is not stored; rebuilt from the task, the earlier messages and tool
    results, it encodes to the very ids whose digest the run recorded."""
    from tttr.engine.replay.prompts import prompts

    store, run, _ = recording
    found = prompts(store, run, tokenizer)
    assert [p.step for p in found] == [0, 1, 2] and all(p.verified for p in found)
    assert [p.n_tokens for p in found] == [e.value["n_tokens"] for e in store.events(run) if e.kind == "prompt"]
    assert "greeting.txt" in found[0].text and found[1].text.startswith(found[0].text[:200])
    assert "echo 'hello world' > greeting.txt" in found[1].text and "exit code 0" in found[1].text
    assert "echo 'hello world' > greeting.txt" not in found[0].text.split("Task: ")[-1]


def test_a_prompt_that_does_not_encode_to_its_digest_is_not_verified(recording, tokenizer, tmp_path):
    import shutil
    import sqlite3

    from tttr.engine.replay.prompts import prompts

    store, run, _ = recording
    copy = tmp_path / "copy.db"
    store.close()
    shutil.copyfile(store.path, copy)
    store_digest = None
    with Store.open(copy, readonly=True) as other:
        store_digest = other.event_at(run, "1:prompt").value["ids_digest"]
    with sqlite3.connect(copy) as conn:  # step 1's recorded digest no longer names the ids rebuilt for it
        changed = conn.execute("UPDATE events SET value = replace(CAST(value AS TEXT), ?, ?) WHERE step = 1 AND "
                               "CAST(value AS TEXT) LIKE ?", (store_digest, "0" * 32, f"%{store_digest}%")).rowcount
    assert changed == 1
    with Store.open(copy, readonly=True) as other:
        found = prompts(other, run, tokenizer)
    assert found[0].verified and not found[1].verified and "does not encode" in found[1].note
