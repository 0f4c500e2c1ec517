"""Each API call recorded as a run in a session database, off the serving path.

The server hands a finished call to `CallRecorder.record` (a queue put); one writer thread
owns the store and writes each call as one step in one transaction. Calls that carry the
same run name (`X-TTTR-Run: NAME`) are steps 0, 1, 2, … of one run, finished when the
server stops; a call without a name is a run of its own.

A call's events are the built-in agent's kinds at step S (the call's index in its run):
`S:prompt` (the prompt's token ids and their digest, plus the request as received, its
sampling parameters and the seed: what a replay needs to run the call again), then per
position `S:token:P` and `S:logits:P`, then `S:message` (text, finish reason, tool calls).
Draws are at RNG coordinates (seed, 0, P) whatever S is: a call's randomness does not
depend on how many calls came before it.

A proxied call (`tttr serve --upstream URL`, see `proxy.py`) is recorded at the token layer
only: `S:prompt` (the request, the body sent upstream, the seed; no ids), `S:token:P` with
`"upstream": true` (text, the upstream's logprob and top_logprobs, bytes, and an id from the
local tokenizer with its `id_source`), `S:message` (text, finish reason, tool calls, and the
upstream's model, system_fingerprint and usage); never `S:logits:P`. Its run's model_id is
the upstream's model name, its kernel_mode is null, and its fingerprint and meta say
`served_by` (upstream URL, model, system_fingerprint) and `"tensor": "not recorded"`.

An SDK event (`tttr.recorders.sdk`, posted to `/tttr/v1/tool` or `/tttr/v1/clock`) is a step
of its own in the named run: `S:tool` or `S:clock`, numbered with the run's model calls in
the order the server receives them. A step per event keeps every site printable and
forkable in the existing grammar (`3:tool`), and a replay that makes the same calls in the
same order meets the same sites; numbering events within a model call's step would instead
tie a tool's site to the call before it. A run's outcome counts `calls` (model calls) and
`sdk_events`.

Each step written is timed (`Store.time_step`, beside the events, never one): a model call's
`model_ms` (from its start in the engine to its end; a proxied call's from its sending
upstream to the end of its answer), an SDK tool's `tool_ms` (the duration
the SDK measured), and `wait_ms`, the time since the run's previous step ended (the
client's own time; from `start_clock` for the first, else none), all on perf_counter."""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tttr.engine.replay.events import ids_digest
from tttr.sessions.records import token_value
from tttr.sessions.store import Store
from tttr.sessions.timings import ms, seconds_ms
from tttr.sessions.vocabulary import site

if TYPE_CHECKING:  # torch is not needed to replay or read a recording
    from tttr.engine.inference.sampler import SamplingParams

RECORDED_TOPK = 5  # alternatives kept per position, as the agent records them (more when a call asked for more)


@dataclass(frozen=True, slots=True)
class CallRecord:
    """Everything recorded of one call."""

    name: str | None  # the X-TTTR-Run name, or None for a run of its own
    endpoint: str  # "chat" | "completion"
    request: dict  # the body as received
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    seed_drawn: bool
    max_tokens: int
    stop: tuple[str, ...]
    records: list  # TokenRecords, in order
    text: str
    finish_reason: str
    tool_calls: list = field(default_factory=list)  # OpenAI tool_call objects
    response_id: str = ""
    top_logprobs: int = 0
    pieces: tuple[int, ...] | None = None  # a streamed answer's text pieces as sent (their lengths)
    clock: dict | None = None  # a recorded program's clock as the call was asked (S:clock, before S:prompt)
    stop_sequence: str | None = None  # the `stop` string that ended the text, if one did


@dataclass(frozen=True, slots=True)
class SDKEvent:
    """A value the program got from outside the model, posted by the SDK."""

    name: str  # the run
    kind: str  # "tool" | "clock"
    value: dict  # checked by engine.serve.sdk_events
    at: float | None = None  # perf_counter when it was posted


@dataclass(frozen=True, slots=True)
class CopiedStep:
    """A recorded step's events written again as the next step of a run (a replay answering
    from the recording): (kind, position or None, value) each."""

    name: str
    events: list
    at: float | None = None  # perf_counter when it was handed over


@dataclass(frozen=True, slots=True)
class RunStarts:
    """The named run's program starts (`CallRecorder.start_clock`): its first wait counts from `at`."""

    name: str
    at: float


