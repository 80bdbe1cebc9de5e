"""Splitting a reasoning model's thoughts from its answer, whatever the stream's pieces."""

from __future__ import annotations

import itertools

import pytest

from engine.text.reasoning import (
    ThinkTags,
    ThoughtSplitter,
    prompt_opens_thoughts,
    split_text,
    think_tags,
)

TAGS = ThinkTags()


def _pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _streamed(text: str, cuts: list[int], *, inside: bool) -> tuple[str, str]:
    splitter = ThoughtSplitter(TAGS, inside=inside)
    thought, answer = [], []
    for piece in _pieces(text, cuts):
        t, a = splitter.feed(piece)
        thought.append(t)
        answer.append(a)
    t, a = splitter.flush()
    return "".join(thought) + t, "".join(answer) + a


@pytest.mark.parametrize(("text", "inside", "want"), [
    ("\nTwo plus two.\n</think>\n\nFour.", True, ("Two plus two.\n", "Four.")),
    ("<think>\nHmm.</think>Four.", False, ("Hmm.", "Four.")),
    ("  <think>Hmm.</think>\n\nFour.", False, ("Hmm.", "Four.")),
    ("Four, no thoughts.", False, ("", "Four, no thoughts.")),
    ("Four <think> is text here", False, ("", "Four <think> is text here")),
    ("cut off while thinking </thi", True, ("cut off while thinking </thi", "")),
    ("</think>", True, ("", "")),
    ("<thin", False, ("", "<thin")),
])
def test_every_split_of_the_stream_gives_the_same_thoughts_and_answer(text, inside, want):
    assert split_text(text, TAGS, inside=inside) == want
    for cut in range(len(text) + 1):
        assert _streamed(text, [cut], inside=inside) == want, cut
    assert _streamed(text, list(range(1, len(text))), inside=inside) == want


def test_the_prompt_opens_the_thoughts_when_its_last_tag_is_an_open_one():
    assert prompt_opens_thoughts("<|im_start|>assistant\n<think>\n", TAGS)
    assert not prompt_opens_thoughts("assistant\n<think>\n\n</think>\n\n", TAGS)
    assert not prompt_opens_thoughts("<|im_start|>assistant\n", TAGS)


class _Vocab:
    def __init__(self, tokens: dict[str, int], template: str | None) -> None:
        self._tokens, self._template = tokens, template

    def token_to_id(self, token: str) -> int | None:
        return self._tokens.get(token)

    @property
    def chat_template_source(self) -> str | None:
        return self._template

    def decode(self, ids: object, *, skip_special: bool = False) -> str:
        raise AssertionError("not needed to find the tags")


def test_a_model_reasons_when_its_vocabulary_or_its_template_knows_the_tags():
    tags = think_tags(_Vocab({"<think>": 7, "</think>": 8}, None))
    assert tags is not None and (tags.open_id, tags.close_id) == (7, 8)
    spelled = think_tags(_Vocab({}, "{{ '<think>' }}...{{ '</think>' }}"))
    assert spelled is not None and spelled.open_id is None
    assert think_tags(_Vocab({}, "{{ messages }}")) is None
