"""A byte-level BPE tokenizer (Qwen2-style pre-tokenizer) with Qwen chat and FIM tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tools.default_model.corpus import SourceFile

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
FIM_PREFIX = "<|fim_prefix|>"
FIM_MIDDLE = "<|fim_middle|>"
FIM_SUFFIX = "<|fim_suffix|>"
FIM_PAD = "<|fim_pad|>"
REPO_NAME = "<|repo_name|>"
FILE_SEP = "<|file_sep|>"

#: Ids 0.. in this order (``<|endoftext|>`` is 0: EOS and pad).
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT, IM_START, IM_END, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD, REPO_NAME,
    FILE_SEP,
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2's split (contractions, letters, single digits, punctuation runs, newlines, spaces)
# with two changes that keep prompts on token boundaries: a word takes only a leading
# space, not a leading bracket ("(len" is "(" + "len"), and punctuation does not swallow the
# newline after it ("):\n" is "):" + "\n"). An editor's prompt ending in "range(" or a
# prompt "def f(x):" then ends where training text has a token boundary too.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
MODEL_MAX_LENGTH = 512


def _texts(files: tuple[SourceFile, ...], max_chars: int) -> Iterator[str]:
    total = 0
    for item in files:
        yield item.text
        total += len(item.text)
        if total >= max_chars:
            return


def train_tokenizer(files: tuple[SourceFile, ...], vocab_size: int,
                    max_chars: int = 6_000_000) -> Tokenizer:
    """Train on (the first ``max_chars`` of) ``files``; deterministic for the same input."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_texts(files, max_chars), trainer=trainer)
    return tok


def tokenizer_config() -> dict[str, object]:
    decoder = {
        str(i): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, content in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": ENDOFTEXT,
        "errors": "replace",
        # our engine's hint: this model fills in the middle best in suffix-prefix-middle
        # order (it learned to continue the prefix only there; MODEL_CARD.md)
        "fim_order": "spm",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_tokenizer_files(tok: Tokenizer, out_dir: Path) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` (with the chat template) and
    ``chat_template.jinja``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2) + "\n", encoding="utf-8")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
