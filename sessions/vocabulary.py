"""The project's nouns, defined once: the layers, and which layers a policy can pin or free.

Every package imports these names instead of spelling the tuple again (a second spelling
is a bug waiting for the two to disagree). Kept free of imports so that the command line
can use them without loading anything else.
"""

from __future__ import annotations

# The layers, in the order they are shown: tensor (logits), token (sampling), trace (the
# world: clock, tools, files), agent (values derived from the others: prompt, message,
# parsed action, outcome; recorded for reading, never pinned or freed).
LAYERS = ("tensor", "token", "trace", "agent")

# The layers a replay policy pins or frees.
RECORDED_LAYERS = ("tensor", "token", "trace")
