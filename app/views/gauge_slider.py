"""The memory-limit slider of one tier (RAM, or VRAM when there is a GPU).

Its range is measured: from what the loaded model needs to answer one request (weights,
runtime and a minimal KV budget: app/memory_words.py, said under the slider) to the tier's
physical size, in MiB steps. Moving it below what is held says, before it is applied,
what will be freed. Moving it sends ``PUT
/v1/limits`` (admin) on release, or ~300 ms after the last move while dragging or typing;
the answer (the engine's ``LimitOutcome``) is written under it in words, errors too, and
the limit is saved in the settings (``limits/host_ram``, ``limits/vram``) and given to the
worker process, so a restarted worker starts with it (the worker itself applies it again to
every model it loads). Snapshots move the slider to the worker's limit unless the user is
at it; a limit below the lowest (what one request needs grew after it was set) is said as
such, never as a value inside the slider's range.
"""

from __future__ import annotations

import math
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QSlider, QVBoxLayout, QWidget

from app.client import ApiFailure, JsonReply, single_shot
from app.context import AppContext
from app.memory_words import Floor, gui_words
from app.views.gauge_bar import MIB, human, label, plural

TIER_WORDS = {"host_ram": "RAM", "vram": "VRAM", "disk": "disk"}
#: The lowest limit offered when the weights are smaller (or not reported yet).
FLOOR_BYTES = 64 * MIB
DEBOUNCE_MS = 300


def _limit_words(text: str) -> str:
    return human(int(text)) if text.isdigit() else text


def describe_outcome(body: dict[str, Any]) -> str:
    """``PUT /v1/limits``'s answer as a sentence: the new limit, what was freed and how,
    and whether the engine is still over it."""
    change = body.get("change") or {}
    tier = TIER_WORDS.get(str(change.get("tier")), str(change.get("tier")))
    limit = change.get("limit_bytes")
    new = human(limit) if isinstance(limit, int) else _limit_words(str(change.get("configured")))
    head = f"{tier} limit set to {new}"
    if change.get("clamped"):
        head += " (clamped to what the system has)"
    if change.get("previous"):
        head += f", was {_limit_words(str(change['previous']))}"
    actions = []
    if body.get("pages_evicted"):
        actions.append(f"evicted {plural(int(body['pages_evicted']), 'cached page')}")
    if body.get("sessions_spilled"):
        actions.append(f"released the KV of {plural(int(body['sessions_spilled']), 'idle chat')}"
                       " (recomputed on its next turn)")
    if body.get("requests_preempted"):
        actions.append(f"preempted {plural(int(body['requests_preempted']), 'request')}")
    freed = int(body.get("bytes_freed") or 0)
    if freed or actions:
        tail = f"freed {human(freed)}" + (f": {', '.join(actions)}" if actions else "")
    else:
        tail = "nothing had to be freed"
    sentence = f"{head}; {tail}."
    note = str(change.get("note") or "")
    if body.get("still_over"):
        sentence += " Still over the limit" + (f" ({note})" if note else "") + \
            ": new answers may be refused until a higher limit is set."
    elif note:
        sentence += f" Note: {note}."
    return sentence


