"""Reasoning models' thoughts: ``<think>…</think>`` apart from the answer.

Qwen3, QwQ and the DeepSeek-R1 distills write their reasoning between think tags before
the answer; their chat templates often open the tag themselves at the end of the prompt
(``…<|im_start|>assistant\\n<think>\\n``), so the output starts inside the thoughts. The
engine splits each generated piece into thought text and answer text as it streams
(:class:`ThoughtSplitter`): stop strings and tool calls then see the answer only, and the
worker returns the thoughts as ``reasoning_content`` (OpenAI) or ``thinking`` (Ollama).

A model has thoughts when its vocabulary holds both tags as tokens, or when its chat
template writes the closing tag (a GGUF import may spell the tags in several tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["ThinkTags", "ThoughtSplitter", "describe_reasoning", "prompt_opens_thoughts",
           "think_tags", "thought_mode"]


@dataclass(frozen=True)
class ThinkTags:
    open: str = "<think>"
    close: str = "</think>"
    #: The tags' token ids where each is one token of the vocabulary.
    open_id: int | None = None
    close_id: int | None = None


class _Vocabulary(Protocol):
    def token_to_id(self, token: str) -> int | None: ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str: ...

    @property
    def chat_template_source(self) -> str | None: ...


def think_tags(tokenizer: _Vocabulary) -> ThinkTags | None:
    """The model's think tags, or None for a model that does not reason aloud."""
    tags = ThinkTags()
    open_id, close_id = tokenizer.token_to_id(tags.open), tokenizer.token_to_id(tags.close)
    if open_id is not None and close_id is not None:
        return ThinkTags(open_id=open_id, close_id=close_id)
    template = tokenizer.chat_template_source or ""
    return tags if tags.close in template else None


def prompt_opens_thoughts(prompt_tail: str, tags: ThinkTags) -> bool:
    """Whether the prompt ends inside an open think tag (the template opened it)."""
    return prompt_tail.rfind(tags.open) > prompt_tail.rfind(tags.close)


def thought_mode(tokenizer: _Vocabulary, prompt: Sequence[int]
                 ) -> Literal["open", "closed"] | None:
    """For a chat prompt: whether the output starts inside the thoughts ("open") or may
    open them ("closed"); None for a model without thoughts."""
    tags = think_tags(tokenizer)
    if tags is None:
        return None
    return "open" if prompt_opens_thoughts(tokenizer.decode(prompt[-48:]), tags) else "closed"


def _partial(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ThoughtSplitter:
    """Splits streamed text into (thought, answer) pieces; the tags themselves and the
    whitespace between the thoughts and the answer go to neither.

    States: ``start`` (nothing but whitespace yet: the answer may still open a tag),
    ``thought``, ``between`` (after the closing tag, before the answer's first
    non-space character) and ``answer`` (everything passes through). Text that may be the
    start of a tag is held until the next piece tells.
    """

    def __init__(self, tags: ThinkTags, *, inside: bool) -> None:
        self.tags = tags
        self._state = "thought" if inside else "start"
        self._held = ""
        self._thought_started = False

    @property
    def in_thought(self) -> bool:
        return self._state == "thought"

    @property
    def answer_started(self) -> bool:
        return self._state == "answer"

    def feed(self, text: str) -> tuple[str, str]:
        text = self._held + text
        self._held = ""
        thought: list[str] = []
        answer: list[str] = []
        while text:
            if self._state == "start":
                body = text.lstrip()
                if not body:
                    self._held = text
                    return "".join(thought), "".join(answer)
                if body.startswith(self.tags.open):
                    text = body[len(self.tags.open):]
                    self._state = "thought"
                    continue
                if self.tags.open.startswith(body):
                    self._held = text
                    return "".join(thought), "".join(answer)
                self._state = "answer"
            elif self._state == "thought":
                if not self._thought_started:
                    text = text.lstrip()
                    if not text:
                        break
                    self._thought_started = True
                at = text.find(self.tags.close)
                if at < 0:
                    keep = _partial(text, self.tags.close)
                    thought.append(text[:len(text) - keep])
                    self._held = text[len(text) - keep:]
                    break
                thought.append(text[:at])
                text = text[at + len(self.tags.close):]
                self._state = "between"
            elif self._state == "between":
                text = text.lstrip()
                if text:
                    self._state = "answer"
            else:
                answer.append(text)
                break
        return "".join(thought), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """What is held at the end of the generation."""
        held, self._held = self._held, ""
        if self._state == "thought":
            return held, ""
        return "", held if self._state in ("start", "answer") else ""


def split_text(text: str, tags: ThinkTags, *, inside: bool) -> tuple[str, str]:
    """:class:`ThoughtSplitter` over a whole text at once."""
    splitter = ThoughtSplitter(tags, inside=inside)
    thought, answer = splitter.feed(text)
    more_thought, more_answer = splitter.flush()
    return thought + more_thought, answer + more_answer



def describe_reasoning(tokenizer: _Vocabulary) -> dict[str, bool] | None:
    """What a client may show: whether the model reasons aloud and whether its template
    takes ``enable_thinking`` (a think switch); None for a model without thoughts."""
    if think_tags(tokenizer) is None:
        return None
    return {"thoughts": True,
            "switch": "enable_thinking" in (tokenizer.chat_template_source or "")}
