"""The runs list, read by window: what `tttr runs` and the app's runs screen show.

A database may hold tens of thousands of runs. The list is never read run by run: the
skeleton (`RunLink`: id, parent, recording) of every run is one narrow query, enough to
order the runs as a fork tree and to count them; the rows a reader shows are then read a
window of ids at a time, each window in a fixed number of queries however many runs it
holds (their rows with their ancestors', their step counts, their event counts). The
`Store` methods `run_links`, `run_rows` and `run_pages` are the interface; the queries
are here.
"""

from __future__ import annotations

import json
import sqlite3
from typing import NamedTuple

from .records import Run

WINDOW = 500  # runs per window `Store.run_pages` reads


class RunLink(NamedTuple):
    """A run's place in the list: its id, its parent's id (None for a recorded run, or
    when the stored parent is not an integer), and whether it is being recorded now."""

    id: int
    parent: int | None
    recording: bool


class RunRow(NamedTuple):
    """One run as a list shows it: the run, its steps and events (a fork's shared prefix
    included, as `Store.steps` and `Store.count_events` count them), and its ancestors,
    its parent first (what a fork inherits, such as a recorded program's command line)."""

    run: Run
    steps: int
    events: int
    ancestors: tuple[Run, ...]


def _ids(ids) -> str:
    return json.dumps([int(i) for i in ids])


def rows_with_ancestors(conn: sqlite3.Connection, columns: str, ids) -> list[tuple]:
    """The runs rows of `ids` and of every ancestor of theirs, in one query (the recursion
    stops at a cycle a hand-edited file may hold: UNION keeps each id once)."""
    return conn.execute(
        "WITH RECURSIVE chain(id) AS (SELECT value FROM json_each(?)"
        " UNION SELECT runs.parent FROM runs JOIN chain ON runs.id = chain.id WHERE runs.parent IS NOT NULL)"
        f" SELECT {columns} FROM runs WHERE id IN (SELECT id FROM chain)",
        (_ids(ids),),
    ).fetchall()


def max_steps(conn: sqlite3.Connection, segments: dict[int, list[tuple[int, int, int]]]) -> dict[int, int]:
    """{run: its highest step} over the segments that make up each run ({run: [(source,
    first seq, end seq)]}, as `Store._segments` gives them), in one query; a run with no
    steps is left out."""
    spec = json.dumps([[rid, source, first, end] for rid, parts in segments.items() for source, first, end in parts])
    rows = conn.execute(
        "SELECT json_extract(s.value, '$[0]'), max(t.step) FROM json_each(?) s JOIN steps t"
        " ON t.run = json_extract(s.value, '$[1]') AND t.first_seq < json_extract(s.value, '$[3]')"
        " AND t.last_seq >= json_extract(s.value, '$[2]') AND typeof(t.step) = 'integer'"
        " GROUP BY 1",
        (spec,),
    )
    return {rid: top for rid, top in rows if top is not None}


def last_own_events(conn: sqlite3.Connection, ids, end: int) -> dict[int, int | None]:
    """{run: the highest event key it stored itself, or None}, in one query (each a short
    range scan of `events`, whose keys are run << 32 | seq)."""
    rows = conn.execute(
        "SELECT j.value, (SELECT max(id) FROM events WHERE id >= j.value * ? AND id < j.value * ? + ?)"
        " FROM json_each(?) j",
        (end, end, end, _ids(ids)),
    )
    return dict(rows.fetchall())


def page_ids(conn: sqlite3.Connection, after: int | None, offset: int, limit: int) -> list[int]:
    """Up to `limit` run ids in id order: after the id `after`, or from position `offset`."""
    if after is None:
        sql, args = "SELECT id FROM runs ORDER BY id LIMIT ? OFFSET ?", (limit, offset)
    else:
        sql, args = "SELECT id FROM runs WHERE id > ? ORDER BY id LIMIT ?", (after, limit)
    return [rid for (rid,) in conn.execute(sql, args)]
