"""Fill-in-the-middle: detect a model's FIM token family and lay out infill prompts.

Layouts (``P``/``S``/``M`` = the family's prefix/suffix/middle tokens, BOS first when the
model's tokenizer adds one by default, e.g. CodeLlama, DeepSeek, Codestral):

- PSM (every family but Codestral): ``P {prefix} S {suffix} M``.
- SPM: the variant of Bavarian et al. 2022 that StarCoder and CodeLlama were trained on,
  ``P S {suffix} M {prefix}``, which keeps the prefix right before the generated middle.
  DeepSeek-Coder was trained on PSM only, so it refuses SPM.
- Codestral has one layout (mistral-common's): ``[SUFFIX]{suffix}[PREFIX]{prefix}``, with
  no middle token; both orders give it.
- The suffix is encoded as a continuation: SentencePiece tokenizers (CodeLlama,
  Codestral) do not get the dummy leading space there, as in the reference encoders.
- Repo level (families with a file separator, used when extra files, a repo name or a
  file path is given). Qwen (as llama.cpp's /infill):
  ``<|repo_name|>name\\n<|file_sep|>path\\ntext\\n ... <|file_sep|>path\\nP...`` (the
  current path defaults to "untitled"); StarCoder2 (its paper's layout):
  ``<repo_name>name<file_sep>path\\ntext ... <file_sep>P path\\n{prefix}...``. The repo
  name is left out when no name is given or the vocabulary lacks its token.
  For families without a file separator the extra files go before the FIM tokens as
  plain text, each under a ``--- path ---`` line (llama.cpp does the same with its
  snippets); the repo name and file path are then not used.

Prefix, suffix and file text are encoded with ``parse_special=False``: code that contains
special-token text cannot inject control tokens.

A model without FIM tokens gets the prefix-only layout of ``engine.generation.fim_plain`` instead
(``Engine.fim_request`` picks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.errors import InvalidOptionError, UnsupportedModelError
from engine.text.tokenizer import Tokenizer

FimOrder = Literal["psm", "spm"]


@dataclass(frozen=True)
class FimFamily:
    """The FIM control tokens of one model; ``None`` where the family has no such token."""

    name: str  # "qwen" | "starcoder" | "codellama" | "deepseek" | "codestral"
    prefix_id: int
    suffix_id: int
    middle_id: int
    pad_id: int | None
    file_sep_id: int | None
    repo_name_id: int | None
    eot_ids: tuple[int, ...]  # end-of-text tokens: the family's own and the tokenizer's EOS


@dataclass(frozen=True)
class FimFile:
    """Another file of the repository, given to the model as context."""

    path: str
    text: str


@dataclass(frozen=True)
class _Spelling:
    name: str
    prefix: tuple[str, ...]
    suffix: tuple[str, ...]
    middle: tuple[str, ...]
    pad: tuple[str, ...] = ()
    file_sep: tuple[str, ...] = ()
    repo_name: tuple[str, ...] = ()
    eot: tuple[str, ...] = ()


# Alternative spellings are tried in order. CodeLlama's tokenizer.json spells its tokens
# with SentencePiece's "▁"; StarCoder1/SantaCoder use <reponame> / hyphens.
_FAMILIES: tuple[_Spelling, ...] = (
    _Spelling("qwen", ("<|fim_prefix|>",), ("<|fim_suffix|>",), ("<|fim_middle|>",),
              pad=("<|fim_pad|>",), file_sep=("<|file_sep|>",), repo_name=("<|repo_name|>",),
              eot=("<|endoftext|>", "<|im_end|>")),
    _Spelling("starcoder", ("<fim_prefix>", "<fim-prefix>"), ("<fim_suffix>", "<fim-suffix>"),
              ("<fim_middle>", "<fim-middle>"), pad=("<fim_pad>", "<fim-pad>"),
              file_sep=("<file_sep>",), repo_name=("<repo_name>", "<reponame>"),
              eot=("<|endoftext|>",)),
    _Spelling("codellama", ("▁<PRE>", "<PRE>", " <PRE>"), ("▁<SUF>", "<SUF>", " <SUF>"),
              ("▁<MID>", "<MID>", " <MID>"), eot=("▁<EOT>", "<EOT>", " <EOT>")),
    _Spelling("deepseek", ("<｜fim▁begin｜>",), ("<｜fim▁hole｜>",), ("<｜fim▁end｜>",),
              eot=("<|EOT|>", "<｜end▁of▁sentence｜>")),
    _Spelling("codestral", ("[PREFIX]",), ("[SUFFIX]",), ("[MIDDLE]",), eot=("</s>",)),
)

_NO_FIM_HINT = (
    "this model has no fill-in-the-middle tokens; use a code model such as "
    "Qwen2.5-Coder, StarCoder2, CodeLlama, DeepSeek-Coder or Codestral"
)


def _first_id(tokenizer: Tokenizer, spellings: Sequence[str]) -> int | None:
    for token in spellings:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    return None


def detect_fim_family(tokenizer: Tokenizer) -> FimFamily | None:
    """The FIM family whose prefix, suffix and middle tokens are all in the vocabulary."""
    for spec in _FAMILIES:
        prefix = _first_id(tokenizer, spec.prefix)
        suffix = _first_id(tokenizer, spec.suffix)
        middle = _first_id(tokenizer, spec.middle)
        if prefix is None or suffix is None or middle is None:
            continue
        eot = [t for t in (tokenizer.token_to_id(s) for s in spec.eot) if t is not None]
        return FimFamily(
            name=spec.name, prefix_id=prefix, suffix_id=suffix, middle_id=middle,
            pad_id=_first_id(tokenizer, spec.pad),
            file_sep_id=_first_id(tokenizer, spec.file_sep),
            repo_name_id=_first_id(tokenizer, spec.repo_name),
            eot_ids=tuple(dict.fromkeys([*eot, *tokenizer.eos_token_ids])),
        )
    return None


def require_fim(tokenizer: Tokenizer) -> FimFamily:
    """Like :func:`detect_fim_family`, but a model without FIM tokens is an error."""
    family = detect_fim_family(tokenizer)
    if family is None:
        raise UnsupportedModelError("this model does not support fill-in-the-middle",
                                    hint=_NO_FIM_HINT)
    return family


def fim_stop_token_ids(family: FimFamily) -> tuple[int, ...]:
    """Ids that end an infill: end-of-text tokens and every FIM control token (a model
    that emits one is starting another file or another FIM example)."""
    control = (family.prefix_id, family.suffix_id, family.middle_id, family.pad_id,
               family.file_sep_id, family.repo_name_id)
    return tuple(dict.fromkeys([*family.eot_ids, *(t for t in control if t is not None)]))


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, parse_special=False) if text else []


def _adds_dummy_prefix(tokenizer: Tokenizer) -> bool:
    ids = tokenizer.encode("a", parse_special=False)
    first = tokenizer.id_to_token(ids[0]) if ids else None
    return first is not None and first[:1] in ("▁", "Ġ")


def _encode_continuation(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text`` as it tokenizes after other text: without a SentencePiece dummy space.

    Encodes ``"\\n" + text`` and drops the newline's tokens (the dummy space goes before
    the newline); if the newline merged into the text, drops a lone leading "▁" instead.
    """
    ids = _encode(tokenizer, text)
    if not ids or not _adds_dummy_prefix(tokenizer):
        return ids
    head = _encode(tokenizer, "\n")
    joined = _encode(tokenizer, "\n" + text)
    if len(joined) > len(head) and joined[:len(head)] == head:
        return joined[len(head):]
    return ids[1:] if tokenizer.id_to_token(ids[0]) in ("▁", "Ġ") else ids


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _repo_context(
    tokenizer: Tokenizer, family: FimFamily, extra_files: Sequence[FimFile],
    repo_name: str | None, file_path: str | None,
) -> tuple[list[int], str]:
    """Repo-level header (files before the current one); returns it and the text that
    starts the prefix region (StarCoder2 puts the current path there)."""
    assert family.file_sep_id is not None
    starcoder = family.name == "starcoder"
    ids: list[int] = []
    if repo_name is not None and family.repo_name_id is not None:
        ids += [family.repo_name_id, *_encode(tokenizer, repo_name if starcoder
                                              else repo_name + "\n")]
    for file in extra_files:
        body = f"{file.path}\n{file.text}" if starcoder else _with_newline(
            f"{file.path}\n{file.text}")
        ids += [family.file_sep_id, *_encode(tokenizer, body)]
    ids.append(family.file_sep_id)
    if starcoder:
        return ids, f"{file_path}\n" if file_path is not None else ""
    ids += _encode(tokenizer, f"{file_path or 'untitled'}\n")
    return ids, ""


