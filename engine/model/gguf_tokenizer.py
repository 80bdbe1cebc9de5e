"""``tokenizer.json`` and ``tokenizer_config.json`` from a GGUF's vocabulary.

Two vocabulary kinds (``tokenizer.ggml.model``):

- ``gpt2``: byte-level BPE with merges (SmolLM, Qwen, Llama 3 ...). The pre-tokenizer is
  chosen by ``tokenizer.ggml.pre`` (the split regex llama.cpp uses for that name).
- ``llama``: SentencePiece BPE with scores and byte fallback (Llama 2, Mistral 7B ...). The
  merges are recovered from the scores the way transformers converts SentencePiece models:
  every split of a piece into two pieces of the vocabulary, ranked by the piece's score.

Control and user-defined tokens become added tokens (control ones special), so chat markers
are matched whole before the text is split.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

from engine.errors import ModelLoadError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
           r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
           r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: tokenizer.ggml.pre -> the split regex (None: GPT-2's own, inside ByteLevel)
PRE_TOKENIZERS: dict[str, str | None] = {
    "default": None, "gpt-2": None, "gpt2": None,
    "llama-bpe": _LLAMA3, "llama3": _LLAMA3, "dbrx": _LLAMA3, "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "tekken": _TEKKEN,
}
#: GPT-2's split with every digit on its own (llama.cpp's "smollm", "starcoder", "refact")
DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact")


@dataclass
class GGUFVocab:
    """The ``tokenizer.ggml.*`` fields of a GGUF."""

    model: str
    tokens: list[str]
    types: list[int]
    merges: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    pre: str = "default"
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool | None = None
    add_space_prefix: bool | None = None
    chat_template: str | None = None
    notes: list[str] = field(default_factory=list)


def _token(vocab: GGUFVocab, tid: int | None) -> str | None:
    return vocab.tokens[tid] if tid is not None and 0 <= tid < len(vocab.tokens) else None


def _byte_level(vocab: GGUFVocab) -> Tokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    merges = []
    for line in vocab.merges:
        left, sep, right = line.partition(" ")
        if not sep:
            raise ModelLoadError(f"tokenizer.ggml.merges has an entry without a space: {line!r}",
                                 hint="the GGUF's vocabulary is damaged; re-download the file")
        merges.append((left, right))
    tok = Tokenizer(models.BPE(ids, merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=False)
    if vocab.pre in DIGITS_THEN_GPT2:
        tok.pre_tokenizer = pre.Sequence([pre.Digits(individual_digits=True),
                                          pre.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif vocab.pre in PRE_TOKENIZERS and PRE_TOKENIZERS[vocab.pre] is not None:
        tok.pre_tokenizer = pre.Sequence([
            pre.Split(Regex(str(PRE_TOKENIZERS[vocab.pre])), behavior="isolated"), byte_level])
    else:
        if vocab.pre not in PRE_TOKENIZERS:
            vocab.notes.append(f"tokenizer.ggml.pre {vocab.pre!r} is not known here; "
                               "GPT-2's pre-tokenizer is used (rare words may split differently "
                               "from llama.cpp)")
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def spm_merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    """SentencePiece BPE merges: each two-piece split of a normal piece, best score first."""
    ids = {t: i for i, t in enumerate(vocab.tokens) if vocab.types[i] in (NORMAL, USER_DEFINED)}
    found: list[tuple[float, int, str, str]] = []
    for piece, pid in ids.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                found.append((-vocab.scores[pid] if vocab.scores else pid, pid, left, right))
    found.sort()
    return [(left, right) for _, _, left, right in found]


def _sentencepiece(vocab: GGUFVocab) -> Tokenizer:
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    unk = _token(vocab, vocab.unk_id)
    tok = Tokenizer(models.BPE(ids, spm_merges(vocab), unk_token=unk, fuse_unk=True,
                               byte_fallback=True))
    prefix = vocab.add_space_prefix is not False
    steps = [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), *steps] if prefix else steps)
    tok_decoders = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        tok_decoders.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(tok_decoders)
    return tok


def build_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """The ``tokenizers`` object for a GGUF vocabulary."""
    if vocab.model == "gpt2":
        tok = _byte_level(vocab)
    elif vocab.model == "llama":
        tok = _sentencepiece(vocab)
    else:
        raise ModelLoadError(
            f"the GGUF's tokenizer.ggml.model is {vocab.model!r}; import-gguf reads 'gpt2' "
            "(byte-level BPE) and 'llama' (SentencePiece) vocabularies",
            hint="convert this model with onnxruntime-genai's builder from its Hugging Face "
                 "files instead")
    added = []
    for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.types, strict=False)):
        if kind in (CONTROL, USER_DEFINED) or i in (vocab.bos_id, vocab.eos_id, vocab.eot_id):
            added.append(AddedToken(text, special=kind != USER_DEFINED, normalized=False))
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    add_bos = vocab.add_bos if vocab.add_bos is not None else vocab.model == "llama"
    bos = _token(vocab, vocab.bos_id)
    if add_bos and bos is not None and vocab.bos_id is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab.bos_id)])
    elif vocab.model == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_config(vocab: GGUFVocab, context: int) -> dict[str, Any]:
    """``tokenizer_config.json`` as transformers writes it (with the chat template)."""
    eos = vocab.eot_id if vocab.eot_id is not None else vocab.eos_id
    config: dict[str, Any] = {
        "add_bos_token": bool(vocab.add_bos if vocab.add_bos is not None
                              else vocab.model == "llama"),
        "add_eos_token": False,
        "bos_token": _token(vocab, vocab.bos_id),
        "eos_token": _token(vocab, eos),
        "pad_token": _token(vocab, vocab.pad_id if vocab.pad_id is not None else eos),
        "unk_token": _token(vocab, vocab.unk_id),
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return {k: v for k, v in config.items() if v is not None}


def write_tokenizer(vocab: GGUFVocab, out_dir: Path, context: int) -> None:
    """``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja``."""
    build_tokenizer(vocab).save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(vocab, context), indent=2, ensure_ascii=False) + "\n")
    if vocab.chat_template:
        (out_dir / "chat_template.jinja").write_text(vocab.chat_template)