class LimitSlider(QWidget):
    """One tier's limit slider; ``update_from`` feeds it the tier's snapshot."""

    applied = Signal(object)  # the LimitOutcome body
    refused = Signal(object)  # ApiFailure

    def __init__(self, ctx: AppContext, tier: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.tier = tier
        self.setObjectName(f"limit_{tier}")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        self.label = label(f"{TIER_WORDS[tier]} limit: waiting for the worker…",
                           f"limitLabel_{tier}")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName(f"limitSlider_{tier}")
        self.slider.setEnabled(False)
        self.slider.setToolTip(f"The most {TIER_WORDS[tier]} this app may use; lowering it "
                               "frees cached KV at once")
        self.floor_label = label("", f"limitFloor_{tier}")
        self.floor_label.setWordWrap(True)
        self.floor: Floor | None = None
        self.held = 0  # what this app holds on the tier now
        self.held_kv = 0
        self.outcome = label("", f"limitOutcome_{tier}")
        self.outcome.setWordWrap(True)
        self.label.setWordWrap(True)
        self.outcome.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        for widget in (self.label, self.slider, self.floor_label, self.outcome):
            layout.addWidget(widget)
        self._syncing = False
        self._reply: JsonReply | None = None
        self._sent: int | None = None  # MiB of the request in flight
        self._debounce = single_shot(DEBOUNCE_MS, self)
        self._debounce.timeout.connect(self.send)
        self.slider.valueChanged.connect(self._on_value)
        self.slider.sliderReleased.connect(self.send)

    # --- from the worker ------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """The user is at it (dragging, a change waiting or in flight)."""
        return self.slider.isSliderDown() or self._debounce.isActive() or \
            self._reply is not None

    def update_from(self, snap: dict[str, Any], floor: Floor | int) -> None:
        """The tier's snapshot (``TierSnapshot``) and what one request needs."""
        if isinstance(floor, int):
            floor = Floor(floor, 0, 0, 0)
        floor_bytes = floor.total
        self.held = int(snap.get("used") or 0)
        self.held_kv = int(snap.get("kv_bytes") or 0)
        capacity, limit = snap.get("capacity"), snap.get("limit")
        if not isinstance(capacity, int) or capacity <= 0:
            self.slider.setEnabled(False)
            self.label.setText(f"{TIER_WORDS[self.tier]} limit: "
                               f"{human(limit) if isinstance(limit, int) else 'unknown'} "
                               "(the memory's size is unknown, so it cannot be set here)")
            return
        if self.busy:
            return
        self._sent = None
        low = min(math.ceil(max(floor_bytes, FLOOR_BYTES) / MIB), capacity // MIB)
        high = capacity // MIB
        self._syncing = True
        try:
            self.slider.setRange(low, high)
            self.slider.setPageStep(max(1, (high - low) // 20))
            if isinstance(limit, int):
                self.slider.setValue(max(low, min(high, round(limit / MIB))))
        finally:
            self._syncing = False
        self.slider.setEnabled(True)
        self.floor = floor
        self._show_label(limit if isinstance(limit, int) else None)
        self._show_floor()

    def _show_floor(self) -> None:
        floor = self.floor
        if floor is None:
            return
        parts = [f"weights {human(floor.weights)}", f"runtime {human(floor.runtime)}"]
        if floor.kv:
            parts.append(f"{human(floor.kv)} for a {floor.kv_tokens:,}-token request")
        if floor.working:
            parts.append(f"{human(floor.working)} working memory")
        self.floor_label.setText(
            f"Lowest: {human(self.slider.minimum() * MIB)}, what this model needs to answer "
            f"one request ({', '.join(parts)}); kept chats are not counted, a lower limit "
            "frees them.")

    def _show_label(self, limit: int | None) -> None:
        words = TIER_WORDS[self.tier]
        low, high = self.slider.minimum() * MIB, self.slider.maximum() * MIB
        if limit is not None and limit < low:
            self.label.setText(f"{words} limit: {human(limit)}, below the {human(low)} this "
                               "model needs to answer a request: move the slider up")
            return
        shown = human(limit) if limit is not None else human(self.slider.value() * MIB)
        self.label.setText(f"{words} limit: {shown} (from {human(low)} to {human(high)})")

    # --- from the user --------------------------------------------------------------------

    def _on_value(self, value: int) -> None:
        if self._syncing:
            return
        self._show_label(value * MIB)
        self.outcome.setText(self.preview(value * MIB))
        self._debounce.start()

    def preview(self, nbytes: int) -> str:
        """What setting the limit to ``nbytes`` will do, said before it is applied."""
        words = TIER_WORDS[self.tier]
        over = self.held - nbytes
        if over <= 0:
            return f"{words} limit {human(nbytes)}: above what this app holds now " \
                f"({human(self.held)}); nothing will be freed."
        freed = min(over, self.held_kv)
        text = (f"{words} limit {human(nbytes)}: below the {human(self.held)} this app holds; "
                f"about {human(freed)} of cached chat memory (KV) will be freed, recomputed "
                "when a chat needs it again.")
        if over > self.held_kv:
            text += (" Answers in progress keep their memory until they end; new ones may "
                     "be refused until it is raised.")
        return text

    def send(self) -> None:
        """``PUT /v1/limits`` with the slider's value (once the one in flight is back)."""
        self._debounce.stop()
        value = self.slider.value()
        if self._reply is not None or value == self._sent:
            return
        nbytes = value * MIB
        self._sent = value
        self.outcome.setText(f"Setting the {TIER_WORDS[self.tier]} limit to {human(nbytes)}…")
        reply = self.ctx.client.call("PUT", "/v1/limits", {self.tier: str(nbytes)}, admin=True)
        reply.finished.connect(self._on_applied)  # bound: dropped if this slider goes
        reply.failed.connect(self._on_refused)
        self._reply = reply

    def _on_applied(self, body: Any) -> None:
        self._reply = None
        nbytes = (self._sent or 0) * MIB
        body = body if isinstance(body, dict) else {}
        self.outcome.setText(gui_words(describe_outcome(body)))
        self.ctx.remember_limit(self.tier, str(nbytes))
        self.applied.emit(body)
        self._again()

    def _on_refused(self, failure: ApiFailure) -> None:
        self._reply = None
        self._sent = None
        words = TIER_WORDS[self.tier]
        if failure.status == 409:
            text = (f"The worker cannot change the {words} limit while it runs: "
                    f"{gui_words(failure.text())}")
        elif failure.unreachable:
            text = f"The {words} limit was not changed: {failure.message}."
        else:
            text = f"The {words} limit was not changed: {failure.text()}"
        self.outcome.setText(text)
        self.refused.emit(failure)

    def _again(self) -> None:
        if not self.slider.isSliderDown() and self.slider.value() != self._sent:
            self.send()  # the user moved on while the last change was in flight