def _plain_context(tokenizer: Tokenizer, extra_files: Sequence[FimFile]) -> list[int]:
    text = "".join(f"--- {f.path} ---\n{_with_newline(f.text)}" for f in extra_files)
    return _encode(tokenizer, text + "\n") if text else []


def build_fim_ids(
    tokenizer: Tokenizer,
    family: FimFamily,
    prefix: str,
    suffix: str,
    *,
    order: FimOrder = "psm",
    extra_files: Sequence[FimFile] = (),
    repo_name: str | None = None,
    file_path: str | None = None,
) -> list[int]:
    """The prompt ids of one infill request (layouts in the module docstring)."""
    if order not in ("psm", "spm"):
        raise InvalidOptionError("order", f"expected 'psm' or 'spm', got {order!r}",
                                 hint="use 'psm' (prefix-suffix-middle), the layout every "
                                 "FIM model knows")
    if order == "spm" and family.name == "deepseek":
        raise InvalidOptionError("order", "DeepSeek-Coder was trained on prefix-suffix-middle "
                                 "only", hint="use order='psm' with this model")
    bos = tokenizer.bos_token_id
    ids = [bos] if tokenizer.adds_bos_by_default and bos is not None else []
    lead = ""
    repo_level = extra_files or repo_name is not None or file_path is not None
    if family.file_sep_id is not None and repo_level:
        context, lead = _repo_context(tokenizer, family, extra_files, repo_name, file_path)
        ids += context
    elif extra_files:
        ids += _plain_context(tokenizer, extra_files)
    prefix_ids = _encode(tokenizer, lead + prefix)
    suffix_ids = _encode_continuation(tokenizer, suffix)
    if family.name == "codestral":
        return [*ids, family.suffix_id, *suffix_ids, family.prefix_id, *prefix_ids]
    if order == "spm":
        return [*ids, family.prefix_id, family.suffix_id, *suffix_ids, family.middle_id,
                *prefix_ids]
    return [*ids, family.prefix_id, *prefix_ids, family.suffix_id, *suffix_ids,
            family.middle_id]
