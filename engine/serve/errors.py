"""An API error: OpenAI's error object plus the HTTP status it is answered with."""

from __future__ import annotations

from tttr.engine.errors import EngineError


class APIError(EngineError):
    """A request the server refuses. `to_json()` is OpenAI's error shape."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(param: str | None, message: str, code: str = "invalid_value") -> APIError:
    """A 400 naming the parameter at fault (the request checkers' refusal)."""
    return APIError(message, status=400, param=param, code=code)


_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 413: "invalid_request_error",
          500: "server_error", 502: "server_error", 503: "server_error", 504: "server_error"}
