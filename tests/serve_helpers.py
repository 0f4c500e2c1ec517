"""A real `tttr serve` app on a free loopback port, in a thread, for tests that talk HTTP."""

from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    """uvicorn serving `app` until `stop()`; `url` is its base."""

    def __init__(self, app, lifespan: str = "on"):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan=lifespan))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def recording_server(db, **service_kw) -> Running:
    """A real `tttr serve --db DB` (the default model, loaded) on a free port: the Running, with
    its `db`, `service` and `recorder`; the caller stops it."""
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service

    service = Service(**{"kernel_mode": "invariant", **service_kw})
    recorder = CallRecorder(db, service)
    running = Running(create_app(Live(service), recorder))
    assert service.wait_ready(300), service.load_error
    running.db, running.service, running.recorder = db, service, recorder
    return running
