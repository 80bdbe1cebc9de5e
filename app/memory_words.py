"""Memory figures and messages in the words of the app's controls.

- :func:`request_floor`: the lowest memory limit at which the loaded model can still answer
  one request once kept chats are freed: its weights, the runtime (what the worker holds
  beyond the weights and the KV: measured, else the engine's estimate), a minimal KV budget
  (one request of up to ``MIN_KV_TOKENS`` tokens, or the whole context when that is
  shorter) and working memory for that request (1/32 of the rest, at least
  ``WORKING_BYTES``). Kept chats' KV is not part of it: a limit below what they hold frees
  them.
- :func:`capacity_words`: how many tokens the KV budget holds, never more than the model's
  context for one conversation; nothing before the context is known.
- :func:`gui_words`: an engine message with its command-line flags replaced by the control
  that sets the same thing (the engine's messages are written for its command line).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20
MIN_KV_TOKENS = 1024
WORKING_BYTES = 8 * MIB

#: The engine's flags, as the app's user sets them.
CONTROLS = {
    "--host-ram-limit": "the RAM limit (the slider in the Resources panel, View → Resources "
                        "panel)",
    "--vram-limit": "the VRAM limit (the slider in the Resources panel)",
    "--disk-limit": "the disk limit",
}
_FLAG = re.compile(r"--[a-z][a-z0-9-]+")
_AT_LEAST = re.compile(r"at least ([\d.]+ ?[KMGT]?i?B)")


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class Floor:
    weights: int
    runtime: int  # the rest of what the worker holds (runtime, KV it keeps)
    kv: int  # one request's KV
    kv_tokens: int
    working: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.runtime + self.kv + self.working

    @property
    def mib(self) -> int:
        return math.ceil(self.total / MIB)


def request_floor(tier: dict[str, Any], budget: dict[str, Any] | None,
                  context_length: int | None) -> Floor:
    """What one request needs on ``tier`` (a ``TierSnapshot``); ``budget`` (the governor's
    KV budget) gives the page size when it is this tier's."""
    weights, kv_held = _int(tier.get("weights_bytes")), _int(tier.get("kv_bytes"))
    measured = max(0, _int(tier.get("used")) - weights - kv_held)
    runtime = max(_int(tier.get("overhead_bytes")), measured)
    budget = budget or {}
    page, per_page = _int(budget.get("page_bytes")), _int(budget.get("tokens_per_page"))
    tokens = min(context_length or MIN_KV_TOKENS, MIN_KV_TOKENS)
    kv = math.ceil(tokens / per_page) * page if page and per_page else 0
    working = max(WORKING_BYTES, (weights + runtime) // 32)
    return Floor(weights, runtime, kv, tokens if kv else 0, working)


def capacity_words(kv_tokens: Any, context_length: int | None) -> str:
    """The KV budget's room in tokens, for people: capped by the model's context."""
    if not isinstance(kv_tokens, int) or not context_length:
        return ""  # a count the model's context does not bound would mislead
    if context_length and kv_tokens >= context_length:
        chats = kv_tokens // context_length
        more = "" if chats < 2 else (f"; about {chats:,} such conversations could be kept "
                                     "at once")
        return (f"room for a conversation at the model's full context "
                f"({context_length:,} tokens){more}")
    return f"room for {kv_tokens:,} of the model's {context_length:,} tokens of context"


def gui_words(text: str) -> str:
    """``text`` with the engine's command-line flags named as the app's controls."""
    def control(match: re.Match[str]) -> str:
        return CONTROLS.get(match.group(0), "the matching setting")
    return _FLAG.sub(control, text)


def refusal_words(message: str) -> str:
    """An answer refused for memory (``resource_limit``), as the transcript says it."""
    need = _AT_LEAST.search(message)
    tier = "VRAM" if "VRAM" in message or "vram" in message else "RAM"
    where = ("the Resources panel's VRAM limit slider" if tier == "VRAM" else
             "the Resources panel's RAM limit slider (View → Resources panel)")
    amount = re.sub(r"(\d)([KMGT]?i?B)$", r"\1 \2", need.group(1)) if need else ""
    target = f" to at least {amount}" if need else ""
    return (f"Not answered: the {tier} limit is too low for this request. Move {where} "
            f"up{target}, or close other chats and send again.")
