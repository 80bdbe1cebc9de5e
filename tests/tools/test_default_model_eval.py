"""The held-out FIM evaluation tells code lines from prose lines (comments, docstrings), so
the model card can report exact match on the lines an editor completes as code."""

from __future__ import annotations

from tools.default_model.evaluate import prose_lines

SOURCE = '''\
def area(r):
    """Return the area of a circle.

    r: the radius.
    """
    """One line."""
    # pi, roughly
    pi = 3.14159  # a trailing comment is code's
    text = """a
b"""
    return pi * r * r
'''


def test_comments_and_docstrings_are_prose_and_code_is_not() -> None:
    lines = SOURCE.split("\n")
    prose = {lines[i] for i in prose_lines(SOURCE)}
    assert prose == {'    """Return the area of a circle.', "", "    r: the radius.",
                     '    """', '    """One line."""', "    # pi, roughly", 'b"""'}
    for code in ("def area(r):", "    pi = 3.14159  # a trailing comment is code's",
                 '    text = """a', "    return pi * r * r"):
        assert code not in prose


def test_text_that_does_not_tokenize_has_no_prose_lines() -> None:
    assert prose_lines('x = """never closed\n# not a comment inside a string\n') == set()


def test_a_rename_edit_sample_shows_the_function_asks_for_a_rename_and_weighs_the_rewrite(
) -> None:
    import re
    from pathlib import Path

    import pytest
    from tokenizers import Tokenizer

    from tools.default_model.corpus import SourceFile, edit_examples
    from tools.default_model.samples import SampleBuilder

    tok_file = Path(__file__).resolve().parents[2] / "tools" / "models" / "default-coder" \
        / "tokenizer.json"
    if not tok_file.is_file():
        pytest.skip("the default model's tokenizer is absent")
    source = ("def scale(values, factor):\n    out = []\n    for v in values:\n"
              "        out.append(v * factor)\n    return out\n")
    files = (SourceFile("m.py", source),)
    edits = edit_examples(files)
    # parameters first, then assigned names (sorted); each occurs at least twice
    assert [e.names for e in edits] == [("values", "factor", "out", "v")]
    tok = Tokenizer.from_file(str(tok_file))
    builder = SampleBuilder(tok, files, [], 512, seed=3, edits=edits)
    ids, weights = builder.edit_sample()
    text = tok.decode(ids, skip_special_tokens=False)
    before, request, after = re.split(r"\n\n(# The same function, with .*:)\n", text)
    assert before == source.rstrip()
    old, new = re.findall(r"`(\w+)`", request)
    assert old in edits[0].names and new != old
    assert after == re.sub(rf"\b{old}\b", new, source.rstrip()) + "\n<|endoftext|>"
    assert weights[0] == 1.0 and weights[-1] == builder.mix.middle_weight


def test_a_hole_on_a_first_line_counts_as_a_miss_for_next_line_prediction() -> None:
    """The prefix-only baseline has nothing to continue on a file's first line: a miss,
    not an empty-prompt error that ends the whole evaluation."""
    from pathlib import Path

    from tools.default_model.evaluate import FimHole, fim_exact_match

    model = Path(__file__).resolve().parents[2] / "tools" / "models" / "default-coder"
    holes = [FimHole("a.py", "", "x = 1\n", "import os"),
             FimHole("a.py", "import os\n", "", "x = 1")]
    result = fim_exact_match(model, holes, order="none", max_new_tokens=4, threads=1)
    assert result.n == 2
    assert result.per_hole[0][1] == "" and result.per_hole[0][2] is False
    assert len(result.per_hole[1][1]) > 0  # the second hole was predicted
