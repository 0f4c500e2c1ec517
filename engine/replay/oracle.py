"""The oracle: the one object through which the agent loop obtains every value it could
not have predicted — the clock of a step, the result of a tool call, the tokens (and the
logits behind them) of a message — and which writes the new run's events.

It holds a policy (pin or free, per layer), a fork's one mutation or an experiment's set of
them (`MutationSet`), and when replaying, the source recording. Recording is the oracle with every layer free and no source.

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

Each step written is timed (`step_clock.StepClock`): the model's part, the tool's part and
the wait, stored beside the events (`Store.time_step`), never as events.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any, Callable

from tttr.engine.replay.divergence import Divergence, compared_value
from tttr.engine.replay.events import EventLog, ids_digest
from tttr.engine.replay.mutation import Mutation
from tttr.engine.replay.mutations import REQUEST_KEYS, MutationSet
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.source import OracleError, Source
from tttr.engine.replay.step_clock import StepClock
from tttr.engine.replay.tokens import Draws, Tokens
from tttr.engine.replay.world import World
from tttr.sessions.records import Outcome
from tttr.sessions.vocabulary import SETUP_STEP, site

class Oracle:
    """Decides, per value, pin or free — and delegates the rest: numbering and writing the
    events (`EventLog`), the sandbox tree and commands (`World`), generation (`Tokens`)."""

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
        mutation: Mutation | MutationSet | None = None,
        fork_seq: int = 0,
        write: bool = True,
        progress: Callable | None = None,
        cancel: threading.Event | None = None,
        max_steps: int = 6,
        begin: Callable[[], int] | None = None,  # begins the run in the store; called at the first commit
    ):
        self.task = task
        self.tokenizer = tokenizer
        self.policy = policy
        self.seed = seed
        self.kernel_mode = kernel_mode
        self.clock_base = clock_base
        self.source = source
        self.mutation = mutation  # as given (read by the recorded-calls driver)
        self.mutations = MutationSet.of(mutation)
        self.progress = progress
        self.cancel = cancel
        self.max_steps = max_steps
        self.log = EventLog(store, run_id, source=source, fork_seq=fork_seq, write=write, begin=begin)
        self.world = World(store=store, task=task, seed=seed, executor_factory=executor_factory, log=self.log,
                           manifests=source.manifests if source else None)
        self.tokens = Tokens(tokenizer=tokenizer, generate=self._loaded_first(generate), make_sequence=make_sequence,
                             seed=seed, log=self.log)

        self.divergence: Divergence | None = None
        self.actions: list[str] = []
        self.token_ids: list[int] = []
        self.last_message_tokens = 0
        self.outcome: Outcome | None = None
        self.status = "recording"
        self._t0 = time.monotonic()
        self._last_clock: datetime = clock_base
        self._clock_shift = timedelta(0)  # how far a fork of the setup clock moved the run's clock
        self.step_clock = StepClock()  # where each step's wall time went (model, tool, wait)
        self._open_step = SETUP_STEP  # the step the clock is timing

    def _loaded_first(self, generate: Callable) -> Callable:
        """`generate`, loading the model (on first use: seconds) outside the step's model time."""
        warm_up = getattr(generate, "warm_up", None)
        if warm_up is None:
            return generate

        def loaded_then_generate(seq):
            with self.step_clock.not_model():
                warm_up()
            return generate(seq)

        return loaded_then_generate

    # ------------------------------------------------------------------ what the caller reads
    @property
    def run_id(self) -> int | None:
        return self.log.run_id

    @property
    def begun(self) -> bool:
        """Whether the run is in the store (always, unless it was given a `begin` not yet called)."""
        return self.log.begun

    @property
    def commands_run(self) -> int:
        return self.world.commands_run

    @property
    def logits_computed(self) -> int:
        return self.tokens.logits_computed

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    # ------------------------------------------------------------------ comparing with the recording
    def _recorded(self, at: str) -> Any:
        return self.source.value(at) if self.source else None

    def _compare(self, at: str, layer: str, recorded: Any, live: Any, texts=None) -> None:
        """`texts()`: a token's two texts, asked for only when it diverges."""
        if self.divergence is None and self.source is not None and recorded != live:
            self.divergence = Divergence(at, layer, recorded, live, ("recorded", "live"),
                                         texts=texts() if texts else (None, None))

    def _mutated(self, kind: str, step: int) -> Mutation | None:
        return self.mutations.get(kind, step)

    def note(self, step: int, kind: str, value: dict) -> None:
        """A derived value of the agent layer (message, action): recorded, never pinned."""
        at = site(step, kind)
        self.log.emit(at, value)
        if kind == "action":
            self.actions.append("done" if value.get("done") else value.get("cmd", ""))
            recorded = self._recorded(at)
            self._compare(at, "agent", recorded and compared_value("action", recorded),
                          compared_value("action", value))

    # ------------------------------------------------------------------ clock
    def _clock(self, step: int) -> datetime:
        at = site(step, "clock")
        recorded = self._recorded(at)
        mutated = self._mutated("clock", step)
        if mutated:
            self.mutations.took(mutated)
            t = mutated.value
            if step == -1 and recorded is not None:
                # The setup clock is when the run happened: moving it moves every later
                # reading with it (an edit of one step's clock moves that step alone).
                self._clock_shift = t.replace(microsecond=0) - datetime.fromisoformat(recorded["t"])
        elif self.policy.pinned("trace") and recorded is not None:
            t = datetime.fromisoformat(recorded["t"]) + self._clock_shift
        elif self.policy.pinned("trace") and self.source is not None:
            t = self._last_clock + timedelta(seconds=1)  # past the end of the recording
        else:
            t = self.clock_base + timedelta(seconds=round(time.monotonic() - self._t0, 3))
        t = t.replace(microsecond=0)
        self._last_clock = t
        self.log.emit(at, {"t": t.isoformat()})
        if recorded is not None and not mutated:
            self._compare(at, "trace", recorded["t"], t.isoformat())
        return t

    # ------------------------------------------------------------------ trace
    def setup(self) -> None:
        clock = self._clock(-1)
        at = site(-1, "setup")
        recorded = self._recorded(at)
        if self.policy.pinned("trace") and recorded is not None and recorded.get("clock") == clock.isoformat():
            self.world.tree = recorded["tree"]
            value = recorded
        else:
            with self.step_clock.tool():
                value = self.world.set_up(clock)
            if recorded is not None:
                self._compare(at, "trace", recorded.get("tree"), value["tree"])
        value = self._setup_values(value)
        self.log.emit(at, value)
        self.commit(SETUP_STEP)
        self._report(0, "set up")

    def _setup_values(self, value: dict) -> dict:
        """The setup with a fork's new start-tree file or starting variable in it: the tree
        (or the shell) the first step meets is then not the recording's, so what depends on it
        runs live."""
        for name, v in (value.get("exports") or {}).items():  # a replay of such a fork starts as it did
            self.world.start_with(name, v)
        edits = [m for m in (self._mutated("file", -1), self._mutated("env", -1)) if m is not None]
        if not edits:
            return value
        value = dict(value)
        for m in edits:
            self.mutations.took(m)
            if m.site.name == "file":
                value["tree"], value["snapshot"] = self.world.edit_file(m.value["path"], m.value["text"], self._last_clock)
            else:
                value["exports"] = self.world.start_with(m.value["name"], m.value["value"])
        value["mutated"] = ", ".join(str(m.site) for m in edits)
        return value

    def tool(self, step: int, cmd: str) -> dict:
        self._open_step = step
        with self.step_clock.tool():
            return self._tool(step, cmd)

    def _tool(self, step: int, cmd: str) -> dict:
        clock = self._clock(step)
        at = site(step, "tool")
        recorded = self._recorded(at)
        shell = self.world.shell
        value: dict
        mutated = self.mutations.tool(step, {"cmd": cmd, "tree_before": self.world.tree})
        if mutated is not None and recorded is None and not self.mutations.strict:
            mutated = None  # an experiment's delta at a step this run does not reach as recorded
        if mutated is not None:
            if recorded is None:
                raise OracleError(f"site {at} has no recorded tool result to mutate")
            self.mutations.took(mutated)
            value = dict(recorded)
            value.update({k: self.log.text_value(v) if k in ("stdout", "stderr") else v
                          for k, v in mutated.value.items() if k not in REQUEST_KEYS})
            value["mutated"] = True
        elif (self.policy.pinned("trace") and recorded is not None
              and recorded.get("cmd") == cmd and recorded.get("cwd") == shell.cwd
              and recorded.get("exports", {}) == shell.exports
              and recorded.get("tree_before") == self.world.tree
              and self._recorded(site(step, "clock")) == {"t": clock.isoformat()}):
            value = recorded  # cassette hit: no command runs
        elif self.source is not None and self.policy.pinned("trace"):  # a command the source never ran here
            value = self.world.known_answer(step, cmd, clock) or self.world.run(step, cmd, clock)
            value["off_record"] = True
        else:
            value = self.world.run(step, cmd, clock)
        self.world.advance(value)
        self.log.emit(at, value)
        if recorded is not None and not value.get("mutated"):
            self._compare(at, "trace", compared_value("tool", recorded), compared_value("tool", value))
        return {
            "stdout": self.log.text_of(value.get("stdout")),
            "stderr": self.log.text_of(value.get("stderr")),
            "exit_code": value.get("exit_code"),
        }

    # ------------------------------------------------------------------ tokens
    def render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def message(self, step: int, prompt_text: str, max_tokens: int, stops: tuple[str, ...], lead: str = "") -> str:
        """The step's message, generated after `prompt_text`. `lead`: what the prompt ends with
        that the step's message event shows before the generated text (the agent's opening
        fence); a whole answer given with it (`STEP:message`, edited from that event) is taken
        without it."""
        self._open_step = step
        with self.step_clock.model():
            return self._message(step, prompt_text, max_tokens, stops, lead)

    def _message(self, step: int, prompt_text: str, max_tokens: int, stops: tuple[str, ...], lead: str) -> str:
        ids = self.tokenizer.encode(prompt_text)
        digest = ids_digest(ids)
        at = site(step, "prompt")
        self.log.emit(at, {"ids_digest": digest, "n_tokens": len(ids)})
        recorded = self._recorded(at)
        same = recorded is not None and recorded.get("ids_digest") == digest
        if recorded is not None and not same:
            self._compare(at, "agent", recorded.get("ids_digest"), digest)
        return self.tokenizer.decode(self._message_ids(step, ids, same, max_tokens, stops, None, lead))

    def call(self, step: int, prompt: dict, max_tokens: int, stops: tuple[str, ...], draws: Draws) -> list:
        """The token ids of a recorded API call's message. Its prompt is the recording's own
        (`prompt` is its `S:prompt` value, written again as it is), so its context is the
        recording's by construction; `draws` carries the call's seed and sampling. The ids
        are the recorded ones where tokens are pinned (no model, no tokenizer needed), else
        generated from the prompt's token ids."""
        self._open_step = step
        with self.step_clock.model():
            self.log.emit(site(step, "prompt"), prompt)
            same = self.source is not None and self._recorded(site(step, "prompt")) is not None
            return self._message_ids(step, prompt.get("ids"), same, max_tokens, stops, draws, ends_with_stop=False)

    def _message_ids(self, step: int, ids, same: bool, max_tokens: int, stops: tuple[str, ...],
                     draws: Draws | None, lead: str = "", ends_with_stop: bool = True) -> list:
        """The step's token ids. A whole answer (`STEP:message`) ends with the step's first stop
        string where `ends_with_stop` (the agent's closing fence), else with the model's stop
        token (an API call's end of turn)."""
        rec_tokens = self.source.tokens.get(step, []) if same else []
        rec_logits = self.source.logits.get(step, []) if same else []

        whole = self._mutated("message", step)
        if whole is not None and not same and not self.mutations.strict:
            whole = None  # as a token delta: only where the context is the recording's
        if whole is not None:
            if not same:
                raise OracleError(f"cannot replace {whole.site}: the context of step {step} is not the recording's")
            self.mutations.took(whole)
            text = whole.value.removeprefix(lead) if lead else whole.value
            return self._took(self.tokens.whole(step, text, stops if ends_with_stop else (), rec_logits, draws))

        mutated = self._mutated("token", step)
        if mutated is not None and not same and not self.mutations.strict:
            mutated = None  # an experiment's token delta applies only where the context is the recording's
        if same and self.policy.pinned("token") and self.policy.pinned("tensor") and not mutated:
            return self._took(self.tokens.replayed(step, rec_tokens, rec_logits))

        if not isinstance(ids, list):
            raise OracleError(f"step {step} has no prompt token ids recorded: its message cannot be generated")
        forced: list[int] = []
        if mutated:
            if not same:
                raise OracleError(f"cannot mutate {mutated.site}: the context of step {step} is not the recording's")
            self.mutations.took(mutated)
            forced = self.tokens.forced(step, mutated, rec_tokens, rec_logits, draws)
        records = self.tokens.generated(step, ids, forced, max_tokens, stops, draws)
        if same and not mutated:
            for r in records:
                pos = r.position
                rt = rec_tokens[pos] if pos < len(rec_tokens) else None
                rl = rec_logits[pos] if pos < len(rec_logits) else None
                self._compare(site(step, "logits", pos), "tensor", rl and rl.get("digest"), r.digest)
                self._compare(site(step, "token", pos), "token", rt and rt.get("id"), r.token_id,
                              lambda: (rt and rt.get("text"), self.tokens.tokenizer.decode([r.token_id])))
            if len(records) < len(rec_tokens):
                pos = len(records)
                self._compare(site(step, "token", pos), "token", rec_tokens[pos]["id"], None,
                              lambda: (rec_tokens[pos].get("text"), None))
        return self._took(forced + [r.token_id for r in records])

    def _took(self, ids: list) -> list:
        self.token_ids += ids
        self.last_message_tokens = len(ids)
        return ids

    # ------------------------------------------------------------------ lifecycle
    def commit(self, step: int) -> None:
        """Write step `step`'s events and what it took (model, tool, wait)."""
        self.log.commit(step, self.step_clock.lap())

    def _commit_open(self) -> None:
        """Write what is in flight, timing the step the model or a tool last ran for if
        it has not been written yet."""
        if self.step_clock.open:
            self.commit(self._open_step)
        else:
            self.log.commit()

    def step_done(self, step: int) -> None:
        self.commit(step)
        self._report(step + 1, f"step {step}: {self.actions[-1][:60] if self.actions else ''}")

    def _report(self, done: int, message: str) -> None:
        if self.progress is not None:
            self.progress(done, self.max_steps, message)

    def finish(self) -> None:
        last_step = max(len(self.actions) - 1, 0)
        at = site(last_step, "outcome")
        recorded = self.source.outcome() if self.source is not None else None
        clock = self._last_clock
        if (self.policy.pinned("trace") and recorded is not None
                and recorded.get("tree") == self.world.tree and recorded.get("clock") == clock.isoformat()):
            outcome = recorded
        else:
            outcome = Outcome.of(self.world.check(clock))
            if recorded is not None:
                self._compare(at, "trace", recorded.passed, outcome.passed)
        self.outcome = outcome
        self.log.emit(at, outcome.to_json())
        self._commit_open()
        self.status = "complete"
        self.log.finish("complete", outcome)
        self._report(self.max_steps, "passed" if outcome.passed else "failed")
        self.close()

    def complete(self, outcome: dict) -> None:
        """End a run that has no task to check (recorded API calls): complete, with `outcome`."""
        self._commit_open()
        self.outcome = Outcome.of(outcome)
        self.status = "complete"
        self.log.finish("complete", outcome)
        self.close()

    def discard(self) -> None:
        """The run failed before its first step was committed: nothing was written, and
        nothing will be (see `begin`)."""
        self.log.discard()
        self.status = "incomplete"
        self.close()

    def abort(self, reason: str) -> None:
        self._commit_open()
        self.status = "incomplete"
        self.log.finish("incomplete", {"reason": reason})
        self.close()

    def close(self) -> None:
        self.world.close()
