"""Anthropic's Claude Agent SDK (`claude-agent-sdk`, which bundles the Claude Code CLI) under
`tttr record` and `tttr replay`, unmodified: assets/examples/claude_agent_sdk_agent.py. And the
Messages API fields the CLI sends that a plain `anthropic` client does not (engine/serve/messages_api.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from sandbox_helpers import needs_sandbox
from tests.program_helpers import record_program, replay_json
from tttr.engine.serve.errors import APIError
from tttr.engine.serve.messages_api import to_chat

ROOT = Path(__file__).resolve().parents[1]
# As the CLI sends a turn (captured from claude-agent-sdk 0.2.189, Claude Code 2.1.332), shortened.
CLI_BODY = {
    "model": "claude-opus-5-5", "max_tokens": 64, "stream": True,
    "system": [{"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
               {"type": "text", "text": "Reply with one word.", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": "Say hello."},
                 {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux",
                                                 "cache_control": {"type": "ephemeral"}}]}],
    "tools": [], "metadata": {"user_id": "{\"device_id\": \"d\", \"session_id\": \"s\"}"},
    "thinking": {"type": "adaptive", "display": "updates"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium"},
}


def test_the_cli_turn_is_the_chat_call_it_means():
    chat = to_chat(CLI_BODY)
    assert chat["messages"] == [
        {"role": "system", "content": "You are a Claude agent.Reply with one word."},
        {"role": "user", "content": "Say hello."},
        {"role": "system", "content": "# Environment\nPlatform: linux"},  # where the CLI put it
    ]
    assert chat["max_tokens"] == 64 and chat["stream"] is True and "thinking" not in chat and "metadata" not in chat
    for thinking, refused in (({"type": "enabled", "budget_tokens": 1024}, True), ({"type": "disabled"}, False)):
        if refused:
            with pytest.raises(APIError, match="thinking is not supported"):
                to_chat({**CLI_BODY, "thinking": thinking})
        else:
            assert to_chat({**CLI_BODY, "thinking": thinking})["messages"] == chat["messages"]
    with pytest.raises(APIError, match=r"messages\[1\]\.content\[0\]"):  # a system message holds text only
        to_chat({**CLI_BODY, "messages": [CLI_BODY["messages"][0], {"role": "system", "content": [{"type": "image"}]}]})
    with pytest.raises(APIError, match=r"messages\[0\]\.role='tool'"):
        to_chat({**CLI_BODY, "messages": [{"role": "tool", "content": "x"}]})


@pytest.mark.slow
@needs_sandbox
@pytest.mark.skipif(importlib.util.find_spec("claude_agent_sdk") is None,
                    reason="claude-agent-sdk is not installed (pip install claude-agent-sdk; in the test extra)")
def test_a_claude_agent_sdk_program_records_and_replays_its_model_calls(tmp_path, capsys):
    tree = tmp_path / "work"
    tree.mkdir()
    shutil.copy(ROOT / "assets" / "examples" / "claude_agent_sdk_agent.py", tree)
    db = tmp_path / "claude.db"
    program = ("env", "CLAUDE_CODE_MAX_OUTPUT_TOKENS=64", "python3", "claude_agent_sdk_agent.py")
    rec = record_program(capsys, db, tree, program=program)
    # The CLI's turn reached the model (a sample: a short answer ends it, exit 0; one cut at 64 tokens
    # is continued and then reported as an error result, exit 1). Its session-title call asks for
    # structured output (output_config.format), which the server refuses: refused, not recorded.
    assert rec["calls"] >= 1 and "result:" in rec["stdout"], rec["stderr"]
    assert rec["refused_calls"] >= 1

    from tttr.sessions.store import Store

    with Store.open(db, create=False, readonly=True) as store:
        prompts = [e.value for e in store.load_run(rec["run_id"])[1] if e.kind == "prompt"]
    roles = [m["role"] for m in prompts[0]["request"]["messages"]]
    assert roles[:3] == ["system", "user", "system"], roles  # the CLI's environment after the user's turn
    assert prompts[0]["request"]["messages"][1]["content"] == "Say hello."

    res = replay_json(capsys, db, rec["run_id"])
    # Every model call answered from the recording: the same requests, nothing generated.
    assert res["calls_answered"] == rec["calls"] and res["calls_generated"] == 0 and res["logits_computed"] == 0, res
    assert res["exit_code"] == rec["exit_code"] and res["same_stdout"] is True, res
    # Not identical: the CLI's runtime reads the realtime clock while it waits for the model, so the
    # recording (a model generating) read it more often than the replay; a request never differs.
    divergence = res["divergence"]
    assert divergence is None or not str(divergence["at"] or "").endswith(":prompt"), divergence
