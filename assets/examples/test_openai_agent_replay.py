"""openai_agent.py's decisions as a test: run 1 of a database (recorded as README.md shows)
replayed sealed against the program as it is now, with TTTR's pytest plugin:

    pytest --tttr-db agent.db assets/examples/test_openai_agent_replay.py

The first test passes while the program asks what it asked when recorded. The second changes
one line of its prompt and fails with the divergence: where the program now asks otherwise,
the recorded and the requested text. Nothing runs live: no model, no tool."""

import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ASKED = "What is the file name? Reply with the name only."


@pytest.mark.tttr(run=1)
def test_the_agent_still_decides_as_recorded(tttr_replay, tmp_path):
    shutil.copy(HERE / "openai_agent.py", tmp_path)  # today's program, alone (the recorded tree has the rest)
    result = tttr_replay.replay(code=tmp_path)
    assert result.identical and result.logits_computed == 0 and result.tools_run == 0


@pytest.mark.tttr(run=1)
def test_a_one_line_prompt_change_fails(tttr_replay, tmp_path):
    source = (HERE / "openai_agent.py").read_text()
    (tmp_path / "openai_agent.py").write_text(source.replace(ASKED, "Which file? Reply with its name only."))
    tttr_replay.replay(code=tmp_path)  # fails: call 0 asks otherwise
