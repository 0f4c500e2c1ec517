"""An agent function that runs in this process (a test's body), served by an in-process server.

A program recorded with `tttr record` runs in the sandbox; a function called from a test runs
here, beside the caller, where no sandbox can hold it. What can be recorded and sealed of it is
what it asks of the outside through HTTP and the SDK: its model calls (OpenAI's chat,
completions and Responses routes, Anthropic's Messages API) and its SDK events (`@sdk.tool`,
`sdk.shell`, `sdk.now()`). Its other effects (files it writes itself, the network, the clock it
reads without the SDK) are neither recorded nor kept from happening.

- `record_calls(db, name, ...)`: an in-process `tttr serve` on a loopback port, the engine here
  (or an upstream) answering, every call recorded into `db` as the steps of one served run named
  `name` (the run a marker finds again by that name, as ids change between recordings).
- `seal_calls(db, run)`: the same port answered from served run `run` of `db`, sealed: no model
  loads, nothing is computed, no SDK tool runs, nothing reaches an upstream. A request is
  answered by the first recorded call not yet answered whose request is equal (a multiset per
  request: a request repeated gets each recorded answer in turn, and calls made concurrently in
  another order still match). The first request that no recorded call answers is the divergence,
  reported against the first recorded call not yet answered (call index, field path, both
  values, as `tttr replay --sealed` reports it); it and every later request get an error in
  place of an answer (HTTP 422 `sealed_replay_miss`; a tool: `SealedReplayMiss`). Recorded steps
  never asked for are reported by `finish()` (fewer calls than recorded is a divergence too).

Either way `env()` is what a client is told: OPENAI_BASE_URL, ANTHROPIC_BASE_URL, their keys,
and the SDK's TTTR_RECORDER_URL / TTTR_RUN / TTTR_REPLAY. The database is opened read-only to
seal: a sealed replay writes nothing."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass

from tttr.engine.program.divergence import call_divergence, in_responses_terms, noting_responses, responses_body
from tttr.engine.program.replay import (  # Divergence and first_request_difference: wherever engine/replay keeps them
    NAMES, Divergence, _response, _Step, first_request_difference, recorded_steps, recorded_tool_answer, request_field,
    sealed_call_answer, sealed_tool_answer,
)
from tttr.engine.replay.calls import is_call_run
from tttr.sessions.errors import TTTRError


class InProcessError(TTTRError):
    """What makes an in-process replay or recording impossible (bad input): one line."""


# ---------------------------------------------------------------------------- the run
def find_run(store, *, run: int | None = None, name: str | None = None):
    """The served run a marker names: `run` by id, or the newest complete served run named
    `name` (its X-TTTR-Run name, or a name given with `tttr rename`), not a replay or a fork."""
    runs = store.runs()
    if run is not None:
        found = next((r for r in runs if r.id == run), None)
        if found is None:
            raise InProcessError(f"run {run} is not in {store.path}: `tttr runs {store.path}` lists its runs")
    else:
        named = [r for r in runs if r.parent is None and r.status == "complete" and is_call_run(r)
                 and name in (r.name, r.task)]
        if not named:
            raise InProcessError(f"no complete run named {name!r} in {store.path}: record it with "
                                 f"`pytest --tttr-db {store.path} --tttr-record` (the model loads)")
        found = max(named, key=lambda r: r.id)
    if not is_call_run(found):
        raise InProcessError(f"run {found.id} is not a run of model calls (recorded by `tttr serve` or a test's "
                             "--tttr-record), so an agent function cannot replay it")
    if found.problem:
        raise InProcessError(f"run {found.id} cannot be replayed: {found.problem}")
    if found.status != "complete":
        raise InProcessError(f"run {found.id} is {found.status}: only complete runs can be replayed")
    return found


def load_steps(store, run) -> list[_Step]:
    """The run's steps in order: model calls ("call", with `S:prompt`), SDK tools and clock reads."""
    _, events = store.load_run(run.id)
    steps = recorded_steps(events)
    if not any(s.kind == "call" for s in steps):
        raise InProcessError(f"run {run.id} has no recorded model call (no S:prompt event): nothing to replay")
    return steps


