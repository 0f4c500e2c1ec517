"""Shared pytest set-up. Area fixtures live in the area's own test modules."""

import os

# Tests never talk to a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
