"""Replay and fork runs recorded by `tttr serve`: the oracle's second program.

A served run is a list of API calls, call S being step S (see engine/serve/recorder.py):
`S:prompt` holds the prompt's token ids and the call's own sampling, seed, max_tokens and
stop strings; `S:token:P` (and `S:logits:P`) each position; `S:message` the answer. This
program walks the calls in order and obtains each message's tokens through the oracle, as
the shell agent's loop does for its steps:

- faithful replay: the recorded tokens (and logits, where recorded) are taken as they are;
  the message is the recorded one. No model, no tokenizer, nothing called: so a run
  recorded through a proxy (`tttr serve --upstream`, tokens without logits) replays the same.
- a freed layer (`--free tensor` or `token`): each call is generated again from its prompt
  ids with its own sampling, at RNG coordinates (seed, 0, P), in the run's kernel mode.
- fork at `S:token:P`: calls before S are replayed as recorded, call S keeps its tokens
  before P, takes the new token at P, and is generated live after it (the model loads
  then). The fork ends with call S: the calls after it were prompted by the client program
  from the recorded answers, and only re-running that program can say what it would have
  asked instead.

Generating needs the run's model: a served run names it (its id is a content hash), and it
is forked or freed only with a local model of that id (`--model`). A proxied run records
no prompt token ids and no logits (the upstream tokenized and computed them), so a fork or
a freed layer is refused with a line that names the upstream; its faithful replay works.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tttr.engine.replay.divergence import Divergence
from tttr.engine.replay.mutation import Mutation, parse_mutation
from tttr.engine.replay.oracle import Oracle
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.result import CallsResult, ReplayError, kernels_note
from tttr.engine.replay.source import Source
from tttr.engine.replay.tokens import Draws
from tttr.kernels.mode import MODES
from tttr.sessions.records import RECORDED_BY
from tttr.sessions.vocabulary import Site, site

SERVED_BY = RECORDED_BY["calls"]  # the recorder's meta.source; a proxy's starts with it too


def is_call_run(run) -> bool:
    """Whether `run` was recorded by `tttr serve` (direct or proxied): its calls, not the
    shell agent's steps. The recorder marks it in meta.source; `api:*` tasks are its too
    (sessions.records.RunMeta names the kinds)."""
    return run.meta.kind == "calls"


def upstream_of(run) -> str | None:
    """The upstream server a proxied run was recorded from (`tttr serve --upstream`), or None
    for a run the local engine served."""
    served_by = run.meta.served_by
    if served_by is not None and served_by.get("upstream"):
        return str(served_by["upstream"])
    fingerprint = run.fingerprint if isinstance(run.fingerprint, dict) else {}
    if fingerprint.get("served_by") == "upstream":
        return str(fingerprint.get("upstream") or "an upstream server")
    return None


def local_kernel_mode(run) -> str:
    """The kernel mode to generate a run's calls in: its own where it is a local one."""
    return run.kernel_mode if run.kernel_mode in MODES else "invariant"


def call_steps(source: Source) -> list[int]:
    return sorted({e.step for e in source.events if e.kind == "prompt"})


# ---------------------------------------------------------------------------- checks
def _check(source: Source, runtime, *, computes: bool) -> None:
    run = source.run
    if run.status != "complete":
        named = " (a run named by X-TTTR-Run is complete once its `tttr serve` stops)" if run.status == "recording" else ""
        raise ReplayError(f"run {run.id} is {run.status}: only complete runs can be replayed or forked{named}")
    if not call_steps(source):
        raise ReplayError(f"run {run.id} has no recorded calls (no S:prompt event): nothing to replay")
    upstream = upstream_of(run)
    if computes and upstream is not None:
        # The proxy saw text and logprobs, not the prompt's token ids nor the logits: there is
        # nothing here to generate from with the upstream's arithmetic, so nothing is guessed.
        raise ReplayError(
            f"run {run.id} was proxied to {upstream} (model {run.model_id}): it records the answers' tokens "
            "but not the prompts' token ids or the logits, so its calls cannot be regenerated here; "
            f"`tttr replay {run.id}` replays it faithfully, and calls recorded by a local `tttr serve --db` can be forked"
        )
    if computes and run.model_id != runtime.model_id:
        raise ReplayError(
            f"run {run.id} was served by model {run.model_id}; generating its calls needs that model here, but "
            f"the local model is {runtime.model_id}: pass it with --model (a faithful replay needs no model)"
        )