# ---------------------------------------------------------------------------- the answers
def _value(step: _Step, kind: str) -> dict:
    value = next((e.value for e in step.events if e.kind == kind), None)
    return value if isinstance(value, dict) else {}


class Cassette:
    """A served run's steps as the answers to an in-process function's requests, sealed."""

    def __init__(self, run, steps: list[_Step]):
        self.run, self.steps = run, steps
        self.used = [False] * len(steps)
        self.calls = 0  # model calls asked so far (the call index)
        self.answered = 0
        self.divergence: Divergence | None = None
        self.detail: dict | None = None  # where, for a machine: call, step, at, field, recorded, requested
        self._lock = threading.Lock()

    def _next(self, kind: str) -> int | None:
        """The first recorded step of `kind` not yet answered."""
        return next((i for i, s in enumerate(self.steps) if not self.used[i] and s.kind == kind), None)

    def _use(self, i: int) -> _Step:
        self.used[i] = True
        self.answered += 1
        return self.steps[i]

    def answer_call(self, name, endpoint: str, body: dict):
        asked = responses_body()  # the Responses request this chat call means, if it came as one
        with self._lock:
            index, self.calls = self.calls, self.calls + 1
            if self.divergence is None:
                for i, step in enumerate(self.steps):
                    if self.used[i] or step.kind != "call":
                        continue
                    prompt = _value(step, "prompt")
                    recorded = prompt.get("request") if isinstance(prompt.get("request"), dict) else {}
                    if prompt.get("endpoint", endpoint) == endpoint and first_request_difference(recorded, body) is None:
                        return _response(endpoint, self._use(i), prompt, self.run.model_id or "tttr")
                self._call_divergence(index, endpoint, body, asked)
            return sealed_call_answer(self.divergence)

    def _call_divergence(self, index: int, endpoint: str, body: dict, asked: dict | None) -> None:
        """Call `index` matches no recorded call: the divergence, against the first not yet answered."""
        via = " (POST /v1/responses)" if asked is not None else ""
        i = self._next("call")
        if i is None:
            self.divergence = Divergence(f"call {index}{via}", "trace", "(the recording ends here)",
                                         f"call {index}: {body.get('messages', body.get('prompt'))}", NAMES)
            self.detail = {"call": index, "step": None, "at": None, "field": "step", "recorded": None,
                           "requested": {"kind": "call", "value": body.get("messages", body.get("prompt"))}}
            return
        step = self.steps[i]
        prompt = _value(step, "prompt")
        recorded = prompt.get("request") if isinstance(prompt.get("request"), dict) else {}
        diff = first_request_difference(recorded, body) or ("endpoint", prompt.get("endpoint"), endpoint)
        if prompt.get("endpoint", endpoint) != endpoint:
            diff = ("endpoint", prompt.get("endpoint"), endpoint)
        if asked is not None:
            diff = in_responses_terms(*diff, asked)
        self.divergence = call_divergence(f"call {index} (step {step.step}{', POST /v1/responses' if via else ''})",
                                          *diff, NAMES)
        path, was, now = request_field(recorded, body) or ("endpoint", prompt.get("endpoint"), endpoint)
        self.detail = {"call": index, "step": step.step, "at": f"{step.step}:prompt", "field": path,
                       "recorded": was, "requested": now}

    def answer_sdk(self, name, kind: str, value: dict):
        """An SDK query's recorded answer; a tool that no recorded one answers gets an error in
        place of running (sealed), a clock read with none left reads the clock."""
        with self._lock:
            if self.divergence is None:
                keys = (("function", "args", "kwargs") if "function" in value else ("cmd", "cwd", "timeout_s")) \
                    if kind == "tool" else ()
                for i, step in enumerate(self.steps):
                    recorded = _value(step, kind)
                    if self.used[i] or step.kind != kind or any(recorded.get(k) != value.get(k) for k in keys):
                        continue
                    self._use(i)
                    return {"t": recorded.get("t")} if kind == "clock" else recorded_tool_answer(recorded, value)
                if kind != "tool":
                    return None
                self._tool_divergence(value, keys)
            return sealed_tool_answer(value, self.divergence) if kind == "tool" else None

    def _tool_divergence(self, value: dict, keys: tuple) -> None:
        label = value.get("function") or value.get("cmd")
        i = next((i for i, s in enumerate(self.steps) if not self.used[i] and s.kind == "tool"
                  and (_value(s, "tool").get("function") or _value(s, "tool").get("cmd")) == label), None)
        if i is None:
            i = self._next("tool")
        if i is None:
            self.divergence = Divergence(f"an SDK tool call ({label})", "trace", "(the recording has no more)",
                                         {k: value.get(k) for k in keys}, NAMES)
            self.detail = {"call": None, "step": None, "at": None, "field": "step", "recorded": None,
                           "requested": {"kind": "tool", "value": {k: value.get(k) for k in keys}}}
            return
        step, recorded = self.steps[i], _value(self.steps[i], "tool")
        key = next(k for k in keys if recorded.get(k) != value.get(k))
        self.divergence = Divergence(f"step {step.step}, tool {recorded.get('function') or recorded.get('cmd')}: {key}",
                                     "trace", recorded.get(key), value.get(key), NAMES)
        self.detail = {"call": None, "step": step.step, "at": f"{step.step}:tool", "field": key,
                       "recorded": recorded.get(key), "requested": value.get(key)}

    def finish(self) -> None:
        """Recorded steps the function never asked for: the divergence at the first of them
        (a model call or a tool; clock reads a function may skip are not counted)."""
        with self._lock:
            if self.divergence is not None:
                return
            i = next((i for i, s in enumerate(self.steps) if not self.used[i] and s.kind != "clock"), None)
            if i is None:
                return
            step = self.steps[i]
            asked = sum(1 for j, s in enumerate(self.steps) if self.used[j] and s.kind == step.kind)
            total = sum(1 for s in self.steps if s.kind == step.kind)
            what = "model calls" if step.kind == "call" else "SDK tool calls"
            recorded = (_value(step, "prompt").get("request") or {}).get("messages") if step.kind == "call" \
                else _value(step, "tool").get("function") or _value(step, "tool").get("cmd")
            self.divergence = Divergence(f"step {step.step} (the test made {asked} of the {total} recorded {what})",
                                         "trace", recorded, "(never asked: the test ended)", NAMES)
            self.detail = {"call": asked if step.kind == "call" else None, "step": step.step, "at": None,
                           "field": "step", "recorded": {"kind": step.kind}, "requested": None}


