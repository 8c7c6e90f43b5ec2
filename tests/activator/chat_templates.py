"""Chat templates for the prompt bound's tests (tests/activator/test_token_bound.py,
test_service_counting.py): every template Thaw ships or its tests use, and the common
shapes of real ones; and the demo tokenizer with any of them."""

from __future__ import annotations

import json
from pathlib import Path

from activator.tokens import TOKENIZER_FILES, ModelTokenizer, build_tokenizer
from thaw.demo_tokenizer import CHAT_TEMPLATE

# Every chat template shipped (the demo model's) or used by the tests, and the common
# shapes of real ones: ChatML with tools as JSON lines, Llama 3.1's with indented JSON
# tools and a dated system header, and one that loops over content parts ("openai").
CHATML_TOOLS = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n\n<tools>{% for tool in tools %}\n"
    "{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0].role != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first and tools %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for tc in message.tool_calls %}\n<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
LLAMA31_TOOLS = (
    "{{- bos_token }}<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: {{ strftime_now('%d %B %Y') }}\n\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content | trim }}{% endif %}<|eot_id|>"
    "{%- if tools %}<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, respond with "
    "a JSON for a function call.\n\n{% for t in tools %}{{ t | tojson(indent=4) }}\n\n{% endfor %}<|eot_id|>"
    "{%- endif %}"
    "{%- for m in messages %}{%- if loop.first and m.role == 'system' %}"
    "{%- elif m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- for tc in m.tool_calls %}{\"name\": \"{{ tc.function.name }}\", \"parameters\": "
    "{{ tc.function.arguments | tojson }}}{% endfor %}<|eot_id|>"
    "{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
OPENAI_PARTS = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}"
    "<|end_header_id|>\n\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.type }}] {{ p.text }}\n"
    "{% endfor %}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# tests/activator/test_tokens.py's and tests/worker/test_swap_engine.py's.
STRICT = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('the first turn must be "
          "the user') }}{% endif %}{{ messages[0]['content'] }}")
TEMPLATES = {"demo": CHAT_TEMPLATE, "swap-engine": "{{ 'model b says: ' }}" + CHAT_TEMPLATE, "strict": STRICT,
             "chatml-tools": CHATML_TOOLS, "llama31-tools": LLAMA31_TOOLS, "openai-parts": OPENAI_PARTS}


_TOKENIZERS: dict[str, ModelTokenizer] = {}


def tokenizer(demo_model_dir: Path, template: str) -> ModelTokenizer:
    """The demo model's tokenizer with ``template`` as its chat template (built once)."""
    if template not in _TOKENIZERS:
        files = {name: (demo_model_dir / name).read_bytes() for name in TOKENIZER_FILES
                 if (demo_model_dir / name).exists()}
        config = json.loads(files["tokenizer_config.json"])
        files["tokenizer_config.json"] = json.dumps({**config, "chat_template": template}).encode()
        _TOKENIZERS[template] = build_tokenizer(files)
    return _TOKENIZERS[template]
