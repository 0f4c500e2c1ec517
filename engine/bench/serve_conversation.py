"""A multi-turn conversation through one `Service`, with and without prefix reuse, side by side.

Each turn's prompt is the conversation so far (a long system prompt, the earlier questions
and answers) plus a new question, as an agent's next call is: with the server's prefix cache
(engine/inference/prefix_cache.py, `invariant` kernels) only the new part is prefilled. The
two sides alternate on the same loaded model, so the machine's load falls on both alike;
every turn's tokens and logits digests are compared between them (`tttr bench serve`'s
`prefix_reuse_*` figures)."""

from __future__ import annotations

import time
from dataclasses import dataclass

SYSTEM = ("You are a careful shell assistant working in a small project directory. Answer with one short "
          "command or one short sentence. The directory holds logs/, src/, notes.txt and a Makefile; the "
          "logs rotate daily and old ones are compressed. Never delete anything outside the directory. ") * 6
QUESTIONS = (
    "Which command lists the files in logs/ by size?",
    "The largest file is app.log (40 MB). How do I see its last 20 lines?",
    "It says 'disk quota exceeded' at 03:10. Which files are older than a week?",
    "Compress those, then tell me how much space that saved.",
)


@dataclass(frozen=True, slots=True)
class Turn:
    prompt_tokens: int
    tokens: tuple[tuple[int, str], ...]  # (token id, logits digest) per position


def conversation(service, *, turns: int = len(QUESTIONS), tokens: int = 16, seed: int = 5) -> list[Turn]:
    """Run the conversation's `turns` on `service` (seeded, sampled); its turns, in order."""
    from tttr.engine.serve.requests import parse_chat

    messages = [{"role": "system", "content": SYSTEM}]
    out = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        prepared = service.prepare(parse_chat({"messages": messages, "max_tokens": tokens, "temperature": 0.7,
                                               "seed": seed + i}))
        records = service.start(prepared).future.result()
        text = service.tokenizer.decode([r.token_id for r in records if r.token_id not in service.tokenizer.stop_token_ids])
        messages.append({"role": "assistant", "content": text})
        out.append(Turn(len(prepared.prompt_ids), tuple((r.token_id, r.digest) for r in records)))
    return out


def measure(service, *, rounds: int = 3, turns: int = len(QUESTIONS), tokens: int = 16) -> dict:
    """The conversation's wall time with the service's prefix cache and without (best round
    of each, alternating which goes first), and whether every turn's tokens and digests agree."""
    from tttr.engine.inference.prefix_cache import PrefixCache

    engine = service.engine
    kept = engine.prefixes
    times: dict[str, list[float]] = {"with": [], "without": []}
    answers: dict[str, list[list[Turn]]] = {"with": [], "without": []}
    hits = reused = 0
    try:
        for r in range(rounds):
            for side in (("with", "without") if r % 2 == 0 else ("without", "with")):
                cache = PrefixCache() if side == "with" else None  # empty: no earlier round's prefixes
                engine.prefixes = cache
                began = time.perf_counter()
                answers[side].append(conversation(service, turns=turns, tokens=tokens))
                times[side].append(time.perf_counter() - began)
                if cache is not None:
                    hits, reused = cache.hits, cache.reused_tokens
    finally:
        engine.prefixes = kept
    first = answers["without"][0]
    return {
        "turns": turns, "prompt_tokens": [t.prompt_tokens for t in first],
        "with_s": round(min(times["with"]), 3), "without_s": round(min(times["without"]), 3),
        "speedup": round(min(times["without"]) / min(times["with"]), 2),
        "identical": all(a == first for side in answers.values() for a in side),
        "reused_tokens": reused, "hits": hits,
    }
