"""`tttr bench serve`: the server's speed and determinism under load, side by side in one run.

Two `tttr serve` processes (one without a database, one with `--db`) and the engine itself
(in this process, no HTTP) run the same eight seeded chat requests, in turn, each round:
the engine with the eight at once, each server with eight concurrent streaming clients, and
the first server with one client at a time (the answers alone). The clients are threads of
this process, so their JSON parsing does not take the servers' CPU; the engine runs here
only while the servers are idle. Figures are the best round of each; the answers under load
are compared with the same requests alone, token by token (text and logprob). The `--db`
overhead is given twice: by throughput (each round's pair) and by the servers' own CPU time
per token (read from /proc), which a shared machine's other work moves far less. Last, a
four-turn conversation on the bench's own engine, with and without prefix reuse
(serve_conversation.py)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tttr.engine.bench import serve_conversation as conversation

try:  # the HTTP client the `openai` package is built on
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx

CLIENTS = 8
PROMPTS = (
    "Name a colour.", "Write one sentence about the sea.", "Count to ten in words.",
    "Describe a cat in a short sentence, please. " * 3, "What is two plus two? Explain.",
    "Give me a recipe for toast.", "List three animals that live in the forest and say why.",
    "Tell me a short story about a robot who learns to paint. " * 2,
)


@dataclass(frozen=True, slots=True)
class Answer:
    tokens: tuple[tuple[str, float], ...]  # (token text, logprob) per position
    n_tokens: int  # completion tokens (the end-of-turn token included)
    ttft: float  # seconds to the first token
    start: float
    end: float


def _body(i: int, tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": PROMPTS[i]}], "max_tokens": tokens, "temperature": 0.8,
            "seed": 1000 + i, "logprobs": True}


def _cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process `pid` has used, its threads included; None where
    /proc cannot say (not Linux)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _cpu_used(server: _Server, before: float | None) -> float | None:
    after = _cpu_seconds(server.proc.pid)
    return after - before if after is not None and before is not None else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A `tttr serve` in its own process."""

    def __init__(self, model_path: Path, db: Path | None, log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "tttr.app", "serve", "--model", str(model_path), "--port", str(self.port)]
        if db is not None:
            cmd += ["--db", str(db)]
        self._log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tttr serve exited with {self.proc.returncode}; see {self._log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"tttr serve was not ready in {timeout:.0f} s; see {self._log.name}")

    def stop(self) -> None:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def _stream(client, url: str, body: dict) -> Answer:
    """One streamed chat call: its tokens and times."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    tokens: list[tuple[str, float]] = []
    n, first = 0, None
    start = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"the server answered {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                entries = (choice.get("logprobs") or {}).get("content") or []
                if entries and first is None:
                    first = time.perf_counter()
                tokens += [(e["token"], e["logprob"]) for e in entries]
    end = time.perf_counter()
    return Answer(tuple(tokens), n, (first or end) - start, start, end)


def _concurrent(url: str, tokens: int) -> list[Answer]:
    """The eight requests at once, one client each."""
    results: list[Answer | None] = [None] * CLIENTS
    errors: list[BaseException] = []
    gate = threading.Barrier(CLIENTS)

    def client(i: int) -> None:
        try:
            with httpx.Client(timeout=600) as c:
                gate.wait()
                results[i] = _stream(c, url, _body(i, tokens))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _alone(url: str, tokens: int) -> list[Answer]:
    with httpx.Client(timeout=600) as c:
        return [_stream(c, url, _body(i, tokens)) for i in range(CLIENTS)]


def _aggregate(answers: list[Answer]) -> float:
    return sum(a.n_tokens for a in answers) / (max(a.end for a in answers) - min(a.start for a in answers))


def _engine_8(service, tokens: int) -> float:
    """The engine's own aggregate: the same eight requests submitted at once, no HTTP."""
    from tttr.engine.serve.requests import parse_chat

    prepared = [service.prepare(parse_chat(_body(i, tokens))) for i in range(CLIENTS)]
    t0 = time.perf_counter()
    calls = [service.start(p) for p in prepared]
    produced = sum(len(c.future.result()) for c in calls)
    return produced / (time.perf_counter() - t0)


