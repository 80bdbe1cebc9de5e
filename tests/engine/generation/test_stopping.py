"""Stop conditions: EOS, token stop sequences, text stop strings with hold-back, limits."""

from __future__ import annotations

import random

import pytest

from engine.config import GenerateOptions
from engine.generation.stopping import FinishReason, StopChecker


def checker(*stops, eos=(), **options) -> StopChecker:
    return StopChecker(GenerateOptions(stop_sequences=tuple(stops), **options),
                       eos_token_ids=eos)


def feed_all(stopper: StopChecker, pieces) -> tuple[list[str], FinishReason | None]:
    emitted, reason = [], None
    for piece in pieces:
        text, reason = stopper.feed_text(piece)
        emitted.append(text)
        if reason is not None:
            return emitted, reason
    emitted.append(stopper.flush())
    return emitted, reason


# --- tokens --------------------------------------------------------------------------------


def test_eos_is_checked_before_stop_sequences():
    reason = checker((7,), eos=[7]).check_token(7, [7])
    assert reason == FinishReason("eos_token")
    assert str(reason) == "eos_token"


def test_eos_ignored_when_stop_on_eos_is_off():
    assert str(checker((7,), eos=[7], stop_on_eos=False).check_token(7, [7])) == \
        "stop_sequence(0)"
    assert checker(eos=[7], stop_on_eos=False).check_token(7, [7]) is None


def test_every_eos_id_counts_and_options_override_the_model_ids():
    stopper = checker(eos=[2, 9])
    assert stopper.check_token(9, [1, 9]) == FinishReason("eos_token")
    overridden = checker(eos=[2], eos_token_ids=(5,))
    assert overridden.check_token(2, [2]) is None
    assert overridden.check_token(5, [5]) == FinishReason("eos_token")


def test_token_stop_sequence_is_a_suffix_match():
    stopper = checker((2, 3))
    reason = stopper.check_token(3, [1, 2, 3])
    assert reason == FinishReason("stop_sequence", 0)
    assert str(reason) == "stop_sequence(0)"
    assert stopper.check_token(3, [2, 1, 3]) is None
    assert stopper.check_token(3, [3]) is None


def test_token_stop_ties_go_to_the_lowest_index():
    stopper = checker("text", (9,), (2, 3), (3,))
    assert stopper.check_token(3, [2, 3]) == FinishReason("stop_sequence", 2)
    assert stopper.check_token(3, [1, 3]) == FinishReason("stop_sequence", 3)


def test_min_new_tokens_defers_token_stops():
    stopper = checker((4,), eos=[7], min_new_tokens=2)
    assert stopper.check_token(7, [7]) is None
    assert stopper.check_token(4, [1, 4]) is None
    assert stopper.check_token(7, [1, 2, 7]) == FinishReason("eos_token")
    assert stopper.single_token_stop_ids == {4, 7}


def test_token_stop_prefix_len_says_how_many_tokens_may_start_a_stop():
    stopper = checker((5, 6, 7), (8, 9))
    assert stopper.token_stop_prefix_len([1, 5, 6]) == 2
    assert stopper.token_stop_prefix_len([5, 6, 8]) == 1
    assert stopper.token_stop_prefix_len([6]) == 0


# --- text ----------------------------------------------------------------------------------


def test_stop_string_across_feeds_is_held_back_and_never_emitted():
    stopper = checker("\n\n")
    assert stopper.feed_text("Hello\n") == ("Hello", None)
    assert stopper.held_text == "\n"
    assert stopper.feed_text("\nWorld") == ("", FinishReason("stop_sequence", 0))
    assert stopper.flush() == ""
    assert stopper.feed_text("more") == ("", FinishReason("stop_sequence", 0))


def test_a_partial_match_that_is_not_a_stop_is_emitted_intact():
    emitted, reason = feed_all(checker("\n\n"), ["a\n", "b\n", "\tc"])
    assert reason is None
    assert emitted == ["a", "\nb", "\n\tc", ""]


def test_stop_string_spanning_three_feeds():
    emitted, reason = feed_all(checker("<END>"), ["x<", "EN", "D>tail"])
    assert emitted == ["x", "", ""]
    assert reason == FinishReason("stop_sequence", 0)


def test_earliest_match_in_the_text_wins_however_it_is_split():
    text = "Hello World"
    for pieces in ([text], list(text), ["Hel", "lo Wor", "ld"]):
        emitted, reason = feed_all(checker("World", "lo"), pieces)
        assert "".join(emitted) == "Hel"
        assert reason == FinishReason("stop_sequence", 1)


