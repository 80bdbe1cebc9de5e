"""Code completion for models without FIM tokens: the prefix-only layout.

The prompt is the code before the cursor, nothing else (BOS first when the tokenizer adds
one by default; extra files, as ``--- path ---`` sections, before it where they fit):

- **Budget.** A prefix over the token budget (``DEFAULT_BUDGET``, at most the context
  minus the room kept for the answer) is clipped at line boundaries: the file's first
  lines (its header: imports, up to the last blank line within a quarter of the budget)
  are kept, then as many of the last lines as fit. The cut moves in steps of
  ``_CUT_STEP`` lines, so the prompt's start stays put while the user types and its KV is
  reused from the prefix cache.
- **Healing.** Blanks at the end of the prefix's last line (``return``'s space, an
  indentation) are taken off the prompt and the first generated tokens must spell them
  (BPE rarely ends a text with a lone space: ``" x"`` is one token), then they are dropped
  from the answer; stop strings are matched only after them (a ``"\\n"`` stop ends the
  answer's line, not the healed line break). When the cursor starts a line (nothing but
  blanks before it), the line break before it is healed too: byte-level BPE merges a line
  break with the next line's indentation (``"\\n    "`` is one token), so a prompt that
  ends with a bare line break is one the model never saw, and it answers with the
  indentation missing or another line break (measured: 4 of 300 held-out holes exact
  without this).
- **Single or multi-line** (``lines``): ``"single"`` ends the answer at the end of the
  line; ``"multi"`` at a dedent below the completion's first line or at a blank line.
  ``"auto"`` (the default) is single when the cursor is mid-line (the suffix's first line
  has text) or when a stop string is ``"\\n"``, multi otherwise.
- **The suffix trims** the answer (``engine.text.fim_trim``): what it already starts with is
  dropped, a line it already has ends the answer, and so does a closing bracket it
  already has.
- **Never an empty line for a hole.** While the answer has no visible character yet and
  the cursor's line is blank, mid-line or open (ends with a blank, an operator, a comma
  or an opening bracket), line breaks, end-of-text, special tokens and the suffix's
  closing bracket are masked (``engine.generation.fim_sampler``): a small model's first choice after
  a line break is often another one.

Models with FIM tokens keep their own layouts (``engine.text.fim``); none of this applies.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from engine.api import GenerateEvent, GenerateRequest
from engine.config import GenerateOptions
from engine.errors import InvalidOptionError
from engine.generation.fim_sampler import LineStartSampler, chain_options
from engine.generation.stopping import EOS_TOKEN
from engine.text.fim import FimFamily, FimFile
from engine.text.fim_trim import CompletionRules, CompletionTrimmer
from engine.text.tokenizer import Tokenizer

FimLines = Literal["auto", "single", "multi"]
FIM_LINES: tuple[str, ...] = ("auto", "single", "multi")
PREFIX_ONLY = "prefix-only"
#: Prompt tokens at most: a cold prefill of this many takes a few seconds on two cores.
DEFAULT_BUDGET = 512
#: Tokens kept free for the answer: at most this many, and at most a quarter of the context.
MAX_RESERVE = 256
_CUT_STEP = 8
@dataclass(frozen=True)
class PrefixOnlyRequest(GenerateRequest):
    """A prefix-only infill: a plain request plus the rules that trim its answer (the
    server applies them through ``engine.text.fim_trim.CompletionTrimmer``)."""

    rules: CompletionRules | None = None


def fim_layout(family: FimFamily | None, tokenizer: Tokenizer) -> str:
    """The layout ``Engine.fim_request`` uses: ``psm``, ``spm``, ``codestral`` or
    ``prefix-only``."""
    if family is None:
        return PREFIX_ONLY
    if family.name == "codestral":
        return "codestral"
    return "spm" if tokenizer.fim_order == "spm" and family.name != "deepseek" else "psm"


def resolve_lines(lines: str, suffix: str, options: GenerateOptions) -> bool:
    """Whether the answer may span lines (see the module docstring for ``"auto"``)."""
    if lines not in FIM_LINES:
        raise InvalidOptionError("lines", f"expected 'auto', 'single' or 'multi', got {lines!r}",
                                 hint="use 'single' for one line, 'multi' for a block")
    if lines != "auto":
        return lines == "multi"
    if suffix.split("\n", 1)[0].strip():
        return False
    return "\n" not in options.stop_sequences


def reserve_for(options: GenerateOptions, max_total: int) -> int:
    """Tokens kept free for the answer (the same rule as /infill's truncation)."""
    return max(1, min(options.max_new_tokens, max_total // 4, MAX_RESERVE))


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, parse_special=False) if text else []


def _header_end(lines: Sequence[str], counts: Sequence[int], budget: int) -> int:
    """Leading lines that fit ``budget``, ending at the last blank line among them."""
    used = end = blank_end = 0
    for index, line in enumerate(lines[:-1]):
        if used + counts[index] > budget:
            break
        used += counts[index]
        end = index + 1
        if not line.strip():
            blank_end = end
    return blank_end or end


def clip_prefix(tokenizer: Tokenizer, prefix: str, budget: int) -> list[int]:
    """``prefix``'s ids, clipped at line boundaries to ``budget`` tokens, header kept."""
    ids = _encode(tokenizer, prefix)
    if len(ids) <= budget:
        return ids
    lines = prefix.splitlines(keepends=True)
    counts = [len(_encode(tokenizer, line)) for line in lines]
    head = _header_end(lines, counts, budget // 4)
    room = budget - sum(counts[:head])
    start, used = len(lines) - 1, counts[-1]
    while start > head and used + counts[start - 1] <= room:
        start -= 1
        used += counts[start]
    stepped = -(-start // _CUT_STEP) * _CUT_STEP
    if start > head and stepped < len(lines) - 1:
        start = stepped
    while True:
        ids = _encode(tokenizer, "".join([*lines[:head], *lines[start:]]))
        if len(ids) <= budget or start >= len(lines) - 1:
            break
        start += 1
    if len(ids) > budget:  # the cursor's line alone is over the budget
        ids = _encode(tokenizer, lines[-1])[-budget:]
    return ids


def _file_context(tokenizer: Tokenizer, files: Sequence[FimFile], room: int) -> list[int]:
    """The newest extra files that fit ``room`` tokens, oldest first."""
    kept: list[list[int]] = []
    for file in reversed(files):
        text = file.text if file.text.endswith("\n") else file.text + "\n"
        ids = _encode(tokenizer, f"--- {file.path} ---\n{text}\n")
        if len(ids) > room:
            break
        kept.insert(0, ids)
        room -= len(ids)
    return [t for ids in kept for t in ids]


def _document_start(tokenizer: Tokenizer) -> list[int]:
    """A first token for an empty prompt: BOS, else the end-of-text separator."""
    for token in (tokenizer.bos_token_id, tokenizer.token_to_id("<|endoftext|>"),
                  *tokenizer.eos_token_ids):
        if token is not None:
            return [token]
    raise InvalidOptionError("prompt", "the code before the cursor is empty and the model "
                             "has no start-of-text token", hint="send some code")


def build_prefix_only_ids(tokenizer: Tokenizer, prefix: str, *, budget: int,
                          extra_files: Sequence[FimFile] = ()) -> tuple[list[int], str]:
    """The prompt ids of a prefix-only infill and the healed blanks (module docstring)."""
    line = prefix.rsplit("\n", 1)[-1]
    heal = line[len(line.rstrip(" \t")):]
    if not line.strip() and "\n" in prefix:
        heal = "\n" + line  # the cursor starts a line: its line break is healed too
    text = prefix[:len(prefix) - len(heal)]
    bos = tokenizer.bos_token_id
    ids = [bos] if tokenizer.adds_bos_by_default and bos is not None else []
    body = clip_prefix(tokenizer, text, max(1, budget - len(ids)))
    files = _file_context(tokenizer, extra_files, budget - len(ids) - len(body))
    ids += files + body
    if not ids:
        ids = _document_start(tokenizer)
    return ids, heal


def prefix_only_request(
    tokenizer: Tokenizer, prefix: str, suffix: str, options: GenerateOptions, *,
    max_total: int, eos_token_ids: Sequence[int], extra_files: Sequence[FimFile] = (),
    lines: str = "auto", budget: int | None = None,
) -> PrefixOnlyRequest:
    """The request of one prefix-only infill (its sampler masks the first tokens)."""
    multiline = resolve_lines(lines, suffix, options)
    limit = max(1, max_total - reserve_for(options, max_total))
    budget = min(limit, DEFAULT_BUDGET if budget is None else max(1, budget))
    ids, heal = build_prefix_only_ids(tokenizer, prefix, budget=budget,
                                      extra_files=extra_files)
    rules = CompletionRules(multiline=multiline, line_prefix=prefix.rsplit("\n", 1)[-1],
                            suffix=suffix, heal=heal)
    eos = options.eos_token_ids if options.eos_token_ids is not None else eos_token_ids
    sampler = LineStartSampler(tokenizer, rules, options, eos_token_ids=eos)
    return PrefixOnlyRequest(token_ids=tuple(ids), options=chain_options(options),
                             sampler=sampler, rules=rules, healed=heal)


def trimmer_for(request: GenerateRequest) -> CompletionTrimmer | None:
    """A fresh trimmer for a prefix-only infill's answer; None for any other request."""
    rules = request.rules if isinstance(request, PrefixOnlyRequest) else None
    return None if rules is None else CompletionTrimmer(rules)


class _StopFlag(threading.Event):
    """Set by a completion rule; also reads as set when the caller's own flag is."""

    def __init__(self, outer: threading.Event | None) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        return super().is_set() or (self._outer is not None and self._outer.is_set())


def stop_flag(cancel: threading.Event | None) -> threading.Event:
    """A cancel flag a completion rule can set without setting the caller's ``cancel``."""
    return _StopFlag(cancel)


def trim_events(events: Iterator[GenerateEvent], trimmer: CompletionTrimmer,
                stop: threading.Event) -> Generator[GenerateEvent, None, None]:
    """``events`` with their text through ``trimmer``; a rule that ends the answer sets
    ``stop`` (the run's cancel flag). The result carries the trimmed text, and an answer a
    rule ended finishes as ``eos_token`` (it is complete), not ``cancelled``."""
    try:
        for event in events:
            if event.result is None:
                text = trimmer.feed(event.text)
                if trimmer.stopped:
                    stop.set()
                yield replace(event, text=text)
                continue
            tail = trimmer.flush()
            if tail:
                yield GenerateEvent(tail, None, None, event.timestamp)
            finish = EOS_TOKEN if trimmer.stopped else event.result.finish_reason
            yield replace(event, result=replace(event.result, text=trimmer.text,
                                                finish_reason=finish))
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()  # the run ends cleanly even when the caller stops listening