# ---------------------------------------------------------------------------- the server
@dataclass(slots=True)
class Served:
    """An in-process server and what its client is told."""

    endpoint: object  # engine/program/record.py's _Endpoint (uvicorn in a thread, a loopback port)
    run_name: str
    replay: bool

    @property
    def url(self) -> str:
        return self.endpoint.base  # http://127.0.0.1:PORT

    @property
    def base_url(self) -> str:
        return f"{self.endpoint.base}/v1"

    def env(self) -> dict[str, str]:
        from tttr.recorders.program import endpoint_env

        return {**endpoint_env(self.endpoint.base, self.run_name), "TTTR_REPLAY": "1" if self.replay else "0"}


def _serve(mode, recorder, run_name: str, replay: bool) -> tuple[Served, object]:
    from tttr.engine.program.record import _Endpoint
    from tttr.engine.serve.server import create_app

    app = create_app(mode, recorder)
    return Served(_Endpoint(noting_responses(app), None), run_name, replay), app.state.server


class SealedCalls:
    """`seal_calls`: a served run answering in-process, sealed. `close()` stops the server."""

    def __init__(self, db: str, run: int | None = None, name: str | None = None):
        from tttr.engine.serve.modes import FromRecording
        from tttr.sessions.store import Store

        if not os.path.isfile(db):
            raise InProcessError(f"--tttr-db {db}: no such database; record the runs first "
                                 f"(pytest --tttr-db {db} --tttr-record)")
        with Store.open(db, create=False, readonly=True) as reader:
            self.run = find_run(reader, run=run, name=name)
            self.cassette = Cassette(self.run, load_steps(reader, self.run))
        model = {"id": self.run.model_id or "tttr", "object": "model", "created": 0, "owned_by": "tttr"}
        mode = FromRecording(self.cassette.answer_call, self.cassette.answer_sdk, model)
        self.served, self._server = _serve(mode, None, self.run.task or f"run-{self.run.id}", True)

    def close(self) -> None:
        # Asked to stop, not waited for: nothing it serves is wanted now, and its thread ends by
        # itself at uvicorn's next 0.1 s tick (waiting took ~0.3 s a test).
        self.served.endpoint.begin_stop()
        self._server.shutdown()


