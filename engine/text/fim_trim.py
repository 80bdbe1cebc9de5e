"""Where a prefix-only answer ends, and what of it the suffix already has.

Rules, on the generated text after the healed blanks (``engine.generation.fim_plain``):

- **Leading blank lines** are skipped when the cursor's line is blank (with the
  indentation the cursor already has taken off the next line): an answer never starts
  with an empty line.
- **Single line:** the answer ends at the first line break.
- **Multi-line:** it ends before a line indented less than the answer's first line
  (``dedent``) or before a blank line (``blank_line``); a trailing line break goes.
- **Suffix line:** the answer ends where it reproduces the suffix — the rest of the
  cursor's line (two characters or more) on the cursor's line, or the suffix's next
  non-blank line as a whole line (``suffix_line``).
- **Suffix bracket:** it ends before a closing bracket that closes nothing the answer
  opened when the suffix's first such bracket is the same one (``suffix_bracket``); a
  line that would start with it goes with its line break.
- **Overlap:** at the end, a tail of the last line that the rest of the cursor's line
  starts with is dropped, unless it closes a bracket the answer opened.

Brackets inside quotes on one line do not count. :class:`CompletionTrimmer` applies the
rules as text streams in: it returns only text no later token can take back (text that
may still be trimmed is held) and says which rule stopped the answer, so the caller can
stop generating. :func:`trim_completion` is the same on a whole text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

_OPENERS = frozenset("([{")
_CLOSERS = frozenset(")]}")
_QUOTES = frozenset("\"'`")
#: Suffix characters scanned for its first unclosed bracket.
_SUFFIX_SCAN = 4000
_MAX_OVERLAP = 200
#: Shorter rests of the line (a lone ")" or ":") only trim by overlap, at the end.
_MIN_REPRODUCED = 2


_OPEN_ENDS = frozenset("([{,=+-*/%<>&|^~!.:")  # a line ending so wants more on it
_BLOCK_ENDS = frozenset(":{")  # ...unless it opens a block (its body goes below)


@dataclass(frozen=True)
class CompletionRules:
    """What shapes one prefix-only answer; built by
    :func:`engine.generation.fim_plain.prefix_only_request`."""

    multiline: bool
    #: The cursor's line up to the cursor, as the user has it.
    line_prefix: str
    suffix: str
    #: Blanks taken off the prompt's end; the answer starts with them (then dropped).
    heal: str = ""

    @property
    def masks_line_start(self) -> bool:
        """Whether the first visible character must come before any line break."""
        line = self.line_prefix
        if not line.strip() or self.suffix.split("\n", 1)[0].strip():
            return True  # a blank line, or mid-line
        if line[-1] in " \t":
            return True
        last = line.rstrip()[-1]
        return last in _OPEN_ENDS and last not in _BLOCK_ENDS


class _Brackets:
    """Bracket depth outside one-line quotes, fed a character at a time."""

    def __init__(self, quote: str | None = None) -> None:
        self.quote = quote
        self.escaped = False
        self.depth = 0

    def feed(self, ch: str) -> bool:
        """Whether ``ch`` closes a bracket opened before this scan began."""
        if self.quote is not None:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch in (self.quote, "\n"):
                self.quote = None
            return False
        if ch in _QUOTES:
            self.quote = ch
        elif ch in _OPENERS:
            self.depth += 1
        elif ch in _CLOSERS:
            if not self.depth:
                return True
            self.depth -= 1
        return False


def _quote_after(line: str) -> str | None:
    scan = _Brackets()
    for ch in line:
        scan.feed(ch)
    return scan.quote


def first_unmatched_closer(line_prefix: str, suffix: str) -> str | None:
    """The suffix's first closing bracket that closes something before the cursor."""
    scan = _Brackets(_quote_after(line_prefix))
    for ch in suffix[:_SUFFIX_SCAN]:
        if scan.feed(ch):
            return ch
    return None


@dataclass(frozen=True)
class _Facts:
    """What the rules read from the request, computed once."""

    multiline: bool
    line_prefix: str
    heal: str
    rest_of_line: str
    reproduced: str  # the rest of the line, stripped, when long enough to count
    next_line: str  # the suffix's next non-blank line, stripped
    closer: str | None
    quote: str | None

    @classmethod
    def of(cls, rules: CompletionRules) -> _Facts:
        first, _, later = rules.suffix.partition("\n")
        next_line = next((line.strip() for line in later.split("\n") if line.strip()), "")
        stripped = first.strip()
        return cls(rules.multiline, rules.line_prefix, rules.heal, first,
                   stripped if len(stripped) >= _MIN_REPRODUCED else "", next_line,
                   first_unmatched_closer(rules.line_prefix, rules.suffix),
                   _quote_after(rules.line_prefix))


class _Outcome(NamedTuple):
    text: str  # the answer if it ended now (all of it while nothing stopped it)
    safe: int  # how much of ``text`` no later token can change
    rule: str | None


def _body(raw: str, facts: _Facts, final: bool) -> str | None:
    """The text the rules read: healed blanks off, leading blank lines skipped. None
    while that cannot be decided yet."""
    heal = facts.heal
    if heal and not raw.startswith(heal):
        if heal.startswith(raw):
            return None if not final else ""
        same = next((i for i, (a, b) in enumerate(zip(raw, heal, strict=False)) if a != b),
                    min(len(raw), len(heal)))
        raw = raw[same:]
    else:
        raw = raw[len(heal):]
    if facts.line_prefix.strip():
        return raw
    if not raw.strip():
        return None if not final else ""
    skipped = False
    while True:
        end = raw.find("\n")
        if end < 0 or raw[:end].strip():
            break
        raw, skipped = raw[end + 1:], True
    if skipped:
        indent = raw[:len(raw) - len(raw.lstrip(" \t"))]
        have = facts.line_prefix
        raw = raw[len(have):] if indent.startswith(have) else raw[len(indent):]
    return raw


