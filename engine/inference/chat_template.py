"""The model's own chat template (Jinja), rendered the way Hugging Face renders it:
a sandboxed environment, trim_blocks + lstrip_blocks, loop controls ({% break %},
{% continue %}), `raise_exception`, `tojson`, `strftime_now`; the caller's `tools` and other
variables (enable_thinking, date_string, ...) reach the template. A model without a
template gets ChatML."""

from __future__ import annotations

import datetime
import functools
import json

from tttr.engine.errors import EngineError

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@functools.lru_cache(maxsize=8)
def _compile(source: str):
    # jinja2 is imported here, not at the top: a tenth of a second of every start, and a
    # prompt without --chat never renders a template
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render_chat_template(template: str | None, messages: list[dict], *, add_generation_prompt: bool = True,
                         bos_token: str = "", eos_token: str = "", **extra) -> str:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise EngineError(f"chat message {i} is {m!r}: each message needs 'role' and 'content'")
    from jinja2.exceptions import TemplateError

    try:
        return _compile(template or CHATML).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token, **extra,
        )
    except TemplateError as exc:
        raise EngineError(f"the model's chat template failed: {exc}") from exc
