"""The lowest layer: what every other package shares, and the session database.

- `vocabulary`: the layers, the kinds of event and the layer of each, the site grammar.
- `errors`: `TTTRError`, the base of every user-facing error (one line, exit code 2).
- `safe_text`: untrusted text made visible and cut to a line.
- `cache`: TTTR's cache directory and the C shared libraries built in it.
- `store` (with `schema`, `codec`, `values`, `blobs`, `records`, `opening`, `header`,
  `liveness`): the SQLite session store — runs, events, blobs — and its checks on read.
"""