def seal_calls(db: str, run: int | None = None, name: str | None = None) -> SealedCalls:
    return SealedCalls(db, run, name)


class RecordedCalls:
    """`record_calls`: the engine here (or `upstream`) answering in-process, every call recorded
    into `db` as a step of the run named `name`. `close()` finishes it: the run's id, or None
    when the function made no call."""

    def __init__(self, db: str, name: str, *, service=None, upstream=None):
        from tttr.engine.serve.modes import Proxied
        from tttr.engine.serve.proxy_anthropic import AnthropicUpstream, ProxiedMessages
        from tttr.engine.serve.recorder import CallRecorder

        self.db, self.name = db, name
        if upstream is not None:
            mode = ProxiedMessages(upstream) if isinstance(upstream, AnthropicUpstream) else Proxied(upstream)
        else:
            mode = _kept(service)  # the session's model: loaded once, closed by its owner
        self.recorder = CallRecorder(db, service if upstream is None else None, default_run=name)
        self.served, self._server = _serve(mode, self.recorder, name, False)
        self._server.startup()  # an upstream's tokenizer loads in the background

    def close(self) -> int | None:
        from tttr.sessions.store import Store

        self.served.endpoint.stop()
        self._server.shutdown()  # writes every call, finishes the named run
        with Store.open(self.db, create=False, readonly=True) as reader:
            try:
                return find_run(reader, name=self.name).id
            except InProcessError:
                return None


def _kept(service):
    """Live over a model the caller owns (loaded once for a session): the server's shutdown
    does not close it."""
    from tttr.engine.serve.modes import Live

    class Kept(Live):
        def close(self) -> None:
            pass

    return Kept(service)


def load_model(model: str | None = None):
    """The engine for recording (the default model, or `model`), loaded on this thread (which
    outlives it: record.py's own_torch_threads)."""
    from tttr.engine.program.record import own_torch_threads
    from tttr.engine.serve.service import Service

    if "torch" not in sys.modules:  # serve.md: two OpenMP runtimes spinning fight for the cores
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    service = Service(model, kernel_mode="invariant", any_model=True)
    own_torch_threads()
    service.load()
    if service.load_error:
        raise InProcessError(f"the model did not load: {service.load_error}")
    return service


def record_calls(db: str, name: str, *, service=None, upstream=None) -> RecordedCalls:
    return RecordedCalls(db, name, service=service, upstream=upstream)


__all__ = ["Cassette", "InProcessError", "RecordedCalls", "SealedCalls", "find_run", "load_model",
           "record_calls", "seal_calls"]