class CallRecorder:
    def __init__(self, db_path, service, *, default_run: str | None = None):
        self.store = Store.open(db_path)  # a bad file is refused here, before serving
        self.service = service
        self.default_run = default_run  # the name of calls without X-TTTR-Run (a recorded program's run)
        self._adopted: set[str] = set()
        self._queue: queue.Queue[CallRecord | None] = queue.Queue()
        self._named: dict[str, list[int]] = {}  # name -> [run id, next step]
        self._sdk_steps: dict[str, int] = {}  # name -> how many of its steps are SDK events
        # sites a fork's child shares with its parent (the prefix before the fork site): not written again
        self.shared: set[str] = set()
        self.recorded = 0
        self.failed = 0
        self.posted: dict[str, int] = {}  # SDK events posted by kind (in a replay: values obtained live)
        # A recorded program's clock (recorders.logicalclock.ClockShare.event): read as each call is handed over
        self.program_clock = None
        self._ended: dict[str, float] = {}  # name -> perf_counter when its last step ended (the writer's)
        self._thread = threading.Thread(target=self._loop, name="tttr-serve-recorder", daemon=True)
        self._thread.start()

    def record(self, call, *, name: str | None, response_id: str) -> None:
        """Record a started call once it finishes (or is cancelled); returns at once."""
        clock = self.program_clock() if self.program_clock is not None else None
        ended: list[float] = []  # when the engine finished it (its future's callback)
        call.future.add_done_callback(lambda _: ended.append(time.perf_counter()))
        self._queue.put((call, name if name is not None else self.default_run, response_id, clock, ended))

    def adopt(self, name: str, run_id: int, first_step: int = 0) -> None:
        """Calls named `name` become steps first_step, first_step + 1, … of `run_id`, a run the
        caller began on `self.store` and finishes itself (close() leaves it as it is)."""
        self._named[name] = [run_id, first_step]
        self._adopted.add(name)

    def record_event(self, name: str, kind: str, value: dict) -> None:
        """Record an SDK event (kind "tool" or "clock") as the next step of the run named
        `name`; returns at once. The server hands events over in the order they arrive, model
        calls included, so a program's steps are numbered in the order it made them."""
        self.posted[kind] = self.posted.get(kind, 0) + 1
        self._queue.put(SDKEvent(name, kind, value, time.perf_counter()))

    def record_copy(self, name: str, events: list) -> None:
        """Write `events` ((kind, position or None, value) each) as the next step of the run
        named `name`; returns at once."""
        self._queue.put(CopiedStep(name, list(events), time.perf_counter()))

    def record_proxied(self, call) -> None:
        """Record a proxied call (a `proxy.ProxiedCall`, complete or cut off); returns at once."""
        call.ended = time.perf_counter()
        self._queue.put(call)

    def start_clock(self, name: str) -> None:
        """The run named `name` starts now (its program starts): its first step's wait counts
        from here. Call it before the run's first step is handed over."""
        self._queue.put(RunStarts(name, time.perf_counter()))

    def last_ended(self, name: str) -> float | None:
        """perf_counter when the run's last step written so far ended (call `flush()` first)."""
        return self._ended.get(name)

    def steps(self, name: str) -> int:
        """How many steps the run named `name` has so far, model calls and SDK events
        together: the next free step (call `flush()` first)."""
        entry = self._named.get(name)
        return entry[1] if entry is not None else 0

    def flush(self) -> None:
        """Wait until every call handed over so far is written."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, finish the named runs, close the database."""
        self._queue.put(None)
        self._thread.join()
        for name, (run_id, steps) in self._named.items():
            if name not in self._adopted:
                sdk = self._sdk_steps.get(name, 0)
                self.store.finish_run(run_id, status="complete",
                                      outcome={"calls": steps - sdk, **({"sdk_events": sdk} if sdk else {})})
        self._named.clear()
        self.store.close()

    # -- the writer thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if isinstance(item, RunStarts):
                    self._ended[item.name] = item.at
                    continue  # not a step: neither recorded nor failed
                if isinstance(item, tuple):
                    call, ended = item[0], item[4]
                    self._write(self._collect(*item[:4]), call.started, ended[0] if ended else time.perf_counter())
                elif isinstance(item, SDKEvent):
                    self._write_event(item)
                elif isinstance(item, CopiedStep):
                    self._write_copy(item)
                else:
                    self._write_proxied(item)
                self.recorded += 1
            except Exception as exc:  # noqa: BLE001 - a failed write must not stop serving
                self.failed += 1
                print(f"tttr serve: could not record a call: {exc}", file=sys.stderr)
            finally:
                self._queue.task_done()

    def _collect(self, call, name: str | None, response_id: str, clock: dict | None = None) -> CallRecord:
        """Wait for the call to end (a cancelled one ends at the engine's next step)."""
        from tttr.engine.serve.responses import output, stream_pieces

        try:
            call.future.result()
        except Exception:  # noqa: BLE001 - cancelled or failed: record what it produced
            pass
        out = output(call, self.service.tokenizer, cancelled=call.cancelled.is_set())
        if call.seq.finish_reason == "error" and not call.cancelled.is_set():
            out = replace(out, finish_reason="error")
        p, req = call.prepared, call.prepared.request
        pieces = None
        if req.stream and p.tool_format is None:  # a call with tools sends its text at the end, in one piece
            pieces = tuple(stream_pieces(self.service.tokenizer, [r.token_id for r in call.seq.records], req.stop))
            if sum(pieces) != len(out.text):  # (cut short by a cancel: the pieces are not the text's)
                pieces = None
        return CallRecord(
            name=name, endpoint=req.endpoint, request=req.body, prompt_ids=p.prompt_ids, sampling=call.seq.sampling,
            seed_drawn=p.seed_drawn, max_tokens=p.max_tokens, stop=req.stop, records=list(call.seq.records),
            text=out.text, finish_reason=out.finish_reason,
            tool_calls=[c.to_json(f"call_{response_id[-12:]}_{i}") for i, c in enumerate(out.tool_calls)],
            response_id=response_id, top_logprobs=req.top_logprobs, pieces=pieces, clock=clock,
            stop_sequence=out.stop_sequence,
        )

    def _begin(self, call: CallRecord) -> tuple[int, int]:
        return self._begin_run(call.name, dict(
            task=call.name or f"api:{call.endpoint}", model_id=self.service.model_id, kernel_mode=self.service.kernel_mode,
            sampling={k: v for k, v in call.sampling.to_json().items() if k != "seed"}, seed=call.sampling.seed,
            fingerprint=self.service.fingerprint, meta={"source": "tttr serve", "name": call.name, "endpoint": call.endpoint},
        ))

    def _begin_run(self, name: str | None, columns: dict) -> tuple[int, int]:
        """(run id, step) of a call: a new run, or the next step of the run named `name`."""
        if name is not None and name in self._named:
            entry = self._named[name]
            entry[1] += 1
            return entry[0], entry[1] - 1
        run_id = self.store.begin_run(**columns)
        if name is not None:
            self._named[name] = [run_id, 1]
        return run_id, 0

    def _timed(self, run_id: int, step: int, name: str | None, started: float, ended: float,
               model_ms: float | None = None, tool_ms: float | None = None) -> None:
        """Store what the step took; `started`..`ended` on perf_counter, the wait counted
        from the end of the run's previous step."""
        before = self._ended.get(name) if name is not None else None
        wait = seconds_ms(started - before) if before is not None else None
        self.store.time_step(run_id, step, model_ms=model_ms, tool_ms=tool_ms, wait_ms=wait)
        if name is not None:
            self._ended[name] = max(ended, before or ended)

    def _finish(self, run_id: int, name: str | None, finish_reason: str | None) -> None:
        if name is None:
            status = "incomplete" if finish_reason == "cancelled" else "complete"
            self.store.finish_run(run_id, status=status, outcome={"finish_reason": finish_reason})
        else:
            self.store.commit_step(run_id)

    def _write_event(self, event: "SDKEvent") -> None:
        s = self.service
        run_id, step = self._begin_run(event.name, dict(
            task=event.name, model_id=s.model_id if s is not None else None,
            kernel_mode=s.kernel_mode if s is not None else None, fingerprint=s.fingerprint if s is not None else None,
            meta={"source": "tttr serve", "name": event.name, "endpoint": "sdk"},
        ))
        self._sdk_steps[event.name] = self._sdk_steps.get(event.name, 0) + 1
        value = event.value
        if event.kind == "tool":  # a large output is a blob, as the built-in agent's commands store it
            from tttr.engine.replay.events import stored_text

            value = {**value, **{k: stored_text(self.store, value[k]) for k in ("stdout", "stderr")
                                 if isinstance(value.get(k), str)}}
        self.store.append(run_id, site(step, event.kind), value)
        self.store.commit_step(run_id)
        if event.at is not None:
            tool = ms(event.value.get("duration_ms")) if event.kind == "tool" else None
            # the tool ran in the program just before it posted: its time is not the program's wait
            self._timed(run_id, step, event.name, event.at - (tool or 0.0) / 1000, event.at, tool_ms=tool)

    def _write_copy(self, item: CopiedStep) -> None:
        if item.name not in self._named:
            raise ValueError(f"no run named {item.name!r} to copy a step into (adopt it first)")
        run_id, step = self._begin_run(item.name, {})
        for kind, pos, value in item.events:
            if site(step, kind, pos) not in self.shared:
                self.store.append(run_id, site(step, kind, pos), value)
        self.store.commit_step(run_id)
        if item.at is not None:
            self._timed(run_id, step, item.name, item.at, item.at)

    def _write_proxied(self, call) -> None:
        plan = call.plan
        served_by = call.served_by()
        sampling = {k: plan.request[k] for k in ("temperature", "top_p", "top_k")
                    if type(plan.request.get(k)) in (int, float) and plan.request[k] >= 0}
        run_id, step = self._begin_run(call.name, dict(
            task=call.name or f"api:{plan.endpoint}", model_id=call.model, kernel_mode=None, sampling=sampling,
            seed=plan.seed, fingerprint={"served_by": "upstream", **served_by},
            meta={"source": "tttr serve", "name": call.name, "endpoint": plan.endpoint, "served_by": served_by,
                  "tensor": "not recorded"},
        ))
        store = self.store

        def emit(kind: str, value, pos: int | None = None) -> None:
            store.append(run_id, site(step, kind, pos), value)

        usage = call.usage or {}
        counted = {"n_tokens": usage["prompt_tokens"]} if type(usage.get("prompt_tokens")) is int else {}
        emit("prompt", {
            **counted, "endpoint": plan.endpoint, "request": plan.request, "sent": plan.sent, "sampling": {**sampling, "seed": plan.seed},
            "seed_drawn": plan.seed_drawn, "response_id": call.response_id, "upstream": served_by["upstream"],
        })
        for p, value in enumerate(call.token_values()):
            emit("token", value, p)
        message = {"text": call.text, "finish_reason": call.finish_reason, "tool_calls": call.tool_calls,
                   "upstream": True, "model": call.model, "system_fingerprint": call.system_fingerprint,
                   "usage": call.usage}
        if call.stop_sequence is not None:  # only then: other calls' messages are stored as before
            message["stop_sequence"] = call.stop_sequence
        emit("message", message)
        self._finish(run_id, call.name, call.finish_reason)
        if call.started is not None and call.ended is not None:  # the upstream's time for the call
            self._timed(run_id, step, call.name, call.started, call.ended,
                        model_ms=seconds_ms(call.ended - call.started))

    def _write(self, call: CallRecord, started: float | None = None, ended: float | None = None) -> None:
        run_id, step = self._begin(call)
        store = self.store

        def emit(kind: str, value, pos: int | None = None) -> None:
            if site(step, kind, pos) not in self.shared:
                store.append(run_id, site(step, kind, pos), value)

        if call.clock is not None:
            emit("clock", call.clock)
        emit("prompt", {
            "ids_digest": ids_digest(call.prompt_ids), "n_tokens": len(call.prompt_ids), "ids": list(call.prompt_ids),
            "endpoint": call.endpoint, "request": call.request, "sampling": call.sampling.to_json(),
            "seed_drawn": call.seed_drawn, "max_tokens": call.max_tokens, "stop": list(call.stop),
            "response_id": call.response_id,
        })
        k = max(RECORDED_TOPK, call.top_logprobs)
        for r in call.records:
            emit("token", token_value(r.token_id, r.text, bool(r.forced), float(r.logprob), r.rng), r.position)
            emit("logits", {"digest": r.digest, "topk": [[int(i), float(lp)] for i, lp in r.topk[:k]],
                            "batch": [r.batch_rows, list(r.rows)], "mode": r.kernel_mode}, r.position)
        message = {"text": call.text, "finish_reason": call.finish_reason, "tool_calls": call.tool_calls}
        if call.pieces is not None:
            message["pieces"] = list(call.pieces)
        if call.stop_sequence is not None:  # only then: other calls' messages are stored as before
            message["stop_sequence"] = call.stop_sequence
        emit("message", message)
        self._finish(run_id, call.name, call.finish_reason)
        if started is not None and ended is not None:
            self._timed(run_id, step, call.name, started, ended, model_ms=seconds_ms(ended - started))
