"""An unmodified LiteLLM program under `tttr record`: it names an OpenAI model of its own
("gpt-4o-mini"), reaches TTTR through `OPENAI_BASE_URL` as LiteLLM's OpenAI route reads it, and
replays identically with no model computation. (The Agents SDK, LangGraph and the `openai`
client are tests/test_examples.py's.)"""

from __future__ import annotations

import json

import pytest

from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import program_tree, record_one_call, replay_json

PROGRAM = """
import litellm

r = litellm.completion(model="gpt-4o-mini", temperature=0, max_tokens=8,
                       messages=[{"role": "user", "content": "Name a colour."}])
print("said:", r.choices[0].message.content)
"""


@pytest.mark.slow
@needs_sandbox
def test_an_unmodified_litellm_program_records_and_replays_identically(tmp_path, capsys):
    db = tmp_path / "litellm.db"
    rec = record_one_call(capsys, db, program_tree(tmp_path, "work", PROGRAM))
    said = rec["stdout"].strip()
    assert said.startswith("said: ") and len(said) > len("said: "), rec["stdout"]
    with Store.open(db, readonly=True) as store:
        (prompt,) = store.events(rec["run_id"], kind="prompt")
    assert json.dumps(prompt.value).count('"gpt-4o-mini"') >= 1  # the program's own model name, as sent

    res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["divergence"] is None, res
    assert res["stdout"] == rec["stdout"] and res["logits_computed"] == 0
