"""The shell agent: one loop for recording, replay and forks.

Each step the model writes a message holding one bash command in a fenced block (the
assistant turn is prefilled with the block's opening, which is what makes a 135M model
write commands instead of prose), or the word `done`. The command runs through the
trace-layer executor and its output becomes the next user turn. Every value the loop
cannot predict comes from the oracle; the loop itself has no idea whether it is
recording, replaying or forking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SYSTEM_PROMPT = (
    "You are a Linux shell agent working in the directory /work. Each reply is exactly one bash "
    "command in a ```bash block. After the output comes back, reply with the next command. "
    "When the task is complete, reply with ```bash\ndone\n```."
)

# Worked examples: a tiny model copies the shape of these far more reliably than it
# follows instructions.
EXAMPLES: tuple[tuple[str, str, str], ...] = (
    ("Create a directory named `archive` inside `logs`.", "mkdir -p logs/archive", "exit code 0"),
    ("Write the line `done: 3` into a new file named `status.txt`.",
     "echo 'done: 3' > status.txt", "exit code 0"),
    ("Delete every file whose name ends in `.bak` in the `cache` directory.",
     "find cache -name '*.bak' -delete", "exit code 0"),
)

FENCE_OPEN = "```bash\n"
FENCE_CLOSE = "```"
STOP_STRINGS = (FENCE_CLOSE,)


@dataclass(frozen=True, slots=True)
class AgentLimits:
    max_steps: int = 6
    max_message_tokens: int = 48
    max_total_tokens: int = 320
    observation_chars: int = 400

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_message_tokens", "max_total_tokens", "observation_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentLimits.{name} must be ≥ 1, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class Action:
    cmd: str | None  # None: the agent said it is done (or wrote no command)
    done: bool

    def to_json(self) -> dict:
        return {"done": True} if self.done else {"cmd": self.cmd}


@dataclass(slots=True)
class Transcript:
    instruction: str
    turns: list[dict] = field(default_factory=list)

    def messages(self) -> list[dict]:
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}]
        for task, cmd, obs in EXAMPLES:
            msgs += [
                {"role": "user", "content": f"Task: {task}"},
                {"role": "assistant", "content": f"{FENCE_OPEN}{cmd}\n{FENCE_CLOSE}"},
                {"role": "user", "content": obs},
                {"role": "assistant", "content": f"{FENCE_OPEN}done\n{FENCE_CLOSE}"},
            ]
        msgs.append({"role": "user", "content": f"Task: {self.instruction}"})
        return msgs + self.turns

    def reply(self, message: str) -> None:
        """The model's message as the assistant turn, its bash block closed."""
        text = message.rstrip()
        closed = text if text.endswith(FENCE_CLOSE) else text + "\n" + FENCE_CLOSE
        self.turns.append({"role": "assistant", "content": closed})

    def observe(self, stdout: str, stderr: str, exit_code: int, limit: int) -> None:
        """A command's result as the next user turn."""
        self.turns.append({"role": "user", "content": observation(stdout, stderr, exit_code, limit)})


def parse_action(message: str) -> Action:
    """The command inside the message's bash block; `done`, `exit` or nothing means done."""
    body = message
    if body.startswith(FENCE_OPEN):
        body = body[len(FENCE_OPEN):]
    body = body.split(FENCE_CLOSE, 1)[0]
    lines = [ln.rstrip() for ln in body.strip("\n").splitlines()]
    cmd = "\n".join(ln for ln in lines if ln.strip()).strip()
    if not cmd or re.fullmatch(r"(done|exit( 0)?|DONE|Done)\.?", cmd):
        return Action(None, True)
    return Action(cmd, False)


def observation(stdout: str, stderr: str, exit_code: int, limit: int) -> str:
    parts = [f"exit code {exit_code}"]
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        text = text.strip("\n")
        if text:
            if len(text) > limit:
                text = text[:limit] + f"\n… ({len(text) - limit} more characters)"
            parts.append(f"{name}:\n{text}")
    return "\n".join(parts)


def run_agent(oracle, instruction: str, limits: AgentLimits = AgentLimits()) -> None:
    """Drive one run to its end. All the non-determinism is behind `oracle`."""
    transcript = Transcript(instruction)
    oracle.setup()
    budget = limits.max_total_tokens
    for step in range(limits.max_steps):
        if oracle.cancelled():
            oracle.abort("cancelled")
            return
        prompt_text = oracle.render(transcript.messages()) + FENCE_OPEN
        max_tokens = min(limits.max_message_tokens, budget)
        text = oracle.message(step, prompt_text, max_tokens, STOP_STRINGS, lead=FENCE_OPEN)
        budget -= oracle.last_message_tokens
        message = FENCE_OPEN + text
        action = parse_action(message)
        oracle.note(step, "message", {"text": message})
        oracle.note(step, "action", action.to_json())
        transcript.reply(message)
        if action.done:
            break
        if oracle.cancelled():
            oracle.abort("cancelled")
            return
        result = oracle.tool(step, action.cmd)
        transcript.observe(result["stdout"], result["stderr"], result["exit_code"], limits.observation_chars)
        oracle.step_done(step)
        if budget <= 0:
            break
    if oracle.cancelled():
        oracle.abort("cancelled")
        return
    oracle.finish()
