"""The tokenizer rebuilt from a GGUF's SentencePiece-style ("llama") vocabulary: merges
recovered from the scores, byte fallback for what the vocabulary lacks, BOS added."""

from __future__ import annotations

import pytest

from engine.errors import ModelLoadError
from engine.model.gguf_tokenizer import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    GGUFVocab,
    build_tokenizer,
    spm_merges,
)

PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁h", "▁he", "llo", "▁hello",
          "▁w", "or", "▁wor", "ld", "▁world"]


def _spm_vocab() -> GGUFVocab:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(PIECES)
    # SentencePiece scores: longer, more frequent pieces score higher (merged first)
    scores = [0.0] * 259 + [-float(i) for i in range(len(PIECES), 0, -1)]
    scores[259 + PIECES.index("▁hello")] = -0.5
    return GGUFVocab(model="llama", tokens=tokens, types=types, scores=scores, bos_id=1,
                     eos_id=2, unk_id=0)


def test_sentencepiece_vocabulary_segments_and_round_trips():
    vocab = _spm_vocab()
    tok = build_tokenizer(vocab)
    enc = tok.encode("hello world")
    assert enc.tokens == ["<s>", "▁hello", "▁world"]
    assert tok.decode(enc.ids, skip_special_tokens=True) == "hello world"


def test_unknown_characters_fall_back_to_bytes():
    tok = build_tokenizer(_spm_vocab())
    enc = tok.encode("hello é", add_special_tokens=False)
    assert enc.tokens == ["▁hello", "▁", "<0xC3>", "<0xA9>"]
    assert tok.decode(enc.ids) == "hello é"


def test_merges_are_ranked_by_the_merged_piece_score():
    merges = spm_merges(_spm_vocab())
    assert merges[0] == ("▁he", "llo")  # "▁hello" scores best
    assert ("l", "l") in merges and ("▁", "h") in merges


def test_an_unknown_vocabulary_kind_is_refused_by_name():
    vocab = _spm_vocab()
    vocab.model = "bert"
    with pytest.raises(ModelLoadError, match="'bert'.*'gpt2'.*'llama'"):
        build_tokenizer(vocab)
