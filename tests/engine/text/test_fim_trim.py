"""engine.text.fim_trim: where a prefix-only completion ends and what the suffix trims, on
whole texts and streamed in pieces (what is sent is never taken back)."""

from __future__ import annotations

import random

import pytest

from engine.text.fim_trim import (
    CompletionRules,
    CompletionTrimmer,
    first_unmatched_closer,
    trim_completion,
)


def rules(prefix: str, suffix: str, *, multi: bool) -> CompletionRules:
    line = prefix.rsplit("\n", 1)[-1]
    return CompletionRules(multiline=multi, line_prefix=line, suffix=suffix,
                           heal=line[len(line.rstrip(" \t")):])


# (prefix, suffix, multi-line, everything the model generated, the answer)
CASES = [
    # one line ends at its line break
    ("x = ", "\n", False, "compute(1)\nprint(x)\n", "compute(1)"),
    # a closing bracket the suffix already has ends it; one the answer opened does not
    ("x = foo(", ")\n", False, "a, b)\n", "a, b"),
    ("print(", ")\n", False, "foo())", "foo()"),
    ("xs = [", "]\n", False, "f(1), g(2)]", "f(1), g(2)"),
    # brackets inside quotes do not count
    ("s = f(", ")\n", False, "')', 1)", "')', 1"),
    # what the rest of the line already starts with is dropped
    ("if x > 0", ":\n    pass\n", False, " and y:\n", " and y"),
    # ...unless the answer needs it to close its own bracket
    ("call(", ")\n", False, "g(1)", "g(1)"),
    # where the answer reproduces the rest of the line, it ends
    ("x = f(a, ", "c)\n", False, "b, c) + 1", "b, "),
    # multi-line: a blank line or a dedent ends it, with its line break
    ("def f():\n    ", "\n    return 1\n", True, "    x = 1\n    y = 2\n\nz = 3",
     "x = 1\n    y = 2"),
    ("def f():\n", "\n", True, "\n    x = 1\ndef g():", "    x = 1"),
    ("    total = 0\n    ", "\n", True, "    for i in x:\n        total += i\nprint()",
     "for i in x:\n        total += i"),
    # ...and so does a line the suffix has next
    ("def f():\n    ", "\n    return 1\n", True, "    x = 1\n    return 1\n", "x = 1"),
    ("items = [\n", "    5,\n]\n", True, "    3,\n    4,\n    5,\n]", "    3,\n    4,\n"),
    # the block after a line that opens one is the answer
    ("def f(x):", "\n", True, "\n    return x\n\n", "\n    return x"),
    # the healed blank of "return " is not repeated
    ("    return ", "\n\nprint(area(2))\n", True, " r * r\n\nprint", "r * r"),
    ("    return ", "\n", True, " r * r\n", "r * r"),
    # leading blank lines are skipped, the cursor's indentation is not doubled
    ("def f():\n    ", "\n", True, "    \n    x = 1\n", "x = 1"),
    ("def f():\n", "\n", False, "\n\n    x = 1\n", "    x = 1"),
    # an answer that only closes what the suffix closes is empty, not the bracket
    ("items = [\n", "]\n", True, "]\n", ""),
    # ...and a line that starts with that bracket goes with its line break
    ("items = [\n    1,\n", "\n]\n", True, "    2,\n]\n", "    2,"),
    ("f(\n    1,", "\n)\n", True, "\n    2,\n    )", "\n    2,"),
]


@pytest.mark.parametrize(("prefix", "suffix", "multi", "raw", "answer"), CASES)
def test_trim_completion(prefix, suffix, multi, raw, answer):
    assert trim_completion(raw, rules(prefix, suffix, multi=multi)) == answer


@pytest.mark.parametrize(("prefix", "suffix", "multi", "raw", "answer"), CASES)
def test_streamed_in_any_pieces_it_sends_only_text_it_keeps(prefix, suffix, multi, raw, answer):
    spec = rules(prefix, suffix, multi=multi)
    chooser = random.Random(len(raw))
    splits = [[1] * len(raw)] + [[chooser.randint(1, 4) for _ in raw] for _ in range(20)]
    for sizes in splits:
        trimmer = CompletionTrimmer(spec)
        sent, at = "", 0
        for size in sizes:
            if at >= len(raw) or trimmer.stopped:
                break
            sent += trimmer.feed(raw[at:at + size])
            at += size
            assert answer.startswith(sent), (sizes, sent)
        sent += trimmer.flush()
        assert sent == answer == trimmer.text


def test_a_rule_says_why_it_stopped_and_stops_at_once():
    trimmer = CompletionTrimmer(rules("def f():\n    ", "\n", multi=True))
    assert trimmer.feed("    x = 1\n") == "x = 1" and not trimmer.stopped
    assert trimmer.feed("print(x)") == "" and trimmer.rule == "dedent"
    assert trimmer.feed("more") == "" and trimmer.flush() == ""
    single = CompletionTrimmer(rules("x = ", "\n", multi=False))
    assert single.feed("1\n2") == "1" and single.rule == "line_end"
    natural = CompletionTrimmer(rules("x = ", "\n", multi=False))
    assert natural.feed("1") == "1" and natural.flush() == "" and natural.rule is None


def test_text_that_may_still_be_trimmed_is_held_back():
    trimmer = CompletionTrimmer(rules("if x > 0", ":\n", multi=False))
    assert trimmer.feed(" and y") == " and y"
    assert trimmer.feed(":") == ""  # the suffix starts with it: sent only if more follows
    assert trimmer.feed(" z") == ": z"
    multi = CompletionTrimmer(rules("def f():\n    ", "\n    return 1\n", multi=True))
    assert multi.feed("    x = 1\n    ret") == "x = 1"  # may be the suffix's next line
    assert multi.feed("ry()\n") == "\n    retry()"


def test_first_unmatched_closer_of_the_suffix():
    assert first_unmatched_closer("f(", "a, b)\n") == ")"
    assert first_unmatched_closer("x = [", "\n    1,\n]\n") == "]"
    assert first_unmatched_closer("x = ", "(1)\n") is None
    assert first_unmatched_closer('s = f("(', '")') == ")"  # the cursor is inside a string


def test_random_code_streamed_in_random_pieces_matches_the_whole_text():
    pieces = ["\n", "    ", " ", "x", "=", "1", "(", ")", "[", "]", ":", ",", "\n\n", "return",
              "'", "y", "    return 1", "5,", "\t"]
    prefixes = ["", "x = ", "def f():\n", "def f():\n    ", "f(", "  if a", "s = '",
                "    return "]
    suffixes = ["", "\n", ")\n", "\n    return 1\n", "5,\n]\n", ":\n", "x)\n", " = 1\n", "'\n"]
    chooser = random.Random(7)
    for _ in range(3000):
        spec = rules(chooser.choice(prefixes), chooser.choice(suffixes),
                     multi=chooser.random() < 0.5)
        raw = "".join(chooser.choice(pieces) for _ in range(chooser.randint(0, 12)))
        answer = trim_completion(raw, spec)
        trimmer, sent, at = CompletionTrimmer(spec), "", 0
        while at < len(raw) and not trimmer.stopped:
            size = chooser.randint(1, 3)
            sent += trimmer.feed(raw[at:at + size])
            at += size
            assert answer.startswith(sent), (spec, raw, sent)
        assert sent + trimmer.flush() == answer, (spec, raw)
