"""Shared helpers for the trace-layer tests (not a test module)."""

from __future__ import annotations

from datetime import datetime

import pytest

from tttr.recorders.probe import probe

CLOCK = datetime(2026, 3, 2, 10, 0, 0)

needs_sandbox = pytest.mark.skipif(not probe().ok, reason=probe().line())
