"""A short agent on Anthropic's official `anthropic` client and TTTR's SDK: it solves the task
suite's `write-line` task (write `hello world` into `greeting.txt`), as openai_agent.py does.

The model is small, so the program asks it narrow questions (which file? which line?) and
checks each answer against the task: a name the task does not mention is replaced by the
task's own. Under `tttr record` the model calls go to TTTR's server through Anthropic's
Messages API (ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, which `tttr record` sets), the first
whole and the second streamed; the tools and the clock are recorded by the SDK. Without TTTR
the same program runs against Anthropic's API (ANTHROPIC_MODEL names the model).

    tttr record --db agent.db --tree work --check 'sh check.sh' -- python3 anthropic_agent.py
"""

import os
import re
import sys

from anthropic import Anthropic

from tttr.recorders import sdk

TASK = "Write the line `hello world` into a new file named `greeting.txt` in the current directory."
SYSTEM = "You answer in a few words."


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
    client = Anthropic()  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
    model = os.environ.get("ANTHROPIC_MODEL", "claude-haiku-4-5")
    asked = {"model": model, "max_tokens": 12, "system": SYSTEM, "extra_body": {"temperature": 0}}

    def ask(question: str) -> str:
        r = client.messages.create(**asked, messages=[{"role": "user", "content": f"Task: {task}\n{question}"}])
        return "".join(b.text for b in r.content if b.type == "text")

    def ask_streamed(question: str) -> str:
        with client.messages.stream(**asked, messages=[{"role": "user", "content": f"Task: {task}\n{question}"}]) as s:
            return "".join(s.text_stream)

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
    said = ask_streamed("What line goes into the file? Reply with the line only.")
    line = pick(said, lines, lines[0])
    print(f"line: {line!r} (the model said {said!r})")
    print(write_file(name, line))
    check = sdk.shell(f"cat {name}", timeout=10)
    print(f"{name}: {check.stdout.strip()!r} (exit {check.exit_code})")
    return check.exit_code


if __name__ == "__main__":
    sys.exit(main())
