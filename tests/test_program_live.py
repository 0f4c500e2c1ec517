"""The live model of a program's replay or fork (engine/program/live.py) loads beside the program,
not before it: a fork's checks import no torch, `start_loading` returns at once, and the thread
that imported torch and loaded the model lasts until `close` (a pool started by a thread that
then ends makes later generation several times slower)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest


def test_checking_a_calls_recorded_sampling_imports_no_torch():
    code = ("import sys, json; from tttr.engine.replay.calls import _sampling; "
            "p = _sampling({'temperature': 0.7, 'top_p': 0.9, 'top_k': 5}, 3); "
            "print(json.dumps([p.temperature, p.top_k, p.seed, 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [0.7, 5, 3, False]


def test_the_model_loads_in_a_thread_that_lasts_until_close(monkeypatch):
    from tttr.engine.program import live as program_live

    release = threading.Event()
    threads: list[threading.Thread] = []

    class Service:
        closed = False

        def close(self):
            self.closed = True

    def load(self):
        threads.append(threading.current_thread())
        release.wait(60)  # a load that takes a while
        self._loaded.append(Service())

    monkeypatch.setattr(program_live.LiveCalls, "_load", load)
    recorder = SimpleNamespace(service=None)
    live = program_live.LiveCalls(None, recorder, None)
    live.start_loading()  # returns while the load goes on: the program starts meanwhile
    live.start_loading()  # once
    release.set()
    service = live._service()
    assert recorder.service is service and len(threads) == 1
    loader = threads[0]
    assert loader is not threading.current_thread() and loader.is_alive()  # still there while the model is used
    live.close()
    assert not loader.is_alive() and service.closed


def test_a_failed_load_is_raised_where_the_model_is_wanted(monkeypatch):
    from tttr.engine.program import live as program_live

    def load(self):
        self._loaded.append(RuntimeError("no such model"))

    monkeypatch.setattr(program_live.LiveCalls, "_load", load)
    live = program_live.LiveCalls(None, SimpleNamespace(service=None), None)
    with pytest.raises(RuntimeError, match="no such model"):
        live._service()
    live.close()
