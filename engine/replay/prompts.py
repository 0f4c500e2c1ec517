"""The prompt the model saw at a step, as text, rebuilt from the record and proved.

A run records each step's prompt as the digest of its token ids, not as text. The shell
agent's prompt is a function of what the run recorded before the step — the task's
instruction, the earlier messages and tool results — so it is rebuilt here the way the
loop built it (`agent.Transcript`, the model's chat template) and encoded again: when the
digest of those ids equals the recorded one, the text is exactly what the model read. A
call recorded by `tttr serve` keeps its prompt ids; they are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass

from tttr.engine.replay.events import ids_digest, read_text
from tttr.engine.replay.agent import FENCE_OPEN, AgentLimits, Transcript
from tttr.engine.replay.result import ReplayError
from tttr.recorders.errors import TaskError
from tttr.recorders.tasks import load_task


@dataclass(frozen=True, slots=True)
class Prompt:
    step: int
    text: str
    n_tokens: int
    verified: bool  # the text encodes to the recorded ids (their digest, or the ids themselves)
    note: str = ""  # why it is not verified


def prompts(store, run_id: int, tokenizer) -> list[Prompt]:
    """Every step's prompt of the run, in step order."""
    run, events = store.load_run(run_id)
    recorded = {e.step: e.value for e in events if e.kind == "prompt"}
    # A served call keeps its request (and, called locally, its ids; proxied, none): decoded, not rebuilt
    if any(isinstance(v, dict) and (isinstance(v.get("ids"), list) or "request" in v) for v in recorded.values()):
        return [_from_ids(step, value, tokenizer) for step, value in sorted(recorded.items())]
    if type(run.task) is not str:
        raise ReplayError(f"run {run.id} names no task: its prompts cannot be rebuilt")
    try:
        task = load_task(run.task)
    except TaskError as exc:
        raise ReplayError(f"run {run.id}: its prompts cannot be rebuilt: {exc}") from None
    limits = AgentLimits(**{k: v for k, v in run.meta.limits.items() if k in AgentLimits.__slots__})
    messages = {e.step: e.value.get("text", "") for e in events if e.kind == "message"}
    tools = {e.step: e.value for e in events if e.kind == "tool"}
    transcript = Transcript(task.instruction)
    out = []
    for step in sorted(recorded):
        text = tokenizer.apply_chat_template(transcript.messages(), add_generation_prompt=True) + FENCE_OPEN
        ids = tokenizer.encode(text)
        value = recorded[step] if isinstance(recorded[step], dict) else {}
        verified = ids_digest(ids) == value.get("ids_digest")
        out.append(Prompt(step, text, len(ids), verified,
                          "" if verified else "rebuilt, but it does not encode to the recorded digest "
                          "(another model's tokenizer, or an older agent)"))
        transcript.reply(messages.get(step, ""))
        tool = tools.get(step)
        if tool is not None:
            transcript.observe(read_text(store, tool.get("stdout")), read_text(store, tool.get("stderr")),
                               tool.get("exit_code"), limits.observation_chars)
    return out


def _from_ids(step: int, value: dict, tokenizer) -> Prompt:
    ids = value.get("ids") if isinstance(value, dict) else None
    if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < tokenizer.vocab_size for i in ids):
        return Prompt(step, "", 0, False, "this call recorded no prompt ids (a proxied call): see its request")
    verified = value.get("ids_digest") in (None, ids_digest(ids))
    return Prompt(step, tokenizer.decode(ids), len(ids), verified, "" if verified else "the ids do not match their digest")