def test_flush_returns_the_held_text():
    stopper = checker("###")
    assert stopper.feed_text("abc#") == ("abc", None)
    assert stopper.feed_text("#") == ("", None)
    assert stopper.flush() == "##"
    assert stopper.flush() == ""


def test_held_text_never_exceeds_the_longest_stop_minus_one():
    stopper = checker("aaab", "zz")
    emitted = []
    for _ in range(20):
        text, reason = stopper.feed_text("aa")
        assert reason is None
        assert len(stopper.held_text) <= 3
        emitted.append(text)
    assert "".join(emitted) + stopper.flush() == "a" * 40


def test_without_text_stops_text_passes_through():
    stopper = checker((1, 2))
    assert stopper.feed_text("any\n\ntext") == ("any\n\ntext", None)
    assert stopper.flush() == ""


# --- reasons and limits --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["max_tokens", "eos_token", "length", "cancelled"])
def test_finish_reason_prints_its_kind(kind):
    assert str(FinishReason(kind)) == kind


def test_limits_report_max_tokens_before_length():
    stopper = checker(max_new_tokens=4)
    assert stopper.check_limits(3, 10, 16) is None
    assert stopper.check_limits(4, 16, 16) == FinishReason("max_tokens")
    assert stopper.check_limits(2, 16, 16) == FinishReason("length")


def reference_stop(text: str, stops: list[str]) -> tuple[str, int | None]:
    """The whole text at once: the stop that completes first (then starts first) wins."""
    found = [(text.find(s) + len(s), text.find(s), i) for i, s in enumerate(stops)
             if s in text]
    if not found:
        return text, None
    _, start, index = min(found)
    return text[:start], index


def test_any_split_of_the_text_gives_the_same_result_as_the_whole():
    rng = random.Random(1234)
    for _ in range(400):
        stops = ["".join(rng.choices("ab\n", k=rng.randint(1, 4))) for _ in range(3)]
        text = "".join(rng.choices("ab\nc", k=rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 5)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        emitted, reason = feed_all(checker(*stops), pieces)
        expected_text, expected_index = reference_stop(text, stops)
        assert "".join(emitted) == expected_text, (stops, pieces)
        assert (reason.stop_index if reason else None) == expected_index


# --- healed text ---------------------------------------------------------------------------


@pytest.mark.parametrize("pieces", [["\n    ", "return x", "\n", "y"],
                                    ["\n", "  ", "  return", " x\ny"],
                                    ["\n    return x\ny"]])
def test_stops_are_matched_after_the_healed_text_only(pieces):
    """A code completion's healed line break is the prompt's, not the answer's: a "\\n"
    stop ends the answer's line, however the text is split into tokens."""
    stopper = StopChecker(GenerateOptions(stop_sequences=("\n",)), eos_token_ids=(),
                          healed="\n    ")
    emitted, reason = feed_all(stopper, pieces)
    assert "".join(emitted) == "\n    return x" and reason == FinishReason("stop_sequence", 0)


def test_healing_ends_where_the_text_differs_from_it():
    stopper = StopChecker(GenerateOptions(stop_sequences=("\n",)), eos_token_ids=(),
                          healed="\n    ")
    emitted, reason = feed_all(stopper, ["\n  x", "\n"])
    assert "".join(emitted) == "\n  x" and reason == FinishReason("stop_sequence", 0)
    # a stop that starts in the healed text and ends in the answer does not count either
    stopper = StopChecker(GenerateOptions(stop_sequences=("\n\n",)), eos_token_ids=(),
                          healed="\n")
    emitted, reason = feed_all(stopper, ["\n", "\nx", "\n\n"])
    assert "".join(emitted) == "\n\nx" and reason == FinishReason("stop_sequence", 0)


def test_constrained_stops_skip_the_healed_text():
    stopper = StopChecker(GenerateOptions(stop_sequences=("\n",)), eos_token_ids=(),
                          healed="\n")
    assert stopper.check_constrained(1, [1], "\n", 1, complete=True) is None
    assert stopper.check_constrained(2, [1, 2], "\nab", 2, complete=True) is None
    assert stopper.check_constrained(3, [1, 2, 3], "\nab\n", 1, complete=True) == \
        FinishReason("stop_sequence", 0)