def call_settings(source: Source, step: int) -> tuple[dict, dict, int, tuple[str, ...]]:
    """A call's prompt value, sampling, max_tokens and stop strings, checked for generation."""
    rid = source.run.id
    prompt = source.value(site(step, "prompt"))
    if not isinstance(prompt, dict):
        raise ReplayError(f"run {rid}, call {step}: its prompt is not recorded")
    ids = prompt.get("ids")
    if not isinstance(ids, list) or not ids or not all(type(i) is int and i >= 0 for i in ids):
        raise ReplayError(f"run {rid}, call {step}: its prompt token ids are not recorded (a proxied call?): "
                          "it cannot be generated here")
    sampling, max_tokens, stop = prompt.get("sampling"), prompt.get("max_tokens"), prompt.get("stop") or []
    if not isinstance(sampling, dict):
        raise ReplayError(f"run {rid}, call {step}: its sampling parameters are not recorded")
    if type(max_tokens) is not int or max_tokens < 1:
        raise ReplayError(f"run {rid}, call {step}: its max_tokens {max_tokens!r} is not a count")
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ReplayError(f"run {rid}, call {step}: its stop strings {stop!r} are not a list of text")
    try:
        _sampling(sampling, 0)
    except (ValueError, TypeError) as exc:
        raise ReplayError(f"run {rid}, call {step}: its recorded sampling cannot be used: {exc}") from None
    return prompt, sampling, max_tokens, tuple(stop)


def _sampling(recorded: dict, seed: int):
    from tttr.engine.inference.sampling import SamplingParams  # not sampler's: that imports torch (~2 s)

    return SamplingParams(temperature=recorded.get("temperature", 1.0), top_p=recorded.get("top_p", 1.0),
                          top_k=recorded.get("top_k", 0), seed=seed)


def recorded_seed(source: Source, sampling: dict) -> int:
    seed = sampling.get("seed", source.run.seed)
    if type(seed) is not int:
        raise ReplayError(f"run {source.run.id}: a call has no recorded seed: replay it with --free token")
    return seed


@dataclass(frozen=True, slots=True)
class CallPlan:
    """A replay or fork of served calls, checked read-only: the decoded recording, the parsed
    change (None for a replay), the seed a freed token layer draws from (drawn at the check)
    and the runtime. `act` carries it out on a store opened for writing, reading nothing of
    the run again."""

    source: Source
    policy: Policy
    mutation: Mutation | None
    seed: int | None
    runtime: Any

    def act(self, store, *, progress=None, cancel=None, meta: dict | None = None) -> CallsResult:
        """`meta` is merged into the child's meta."""
        return _child(store, self.source.on(store), self.runtime, policy=self.policy, mutation=self.mutation,
                      seed=self.seed, progress=progress, cancel=cancel, meta_extra=meta)


def check_call_replay(source: Source, policy: Policy, *, runtime, seed: int | None = None) -> CallPlan:
    """Everything a replay of served calls checks before it writes, on the decoded run."""
    _check(source, runtime, computes=not policy.faithful)
    if policy.pinned("token") and not policy.faithful:
        for step in call_steps(source):
            recorded_seed(source, call_settings(source, step)[1])
    elif not policy.faithful:
        for step in call_steps(source):
            call_settings(source, step)
    if not policy.pinned("token") and seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    return CallPlan(source, policy, None, seed, runtime)


def check_call_fork(source: Source, site_text: str, value: str, *, runtime) -> CallPlan:
    """Everything a fork of served calls checks before it writes, on the decoded run: the
    site, the new value (parsed once, here) and the call's recorded settings."""
    run_id = source.run.id
    try:
        at = Site.parse(site_text)
    except ValueError:
        at = None
    if at is not None and at.name not in ("token", "message"):
        raise ReplayError(f"run {run_id} is recorded API calls: only a token (CALL:token:POS) or a whole "
                          f"answer (CALL:message) can be changed there, not {at}")
    _check(source, runtime, computes=True)
    mutation = parse_mutation(source.store, run_id, site_text, value, tokenizer=runtime.tokenizer)
    step, pos = mutation.site.step, mutation.site.pos or 0
    _, sampling, _, _ = call_settings(source, step)
    recorded_seed(source, sampling)
    before = source.tokens.get(step, [])[:pos]
    if not all(type(t.get("id")) is int for t in before):
        raise ReplayError(f"run {run_id}, call {step}: its tokens before position {pos} have no ids "
                          "(a proxied call that recorded text only): it cannot be forked there")
    return CallPlan(source, Policy(), mutation, None, runtime)