def run_bench(*, model_path: Path, tokens: int = 48, rounds: int = 3,
              progress: Callable[[str], None] = lambda text: None) -> dict:
    from tttr.engine.serve.service import Service

    with tempfile.TemporaryDirectory(prefix="tttr-bench-serve-") as tmp:
        folder = Path(tmp)
        plain = _Server(model_path, None, folder / "plain.log")
        recording = _Server(model_path, folder / "calls.db", folder / "recording.log")
        try:
            progress("starting two servers (one with --db) and the engine…")
            service = Service(str(model_path), kernel_mode="invariant")
            service.load()
            plain.wait_ready()
            recording.wait_ready()
            best = {"http_1": 0.0, "http_8": 0.0, "http_8_db": 0.0, "engine_8": 0.0}
            ttfts: list[float] = []
            same = compared = 0
            overheads: list[float] = []
            cpu_overheads: list[float] = []  # the --db server's CPU per token against the plain one's
            over_engine: list[float] = []
            for r in range(1, rounds + 1):
                # The order alternates round by round and each ratio pairs figures of one round, so
                # neither server gains from going first (a warmer cache, a quieter moment).
                engine = _engine_8(service, tokens)
                if r % 2:
                    plain_cpu = _cpu_seconds(plain.proc.pid)
                    loaded = _concurrent(plain.url, tokens)
                    plain_cpu = _cpu_used(plain, plain_cpu)
                    db_cpu = _cpu_seconds(recording.proc.pid)
                    loaded_db = _concurrent(recording.url, tokens)
                else:
                    db_cpu = _cpu_seconds(recording.proc.pid)
                    loaded_db = _concurrent(recording.url, tokens)
                    plain_cpu = _cpu_seconds(plain.proc.pid)
                    loaded = _concurrent(plain.url, tokens)
                    plain_cpu = _cpu_used(plain, plain_cpu)
                alone = _alone(plain.url, tokens)  # meanwhile the --db server's writer ends (idle else)
                db_cpu = _cpu_used(recording, db_cpu)
                if plain_cpu is not None and db_cpu is not None:
                    cpu_overheads.append(db_cpu / sum(a.n_tokens for a in loaded_db)
                                         / (plain_cpu / sum(a.n_tokens for a in loaded)) - 1)
                one = sum(a.n_tokens for a in alone) / sum(a.end - a.start for a in alone)
                figures = {"http_1": one, "http_8": _aggregate(loaded), "http_8_db": _aggregate(loaded_db),
                           "engine_8": engine}
                best = {k: max(best[k], v) for k, v in figures.items()}
                overheads.append(figures["http_8"] / figures["http_8_db"] - 1)
                over_engine.append(figures["http_8"] / engine)
                ttfts += [a.ttft for a in loaded]
                for under in (loaded, loaded_db):
                    same += sum(a.tokens == b.tokens for a, b in zip(under, alone))
                    compared += len(under)
                cpu_line = (f"; servers' CPU per token {plain_cpu / sum(a.n_tokens for a in loaded) * 1000:.2f} ms "
                            f"(--db {db_cpu / sum(a.n_tokens for a in loaded_db) * 1000:.2f})"
                            if plain_cpu is not None and db_cpu is not None else "")
                progress(f"round {r}/{rounds}: HTTP 1 client {one:.1f} tok/s, 8 clients {figures['http_8']:.1f} "
                         f"(--db {figures['http_8_db']:.1f}), engine 8 {engine:.1f} tok/s{cpu_line}")
            progress(f"a {len(conversation.QUESTIONS)}-turn conversation with and without prefix reuse, "
                     f"{rounds} rounds…")
            reuse = conversation.measure(service, rounds=rounds)
            service.close()
        finally:
            plain.stop()
            recording.stop()
    return {
        "model": service.model_id, "kernels": "invariant", "clients": CLIENTS, "tokens": tokens, "rounds": rounds,
        "http_1_tok_s": round(best["http_1"], 2), "http_8_tok_s": round(best["http_8"], 2),
        "http_8_db_tok_s": round(best["http_8_db"], 2), "engine_8_tok_s": round(best["engine_8"], 2),
        "server_over_engine_8": round(statistics.median(over_engine), 3),  # the median of each round's pair
        "identical_under_load_fraction": round(same / compared, 4),
        "ttft_ms_p50": round(statistics.median(ttfts) * 1000, 1),
        "record_overhead": round(statistics.median(overheads), 4),  # the median of each round's pair
        # the same by the servers' CPU time per token (median of the rounds; None without /proc)
        "record_overhead_cpu": round(statistics.median(cpu_overheads), 4) if cpu_overheads else None,
        "prefix_reuse_with_s": reuse["with_s"], "prefix_reuse_without_s": reuse["without_s"],
        "prefix_reuse_speedup": reuse["speedup"], "prefix_reuse_identical": reuse["identical"],
        "prefix_reuse_prompt_tokens": reuse["prompt_tokens"],
    }


def format_report(r: dict) -> str:
    return "\n".join([
        f"serve ({r['kernels']}, {r['clients']} requests x {r['tokens']} tokens, best of {r['rounds']}; ratios: "
        "the median of each round's pair, the order alternating): "
        f"HTTP 1 client {r['http_1_tok_s']:.2f} tok/s, {r['clients']} clients {r['http_8_tok_s']:.2f} tok/s; "
        f"engine {r['clients']} sequences {r['engine_8_tok_s']:.2f} tok/s",
        f"server_over_engine_8 {r['server_over_engine_8']:.3f} (target >= 0.9); identical_under_load_fraction "
        f"{r['identical_under_load_fraction']:.4f} (target 1.0); ttft_ms_p50 {r['ttft_ms_p50']:.1f} ms at "
        f"{r['clients']} clients; record_overhead {r['record_overhead'] * 100:+.1f}% (target <= 5%)"
        + (f", by the servers' CPU per token {r['record_overhead_cpu'] * 100:+.1f}%"
           if r.get("record_overhead_cpu") is not None else ""),
        f"prefix reuse ({len(r['prefix_reuse_prompt_tokens'])}-turn conversation, prompts "
        f"{'/'.join(map(str, r['prefix_reuse_prompt_tokens']))} tokens): {r['prefix_reuse_with_s']:.2f} s with, "
        f"{r['prefix_reuse_without_s']:.2f} s without ({r['prefix_reuse_speedup']:.2f}x); same tokens and logits "
        f"digests: {str(r['prefix_reuse_identical']).lower()}",
    ])
