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
