"""The `write-line` agent of openai_agent.py as a LangGraph `StateGraph` on langchain-openai's
`ChatOpenAI`: a plain LangGraph program, TTTR's only trace the SDK on its tools (`@sdk.tool`,
`sdk.shell`) and its clock (`sdk.now`). `ChatOpenAI` reads OPENAI_BASE_URL and OPENAI_API_KEY,
which `tttr record` sets; the model id is OPENAI_MODEL or the first of `GET /v1/models`.

    tttr record --db agent.db --tree work --check 'sh check.sh' -- python3 langgraph_agent.py
"""

import os
import re
import sys
from typing import TypedDict

from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from openai import OpenAI

from tttr.recorders import sdk

TASK = "Write the line `hello world` into a new file named `greeting.txt` in the current directory."


class State(TypedDict, total=False):
    task: str
    files: list
    name: str
    line: str
    result: str


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


model_id = os.environ.get("OPENAI_MODEL") or OpenAI().models.list().data[0].id
llm = ChatOpenAI(model=model_id, temperature=0, max_tokens=12)


def ask(task: str, question: str) -> str:
    return llm.invoke([("user", f"Task: {task}\n{question}")]).content


def look(state: State) -> State:
    return {"files": list_files()}


def choose_name(state: State) -> State:
    names = [q for q in re.findall(r"`([^`]+)`", state["task"]) if "." in q] or ["out.txt"]
    said = ask(state["task"], "What is the file name? Reply with the name only.")
    print(f"file name: the model said {said!r}")
    return {"name": pick(said, names, names[0])}


def choose_line(state: State) -> State:  # reached only for a new file: the task never overwrites one
    lines = [q for q in re.findall(r"`([^`]+)`", state["task"]) if q != state["name"]] or [""]
    said = ask(state["task"], "What line goes into the file? Reply with the line only.")
    print(f"line: the model said {said!r}")
    return {"line": pick(said, lines, lines[0])}


def write(state: State) -> State:
    return {"result": write_file(state["name"], state["line"])}


def verify(state: State) -> State:
    check = sdk.shell(f"cat {state['name']}", timeout=10)
    return {"result": f"{state['result']}; {state['name']}: {check.stdout.strip()!r} (exit {check.exit_code})"}


graph = StateGraph(State)
for node in (look, choose_name, choose_line, write, verify):
    graph.add_node(node.__name__, node)
graph.add_edge(START, "look")
graph.add_edge("look", "choose_name")
graph.add_conditional_edges("choose_name", lambda s: END if s["name"] in s["files"] else "choose_line")
graph.add_edge("choose_line", "write")
graph.add_edge("write", "verify")
graph.add_edge("verify", END)
app = graph.compile()

if __name__ == "__main__":
    task = sys.argv[1] if len(sys.argv) > 1 else TASK
    print(f"[{sdk.now():%Y-%m-%d %H:%M}] task: {task}")
    final = app.invoke({"task": task})
    print(final.get("result") or f"{final['name']} exists already: not overwriting it")
    sys.exit(0 if "(exit 0)" in final.get("result", "") else 1)
