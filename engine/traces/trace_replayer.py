"""The replayer of a program run against an imported trace (engine/traces/against.py): it meets
the program's requests with the trace's steps, in order, as the recorded program's Replayer
(engine/program/replay.py) meets them with a recording's; what is compared is matching.py's.

A model call is answered with the trace's answer (or a fork's new one) while its messages match;
the trace's tool calls the program does not ask the SDK for before its next model call are
passed over (their results are compared in that call's messages); an SDK tool query is answered
with the trace's result (or a fork's) while its name and arguments match; clock reads are live.
The first difference is the divergence, named with the trace's and the program's values; after
it calls run live (LiveCalls here, or UpstreamCalls for --upstream) unless sealed."""

from __future__ import annotations

from tttr.engine.program.replay import (  # Divergence: wherever engine/replay keeps it, as replay imports it
    Divergence, Replayer, _Event, _response, _Step,
)
from tttr.engine.traces.matching import (
    COMPARED, asked_messages, message_difference, tool_answer, tool_difference, trace_messages,
)

NAMES = ("trace", "program")


class TraceReplayer(Replayer):
    """Meets the program's requests with the trace's steps, in order (see the module's text)."""

    def __init__(self, rec, recorder, name: str, plan):  # plan: against.py's AgainstTrace
        from tttr.engine.program.live import LiveCalls

        super().__init__(rec, recorder, name, plan.model)
        self.plan = plan
        if plan.upstream is not None:
            from tttr.engine.traces.upstream import UpstreamCalls, check_upstream

            self.live = UpstreamCalls(*check_upstream(plan.upstream, plan.upstream_key_env), recorder)
        else:
            self.live = LiveCalls(plan.model, recorder, None)  # any model: the trace's was another server's
        self.forked = False
        self.not_asked: list[str] = []  # trace tool calls the program did not ask the SDK for (_pass_tools)

    def _diverge(self, where: str, a, b, detail: dict | None = None) -> None:
        self.divergence = Divergence(where, "trace", a, b, NAMES)
        self.detail = detail

    def _is_change(self, step) -> bool:
        c = self.plan.change
        return c is not None and not self.forked and c.site.step == step.step and c.site.name == step.events[0].kind

    def answer_call(self, name, endpoint: str, body: dict):
        from tttr.engine.program.divergence import call_divergence

        with self._lock:
            asked = asked_messages(endpoint, body)
            self._pass_tools()
            step = self._take("call", asked)
            if step is not None:
                index = self.calls
                t = step.events[0].value
                diff = message_difference(trace_messages(t), asked)
                if diff is None:
                    changed = self._is_change(step)
                    message = self.plan.change.value if changed else {
                        k: t.get(k) for k in ("text", "tool_calls", "finish_reason")}
                    self.forked = self.forked or changed
                    message = {**message, "text": message.get("text") or "",
                               "finish_reason": message.get("finish_reason") or (
                                   "tool_calls" if message.get("tool_calls") else "stop")}
                    if not message.get("tool_calls"):
                        message.pop("tool_calls", None)
                    self.recorder.record_copy(self.name, [
                        ("prompt", None, {"request": body, "endpoint": endpoint, "trace_site": step.events[0].site}),
                        ("message", None, {**message, "model": t.get("model")})])
                    self.cursor += 1
                    self.answered += 1
                    self.calls += 1
                    shown = _Step(step.step, "call", [_Event("message", message, f"{step.step}:message")])
                    return _response(endpoint, shown, {}, self.rec.run.model_id or "tttr")
                path, a, b = diff
                self.divergence = call_divergence(f"call {index} (step {step.step})", path, a, b, NAMES)
                self.detail = {"call": index, "step": step.step, "at": f"{step.step}:message", "field": path,
                               "recorded": a, "requested": b}
            return self._live_call(name, endpoint, body)

    def _pass_tools(self) -> None:
        """The trace's tool calls before the next model call that the program did not ask for
        through the SDK: its own tools (their results are in the next call's messages, compared
        there), passed over, not a divergence."""
        if self.divergence is not None:
            return
        while self.cursor < len(self.rec.steps) and self.rec.steps[self.cursor].kind == "tool":
            self.not_asked.append(self.rec.steps[self.cursor].events[0].site)
            self.cursor += 1

    def finish(self) -> None:
        with self._lock:
            self._pass_tools()  # trailing tools the program ran itself
        super().finish()

    def answer_sdk(self, name, kind: str, value: dict):
        if kind == "clock":
            return None  # a trace holds no clock reads: the virtual clock answers, live
        with self._lock:
            step = self._take("tool", value)
            if step is None:
                return self._sealed_tool(value) if self.sealed else None
            t = step.events[0].value
            diff = tool_difference(t, value)
            if diff is not None:
                key, a, b = diff
                label = t.get("function") or t.get("cmd")
                self._diverge(f"step {step.step}, tool {label}: {key}", a, b,
                              {"call": None, "step": step.step, "at": f"{step.step}:tool", "field": key,
                               "recorded": a, "requested": b})
                return self._sealed_tool(value) if self.sealed else None
            answer = tool_answer(t, value)
            if self._is_change(step):
                self.forked = True
                answer = _changed(answer, self.plan.change.value, "cmd" in t)
            asked = {k: value[k] for k in ("function", "args", "kwargs", "cmd", "cwd", "timeout_s") if k in value}
            self.recorder.record_copy(self.name, [("tool", None, {**asked, **answer, "source": "sdk",
                                                                  "trace_site": step.events[0].site})])
            self.cursor += 1
            self.answered += 1
            return answer

    def report(self) -> dict:
        out = {**super().report(), "against_trace": self.plan.run_id, "compared": COMPARED,
               "trace_steps": len(self.rec.steps), "tools_not_asked": list(self.not_asked)}
        if self.plan.change is not None:
            out |= {"fork_site": str(self.plan.change.site), "forked": self.forked}
        return out


def _changed(answer: dict, value: dict, command: bool) -> dict:
    """A tool's answer with a fork's new fields (program/fork.py's grammar) in place."""
    if command:
        return {**answer, **{k: v for k, v in value.items() if k in ("stdout", "stderr", "exit_code")}}
    if "error" in value:
        return {"error": value["error"]}
    return {"result": value.get("result")}


__all__ = ["TraceReplayer"]
