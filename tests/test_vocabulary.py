"""The vocabulary is defined once (`tttr.sessions.vocabulary`) and everyone uses it: the
site grammar, its order, the kind → layer map; one Divergence, one ShellState, one rule
for cutting a value to a line."""

import ast
from pathlib import Path

import pytest

from tttr.engine.replay.diff import Divergence, divergences
from tttr.sessions import codec
from tttr.sessions.safe_text import brief, short
from tttr.sessions.vocabulary import (KIND_LAYER, KINDS, LAYERS, MUTABLE, POSITIONAL, SETUP_STEP, Site, SiteError,
                                      canonical_site, site, site_order, site_parts)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "engine", "kernels", "recorders", "sessions")


def test_every_kind_has_a_known_layer():
    assert set(KIND_LAYER.values()) <= set(LAYERS)
    assert set(MUTABLE) <= set(KINDS) and set(POSITIONAL) <= set(KINDS)
    assert KIND_LAYER["logits"] == "tensor" and KIND_LAYER["token"] == "token" and KIND_LAYER["tool"] == "trace"


@pytest.mark.parametrize("text", ["2:clock", "setup:setup", "setup:clock", "0:token:0", "12:logits:345", "3:foreign_kind", "4:x:7"])
def test_stored_sites_round_trip(text):
    parts = site_parts(text)
    assert parts is not None and site(*parts) == text
    pos, verbatim = codec.split_site(text, parts[0], parts[1])
    assert verbatim is None and codec.join_site(parts[0], parts[1], pos, None) == text


@pytest.mark.parametrize("text", ["02:clock", "2:token:01", "2:token:-1", " 2:clock", "2", "a:clock", "2::3", "1:2:3:4",
                                  "٣:clock", "-01:clock", "Setup:clock", "setup :clock"])
def test_non_canonical_sites_are_stored_verbatim(text):
    assert site_parts(text) is None
    assert codec.split_site(text, 2, "clock") == (None, text)


def test_the_setup_step_is_written_setup_and_its_old_spelling_reads_the_same():
    """Sites of step -1 are `setup:KIND` (a value that starts with "-" reads as an option on a
    command line); `-1:KIND`, as older databases and scripts wrote them, names the same site."""
    assert site(SETUP_STEP, "clock") == "setup:clock" and site(-2, "clock") == "-2:clock"
    assert site_parts("-1:clock") == site_parts("setup:clock") == (SETUP_STEP, "clock", None)
    assert canonical_site("-1:setup") == "setup:setup" and canonical_site("4:token:2") == "4:token:2"
    assert canonical_site("not a site") == "not a site"
    # stored as nothing but its position, so it reads back in the one spelling
    pos, verbatim = codec.split_site("-1:clock", SETUP_STEP, "clock")
    assert verbatim is None and codec.join_site(SETUP_STEP, "clock", pos, None) == "setup:clock"
    assert Site.parse("setup:clock") == Site.parse(" -1:clock") == Site(SETUP_STEP, "clock")
    assert str(Site.parse("-1:clock")) == "setup:clock" and Site.parse("setup:clock").at("clock", SETUP_STEP)
    assert site_order("-1:setup") == site_order("setup:setup") < site_order("0:prompt")
    for bad in ("setup:token", "setup:clock:1", "setup:bogus", "setupx:clock", "setup"):
        with pytest.raises(SiteError):
            Site.parse(bad)


def test_site_order_is_the_order_the_loop_consumes():
    consumed = ["setup:clock", "setup:setup", "0:prompt", "0:token:0", "0:logits:0", "0:token:1", "0:logits:1", "0:token:10",
                "0:message", "0:action", "0:clock", "0:tool", "1:prompt", "1:outcome", "not a site"]
    shuffled = sorted(consumed, key=lambda s: (hash(s) % 7, s))
    ordered = sorted(shuffled, key=site_order)
    # token and logits of one position share a rank; everything else is strictly ordered
    assert [s for s in ordered if "logits" not in s] == [s for s in consumed if "logits" not in s]
    assert ordered.index("0:token:1") < ordered.index("0:token:10") and ordered[-1] == "not a site"


def test_user_sites_parse_and_refuse():
    assert Site.parse(" 2:token:05 ") == Site(2, "token", 5) and str(Site(2, "token", 5)) == "2:token:5"
    assert Site.parse("3:clock").layer == "trace" and Site.parse("3:clock").at("clock", 3)
    assert not Site.parse("3:clock").at("clock", 4) and not Site.parse("3:clock").at("tool", 3)
    for bad in ("2:token", "2:clock:1", "2:bogus", "x", "99999999999:clock"):
        with pytest.raises(SiteError):
            Site.parse(bad)



def test_setup_value_sites_carry_their_path_or_name():
    at = Site.parse("setup:file:notes/a b.txt")
    assert (at.step, at.name, at.arg, at.layer) == (-1, "file", "notes/a b.txt", "trace")
    assert str(at) == "setup:file:notes/a b.txt" and at.at("file", -1)
    assert str(Site.parse("-1:env:GREETING")) == "setup:env:GREETING"
    assert Site.parse("2:message") == Site(2, "message")
    for bad in ("setup:file:", "2:file:a.txt", "setup:env", "setup:file:" + "a" * 5000):
        with pytest.raises(SiteError):
            Site.parse(bad)


def test_one_divergence_names_its_sides():
    d = Divergence("1:tool", "trace", "a\x1b[2J", {"exit_code": 1}, ("recorded", "live"))
    assert d.to_json() == {"site": "1:tool", "layer": "trace", "recorded": "a\x1b[2J", "live": {"exit_code": 1}}
    assert "\x1b" not in d.describe() and "recorded 'a\\x1b[2J'" in d.describe()
    plain = divergences([], [type("E", (), {"kind": "clock", "site": "0:clock", "value": {"t": "x"}})()]).first
    assert plain["trace"].to_json() == {"site": "0:clock", "layer": "trace", "a": None, "b": "x"}


def test_brief_and_short_cut_to_width():
    assert short("a\n  b\tc", 80) == "a b c" and len(short("x" * 500, 40)) == 40 and short("x" * 500, 40).endswith("…")
    assert brief("é" * 300, 20).endswith("…") and len(brief("é" * 300, 20)) == 20 and brief({"a": 1}) == '{"a": 1}'


def _definitions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                    found.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            found.setdefault(target.id, []).append(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("name", ["Divergence", "ShellState", "Site", "Mutation", "site_order", "site_parts", "canonical_site", "SETUP_STEP",
                                  "KIND_LAYER", "brief", "short", "_short", "_site_key", "_LAYER_OF", "_RANK"])
def test_defined_once(name):
    assert len(_definitions().get(name, [])) <= 1, f"{name} is defined in {_definitions()[name]}"
