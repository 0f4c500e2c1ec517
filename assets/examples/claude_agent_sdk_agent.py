"""A small program on Anthropic's Claude Agent SDK (`claude-agent-sdk`), recorded and replayed
by TTTR as it is: `query()` starts the Claude Code CLI that the wheel bundles, and the CLI
talks to ANTHROPIC_BASE_URL with ANTHROPIC_API_KEY, which `tttr record` sets (no login is needed
when a key is set).

    tttr record --db claude.db --tree work -- env CLAUDE_CODE_MAX_OUTPUT_TOKENS=64 python3 claude_agent_sdk_agent.py
    tttr replay 1 --db claude.db

CLAUDE_CODE_MAX_OUTPUT_TOKENS: the CLI asks for 128,000 output tokens, more than the default
model's 8,192-token context holds, and TTTR's server refuses that as Anthropic's API does (a
prompt plus max_tokens over the context is an error); a smaller bound fits. The CLI sends no
temperature (Anthropic's default, 1, applies), so the small model's answer is a sample: a short
one ends the turn, a long one is cut at the bound, which the CLI reports as an error result."""

import anyio
from claude_agent_sdk import AssistantMessage, ClaudeAgentOptions, ResultMessage, TextBlock, query


async def main() -> int:
    options = ClaudeAgentOptions(system_prompt="Reply with one word.", max_turns=1, tools=[])
    code = 1
    async for message in query(prompt="Say hello.", options=options):  # read to its end: the CLI then exits
        if isinstance(message, AssistantMessage):
            print("assistant:", " ".join(b.text for b in message.content if isinstance(b, TextBlock)))
        elif isinstance(message, ResultMessage):
            print("result:", "error" if message.is_error else "ok", f"after {message.num_turns} turn(s)")
            code = 1 if message.is_error else 0
    return code


if __name__ == "__main__":
    raise SystemExit(anyio.run(main))
