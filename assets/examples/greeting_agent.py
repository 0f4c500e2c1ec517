"""An agent as a function, called in-process (by a test, a notebook, a service) rather than run
as a program: it plans the task suite's `write-line` task (which file, which line) with the
official `openai` client and one SDK tool.

Its test, tests of it replayed sealed with TTTR's pytest plugin: test_greeting_agent_replay.py.
Without TTTR it runs against any OpenAI-compatible server (OPENAI_BASE_URL, OPENAI_API_KEY)."""

import os
import re

from tttr.recorders import sdk

TASK = "Write the line `hello world` into a new file named `greeting.txt` in the current directory."
ASKED = "What is the file name? Reply with the name only."


@sdk.tool
def list_files() -> list:
    return sorted(os.listdir("."))


def ask(client, question: str) -> str:
    answer = client.chat.completions.create(
        model=os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"), temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": question}])
    return (answer.choices[0].message.content or "").strip()


def pick(answer: str, allowed: list, fallback: str) -> str:
    """A value the task names that the answer says, else the fallback (the model is small)."""
    found = [v for v in allowed if re.search(re.escape(v), answer)]
    return found[0] if found else fallback


def plan_greeting(client) -> dict:
    """Which file to write and which line, asked of the model; the model's own words kept."""
    files = list_files()
    if "greeting.txt" in files:
        return {"file": None, "line": None, "said": ["greeting.txt exists already"]}
    said_file = ask(client, f"Task: {TASK}\nFiles here: {', '.join(files) or 'none'}\n{ASKED}")
    name = pick(said_file, ["greeting.txt"], "greeting.txt")
    said_line = ask(client, f"Task: {TASK}\nWhat line goes into {name}? Reply with the line only.")
    return {"file": name, "line": pick(said_line, ["hello world"], "hello world"), "said": [said_file, said_line]}
