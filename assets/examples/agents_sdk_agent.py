"""The same `write-line` agent on the OpenAI Agents SDK (`openai-agents`), unchanged for TTTR
except for the SDK's decorators: it names its own model ("gpt-4.1-mini") and talks to
`OPENAI_BASE_URL` through the Responses API, the SDK's default. Under `tttr record` the local
model answers whatever model the program names (the name stays in the recorded requests),
and the SDK's trace upload is off (`OPENAI_AGENTS_DISABLE_TRACING`: the run is TTTR's record).

The model is small and has no tool format, so the program asks the agent narrow questions
and runs the tools itself, as the openai example does.

    tttr record --db agent.db --tree work --check 'sh check.sh' -- python3 agents_sdk_agent.py
"""

import os
import re
import sys

from agents import Agent, ModelSettings, Runner

from tttr.recorders import sdk

TASK = "Write the line `hello world` into a new file named `greeting.txt` in the current directory."

helper = Agent(name="helper", model="gpt-4.1-mini", instructions="Answer with the value asked for, nothing else.",
               model_settings=ModelSettings(temperature=0, max_tokens=128))


@sdk.tool
def list_files() -> list:
    return sorted(os.listdir("."))


@sdk.tool
def write_file(name: str, line: str) -> str:
    with open(name, "w") as f:
        f.write(line + "\n")
    return f"wrote {len(line) + 1} bytes to {name}"


def pick(answer: str, allowed: list, fallback: str) -> str:
    """The first `quoted` value of the answer that the task names, else the fallback."""
    found = [v for v in re.findall(r"`([^`\n]+)`", answer) if v in allowed]
    return found[0] if found else fallback


def main() -> int:
    task = sys.argv[1] if len(sys.argv) > 1 else TASK

    def ask(question: str) -> str:
        return str(Runner.run_sync(helper, f"Task: {task}\n{question}").final_output or "")

    print(f"[{sdk.now():%Y-%m-%d %H:%M}] task: {task}")
    files = list_files()
    print("files:", files)
    quoted = re.findall(r"`([^`]+)`", task)
    names = [q for q in quoted if "." in q] or ["out.txt"]
    lines = [q for q in quoted if q not in names] or [""]
    said = ask("What is the file name? Reply with the name only.")
    name = pick(said, names, names[0])
    print(f"file name: {name!r} (the model said {said!r})")
    if name in files:  # the task wants a new file: never overwrite one
        print(f"{name} exists already: not overwriting it")
        return 1
    said = ask("What line goes into the file? Reply with the line only.")
    line = pick(said, lines, lines[0])
    print(f"line: {line!r} (the model said {said!r})")
    print(write_file(name, line))
    check = sdk.shell(f"cat {name}", timeout=10)
    print(f"{name}: {check.stdout.strip()!r} (exit {check.exit_code})")
    return check.exit_code


if __name__ == "__main__":
    sys.exit(main())
