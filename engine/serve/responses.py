"""OpenAI's response objects, built from the engine's token records.

Logprobs are those of the model's own distribution (log-softmax of the raw logits, before
temperature, top-k and top-p), as the engine records them. The turn's end token (e.g.
`<|im_end|>`) counts in `usage` but is not shown as text or in `logprobs`; text from a
`stop` string on is cut, as OpenAI does."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass

from tttr.engine.serve.service import Call, Service
from tttr.engine.serve.tools import parse_tool_calls

FINISH = {"stop": "stop", "stop_string": "stop", "length": "length", "context": "length"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character a byte is written as -> the byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    codes, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            codes.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, codes)}


def token_bytes(tokenizer, token_id: int) -> list[int]:
    """The token's raw bytes (a byte-level token may hold half of a UTF-8 character)."""
    backend = getattr(tokenizer, "_tk", None)
    piece = backend.id_to_token(int(token_id)) if backend is not None else None
    if piece is not None and token_id not in tokenizer.stop_token_ids:
        table = _byte_decoder()
        if all(ch in table for ch in piece):
            return [table[ch] for ch in piece]
    return list(tokenizer.token_text(token_id).encode("utf-8"))


def _visible(call: Call, tokenizer) -> list:
    """The records whose tokens are shown: all but a final end-of-turn token."""
    records = list(call.seq.records)
    if records and records[-1].token_id in tokenizer.stop_token_ids:
        records.pop()
    return records


def _first_stop(text: str, stops: tuple[str, ...]) -> str | None:
    """The stop string that cuts `text` (the earliest; of two at one place, the longer), or None."""
    found = [(at, -len(s), s) for s in stops if (at := text.find(s)) >= 0]
    return min(found)[2] if found else None