# ---------------------------------------------------------------------------- the program
def run_calls(oracle: Oracle, source: Source, runtime, *, seed: int | None, last: int | None = None,
              progress=None) -> list[str]:
    """Obtain each recorded call's message through the oracle, up to call `last`; the
    messages' text, in order."""
    steps = [s for s in call_steps(source) if last is None or s <= last]
    texts = []
    for n, step in enumerate(steps):
        if oracle.cancelled():
            oracle.abort("cancelled")
            return texts
        prompt = source.value(site(step, "prompt"))
        mutated = oracle.mutation is not None and (oracle.mutation.at("token", step) or oracle.mutation.at("message", step))
        live = mutated or not oracle.policy.faithful
        if live:
            prompt, sampling, max_tokens, stops = call_settings(source, step)
            call_seed = recorded_seed(source, sampling) if oracle.policy.pinned("token") else seed
            draws = Draws(call_seed, 0, _sequence_factory(runtime, sampling))
        else:
            max_tokens, stops, draws = 0, (), None
        ids = oracle.call(step, prompt, max_tokens, stops, draws)
        if live:
            message = _message(runtime.tokenizer, ids, max_tokens, stops)
        else:
            recorded = source.value(site(step, "message"))
            message = recorded if isinstance(recorded, dict) else {"text": None}
        oracle.note(step, "message", message)
        oracle.commit(step)
        texts.append(message.get("text"))
        if progress is not None:
            progress(n + 1, len(steps), f"call {step}: {str(message.get('text'))[:60]}")
    return texts


def _sequence_factory(runtime, sampling: dict):
    def make(prompt_ids, seed, rng_step, first_position, max_tokens, stops):
        return runtime.sequence_factory(_sampling(sampling, seed))(prompt_ids, seed, rng_step, first_position,
                                                                   max_tokens, stops)

    return make


def _message(tokenizer, ids: list[int], max_tokens: int, stops: tuple[str, ...]) -> dict:
    """A generated call's answer as the server gives it: the end-of-turn token not shown,
    the text cut at the first stop string."""
    shown = ids[:-1] if ids and ids[-1] in tokenizer.stop_token_ids else ids
    text = tokenizer.decode(shown)
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if at >= 0:
        text, reason = text[:at], "stop"
    else:
        reason = "stop" if len(shown) < len(ids) or len(ids) < max_tokens else "length"
    return {"text": text, "finish_reason": reason, "tool_calls": []}


# ---------------------------------------------------------------------------- acting
def _child(store, source: Source, runtime, *, policy: Policy, mutation: Mutation | None, seed: int | None,
           progress, cancel, meta_extra: dict | None = None) -> CallsResult:
    run = source.run
    live = mutation is not None or not policy.faithful
    meta = {**run.meta.to_json(), "replay": {"free": sorted(policy.free)}} if mutation is None else run.meta.to_json()
    meta.update(meta_extra or {})
    kernel_mode = local_kernel_mode(run) if live else run.kernel_mode
    settings = dict(
        task=run.task, model_id=run.model_id, kernel_mode=kernel_mode, sampling=run.sampling,
        seed=run.seed if policy.pinned("token") else seed,
        fingerprint=runtime.fingerprint() if live else run.fingerprint,
        parent=run.id, fork_seq=source.seq_of(mutation.first_site) if mutation else 0,
        fork_site=str(mutation.site) if mutation else None,
        mutation=mutation.to_json() if mutation else None, meta=meta,
    )
    oracle = Oracle(
        store=store, run_id=None, begin=lambda: store.begin_run(**settings), task=None,
        tokenizer=runtime.tokenizer if live else None,
        generate=runtime.generate_in(local_kernel_mode(run)), make_sequence=None, policy=policy,
        seed=run.seed or 0, kernel_mode=kernel_mode, clock_base=datetime.now(timezone.utc).replace(tzinfo=None),
        executor_factory=_no_commands, source=source, mutation=mutation, fork_seq=settings["fork_seq"],
        cancel=cancel,
    )
    last = mutation.site.step if mutation else None
    try:
        texts = run_calls(oracle, source, runtime, seed=seed, last=last, progress=progress)
        if oracle.status == "recording":
            oracle.complete({"calls": len(texts), **({"fork_ends_at_call": last} if mutation else {})})
    except BaseException as exc:
        if oracle.status == "recording" and not oracle.begun:
            oracle.discard()
        elif oracle.status == "recording":
            try:
                oracle.abort(f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
        raise
    recorded_ids = [t.get("id") for s in call_steps(source) if last is None or s <= last
                    for t in source.tokens.get(s, [])]
    identical = oracle.token_ids == recorded_ids
    divergence = oracle.divergence
    if mutation is not None and divergence is None:
        p = mutation.site
        recorded = source.value(str(p)) or {}
        divergence = Divergence(str(p), "token", recorded.get("id"), mutation.value, ("recorded", "live"),
                                texts=(recorded.get("text"), runtime.tokenizer.decode([mutation.value])
                                       if type(mutation.value) is int else None))  # a 0:message fork's is text
    notes = []
    if oracle.logits_computed:
        note = kernels_note(run.fingerprint or {})
        if note:
            notes.append(note)
    return CallsResult(oracle.run_id, oracle.status, oracle.outcome, texts, identical=identical,
                       divergence=divergence, parent=run.id, logits_computed=oracle.logits_computed,
                       commands_run=0, extra={"notes": notes} if notes else {})


def _no_commands(tree_dir, seed):
    raise ReplayError("recorded API calls run no commands")
