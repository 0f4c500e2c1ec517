"""The engine: continuous batching over one model.

Every step: admit waiting sequences (their whole prompt is prefilled in this pass), flatten
the rows of all running sequences (prefill and decode mixed) into one pass, then for each
position produced: digest the fp32 logits, take top-k logprobs, force or sample the token,
and check the stop conditions. Finished sequences leave; new ones join at the next step.

A run of forced tokens (replay) can be fed in one pass: a forced token does not depend on
the logits before it, so positions p..p+n that are all forced cost one pass, not n. That
changes the batch composition of those positions, so by default it is done only under the
`invariant` kernels, where composition cannot change a result (`chain_forced=None`).

Sequences that would compute the same rows are computed once (twins.py): under an invariant
mode, a sequence whose cache holds the same ids as another's and that feeds the same tokens
this pass (tests of a bisect round that differ only where the model has not reached yet, n
samples of one prompt) copies that leader's new keys/values and reads its logits; each still
samples its own token, and once two part they are computed apart (`share_twins`). Under any
mode, sequences that start from the same prompt share its prefill.

All compute happens on one background thread; `submit` is thread-safe and `generate` is
`submit` + wait. A sequence runs under the kernel mode current where it was submitted
(or the Engine's fixed mode); sequences of different modes never share a pass."""

from __future__ import annotations

import atexit
import collections
import dataclasses
import threading
import weakref
from concurrent.futures import Future

import torch

from tttr.engine.inference.digest import logits_digests
from tttr.engine.errors import EngineError
from tttr.engine.inference.kv_cache import KVCache, KVPool
from tttr.engine.inference.model import Model
from tttr.engine.inference.one_pass import Pass, PassOutput, Planned
from tttr.engine.inference.sampler import sample_rows
from tttr.engine.inference.sequence import TOPK, Sequence, TokenRecord
from tttr.engine.inference.twins import Twins
from tttr.kernels import ops
from tttr.kernels.mode import check_mode, get_mode, is_invariant, kernel_mode


_ENGINES: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    # A worker thread still parked at interpreter exit makes torch's runtime abort.
    for engine in list(_ENGINES):
        engine.close()


