"""The oracle: the one object through which the agent loop obtains every value it could
not have predicted — the clock of a step, the result of a tool call, the tokens (and the
logits behind them) of a message — and which writes the new run's events.

It holds a policy (pin or free, per layer), at most one mutation, and when replaying, the
source recording. Recording is the oracle with every layer free and no source.

- token pinned: while the step's context (its prompt token ids) is identical to the
  recording's, the recorded tokens are taken as they are; once it differs, tokens are
  sampled live with the recorded RNG stream (seed, step, position). token free: a fresh seed.
- tensor pinned: the recorded logits stand (no model compute where tokens are pinned too);
  tensor free: logits are computed live, in whatever batch the position lands in, and the
  token is re-drawn from them with the recorded draw, so a changed logit that changes a
  decision shows up as a divergence of the tensor layer.
- trace pinned: the clock reads the recorded value; a tool call returns the recorded result
  when the command, shell state, clock and tree before it all match the recording (a
  cassette); otherwise it runs live in a sandbox restored to that state and is marked
  off-record. trace free: a live running clock and live execution.

A mutation makes what depends on it live; values that do not depend on it (later clocks,
the RNG stream) stay pinned. In a fork, the events before the fork site are the parent's
and are not written again: the oracle counts them and starts writing at the fork point.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

from tttr.engine import sites
from tttr.engine.replay.diff import compared_value
from tttr.engine.replay.policy import Policy
from tttr.recorders.sandbox import ShellState as SandboxShell
from tttr.recorders.snapshot import restore, snapshot, tree_digest
from tttr.sessions.errors import TTTRError
from tttr.sessions.safe_text import brief

BLOB_THRESHOLD = 1024
UNRUNNABLE_EXIT = 126  # the shell's "cannot execute"
NUL_STDERR = "tttr: the command contains a NUL byte (\\x00), which no shell command line can hold; it was not run\n"


class OracleError(TTTRError, RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Divergence:
    site: str
    layer: str
    recorded: Any
    live: Any

    def describe(self) -> str:
        return f"replay diverged at {self.site} ({self.layer} layer): recorded {brief(self.recorded)}, live {brief(self.live)}"

    def to_json(self) -> dict:
        return {"site": self.site, "layer": self.layer, "recorded": self.recorded, "live": self.live}


@dataclass(frozen=True, slots=True)
class Mutation:
    """One recorded value replaced. `value` is already validated and typed:
    clock -> datetime; tool -> dict of replaced fields; token -> int token id."""

    site: sites.Site
    value: Any
    text: str  # as the user wrote it, for the record

    def to_json(self) -> dict:
        v = self.value.isoformat() if isinstance(self.value, datetime) else self.value
        return {"site": str(self.site), "value": v, "input": self.text}


class Source:
    """A recording being replayed, indexed by site."""

    def __init__(self, store, run_id: int):
        self.store = store
        # Every event decoded and checked: an unreadable one refuses the run here, in one
        # line naming the run and site, before anything is written.
        self.run, self.events = store.load_run(run_id)
        self.by_site = {e.site: e for e in self.events}
        self.tokens: dict[int, list[dict]] = {}
        self.logits: dict[int, list[dict]] = {}
        self.manifests: dict[str, str] = {}
        for e in self.events:
            if e.kind == "token":
                self.tokens.setdefault(e.step, []).append(e.value)
            elif e.kind == "logits":
                self.logits.setdefault(e.step, []).append(e.value)
            elif e.kind in ("setup", "tool") and isinstance(e.value, dict):
                tree = e.value.get("tree_after") or e.value.get("tree")
                if tree and e.value.get("snapshot"):
                    self.manifests[tree] = e.value["snapshot"]

    def value(self, site: str) -> Any:
        e = self.by_site.get(site)
        return None if e is None else e.value

    def seq_of(self, site: str) -> int:
        e = self.by_site.get(site)
        if e is None:
            raise OracleError(f"site {site} does not exist in run {self.run.id}")
        return e.seq


@dataclass(slots=True)
class ShellState:
    cwd: str = "/work"
    exports: dict = field(default_factory=dict)


class Oracle:
    def __init__(
        self,
        *,
        store,
        run_id: int | None,
        task,
        tokenizer,
        generate: Callable,  # generate(Sequence) -> list[TokenRecord]; loads the model on first use
        make_sequence: Callable,  # (prompt_ids, seed, step, first_position, max_tokens, stops) -> Sequence
        policy: Policy,
        seed: int,
        kernel_mode: str,
        clock_base: datetime,
        executor_factory: Callable,  # (tree_dir, seed) -> Executor
        source: Source | None = None,
        mutation: Mutation | None = None,
        fork_seq: int = 0,
        write: bool = True,
        progress: Callable | None = None,
        cancel: threading.Event | None = None,
        max_steps: int = 6,
        begin: Callable[[], int] | None = None,  # begins the run in the store; called at the first commit
    ):
        self.store = store
        self.run_id = run_id
        # With `begin`, the run is begun only when its first step is committed: a run that
        # fails before that (its setup, or a fork's shared prefix) leaves nothing behind.
        self._begin = begin
        self._pending: list[tuple] = []
        self.task = task
        self.tokenizer = tokenizer
        self._generate = generate
        self._make_sequence = make_sequence
        self.policy = policy
        self.seed = seed
        self.kernel_mode = kernel_mode
        self.clock_base = clock_base
        self._executor_factory = executor_factory
        self.source = source
        self.mutation = mutation
        self.fork_seq = fork_seq
        self.write = write
        self.progress = progress
        self.cancel = cancel
        self.max_steps = max_steps

        self.next_seq = 0
        self.divergence: Divergence | None = None
        self.actions: list[str] = []
        self.token_ids: list[int] = []
        self.last_message_tokens = 0
        self.logits_computed = 0
        self.commands_run = 0
        self.outcome: dict | None = None
        self.status = "recording"

        self._t0 = time.monotonic()
        self._last_clock: datetime = clock_base
        self._shell = ShellState()
        self._tree: str | None = None  # digest of the sandbox tree as the run now stands
        self._manifests: dict[str, str] = dict(source.manifests) if source else {}
        self._workdir = Path(tempfile.mkdtemp(prefix="tttr-run-"))
        self._tree_dir: Path | None = None  # materialised tree, if any
        self._tree_dir_digest: str | None = None
        self._executor = None
        self._executor_tree: Path | None = None

    # ------------------------------------------------------------------ events
    def _emit(self, step: int, layer: str, kind: str, site: str, value: Any) -> None:
        seq = self.next_seq
        self.next_seq += 1
        if seq < self.fork_seq:
            # The parent's event, shared by the fork; the prefix is pinned, so it must match.
            if self.source is not None and self.source.events[seq].site != site:
                raise OracleError(
                    f"fork prefix drifted at seq {seq}: parent has {self.source.events[seq].site}, replay has {site}"
                )
            return
        if not self.write:
            return
        if self.run_id is None and self._begin is not None:
            self._pending.append((seq, step, layer, kind, site, value))
            return
        self._append(seq, step, layer, kind, site, value)

    def _append(self, seq: int, step: int, layer: str, kind: str, site: str, value: Any) -> None:
        got = self.store.append(self.run_id, step, layer, kind, site, value)
        if got is not None and got != seq:
            raise OracleError(f"event numbering drifted: store gave seq {got}, oracle expected {seq}")

    @property
    def begun(self) -> bool:
        """Whether the run is in the store (always, unless it was given a `begin` not yet called)."""
        return self.run_id is not None or self._begin is None

    def _begin_now(self) -> None:
        self.run_id = self._begin()
        pending, self._pending = self._pending, []
        for event in pending:
            self._append(*event)

    def note(self, step: int, kind: str, value: dict) -> None:
        """A derived value of the agent layer (message, action): recorded, never pinned."""
        site = f"{step}:{kind}"
        self._emit(step, "agent", kind, site, value)
        if kind == "action":
            self.actions.append("done" if value.get("done") else value.get("cmd", ""))
            recorded = self.source.value(site) if self.source else None
            self._compare(site, "agent", recorded and compared_value("action", recorded),
                          compared_value("action", value))

    def _compare(self, site: str, layer: str, recorded: Any, live: Any) -> None:
        if self.divergence is None and self.source is not None and recorded != live:
            self.divergence = Divergence(site, layer, recorded, live)

    def _commit(self) -> None:
        if self.write and self.next_seq > self.fork_seq:
            if not self.begun:
                self._begin_now()
            self.store.commit_step(self.run_id)

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def _blob(self, text: str) -> Any:
        data = text.encode("utf-8", "surrogateescape")
        if len(data) <= BLOB_THRESHOLD or not self.write:
            return text
        return {"$blob": self.store.put_blob(data), "size": len(data)}

    def _unblob(self, value: Any) -> str:
        if isinstance(value, dict) and "$blob" in value:
            return self.store.get_blob(value["$blob"]).decode("utf-8", "surrogateescape")
        return value or ""

    # ------------------------------------------------------------------ clock
    def _clock(self, step: int) -> datetime:
        site = sites.clock(step)
        m = self.mutation
        recorded = self.source.value(site) if self.source else None
        if m is not None and m.site.name == "clock" and m.site.step == step:
            t = m.value
        elif self.policy.pinned("trace") and recorded is not None:
            t = datetime.fromisoformat(recorded["t"])
        elif self.policy.pinned("trace") and self.source is not None:
            t = self._last_clock + timedelta(seconds=1)  # past the end of the recording
        else:
            t = self.clock_base + timedelta(seconds=round(time.monotonic() - self._t0, 3))
        t = t.replace(microsecond=0)
        self._last_clock = t
        self._emit(step, "trace", "clock", site, {"t": t.isoformat()})
        if recorded is not None and not (m is not None and m.site.name == "clock" and m.site.step == step):
            self._compare(site, "trace", recorded["t"], t.isoformat())
        return t

    # ------------------------------------------------------------------ trace
    def _executor_for(self, tree_dir: Path):
        if self._executor is None or self._executor_tree != tree_dir:
            self._executor = self._executor_factory(tree_dir, self.seed)
            self._executor_tree = tree_dir
        return self._executor

    def _materialise(self) -> Path:
        """The sandbox tree on disk, at the state the run now stands in."""
        if self._tree_dir is not None and self._tree_dir_digest == self._tree:
            return self._tree_dir
        manifest = self._manifests.get(self._tree)
        if manifest is None:
            raise OracleError(f"no snapshot of tree {self._tree} in the recording: cannot restore it")
        dest = self._workdir / f"tree-{self.next_seq}"
        restore(manifest, self.store, dest)
        if self._tree_dir is not None:
            shutil.rmtree(self._tree_dir, ignore_errors=True)
        self._tree_dir, self._tree_dir_digest = dest, self._tree
        return dest

    def _snapshot(self, tree_dir: Path) -> tuple[str, str | None]:
        digest = tree_digest(tree_dir)
        manifest = self._manifests.get(digest)
        if manifest is None and self.write:
            manifest = snapshot(tree_dir, self.store)
            self._manifests[digest] = manifest
        self._tree_dir_digest = digest
        return digest, manifest

    def setup(self) -> None:
        clock = self._clock(-1)
        site = "-1:setup"
        recorded = self.source.value(site) if self.source else None
        if self.policy.pinned("trace") and recorded is not None and \
                recorded.get("clock") == clock.isoformat():
            self._tree = recorded["tree"]
            value = recorded
        else:
            tree_dir = self._workdir / "tree"
            tree_dir.mkdir()
            self.task.setup(tree_dir, self._executor_for(tree_dir), clock)
            self._tree_dir = tree_dir
            digest, manifest = self._snapshot(tree_dir)
            self._tree = digest
            value = {"task": self.task.name, "clock": clock.isoformat(), "tree": digest, "snapshot": manifest}
            if recorded is not None:
                self._compare(site, "trace", recorded.get("tree"), digest)
        self._emit(-1, "trace", "setup", site, value)
        self._commit()
        self._report(0, "set up")

    def tool(self, step: int, cmd: str) -> dict:
        clock = self._clock(step)
        site = sites.tool(step)
        recorded = self.source.value(site) if self.source else None
        before = self._tree
        shell = self._shell
        m = self.mutation
        value: dict
        if m is not None and m.site.name == "tool" and m.site.step == step:
            if recorded is None:
                raise OracleError(f"site {site} has no recorded tool result to mutate")
            value = dict(recorded)
            value.update({k: self._blob(v) if k in ("stdout", "stderr") else v for k, v in m.value.items()})
            value["mutated"] = True
        elif (self.policy.pinned("trace") and recorded is not None
              and recorded.get("cmd") == cmd and recorded.get("cwd") == shell.cwd
              and recorded.get("exports", {}) == shell.exports
              and recorded.get("tree_before") == before
              and self.source.value(sites.clock(step)) == {"t": clock.isoformat()}):
            value = recorded  # cassette hit: no command runs
        else:
            value = self._run_live(step, cmd, clock, before, shell)
            if self.source is not None and self.policy.pinned("trace"):
                value["off_record"] = True
        self._tree = value.get("tree_after", before)
        self._shell = ShellState(value.get("cwd_after", shell.cwd), dict(value.get("exports_after", shell.exports)))
        self._emit(step, "trace", "tool", site, value)
        if recorded is not None and not value.get("mutated"):
            self._compare(site, "trace", compared_value("tool", recorded), compared_value("tool", value))
        return {
            "stdout": self._unblob(value.get("stdout")),
            "stderr": self._unblob(value.get("stderr")),
            "exit_code": value.get("exit_code"),
        }

    def _run_live(self, step: int, cmd: str, clock: datetime, before: str, shell: ShellState) -> dict:
        if "\0" in cmd:
            return self._unrunnable(cmd, before, shell, NUL_STDERR)
        tree_dir = self._materialise()
        ex = self._executor_for(tree_dir)
        res = ex.run(cmd, clock=clock, step=step, state=SandboxShell(cwd=shell.cwd, exports=dict(shell.exports)))
        self.commands_run += 1
        after, manifest = self._snapshot(tree_dir) if self.write else (before, None)
        return {
            "cmd": cmd,
            "cwd": shell.cwd,
            "exports": dict(shell.exports),
            "env": res.env,
            "stdout": self._blob(res.stdout),
            "stderr": self._blob(res.stderr),
            "exit_code": res.exit_code,
            "duration_ms": round(res.duration_ms, 3),
            "stdout_size": res.stdout_size,
            "stderr_size": res.stderr_size,
            "truncated": res.truncated,
            "limit_hit": res.limit_hit,  # timeout, tree-quota, tmp-full, file-size, or None
            "tree_before": before,
            "tree_after": after,
            "snapshot": manifest if after != before else None,
            "cwd_after": res.state_after.cwd,
            "exports_after": dict(res.state_after.exports),
        }

    def _unrunnable(self, cmd: str, before: str, shell: ShellState, stderr: str) -> dict:
        """A command no shell can be given (the model wrote a NUL byte): a failed tool call,
        as a shell reports a command it cannot run, not the end of the run. Nothing ran,
        so the tree and the shell state stay as they were."""
        return {
            "cmd": cmd, "cwd": shell.cwd, "exports": dict(shell.exports), "env": {},
            "stdout": "", "stderr": stderr, "exit_code": UNRUNNABLE_EXIT, "duration_ms": 0.0,
            "stdout_size": 0, "stderr_size": len(stderr.encode()), "truncated": False,
            "tree_before": before, "tree_after": before, "snapshot": None,
            "cwd_after": shell.cwd, "exports_after": dict(shell.exports),
        }

    # ------------------------------------------------------------------ tokens
    def render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def message(self, step: int, prompt_text: str, max_tokens: int, stops: tuple[str, ...]) -> str:
        ids = self.tokenizer.encode(prompt_text)
        digest = hashlib.blake2b(json.dumps(ids).encode(), digest_size=16).hexdigest()
        site = f"{step}:prompt"
        self._emit(step, "agent", "prompt", site, {"ids_digest": digest, "n_tokens": len(ids)})
        recorded = self.source.value(site) if self.source else None
        same = recorded is not None and recorded.get("ids_digest") == digest
        if recorded is not None and not same:
            self._compare(site, "agent", recorded.get("ids_digest"), digest)
        rec_tokens = self.source.tokens.get(step, []) if same else []
        rec_logits = self.source.logits.get(step, []) if same else []

        m = self.mutation
        mutated_here = m is not None and m.site.name == "token" and m.site.step == step
        if same and self.policy.pinned("token") and self.policy.pinned("tensor") and not mutated_here:
            for pos, (tv, lv) in enumerate(zip(rec_tokens, rec_logits)):
                self._emit(step, "token", "token", sites.token(step, pos), tv)
                self._emit(step, "tensor", "logits", sites.logits(step, pos), lv)
            out = [tv["id"] for tv in rec_tokens]
            self.token_ids += out
            self.last_message_tokens = len(out)
            return self.tokenizer.decode(out)

        forced: list[int] = []
        seed = self.seed
        if mutated_here:
            if not same:
                raise OracleError(f"cannot mutate {m.site}: the context of step {step} is not the recording's")
            p = m.site.pos
            for pos in range(p):
                self._emit(step, "token", "token", sites.token(step, pos), rec_tokens[pos])
                self._emit(step, "tensor", "logits", sites.logits(step, pos), rec_logits[pos])
            forced = [tv["id"] for tv in rec_tokens[:p]] + [m.value]
            self._emit(step, "token", "token", sites.token(step, p), {
                "id": m.value, "text": self.tokenizer.decode([m.value]), "forced": True,
                "mutated": True, "logprob": _logprob_of(rec_logits[p], m.value), "rng": [seed, step, p]})
            self._emit(step, "tensor", "logits", sites.logits(step, p), rec_logits[p])

        records = []
        prefix_text = self.tokenizer.decode(forced) if forced else ""
        budget = max_tokens - len(forced)
        stopped = any(s in prefix_text for s in stops) or (forced and forced[-1] in self._stop_ids())
        if budget > 0 and not stopped:
            seq = self._make_sequence(ids + forced, seed, step, len(forced), budget, stops)
            records = self._generate(seq)
            self.logits_computed += len(records)
        for r in records:
            pos = r.position
            tv = {"id": r.token_id, "text": self.tokenizer.decode([r.token_id]), "forced": bool(r.forced),
                  "logprob": round(float(r.logprob), 6), "rng": [seed, step, pos]}
            lv = {"digest": r.digest, "topk": [[int(i), round(float(lp), 6)] for i, lp in r.topk],
                  "batch": [r.batch_rows, list(r.rows)], "mode": r.kernel_mode}
            self._emit(step, "token", "token", sites.token(step, pos), tv)
            self._emit(step, "tensor", "logits", sites.logits(step, pos), lv)
            if same and not mutated_here:
                rt = rec_tokens[pos] if pos < len(rec_tokens) else None
                rl = rec_logits[pos] if pos < len(rec_logits) else None
                self._compare(sites.logits(step, pos), "tensor", rl and rl.get("digest"), lv["digest"])
                self._compare(sites.token(step, pos), "token", rt and rt.get("id"), tv["id"])
        if same and not mutated_here and len(records) < len(rec_tokens):
            pos = len(records)
            self._compare(sites.token(step, pos), "token", rec_tokens[pos]["id"], None)
        out = forced + [r.token_id for r in records]
        self.token_ids += out
        self.last_message_tokens = len(out)
        return self.tokenizer.decode(out)

    def _stop_ids(self) -> tuple[int, ...]:
        return tuple(self.tokenizer.stop_token_ids)  # the ids the engine stops a message on

    # ------------------------------------------------------------------ lifecycle
    def step_done(self, step: int) -> None:
        self._commit()
        self._report(step + 1, f"step {step}: {self.actions[-1][:60] if self.actions else ''}")

    def _report(self, done: int, message: str) -> None:
        if self.progress is not None:
            self.progress(done, self.max_steps, message)

    def finish(self) -> None:
        last_step = max(len(self.actions) - 1, 0)
        site = f"{last_step}:outcome"
        recorded = None
        if self.source is not None:
            recorded = next((e.value for e in reversed(self.source.events) if e.kind == "outcome"), None)
        clock = self._last_clock
        if (self.policy.pinned("trace") and recorded is not None
                and recorded.get("tree") == self._tree and recorded.get("clock") == clock.isoformat()):
            outcome = recorded
        else:
            tree_dir = self._materialise()
            passed, code, output = self.task.check(tree_dir, self._executor_for(tree_dir), clock)
            outcome = {"passed": bool(passed), "checker_exit": int(code), "checker_output": output[-2000:],
                       "tree": self._tree, "clock": clock.isoformat()}
            if recorded is not None:
                self._compare(site, "trace", recorded.get("passed"), outcome["passed"])
        self.outcome = outcome
        self._emit(last_step, "agent", "outcome", site, outcome)
        self._commit()
        self.status = "complete"
        if self.write:
            self.store.finish_run(self.run_id, status="complete", outcome=outcome)
        self._report(self.max_steps, "passed" if outcome["passed"] else "failed")
        self.close()

    def discard(self) -> None:
        """The run failed before its first step was committed: nothing was written, and
        nothing will be (see `begin`)."""
        self._pending.clear()
        self.status = "incomplete"
        self.close()

    def abort(self, reason: str) -> None:
        self._commit()
        if self.write and not self.begun:  # cancelled inside a fork's shared prefix: still a run, incomplete
            self._begin_now()
        self.status = "incomplete"
        if self.write:
            self.store.finish_run(self.run_id, status="incomplete", outcome={"reason": reason})
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)


def _logprob_of(logits_value: dict, token_id: int) -> float | None:
    for i, lp in logits_value.get("topk", []):
        if i == token_id:
            return lp
    return None


