"""greeting_agent.py's decisions as a test: an agent *function* called in this process, its
model calls and SDK tool answered from the run named `greeting` of a database, sealed, with
TTTR's pytest plugin (no model, no tool runs, nothing reaches the network):

    pytest --tttr-db greeting.db --tttr-record -k still_decides assets/examples/test_greeting_agent_replay.py
    pytest --tttr-db greeting.db assets/examples/test_greeting_agent_replay.py

The first command records the run (the default model answers, here in the test's process); the
second replays both tests. The first passes while the function asks what it asked when
recorded. The second changes one line of its prompt and fails with the divergence: the call,
the field, the recorded and the requested text. There is no sandbox: the function runs here,
and only what it asks through its client and TTTR's SDK is recorded and answered."""

import pytest
from openai import OpenAI

import greeting_agent

ASKED = "What is the file name? Reply with the name only."


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "README").write_text("greeting.txt should say hello world\n")
    monkeypatch.chdir(tmp_path)


@pytest.mark.tttr(name="greeting")
def test_the_agent_still_decides_as_recorded(tttr_replay, folder):
    plan = greeting_agent.plan_greeting(OpenAI())  # OPENAI_BASE_URL is the plugin's server
    assert plan["file"] == "greeting.txt" and plan["line"] == "hello world"


@pytest.mark.tttr(name="greeting")
def test_a_one_line_prompt_change_fails(tttr_replay, folder, monkeypatch):
    monkeypatch.setattr(greeting_agent, "ASKED", "Which file? Reply with its name only.")
    greeting_agent.plan_greeting(OpenAI())  # fails: call 0 asks otherwise