class Engine:
    def __init__(self, model: Model, *, kernel_mode: str | None = None, max_running: int = 32,
                 max_batch_rows: int = 2048, topk: int = TOPK, chain_forced: bool | None = None,
                 share_twins: bool = True):
        self.model = model
        self.fixed_mode = check_mode(kernel_mode) if kernel_mode is not None else None
        self.max_running = max_running
        self.max_batch_rows = max_batch_rows
        self.topk = topk
        self.chain_forced = chain_forced
        # Twins (twins.py) computed once, under the invariant modes only: under `fast` leaving
        # a row out of the pass would change the others' bits.
        self.share_twins = share_twins
        self._twins = Twins()
        self._cv = threading.Condition()
        self._waiting: collections.deque[tuple[Sequence, Future]] = collections.deque()
        self._running: list[tuple[Sequence, Future]] = []
        self._cancel: list[Sequence] = []  # running sequences to drop before the next step
        self._thread: threading.Thread | None = None
        self._closed = False
        cfg = model.config
        self._pool = KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, model.dtype, model.device)
        self.steps = 0  # forward passes run so far
        self.prefixes = None  # a PrefixCache: invariant sequences start from known prefixes (prefix_cache.py)
        self.history: collections.deque[tuple[int, tuple[int, ...]]] = collections.deque(maxlen=4096)
        # (rows in the pass, ids of the sequences in it) per step, for tests and the bench
        _ENGINES.add(self)

    # -- public API --------------------------------------------------------------------
    def submit(self, seq: Sequence) -> Future:
        """Queue `seq`; the future resolves to its list of TokenRecords. Bad requests raise
        EngineError here, in the caller's thread."""
        if not isinstance(seq, Sequence):
            raise EngineError(f"submit() takes a Sequence, not {type(seq).__name__}")
        if seq.kernel_mode is not None:
            raise EngineError(f"{seq!r} was already submitted: make a new Sequence")
        self._validate(seq)
        seq.kernel_mode = self.fixed_mode or get_mode()
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        with self._cv:
            if self._closed:
                raise EngineError("the engine is closed: make a new Engine")
            self._waiting.append((seq, fut))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tttr-engine", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return fut

    def generate(self, seqs: list[Sequence]) -> list[list[TokenRecord]]:
        futures = [self.submit(s) for s in seqs]
        return [f.result() for f in futures]

    def cancel(self, seq: Sequence) -> bool:
        """Stop `seq` (a client went away): a sequence still waiting is removed now and never
        prefilled; a running one leaves before the next step, its cache freed. Its future
        resolves to the records it has, with finish_reason "cancelled". False if the engine
        no longer has it (it had finished)."""
        with self._cv:
            for i, (waiting, fut) in enumerate(self._waiting):
                if waiting is seq:
                    del self._waiting[i]
                    _resolve_cancelled(seq, fut)
                    return True
            if any(running is seq for running, _ in self._running):
                self._cancel.append(seq)
                return True
        return False

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- checks ------------------------------------------------------------------------
    def _validate(self, seq: Sequence) -> None:
        cfg = self.model.config
        vocab = cfg.vocab_size
        bad = [t for t in seq.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise EngineError(f"prompt token id {bad[0]} is out of range: the vocabulary has {vocab} tokens")
        bad = {p: t for p, t in seq.forced.items() if not 0 <= t < vocab}
        if bad:
            p = next(iter(bad))
            raise EngineError(f"forced token {bad[p]} at position {p} is out of range: vocabulary has {vocab} tokens")
        if len(seq.prompt_ids) >= cfg.context_length and seq.max_tokens > 0:
            raise EngineError(
                f"prompt of {len(seq.prompt_ids)} tokens is longer than the model's context of "
                f"{cfg.context_length} tokens (room for none to generate): shorten the prompt"
            )

    # -- the loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._running and not self._closed:
                    self._cv.wait()
                if self._closed and not self._waiting and not self._running:
                    return
                if self._cancel:
                    self._drop_cancelled()
                self._admit()
            if self._running:
                try:
                    self._step()
                except BaseException as exc:  # noqa: BLE001 - fail the batch, keep serving
                    for seq, fut in self._running:
                        seq.finish_reason = "error"
                        seq.cache = None
                        seq.done.set()
                        fut.set_exception(exc)
                    self._running = []
                    self._release()

    def _admit(self) -> None:
        """Move waiting sequences into the running batch (called with the lock held)."""
        mode = self._running[0][0].kernel_mode if self._running else None
        rows = sum(len(s.ids) - s.cache.length for s, _ in self._running)
        while self._waiting and len(self._running) < self.max_running:
            seq, fut = self._waiting[0]
            if mode is not None and seq.kernel_mode != mode:
                break  # a different kernel mode waits until this batch drains
            need = len(seq.prompt_ids)
            if self._running and rows + need > self.max_batch_rows:
                break
            self._waiting.popleft()
            if seq.max_tokens == 0:
                seq.finish_reason = "length"
                seq.done.set()
                fut.set_result(seq.records)
                continue
            capacity = min(self.model.config.context_length, len(seq.prompt_ids) + seq.max_tokens)
            cfg = self.model.config
            seq.cache = KVCache(cfg.n_layers, capacity, cfg.n_kv_heads, cfg.head_dim, allocate=False)
            prefixes = self.prefixes
            # invariant modes only; kept prefixes serve their own mode (prefix_cache.py)
            if prefixes is not None and is_invariant(seq.kernel_mode):
                prefixes.fill(seq.prompt_ids, seq.cache, ((s.ids, s.cache) for s, _ in self._running
                                                          if s.kernel_mode == seq.kernel_mode), seq.kernel_mode)
            self._running.append((seq, fut))
            mode = seq.kernel_mode
            rows += need

    def _drop_cancelled(self) -> None:
        """Remove the running sequences `cancel` named (lock held, between steps)."""
        gone = self._cancel
        self._cancel = []
        keep = []
        for seq, fut in self._running:
            if any(seq is g for g in gone):
                _resolve_cancelled(seq, fut)
            else:
                keep.append((seq, fut))
        self._running = keep
        if not keep:
            self._release()

    def _feed(self, seq: Sequence) -> tuple[list[int], int]:
        """Tokens this sequence feeds now, and how many of the last rows produce positions."""
        feed = seq.ids[seq.cache.length:]
        n_out = 1
        chain = self.chain_forced if self.chain_forced is not None else is_invariant(seq.kernel_mode)
        if chain and seq.forced:
            stops = self._stop_ids(seq)
            p = seq.next_position
            room = seq.cache.capacity - seq.cache.length - len(feed)
            last = seq.first_position + seq.max_tokens - 1  # the last position this call may produce
            while (room > 0 and p in seq.forced and p < last and seq.forced[p] not in stops
                   and not seq.stop_strings):
                feed = feed + [seq.forced[p]]
                n_out += 1
                p += 1
                room -= 1
        return feed, n_out

    def _stop_ids(self, seq: Sequence) -> tuple[int, ...]:
        if seq.stop_token_ids is not None:
            return seq.stop_token_ids
        return self.model.tokenizer.stop_token_ids

    def _step(self) -> None:
        batch = list(self._running)
        mode = batch[0][0].kernel_mode
        twins = self._twins if self.share_twins and is_invariant(mode) else None
        finished: list[tuple[Sequence, Future]] = []
        self._pool.arrange([seq.cache for seq, _ in batch])
        with kernel_mode(mode), torch.inference_mode():
            planned = self._plan(batch, twins, finished)
            if planned.parts:  # else every sequence finished catching up
                out = self._forward(planned, mode)
                if twins is not None:
                    for key, part in planned.computed:
                        twins.remember(key, (part, out), self.steps)
                for part in planned.parts:
                    self._produce_part(part, out, finished)
        if finished:
            self._finish(finished)

    def _plan(self, batch: list[tuple[Sequence, Future]], twins: Twins | None,
              finished: list[tuple[Sequence, Future]]) -> Pass:
        planned = Pass()
        shared: dict[tuple, Planned] = {}  # a key already computed in this pass -> its leader's part
        for seq, fut in batch:
            feed, n_out = self._feed(seq)
            # Sequences that start from the same prompt (n samples of one request, the same
            # step replayed under several seeds) share one prefill: the first computes it,
            # the others copy its keys/values and read its logits. Under invariant kernels
            # any twins do (twins.py), and a twin that joined behind another first takes,
            # without computing, what the other computed in its earlier passes.
            if twins is not None:
                key = twins.key(seq, feed, n_out)
                while key not in shared and self._catch_up(seq, fut, key, twins, finished):
                    if seq.finished:
                        break
                    feed, n_out = self._feed(seq)
                    key = twins.key(seq, feed, n_out)
                if seq.finished:
                    continue
            else:
                key = (tuple(feed), n_out) if seq.cache.length == 0 and len(feed) > 1 else None
            leader = shared.get(key) if key is not None else None
            if leader is not None and (twins is None or twins.same_history(seq, leader.seq)):
                planned.followers.append((seq, leader))
                planned.parts.append(leader._replace(seq=seq, fut=fut))
                continue
            part = planned.add(seq, fut, feed, n_out)
            if key is not None and leader is None:
                shared[key] = part
                planned.computed.append((key, part))
        return planned

    def _forward(self, planned: Pass, mode: str) -> PassOutput:
        """Run the pass (the caller holds its kernel mode) and give each follower its leader's rows."""
        logits = self.model.forward(torch.tensor(planned.tokens, dtype=torch.int64),
                                    torch.tensor(planned.positions, dtype=torch.int64), planned.segments,
                                    torch.tensor(planned.logit_rows, dtype=torch.int64))
        for seq, leader in planned.followers:
            _copy_rows(leader.seq, seq, leader.end - leader.start)
        logprobs = ops.log_softmax(logits, dim=-1)
        top_v, top_i = ops.topk(logprobs, self.topk)
        R = len(planned.tokens)
        self.steps += 1
        self.history.append((R, tuple(id(part.seq) for part in planned.parts)))
        return PassOutput(logits, logprobs, top_v.tolist(), top_i.tolist(), logits_digests(logits),
                           self._draw(planned.parts, logits), R, mode)

    def _catch_up(self, seq: Sequence, fut: Future, key, twins: Twins,
                  finished: list[tuple[Sequence, Future]]) -> bool:
        """When a running twin computed `key` in a recent pass (it is ahead of `seq`), give
        `seq` that pass's keys/values and logits and produce its positions from them; False
        when none did."""
        hit = twins.recall(key)
        if hit is None:
            return False
        part, out = hit
        leader = part.seq
        if leader is seq or leader.cache is None or not twins.same_history(seq, leader):
            return False  # the twin left (its cache is gone), or only the hashes matched
        _copy_rows(leader, seq, part.end - part.start)
        mine = part._replace(seq=seq, fut=fut)
        self._produce_part(mine, dataclasses.replace(out, drawn=self._draw([mine], out.logits)), finished)
        return True

    def _produce_part(self, part: Planned, out: PassOutput, finished: list[tuple[Sequence, Future]]) -> None:
        """Advance `part`'s cache over its rows and produce its positions; a finished or
        failed sequence joins `finished`."""
        seq = part.seq
        seq.cache.length += part.end - part.start
        rows = tuple(range(part.start, part.end))
        try:
            for j in range(part.n_out):
                self._produce(part, j, rows, out)
                if seq.finished:
                    break
        except BaseException as exc:  # noqa: BLE001 - a failing callback fails its sequence
            seq.finish_reason = "error"
            part.fut.set_exception(exc)
            finished.append((seq, part.fut))
            return
        if seq.finished:
            finished.append((seq, part.fut))

    def _finish(self, finished: list[tuple[Sequence, Future]]) -> None:
        done = {id(s) for s, _ in finished}
        with self._cv:
            self._running = [(s, f) for s, f in self._running if id(s) not in done]
            if not self._running:
                self._release()  # nothing left to keep: free the memory now
        prefixes = self.prefixes
        for seq, fut in finished:
            if prefixes is not None and is_invariant(seq.kernel_mode) and seq.finish_reason != "error":
                prefixes.keep(seq.ids, seq.cache, seq.kernel_mode)
            seq.cache = None  # free the memory now; the records are what callers keep
            seq.done.set()
            if not fut.done():
                fut.set_result(seq.records)

    def _release(self) -> None:
        self._pool.release()
        self._twins.forget()

    @staticmethod
    def _draw(plan: list[Planned], logits: torch.Tensor) -> dict[tuple[int, int], int]:
        """The sampled tokens of this pass, drawn together: {(id(seq), j): token} for every
        position j of the plan that is not forced (see sampler.sample_rows)."""
        want = [(id(seq), j, part.first_out + j, seq.sampling, (seq.rng_step, seq.next_position + j))
                for part in plan for seq in (part.seq,) for j in range(part.n_out)
                if seq.next_position + j not in seq.forced]
        if not want:
            return {}
        tokens = sample_rows(logits[[w[2] for w in want]], [w[3] for w in want], [w[4] for w in want])
        return {(w[0], w[1]): t for w, t in zip(want, tokens)}

    def _produce(self, part: Planned, j: int, rows: tuple[int, ...], out: PassOutput) -> None:
        """The j-th position `part` produces in this pass (`rows` are its rows)."""
        seq = part.seq
        i = part.first_out + j
        p = seq.next_position
        forced = p in seq.forced
        token = seq.forced[p] if forced else out.drawn.get((id(seq), j))
        rec = TokenRecord(
            position=p, token_id=token, forced=forced, logprob=float(out.logprobs[i][token]),
            topk=tuple(zip(out.top_i[i], out.top_v[i])), digest=out.digests[i], batch_rows=out.batch_rows,
            rows=rows, row=part.end - part.n_out + j, kernel_mode=out.mode,
            rng=(seq.sampling.seed, seq.rng_step, p),
            text=self.model.tokenizer.token_text(token),
            logits=out.logits[i].clone() if seq.keep_logits else None,
        )
        seq.records.append(rec)
        seq.ids.append(token)
        if token in self._stop_ids(seq):
            seq.finish_reason = "stop"
        elif seq.stop_strings and self._hit_stop_string(seq):
            seq.finish_reason = "stop_string"
        elif len(seq.records) >= seq.max_tokens:
            seq.finish_reason = "length"
        elif len(seq.ids) > self.model.config.context_length or len(seq.ids) > seq.cache.capacity:
            seq.finish_reason = "context"
        if seq.on_token is not None:
            seq.on_token(rec)

    def _hit_stop_string(self, seq: Sequence) -> bool:
        tail = seq.output_ids[-64:]  # stop strings are short; 64 tokens cover any of them
        text = self.model.tokenizer.decode(tail)
        return any(s and s in text for s in seq.stop_strings)


def _copy_rows(leader: Sequence, seq: Sequence, n: int) -> None:
    """Give `seq` the keys/values `leader` holds for the `n` positions after seq's cache (their
    caches held the same ids before them)."""
    a = seq.cache.length
    seq.cache.k[:, a:a + n] = leader.cache.k[:, a:a + n]
    seq.cache.v[:, a:a + n] = leader.cache.v[:, a:a + n]


def _resolve_cancelled(seq: Sequence, fut: Future) -> None:
    seq.finish_reason = "cancelled"
    seq.cache = None
    seq.done.set()
    if not fut.done():
        fut.set_result(seq.records)
