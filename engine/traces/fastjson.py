"""JSON read and written by orjson where it is installed (the otel extra brings it), with the
standard library's results: what orjson refuses goes to `json`, so a value reads and a
failure says the same either way.

orjson reads a message's few hundred bytes of JSON about three times as fast as `json.loads`
and writes a whole OTLP/JSON file about five times as fast as `json.dumps` (measured here);
the traces package reads ~2 such texts per span. (A whole file is read by `json`: orjson is
barely faster there, and its times are 19-digit numbers.)
"""

from __future__ import annotations

import json
import re
from typing import Any

try:
    import orjson
except ImportError:  # without the otel extra: the standard library
    orjson = None


_LONG_NUMBER = re.compile(r"\d{19}")


def loads(text: str) -> Any:
    """`json.loads(text)`: orjson's reading where it reads `text` alike; `json.loads` for what
    it refuses (NaN and Infinity, lone surrogates, deep nesting) and for text with a run of 19
    digits (orjson reads an integer beyond 64 bits as a float), so the value and any error are
    json.loads's. For short texts: the search for digits reads the whole text."""
    if orjson is not None and not _LONG_NUMBER.search(text):
        try:
            return orjson.loads(text)
        except ValueError:  # orjson.JSONDecodeError
            pass
    return json.loads(text)