def _overlap(text: str, rest: str, brackets: bool) -> int:
    """Length of the longest tail of ``text``'s last line that ``rest`` starts with
    (with ``brackets``: not one that closes a bracket the text opened)."""
    line = text[text.rfind("\n") + 1:]
    for size in range(min(len(line), len(rest), _MAX_OVERLAP), 0, -1):
        if line.endswith(rest[:size]) and not (brackets and _closes_own(text, size)):
            return size
    return 0


def _closes_own(text: str, size: int) -> bool:
    scan = _Brackets()
    for ch in text[:len(text) - size]:
        scan.feed(ch)
    return scan.depth > 0 and any(ch in _CLOSERS for ch in text[len(text) - size:])


def _evaluate(raw: str, facts: _Facts, final: bool) -> _Outcome:
    body = _body(raw, facts, final)
    if body is None:
        return _Outcome("", 0, None)
    whole_first = not facts.line_prefix.strip()  # the cursor's line is the answer's
    scan = _Brackets(facts.quote)
    base: int | None = None
    line_no, start, seen = 0, 0, False
    cut: int | None = None
    rule: str | None = None
    for i, ch in enumerate(body):
        if ch == "\n":
            line = body[start:i]
            whole = line_no > 0 or whole_first
            if whole and facts.next_line and line.strip() == facts.next_line:
                cut, rule = max(start - 1, 0), "suffix_line"
                break
            if not facts.multiline:
                cut, rule = i, "line_end"
                break
            if line_no > 0 and not line.strip():
                cut, rule = start - 1, "blank_line"
                break
            line_no, start, seen = line_no + 1, i + 1, False
            scan.feed(ch)
            continue
        first_on_line = not seen and ch not in " \t"
        if first_on_line:
            seen = True
            indent = i - start
            if line_no == 0:
                lead = facts.line_prefix
                indent = len(lead) + indent if whole_first else len(lead) - len(lead.lstrip())
            if base is None:
                base = indent
            elif line_no > 0 and indent < base:
                cut, rule = start - 1, "dedent"
                break
        if scan.feed(ch) and ch == facts.closer:
            # a line that would start with it goes whole, with the line break before it
            cut = i if not first_on_line else start - 1 if line_no else 0 if whole_first else i
            rule = "suffix_bracket"
            break
        target = facts.reproduced
        if line_no == 0 and target and i + 1 >= len(target) \
                and body.startswith(target, i + 1 - len(target)):
            cut, rule = i + 1 - len(target), "suffix_line"
            break
    if cut is None and not final:
        return _Outcome(body, _safe(body, facts, line_no, start), None)
    if cut is None:
        cut = len(body)
        last = body[start:]
        if (line_no > 0 or whole_first) and facts.next_line and last.strip() == facts.next_line:
            cut = max(start - 1, 0)
        elif line_no > 0 and not last.strip():
            cut = start - 1
    text = body[:cut]
    return _Outcome(text[:len(text) - _overlap(text, facts.rest_of_line, True)], cut, rule)


def _safe(body: str, facts: _Facts, line_no: int, start: int) -> int:
    """How much of ``body`` is final: before every place a later rule may still cut, and
    before every tail the overlap rule may still drop at such a place."""
    ends = [len(body)]
    last = body[start:]
    whole = line_no > 0 or not facts.line_prefix.strip()
    if line_no > 0 and not last.strip():
        ends.append(start - 1)  # a dedent or a blank line may still end it here
    lead = last.lstrip()
    if whole and facts.next_line and (facts.next_line.startswith(lead)
                                      or lead.rstrip() == facts.next_line):
        ends.append(max(start - 1, 0))  # this line may still turn out to be the suffix's
    target = facts.reproduced
    if line_no == 0 and target:
        ends += [p for p in range(max(0, len(body) - len(target) + 1), len(body))
                 if target.startswith(body[p:])]
    return min(end - _overlap(body[:end], facts.rest_of_line, False) for end in ends)


class CompletionTrimmer:
    """The rules of the module docstring, applied as text streams in."""

    def __init__(self, rules: CompletionRules) -> None:
        self._facts = _Facts.of(rules)
        self._raw = ""
        self._text = ""
        self._done = False
        #: The rule that ended the answer early (None: it ended by itself, or not yet).
        self.rule: str | None = None

    @property
    def stopped(self) -> bool:
        """A rule ended the answer: generating more is wasted."""
        return self.rule is not None

    @property
    def text(self) -> str:
        """Everything returned so far."""
        return self._text

    def feed(self, text: str) -> str:
        """Take newly generated text; return what of the answer became final with it."""
        if self._done or not text:
            return ""
        self._raw += text
        outcome = _evaluate(self._raw, self._facts, final=False)
        if outcome.rule is not None:
            self.rule, self._done = outcome.rule, True
            return self._release(outcome.text)
        return self._release(outcome.text[:outcome.safe])

    def flush(self) -> str:
        """The generation ended by itself: the rest of the answer."""
        if self._done:
            return ""
        self._done = True
        return self._release(_evaluate(self._raw, self._facts, final=True).text)

    def _release(self, text: str) -> str:
        if not text.startswith(self._text):
            return ""  # never take back what was sent (the holds are meant to prevent it)
        new, self._text = text[len(self._text):], text
        return new


def trim_completion(raw: str, rules: CompletionRules) -> str:
    """The answer ``raw`` (everything generated) gives under ``rules``."""
    trimmer = CompletionTrimmer(rules)
    return trimmer.feed(raw) + trimmer.flush()
