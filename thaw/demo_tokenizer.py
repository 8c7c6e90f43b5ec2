"""The demo model's tokenizer: a byte-level BPE trained on the corpus shipped in
``thaw/data/corpus.txt`` (deterministic: two trainings give the same file), with Llama
3's special tokens and chat template."""

from __future__ import annotations

import json
from importlib import resources

BOS_TOKEN = "<|begin_of_text|>"
END_OF_TEXT_TOKEN = "<|end_of_text|>"
START_HEADER_TOKEN = "<|start_header_id|>"
END_HEADER_TOKEN = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"
# Trained first, so they take ids 0..4 in this order.
SPECIAL_TOKENS = (BOS_TOKEN, END_OF_TEXT_TOKEN, START_HEADER_TOKEN, END_HEADER_TOKEN, EOT_TOKEN)
TOKENIZER_VOCAB_SIZE = 3072  # including the special tokens

# Llama 3's template, verbatim in behaviour: BOS once, a header per turn,
# content trimmed, <|eot_id|> after each turn, then the assistant header.
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


def corpus_text() -> str:
    """The English text the tokenizer is trained on (``thaw/data/corpus.txt``)."""
    return resources.files("thaw").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def train_tokenizer() -> str:
    """Train the byte-level BPE tokenizer and return its ``tokenizer.json`` text.

    Deterministic: the corpus is fixed and the BPE trainer breaks count ties
    by token id. Byte-level pre-tokenization and decoding mean any UTF-8 text
    round-trips, even characters the corpus never shows.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_text().split("\n\n"), trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) != TOKENIZER_VOCAB_SIZE:
        # The corpus ran out of merges: vocab_size in config.json would lie.
        raise RuntimeError(
            f"tokenizer trained to {tok.get_vocab_size(with_added_tokens=True)} tokens, "
            f"expected {TOKENIZER_VOCAB_SIZE}; the corpus is too small"
        )
    bos_id = tok.token_to_id(BOS_TOKEN)
    # Like Llama 3: BOS in front of plain encodings. Chat prompts already carry
    # it from the template and vLLM encodes them without special tokens.
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
                special_tokens=[(BOS_TOKEN, bos_id)],
            ),
        ]
    )
    return tok.to_str()


def token_ids(tokenizer_json: str) -> dict[str, int]:
    added = json.loads(tokenizer_json)["added_tokens"]
    ids = {t["content"]: t["id"] for t in added}
    missing = [t for t in SPECIAL_TOKENS if t not in ids]
    if missing:
        raise RuntimeError(f"tokenizer lacks special tokens {missing}")
    return ids


def tokenizer_config(ids: dict[str, int], max_length: int) -> dict[str, object]:
    return {
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "bos_token": BOS_TOKEN,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        # A chat model: generation stops at the end of the assistant's turn.
        "eos_token": EOT_TOKEN,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