def _cut(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    at = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


@dataclass(frozen=True, slots=True)
class Output:
    text: str
    finish_reason: str
    tool_calls: list  # of ToolCall
    records: list  # the shown tokens' records
    completion_tokens: int
    stop_sequence: str | None = None  # the stop string that ended the text (finish_reason "stop")


def output(call: Call, tokenizer, *, cancelled: bool = False) -> Output:
    """What a finished (or cancelled) call produced."""
    records = _visible(call, tokenizer)
    decoded = tokenizer.decode([r.token_id for r in records])
    text, cut = _cut(decoded, call.prepared.request.stop)
    reason = call.seq.finish_reason
    finish = "cancelled" if cancelled else ("stop" if cut else FINISH.get(reason, reason or "stop"))
    calls = []
    if call.prepared.tool_format is not None:
        text, calls = parse_tool_calls(text, call.prepared.tool_format, set(call.prepared.tool_names))
        if not call.prepared.request.parallel_tool_calls:
            calls = calls[:1]  # `parallel_tool_calls: false`: one call at most (decoding is not constrained)
        if calls:
            finish = "tool_calls"
    stop = _first_stop(decoded, call.prepared.request.stop) if cut and finish == "stop" else None
    return Output(text, finish, calls, records, len(call.seq.records), stop)


class TextStream:
    """Turns tokens into text deltas as they come: waits out half a UTF-8 character, and
    holds back a tail that could still become a `stop` string.

    Each token decodes a window of the last few tokens, not the whole answer (linear in the
    answer's length, where decoding everything per token was quadratic: 1.3 s for 4,000
    tokens). The window starts at the token before the newest complete piece, so that a
    decoder that treats an answer's first token specially (a stripped leading space) treats
    both decodes alike; where the window's text does not extend what came before, the whole
    answer is decoded instead. `text` always equals the decoder's text of `ids`, up to the
    last complete character."""

    def __init__(self, tokenizer, stops: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stops = stops
        self.ids: list[int] = []
        self.text = ""  # the decoded text of ids[:self._read]
        self.sent = 0  # characters of the text already sent
        self.stopped = False
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._prefix = self._read = 0  # the window: ids[_prefix:_read] are decoded already
        self._unsearched = 0  # where a stop string could start that no earlier push has looked for

    def _decode(self) -> bool:
        """Extends `text` by the new tokens; False while they end in half a character."""
        decode = self.tokenizer.decode
        window = decode(self.ids[self._prefix:])
        if window.endswith("\ufffd"):
            return False
        head = decode(self.ids[self._prefix:self._read])
        if window.startswith(head):
            self.text += window[len(head):]
        else:  # the window reads differently alone: the whole answer, as the decoder reads it
            self.text, self._unsearched = decode(self.ids), 0
        self._prefix, self._read = self._read, len(self.ids)
        return True

    def push(self, token_id: int) -> str:
        if self.stopped or token_id in self.tokenizer.stop_token_ids:
            return ""
        self.ids.append(token_id)
        if not self._decode():
            return ""
        searched = self._unsearched
        self._unsearched = max(0, len(self.text) - self._hold)
        tail, self.stopped = _cut(self.text[searched:], self.stops)
        text = self.text[:searched] + tail
        end = len(text) if self.stopped else max(self.sent, len(text) - self._hold)
        delta, self.sent = text[self.sent:end], end
        return delta

    def flush(self) -> str:
        if self.stopped:
            return ""
        text, _ = _cut(self.tokenizer.decode(self.ids), self.stops)
        delta, self.sent = text[self.sent:], len(text)
        return delta


def stream_pieces(tokenizer, token_ids, stops: tuple[str, ...]) -> list[int]:
    """The lengths (in characters) of the text pieces a streamed answer of these tokens is
    sent in (engine/serve/server.py's stream, which sends each non-empty delta of a TextStream, then
    what it held back): recorded, so that a replay streams the same pieces."""
    text = TextStream(tokenizer, stops)
    pieces = [len(d) for d in map(text.push, token_ids) if d]
    last = text.flush()
    return pieces + [len(last)] if last else pieces


def logprob_entry(record, tokenizer, top: int) -> dict:
    entry = {"token": record.text, "logprob": record.logprob, "bytes": token_bytes(tokenizer, record.token_id)}
    entry["top_logprobs"] = [
        {"token": tokenizer.token_text(tid), "logprob": lp, "bytes": token_bytes(tokenizer, tid)}
        for tid, lp in record.topk[:top]
    ]
    return entry


def _usage(call: Call, completion_tokens: int) -> dict:
    prompt = len(call.prepared.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def _tttr(call: Call, stop_sequence: str | None = None) -> dict:
    """The extension field: the seed (drawn by the server when the request had none), and the
    `stop` string that ended the answer, where one did (Anthropic's Messages API names it)."""
    out = {"seed": call.prepared.seed, "seed_drawn": call.prepared.seed_drawn}
    if stop_sequence is not None:
        out["stop_sequence"] = stop_sequence
    return out


def chat_response(service: Service, call: Call, out: Output, response_id: str) -> dict:
    req = call.prepared.request
    message: dict = {"role": "assistant", "content": out.text if (out.text or not out.tool_calls) else None}
    if out.tool_calls:
        message["tool_calls"] = [c.to_json(f"call_{response_id[-12:]}_{i}") for i, c in enumerate(out.tool_calls)]
    choice = {"index": 0, "message": message, "finish_reason": out.finish_reason, "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = {"content": [logprob_entry(r, service.tokenizer, req.top_logprobs) for r in out.records]}
    return {"id": response_id, "object": "chat.completion", "created": call.created, "model": service.model_id,
            "system_fingerprint": service.system_fingerprint, "choices": [choice],
            "usage": _usage(call, out.completion_tokens), "tttr": _tttr(call, out.stop_sequence)}


def chat_chunk(service: Service, call: Call, response_id: str, delta: dict, *, finish: str | None = None,
               records: list | None = None, stop_sequence: str | None = None) -> dict:
    req = call.prepared.request
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    if req.logprobs and records:
        choice["logprobs"] = {"content": [logprob_entry(r, service.tokenizer, req.top_logprobs) for r in records]}
    chunk = {"id": response_id, "object": "chat.completion.chunk", "created": call.created,
             "model": service.model_id, "system_fingerprint": service.system_fingerprint, "choices": [choice],
             "tttr": _tttr(call, stop_sequence)}
    if req.include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(service: Service, call: Call, response_id: str, completion_tokens: int, obj: str) -> dict:
    return {"id": response_id, "object": obj, "created": call.created, "model": service.model_id,
            "system_fingerprint": service.system_fingerprint, "choices": [],
            "usage": _usage(call, completion_tokens), "tttr": _tttr(call)}


def _legacy_logprobs(records: list, tokenizer, top: int, offset: int = 0) -> dict:
    tokens, lps, tops, offsets = [], [], [], []
    at = offset
    for r in records:
        tokens.append(r.text)
        lps.append(r.logprob)
        tops.append({tokenizer.token_text(t): lp for t, lp in r.topk[:top]} if top else None)
        offsets.append(at)
        at += len(r.text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def completion_response(service: Service, call: Call, out: Output, response_id: str) -> dict:
    req = call.prepared.request
    choice = {"index": 0, "text": out.text, "finish_reason": out.finish_reason, "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = _legacy_logprobs(out.records, service.tokenizer, req.top_logprobs)
    return {"id": response_id, "object": "text_completion", "created": call.created, "model": service.model_id,
            "system_fingerprint": service.system_fingerprint, "choices": [choice],
            "usage": _usage(call, out.completion_tokens), "tttr": _tttr(call)}


def completion_chunk(service: Service, call: Call, response_id: str, text: str, *, finish: str | None = None,
                     records: list | None = None) -> dict:
    req = call.prepared.request
    choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if req.logprobs and records:
        choice["logprobs"] = _legacy_logprobs(records, service.tokenizer, req.top_logprobs)
    chunk = {"id": response_id, "object": "text_completion", "created": call.created, "model": service.model_id,
             "system_fingerprint": service.system_fingerprint, "choices": [choice], "tttr": _tttr(call)}
    if req.include_usage:
        chunk["usage"] = None
    return chunk


def models(service: Service) -> dict:
    return {"object": "list", "data": [{"id": service.model_id, "object": "model", "created": service.created,
                                        "owned_by": "tttr"}]}
