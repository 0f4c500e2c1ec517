"""The model families users bring as GGUF files (Llama 3.x, Qwen2.5, Qwen3), each as a tiny
random model written the way llama.cpp's converter writes that family (F32 tensors, the
family's metadata, a small byte-level BPE vocabulary with its special tokens and chat
template), checked against transformers reading the same file: logits, greedy tokens,
tokenization, chat templates with tools, BOS and end-of-turn rules; plus the one-line errors
for what is not supported."""

from __future__ import annotations

import contextlib
import io
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.engine_tiny import _GGUF_LAYER, MERGES, byte_alphabet, tiny_weights, write_tensors
from tttr.engine.errors import EngineError
from tttr.engine.inference.loader import load_checkpoint
from tttr.engine.inference.model import Segment, load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.engine.inference.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
transformers = pytest.importorskip("transformers")

# -- the families' chat templates, as their tokenizer_config.json files carry them ----------
LLAMA32_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

_QWEN_TOOLS_HEADER = """    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
"""

QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n" }}
""" + _QWEN_TOOLS_HEADER + """{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
""" + _QWEN_TOOLS_HEADER + """{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN3_USER_DEFINED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # GGUF token type 4, as Qwen3's files mark them


@dataclass(frozen=True)
class Family:
    """A tiny model of one family, and how llama.cpp's converter writes that family."""

    name: str
    arch: str
    pre: str
    specials: list[str]
    bos: str
    eos: str
    add_bos: bool
    template: str
    head_dim: int = 16
    bias: bool = False
    user_defined: list[str] = field(default_factory=list)
    # Llama 3.x rope scaling (factor, low_freq_factor, high_freq_factor, original context):
    # a small original context so that the scaling changes the rotation of short prompts
    rope: tuple[float, float, float, int] | None = None

    @property
    def tokens(self) -> list[str]:
        return byte_alphabet() + ["".join(m) for m in MERGES] + self.specials + self.user_defined

    def hf_config(self) -> dict:
        return {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": self.head_dim, "vocab_size": len(self.tokens),
                "tie_word_embeddings": False, "attention_bias": self.bias}


LLAMA3 = Family("llama3", "llama", "llama-bpe", LLAMA3_SPECIALS, "<|begin_of_text|>", "<|end_of_text|>", True,
                LLAMA32_TEMPLATE, rope=(8.0, 1.0, 4.0, 64))
QWEN25 = Family("qwen2.5", "qwen2", "qwen2", QWEN_SPECIALS, "<|endoftext|>", "<|im_end|>", False, QWEN25_TEMPLATE,
                bias=True)
QWEN3 = Family("qwen3", "qwen3", "qwen2", QWEN_SPECIALS, "<|endoftext|>", "<|im_end|>", False, QWEN3_TEMPLATE,
               head_dim=24, user_defined=QWEN3_USER_DEFINED)  # head_dim 24 != d / heads = 16
FAMILIES = [LLAMA3, QWEN25, QWEN3]


def family_weights(fam: Family, seed: int = 0) -> dict[str, torch.Tensor]:
    w = tiny_weights(fam.hf_config(), seed=seed)
    if fam.arch == "qwen3":
        g = torch.Generator().manual_seed(seed + 100)
        for i in range(2):
            for n in "qk":
                w[f"model.layers.{i}.self_attn.{n}_norm.weight"] = 1 + 0.3 * torch.randn(fam.head_dim, generator=g)
    return w


def llama3_rope_freqs(fam: Family) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter (LlamaModel.generate_extra_tensors)
    writes as rope_freqs.weight for a "llama3" rope_scaling."""
    factor, low, high, orig = fam.rope
    freqs = 1.0 / (10000.0 ** (np.arange(0, fam.head_dim, 2, dtype=np.float32) / fam.head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


_NAMES = {**_GGUF_LAYER, "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}


def write_family(path: Path, fam: Family, weights: dict[str, torch.Tensor], *, rope_freqs: bool = True,
                 meta: dict | None = None, arch: str | None = None, pre: str | None = None,
                 quant: str | None = None) -> Path:
    """The file llama.cpp's converter writes for `fam` (F32, or `quant` for the 2-D weights):
    Q/K rows permuted for `llama` only, the head size written when it is not d / heads,
    Llama 3's scaling as rope_freqs (or, rope_freqs=False, none); `meta` adds or overrides
    metadata (value None: left out)."""
    import gguf

    arch = arch or fam.arch
    tokens = fam.tokens
    w = gguf.GGUFWriter(str(path), arch)
    values = {
        "general.name": f"tiny-{fam.name}",
        f"{arch}.block_count": 2, f"{arch}.context_length": 256, f"{arch}.embedding_length": 64,
        f"{arch}.feed_forward_length": 96, f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
        f"{arch}.rope.freq_base": 10000.0, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.vocab_size": len(tokens),
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre or fam.pre,
        "tokenizer.ggml.bos_token_id": tokens.index(fam.bos), "tokenizer.ggml.eos_token_id": tokens.index(fam.eos),
        "tokenizer.ggml.add_bos_token": fam.add_bos, "tokenizer.chat_template": fam.template,
    }
    if fam.head_dim != 16:
        values[f"{arch}.attention.key_length"] = values[f"{arch}.attention.value_length"] = fam.head_dim
    values.update(meta or {})
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in fam.specials else 4 if t in fam.user_defined else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in MERGES])
    if fam.rope and rope_freqs:
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(fam))
    write_tensors(w, weights, arch, 4, 2, quant, _NAMES)
    return path


def reference(path: Path, fam: Family, *, scaled: bool = True, rope_parameters: dict | None = None):
    """transformers' model for the file: its GGUF config and tensor reading (which un-permutes
    llama's Q/K itself), given what its GGUF config mapping does not read: the head size of
    a Qwen3 file and Llama 3's rope scaling."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(path.parent), path.name
    with contextlib.redirect_stderr(io.StringIO()):
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        config.head_dim = fam.head_dim
        if fam.rope and scaled:
            factor, low, high, orig = fam.rope
            config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": factor,
                                      "low_freq_factor": low, "high_freq_factor": high,
                                      "original_max_position_embeddings": orig}
        if rope_parameters is not None:
            config.rope_parameters = {"rope_theta": 10000.0, **rope_parameters}
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(state, strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    return model.eval()


def ref_tokenizer(path: Path):
    with contextlib.redirect_stderr(io.StringIO()):
        return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _logits(model, ids: list[int]) -> torch.Tensor:
    cache = model.new_cache(len(ids))
    return model.forward(torch.tensor(ids), torch.arange(len(ids)), [Segment(0, len(ids), cache)])


PROMPT = "the hello world, it's 1234567 ünïcode!"


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def family(request, tmp_path_factory):
    fam = request.param
    path = write_family(tmp_path_factory.mktemp(fam.name) / f"{fam.name}.gguf", fam, family_weights(fam))
    return fam, path


def test_logits_and_greedy_tokens_match_transformers(family):
    """The file's logits as transformers computes them (fp32, a 1e-4 bound on values of
    several units), and the same greedy continuation through the engine (KV cache, decode steps)."""
    fam, path = family
    ours = load_model(path)
    ref = reference(path, fam)
    ids = ours.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expect = ref(torch.tensor([ids])).logits[0]
    diff = (_logits(ours, ids) - expect).abs().max().item()
    print(f"{fam.name}: max |logit difference| vs transformers = {diff:.2e} over {len(ids)} positions")
    assert diff < 1e-4

    steps = 8
    seq = Sequence(ids, SamplingParams(temperature=0.0), steps, stop_token_ids=())
    engine = Engine(ours)
    try:
        engine.generate([seq])
    finally:
        engine.close()
    want = list(ids)
    with torch.inference_mode():
        for _ in range(steps):
            want.append(int(ref(torch.tensor([want])).logits[0, -1].argmax()))
    assert seq.output_ids == want[len(ids):]


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
def test_q8_0_files_run_from_blocks_and_match_transformers(tmp_path, fam):
    """The same families quantized (Q8_0, Q/K rows of llama moved whole, blocks intact):
    products run from the blocks, logits as transformers dequantizes them."""
    path = write_family(tmp_path / "q.gguf", fam, family_weights(fam), quant="Q8_0")
    ours = load_model(path)
    assert ours.block_weights >= 8  # q/k/v, o, gate/up and down of both layers
    ids = ours.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expect = reference(path, fam)(torch.tensor([ids])).logits[0]
    assert (_logits(ours, ids) - expect).abs().max().item() < 1e-4


def test_family_metadata_reaches_the_config(family):
    fam, path = family
    cfg = load_checkpoint(path).config
    assert (cfg.arch, cfg.head_dim, cfg.attn_bias, cfg.qk_norm) == \
        (fam.arch, fam.head_dim, fam.bias, fam.arch == "qwen3")
    assert cfg.head_dim * cfg.n_heads != cfg.d_model or fam.arch != "qwen3"


def test_qwen3_hugging_face_folder_matches_its_gguf(tmp_path):
    """The same Qwen3 as a Hugging Face folder (config.json's model_type, head_dim) gives the
    GGUF file's logits bit for bit."""
    from tests.engine_tiny import tiny_config, write_hf_folder

    fam = QWEN3
    weights = family_weights(fam)
    cfg = {**tiny_config("qwen2"), **fam.hf_config(), "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
           "rms_norm_eps": 1e-6, "max_position_embeddings": 256}
    folder = write_hf_folder(tmp_path / "hf", cfg, weights)
    a, b = load_model(folder), load_model(write_family(tmp_path / "q.gguf", fam, weights))
    assert a.config.qk_norm and a.config.head_dim == fam.head_dim
    ids = b.tokenizer.encode(PROMPT)
    assert torch.equal(_logits(a, ids), _logits(b, ids))


def test_llama3_rope_scaling_is_applied_from_rope_freqs_or_from_metadata(tmp_path):
    """Llama 3.x's scaling changes the logits (transformers without it disagrees), and a
    file that names the scaling in metadata instead of carrying rope_freqs gives the same model."""
    fam = LLAMA3
    weights = family_weights(fam)
    with_freqs = write_family(tmp_path / "freqs.gguf", fam, weights)
    from_meta = write_family(tmp_path / "meta.gguf", fam, weights, rope_freqs=False, meta={
        "llama.rope.scaling.type": "llama3", "llama.rope.scaling.factor": fam.rope[0],
        "llama.rope.scaling.original_context_length": fam.rope[3]})
    a, b = load_model(with_freqs), load_model(from_meta)
    assert b.config.rope_scaling is not None and b.config.rope_scaling.kind == "llama3"
    ids = a.tokenizer.encode(PROMPT)
    la, lb = _logits(a, ids), _logits(b, ids)
    assert (la - lb).abs().max().item() < 1e-4
    with torch.inference_mode():
        unscaled = reference(with_freqs, fam, scaled=False)(torch.tensor([ids])).logits[0]
    assert (la - unscaled).abs().max().item() > 1e-2  # the scaling matters at these positions


def test_linear_rope_scaling_is_applied(tmp_path):
    path = write_family(tmp_path / "lin.gguf", LLAMA3, family_weights(LLAMA3), rope_freqs=False,
                        meta={"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0})
    ours = load_model(path)
    ids = ours.tokenizer.encode(PROMPT)
    with torch.inference_mode():
        expect = reference(path, LLAMA3, scaled=False, rope_parameters={"rope_type": "linear", "factor": 4.0})(
            torch.tensor([ids])).logits[0]
        unscaled = reference(path, LLAMA3, scaled=False)(torch.tensor([ids])).logits[0]
    got = _logits(ours, ids)
    assert (got - expect).abs().max().item() < 1e-4 < (got - unscaled).abs().max().item()


@pytest.mark.parametrize("meta, message", [
    ({"llama.rope.scaling.type": "llama3"},
     "has llama3 rope scaling but neither a rope_freqs.weight tensor nor llama.rope.scaling.factor and "
     "llama.rope.scaling.original_context_length"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0},
     "unsupported rope scaling 'yarn' in bad.gguf: supported are none, linear, llama3"),
    ({"llama.rope.dimension_count": 8}, "unsupported llama.rope.dimension_count=8 in bad.gguf"),
])
def test_rope_metadata_it_cannot_follow_is_one_line(tmp_path, meta, message):
    path = write_family(tmp_path / "bad.gguf", LLAMA3, family_weights(LLAMA3), rope_freqs=False, meta=meta)
    with pytest.raises(EngineError) as err:
        load_model(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_tokenizer_matches_transformers_gguf_tokenizer(family):
    """Each family's pre-tokenizer split (Llama 3's digits in threes, Qwen's one by one),
    special and user-defined tokens matched whole, as transformers builds the file's tokenizer."""
    fam, path = family
    ours = load_model(path).tokenizer
    ref = ref_tokenizer(path)
    texts = [PROMPT, "x = 1234567890;\n\n  indented\tTAB  I'M HERE'S   ", "中文 émoji 🙂 ²³",
             f"{fam.specials[1]}user\nhi{fam.eos} 42{''.join(fam.user_defined)}"]
    for text in texts:
        assert ours.encode(text, add_bos=False) == ref(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ours.encode(text, add_bos=False)) == text
    for t in fam.specials + fam.user_defined:
        assert ours.encode(f"a{t}b", add_bos=False)[1] == fam.tokens.index(t)


def _fields(pre: str, extra_tokens: list[str] = (), **more) -> dict:
    tokens = byte_alphabet() + ["".join(m) for m in MERGES] + LLAMA3_SPECIALS + list(extra_tokens)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if t in LLAMA3_SPECIALS else 1 for t in tokens],
            "tokenizer.ggml.merges": [" ".join(m) for m in MERGES],
            "tokenizer.ggml.bos_token_id": tokens.index("<|begin_of_text|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|end_of_text|>"), **more}


# llama.cpp's regexes per pre-tokenizer type (llama-vocab.cpp), applied in turn
_LLAMA_CPP_SPLITS = {
    "llama-bpe": [r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "smollm": [r"\p{N}", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"],
    "gpt-2": [r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"],
}


def _split(regexes: list[str], text: str) -> list[str]:
    import regex

    pieces = [text]
    for rx in regexes:
        out = []
        for piece in pieces:
            at = 0
            for m in regex.finditer(rx, piece):
                if m.start() > at:
                    out.append(piece[at:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                at = m.end()
            if at < len(piece):
                out.append(piece[at:])
        pieces = out
    return pieces


@pytest.mark.parametrize("pre", sorted(_LLAMA_CPP_SPLITS))
def test_pre_tokenizer_splits_as_llama_cpp(pre):
    from tttr.engine.inference.tokenizer import _pre_tokenizer

    texts = ["Hello world, it's 2024-12-01: 1234567 items!\n\n  indented\tTAB  I'M HE'LL   ",
             "ünïcode 中文字符 émoji 🙂🙂 ²³ ٣٤ x²", "a\r\n\r\nb   \n c", "$100.50+3e10==?!?...", "  "]
    spelled = {b: c for b, c in zip(range(256), byte_alphabet())}
    pt = _pre_tokenizer(pre)
    for text in texts:
        want = ["".join(spelled[b] for b in piece.encode()) for piece in _split(_LLAMA_CPP_SPLITS[pre], text)]
        assert [p for p, _ in pt.pre_tokenize_str(text)] == want, (pre, text)


def test_bos_follows_add_bos_token_then_the_pre_tokenizer_default():
    bos = _fields("llama-bpe")["tokenizer.ggml.bos_token_id"]
    assert Tokenizer.from_gguf_fields(_fields("llama-bpe")).encode("hi")[0] == bos  # llama.cpp: llama3 adds BOS
    assert Tokenizer.from_gguf_fields(_fields("llama-bpe", **{"tokenizer.ggml.add_bos_token": False})).encode("hi")[0] != bos
    assert Tokenizer.from_gguf_fields(_fields("qwen2")).encode("hi")[0] != bos  # qwen2: no BOS unless the file says
    assert Tokenizer.from_gguf_fields(_fields("qwen2", **{"tokenizer.ggml.add_bos_token": True})).encode("hi")[0] == bos
    tok = Tokenizer.from_gguf_fields(_fields("llama-bpe"))
    assert tok.encode("<|begin_of_text|>hi").count(bos) == 1  # a template that writes the BOS gets one


def test_llama3_words_found_whole_in_the_vocabulary_skip_the_merges():
    """llama.cpp's llama3 pre-tokenizers set ignore_merges: a pre-token that is a vocabulary
    entry is that token even when the merges cannot build it."""
    tok = Tokenizer.from_gguf_fields(_fields("llama-bpe", ["Ġworld"]))
    assert tok.encode(" world", add_bos=False) == [tok.token_to_id("Ġworld")]
    qwen = Tokenizer.from_gguf_fields(_fields("qwen2", ["Ġworld"]))
    assert len(qwen.encode(" world", add_bos=False)) == 5  # Ġw o r l d: merges only


def test_stop_ids_hold_the_turn_end_besides_eos():
    """A Llama 3 file whose EOS is <|end_of_text|> still stops at <|eot_id|> (and <|eom_id|>),
    and an eot id the file names is a stop id whatever its text."""
    tok = Tokenizer.from_gguf_fields(_fields("llama-bpe"))
    for t in ("<|end_of_text|>", "<|eot_id|>", "<|eom_id|>"):
        assert tok.token_to_id(t) in tok.stop_token_ids
    fields = _fields("llama-bpe", ["<|my_end|>"])
    fields["tokenizer.ggml.eot_token_id"] = fields["tokenizer.ggml.tokens"].index("<|my_end|>")
    assert fields["tokenizer.ggml.eot_token_id"] in Tokenizer.from_gguf_fields(fields).stop_token_ids


def test_the_tokenizer_cache_keeps_the_files_end_of_turn_ids(tmp_path):
    """The replay runtime caches a GGUF's tokenizer as JSON: an eot id the file names survives
    the round trip, and an entry written without end ids is refused (so it gets rebuilt)."""
    import json

    from tttr.engine.replay.runtime import _read_cached, _write_cached

    fields = _fields("llama-bpe", ["<|my_end|>"])
    fields["tokenizer.ggml.eot_token_id"] = my_end = fields["tokenizer.ggml.tokens"].index("<|my_end|>")
    _write_cached(Tokenizer.from_gguf_fields(fields), tmp_path / "t.json")
    assert my_end in _read_cached(tmp_path / "t.json").stop_token_ids
    old = json.loads((tmp_path / "t.json").read_text())
    del old["end_token_ids"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="end_token_ids"):
        _read_cached(tmp_path / "old.json")


def test_llama3_generation_stops_at_eot(tmp_path):
    """End to end: a Llama 3 chat prompt, and a model made to answer <|eot_id|> (its head row
    for it is twice the row of the token it would pick): generation ends there."""
    fam = LLAMA3
    model = load_model(write_family(tmp_path / "l.gguf", fam, family_weights(fam)))
    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "hello"}], date_string="26 Jul 2024"))
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    first = int(_logits(model, ids)[-1].argmax())
    eot = tok.token_to_id("<|eot_id|>")
    assert eot != tok.eos_token_id and first != eot
    model.lm_head[eot] = 2 * model.lm_head[first]
    seq = Sequence(ids, SamplingParams(temperature=0.0), 10)
    engine = Engine(model)
    try:
        engine.generate([seq])
    finally:
        engine.close()
    assert seq.output_ids == [eot] and seq.finish_reason == "stop"


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp_c\": 21}"},
    {"role": "user", "content": "And in Lyon?"},
]


@pytest.mark.parametrize("fam", FAMILIES, ids=[f.name for f in FAMILIES])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_chat_template_renders_as_transformers_does(fam, with_tools):
    from transformers.utils.chat_template_utils import render_jinja_template

    from tttr.engine.serve.tools import call_format, supports_tools

    tok = Tokenizer.from_gguf_fields({**_fields(fam.pre), "tokenizer.chat_template": fam.template})
    messages = CONVERSATION if with_tools else CONVERSATION[:2]
    tools = TOOLS if with_tools else None
    extra = {"date_string": "26 Jul 2024"}
    ours = tok.apply_chat_template(messages, tools=tools, **extra)
    (want,), _ = render_jinja_template([messages], tools=tools, chat_template=fam.template,
                                       add_generation_prompt=True, bos_token=tok.token_text(tok.bos_token_id),
                                       eos_token=tok.token_text(tok.eos_token_id), **extra)
    assert ours == want
    if with_tools:
        assert "get_weather" in ours and "Lyon" in ours
        assert '"city": "Paris"' in ours
    assert supports_tools(fam.template)
    assert call_format(fam.template) == ("json" if fam.arch == "llama" else "hermes")


def test_qwen3_template_thinking():
    tok = Tokenizer.from_gguf_fields({**_fields("qwen2"), "tokenizer.chat_template": QWEN3_TEMPLATE})
    history = [{"role": "user", "content": "2+2?"},
               {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
               {"role": "user", "content": "3+3?"}]
    text = tok.apply_chat_template(history, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "add them" not in text and "<|im_start|>assistant\n4<|im_end|>" in text  # earlier reasoning dropped
    assert tok.apply_chat_template(history).endswith("<|im_start|>assistant\n")


def test_unsupported_architecture_names_it_and_the_supported_ones(tmp_path):
    path = write_family(tmp_path / "g.gguf", QWEN25, family_weights(QWEN25), arch="gemma2")
    with pytest.raises(EngineError) as err:
        load_model(path)
    msg = str(err.value)
    assert "unsupported architecture 'gemma2'" in msg and "llama, qwen2, qwen3" in msg and "\n" not in msg


def test_unsupported_pre_tokenizer_is_one_line_from_the_cli(tmp_path):
    path = write_family(tmp_path / "t.gguf", QWEN25, family_weights(QWEN25), pre="tekken")
    out = subprocess.run([sys.executable, "-m", "tttr.app", "generate", "hi", "--model", str(path), "--max-tokens", "1"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "unsupported pre-tokenizer 'tekken' (tokenizer.ggml.pre)" in lines[0], out.stderr
    assert "llama-bpe" in lines[0] and "qwen2" in lines[0]


def test_a_sentencepiece_vocabulary_is_one_line():
    fields = {**_fields("default"), "tokenizer.ggml.model": "llama"}  # Llama 2 / Mistral GGUFs
    with pytest.raises(EngineError) as err:
        Tokenizer.from_gguf_fields(fields)
    assert "unsupported GGUF tokenizer 'llama'" in str(err.value) and "\n" not in str(err.value)
