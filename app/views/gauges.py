"""The resources panel (the window's right-hand side): where the model runs, VRAM / RAM / KV
gauges (used / limit / headroom; this app's weights, KV and runtime vs other programs), the
last answer's tokens/s and time to first token, the memory-limit sliders and a live chart.

Everything comes from ``/v1/resources/stream`` through :class:`ResourcesFeed`, about once a
second; the provider comes from the model card (``meta.provider``).
"""

from __future__ import annotations

import html
import time
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.client import ApiFailure
from app.context import AppContext
from app.memory_words import capacity_words, gui_words, request_floor
from app.resources_feed import ResourcesFeed
from app.views.gauge_bar import Gauge, Segment, human, label, plural
from app.views.gauge_chart import LiveChart
from app.views.gauge_slider import LimitSlider

PROVIDER_WORDS = {"cpu": "CPU", "cuda": "CUDA (NVIDIA GPU)", "directml": "DirectML (GPU)",
                  "dml": "DirectML (GPU)"}


def provider_words(card: dict[str, Any] | None) -> str:
    """Where the model runs, plainly: "CPU", "CUDA (NVIDIA GPU)", "DirectML (GPU)"."""
    provider = str(((card or {}).get("meta") or {}).get("provider") or "")
    return PROVIDER_WORDS.get(provider.lower(), provider or "unknown")


def memory_segments(tier: dict[str, Any]) -> list[Segment]:
    """This app's weights, KV and the rest of it (runtime), then other programs."""
    used, weights, kv = (int(tier.get(k) or 0) for k in ("used", "weights_bytes", "kv_bytes"))
    return [Segment("weights", weights, "weights"), Segment("KV", kv, "kv"),
            Segment("runtime", max(0, used - weights - kv), "app"),
            Segment("other programs", int(tier.get("others_used") or 0), "others")]


def _heading(text: str, name: str) -> QLabel:
    return label(f"<b>{html.escape(text)}</b>", name)


class GaugesPanel(QWidget):
    """The right-hand panel; ``feed`` is its :class:`ResourcesFeed`."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.setObjectName("gaugesPanel")
        self.last: dict[str, Any] | None = None
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        # the panel's width is the dock's: texts wrap, nothing hides behind a side scroll
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        outer.addWidget(scroll)
        body = QWidget()
        scroll.setWidget(body)
        layout = QVBoxLayout(body)
        layout.setContentsMargins(8, 8, 8, 8)
        self.provider = label("Runs on: …", "providerLabel")
        self.provider.setWordWrap(True)
        self.state = label("Waiting for the worker…", "resourcesState")
        self.state.setWordWrap(True)
        self.vram = Gauge("VRAM", "vram")
        self.ram = Gauge("RAM", "ram")
        self.kv = Gauge("KV cache (device / RAM / disk)", "kv")
        self.throughput = label("Last answer: none yet", "throughputLabel")
        self.throughput.setWordWrap(True)
        # what kept chats and the prefix cache hold, freed on request (POST /v1/kv/free)
        self.free_button = QPushButton("Free")
        self.free_button.setObjectName("freeKvButton")
        self.free_button.setToolTip("Free the memory kept chats and the prompt cache hold; "
                                    "a chat's next answer recomputes its context")
        self.free_button.setEnabled(False)
        self.free_button.clicked.connect(self.free_kept)
        self.free_label = label("", "freeKvLabel")
        self.free_label.setWordWrap(True)
        free_row = QWidget()
        row = QHBoxLayout(free_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.free_label, 1)
        row.addWidget(self.free_button)
        self._freeing = False
        self.ram_limit = LimitSlider(ctx, "host_ram")
        self.vram_limit = LimitSlider(ctx, "vram")
        self.vram_limit.setVisible(False)
        self.chart = LiveChart()
        for widget in (self.provider, self.state, self.vram, self.ram, self.kv, free_row,
                       self.throughput, _heading("Memory limits", "limitsHeading"),
                       self.ram_limit, self.vram_limit,
                       _heading("Last minutes", "chartHeading"), self.chart):
            layout.addWidget(widget)
        layout.addStretch(1)
        self.feed = ResourcesFeed(ctx, self, window_s=self.chart.window_s)
        self.feed.snapshot.connect(self.show_snapshot)
        self.feed.problem.connect(self._on_problem)
        self.feed.state_changed.connect(self._on_feed_state)
        ctx.model_changed.connect(self._show_provider)
        self._show_provider(ctx.model)

    # --- slots ----------------------------------------------------------------------------

    def _show_provider(self, card: Any) -> None:
        card = card if isinstance(card, dict) else None
        if card is None:
            self.provider.setText("Runs on: no model loaded")
            return
        where = "the remote server" if self.ctx.remote else provider_words(card)
        self.provider.setText(f"Runs on: {where} · {card.get('id', '')}")

    def _on_feed_state(self, state: str) -> None:
        if state in ("down", "retrying", "unsupported"):  # the next snapshot enables them
            self.ram_limit.slider.setEnabled(False)
            self.vram_limit.slider.setEnabled(False)
        if state == "unsupported":  # a server without figures: nothing old is left shown
            for gauge in (self.vram, self.ram, self.kv):
                gauge.show_message("not reported", "Not reported by this server.")
            for slider in (self.ram_limit, self.vram_limit):
                slider.slider.hide()
                slider.floor_label.setText("")
                slider.outcome.setText("")
                slider.label.setText(f"{slider.label.text().split(':')[0]}: not reported "
                                     "by this server")
            self.throughput.setText("Last answer: speed not reported by this server.")
            self.chart.show_history([], time.monotonic())
        elif state == "live":
            self.ram_limit.slider.show()
            self.vram_limit.slider.show()

    def _on_problem(self, text: str) -> None:
        self.state.setText(text)
        self.state.setVisible(True)

    def show_snapshot(self, body: Any) -> None:
        """One ``/v1/resources`` body: every gauge, the sliders and the chart."""
        if not isinstance(body, dict):
            return
        self.last = body
        gov, kv = body.get("governor"), body.get("kv")
        if not isinstance(gov, dict):
            why = f"no model loaded (worker {body.get('state', 'unknown')})"
            for gauge in (self.vram, self.ram, self.kv):
                gauge.show_message("no model", why)
            self.state.setText(f"Nothing to measure: {why}.")
            self.state.setVisible(True)
        else:
            self.state.setText("" if body.get("fresh", True) else
                               "Figures as last reported (the engine is busy).")
            self.state.setVisible(not body.get("fresh", True))
            self._show_vram(gov)
            self._show_ram(gov)
            self._show_kv(gov, kv if isinstance(kv, dict) else {})
            self._update_sliders(gov)
        self._show_throughput(body.get("throughput"))
        self.chart.show_history(self.feed.history, time.monotonic())

    # --- the gauges -----------------------------------------------------------------------

    def _show_tier(self, gauge: Gauge, tier: dict[str, Any]) -> None:
        used, limit, headroom = tier.get("used"), tier.get("limit"), tier.get("headroom")
        capacity = tier.get("capacity")
        figures = (f"{human(used)} used / {human(limit)} limit / {human(headroom)} headroom"
                   f"\nother programs {human(tier.get('others_used'))} · "
                   f"{human(capacity)} in all")
        if tier.get("note"):
            figures += f"\n{gui_words(str(tier['note']))}"
        details = [f"used by this app: {human(used)}", f"limit: {human(limit)} "
                   f"(configured: {tier.get('configured')})", f"headroom: {human(headroom)}",
                   f"free on the system: {human(tier.get('available'))}",
                   f"overhead: {human(tier.get('overhead_bytes'))}"]
        gauge.show_figures(memory_segments(tier), int(capacity or 0),
                           limit if isinstance(limit, int) else None,
                           headroom if isinstance(headroom, int) else None, figures, details)

    def _show_vram(self, gov: dict[str, Any]) -> None:
        vram = gov.get("vram") or {}
        if vram.get("capacity") is None and not vram.get("used"):
            on_cpu = provider_words(self.ctx.model) == "CPU"
            why = ("The model runs on the CPU; no GPU memory is in use." if on_cpu else
                   "No GPU memory could be measured.")
            self.vram.show_message("no GPU", why)
            self.vram.setToolTip(str(vram.get("note") or why))
            return
        self._show_tier(self.vram, vram)

    def _show_ram(self, gov: dict[str, Any]) -> None:
        self._show_tier(self.ram, gov.get("host_ram") or {})

    def _show_kv(self, gov: dict[str, Any], kv: dict[str, Any]) -> None:
        b = gov.get("breakdown") or {}
        store = kv.get("store") or {}
        device = int(b.get("kv_vram_bytes") or 0)
        host = int(b.get("kv_host_ram_bytes") or 0) + int(store.get("ram_bytes") or 0)
        disk = int(b.get("kv_disk_bytes") or 0) + int(store.get("disk_bytes") or 0)
        budget = gov.get("budget") or {}
        room = budget.get("kv_bytes")
        live = device if gov.get("kv_tier") == "vram" else int(b.get("kv_host_ram_bytes") or 0)
        headroom = max(0, room - live) if isinstance(room, int) else None
        tokens = budget.get("kv_tokens")
        figures = f"{human(device + host + disk)} held of {human(room)}"
        words = capacity_words(tokens, self._context_length())
        if words:
            figures += f"\n{words}"
        pool, cache = kv.get("pool") or {}, kv.get("prefix_cache") or {}
        sessions = kv.get("sessions") or {}
        per_token = kv.get("bytes_per_token")
        of = f": {kv.get('dtype')} KV, {human(per_token)} a token" \
            if kv.get("dtype") and isinstance(per_token, int) else ""
        details = [f"pages: {pool.get('pages', 0)} of {pool.get('max_pages', '?')} "
                   f"({human(kv.get('page_bytes'))} each{of})",
                   f"prefix cache: {cache.get('pages', 0)} pages, {cache.get('hits', 0)} hits "
                   f"of {cache.get('lookups', 0)} lookups",
                   f"chats with kept KV: {sessions.get('named', 0)}"]
        if store:
            details.append(f"spilled to RAM: {human(store.get('ram_bytes'))} of "
                           f"{human(store.get('ram_cap_bytes'))}; to disk: "
                           f"{human(store.get('disk_bytes'))} of "
                           f"{human(store.get('disk_cap_bytes'))}")
        segments = [Segment("device", device, "device"), Segment("RAM", host, "host"),
                    Segment("disk", disk, "disk")]
        self.kv.show_figures(segments, int(room or 0), room if isinstance(room, int) else None,
                             headroom, figures, details)
        self._show_kept(int(sessions.get("named") or 0), int(cache.get("pages") or 0),
                        device + host)

    # --- freeing what kept chats hold -------------------------------------------------------

    def _show_kept(self, chats: int, pages: int, held: int) -> None:
        self.free_button.setEnabled(not self._freeing and not self.ctx.remote
                                    and (chats > 0 or pages > 0))
        if self._freeing:
            return
        if chats or pages:
            self.free_label.setText(f"Kept: {plural(chats, 'chat')} and "
                                    f"{plural(pages, 'cached page')}, {human(held)} of KV.")
        elif not self.free_label.text().startswith("Freed"):
            self.free_label.setText("Nothing kept to free.")

    def free_kept(self) -> None:
        """``POST /v1/kv/free``: close kept chats, drop the prompt cache."""
        self._freeing = True
        self.free_button.setEnabled(False)
        self.free_label.setText("Freeing…")
        reply = self.ctx.client.call("POST", "/v1/kv/free", {}, admin=True)
        reply.finished.connect(self._on_freed)
        reply.failed.connect(self._on_free_failed)

    def _on_freed(self, body: Any) -> None:
        self._freeing = False
        body = body if isinstance(body, dict) else {}
        self.free_label.setText(
            f"Freed {human(int(body.get('bytes_freed') or 0))}: closed "
            f"{plural(int(body.get('sessions_closed') or 0), 'kept chat')}, dropped "
            f"{plural(int(body.get('pages_evicted') or 0), 'cached page')}; a chat's next "
            "answer recomputes its context.")

    def _on_free_failed(self, failure: ApiFailure) -> None:
        self._freeing = False
        self.free_button.setEnabled(True)
        self.free_label.setText(f"Nothing was freed: {failure.text()}")

    def _show_throughput(self, throughput: Any) -> None:
        last = (throughput or {}).get("last") if isinstance(throughput, dict) else None
        if not isinstance(last, dict):
            self.throughput.setText("Last answer: none yet")
            return
        self.throughput.setText(
            f"Last answer: {last.get('tokens_per_s', 0):.1f} tokens/s · first token after "
            f"{last.get('ttft_ms', 0):.0f} ms · {last.get('completion_tokens', 0)} tokens")

    def _update_sliders(self, gov: dict[str, Any]) -> None:
        ram, vram = gov.get("host_ram") or {}, gov.get("vram") or {}
        budget = gov.get("budget") or {}
        context = self._context_length()
        self.ram_limit.update_from(ram, request_floor(
            ram, budget if gov.get("kv_tier") == "host_ram" else None, context))
        has_gpu = isinstance(vram.get("capacity"), int)
        self.vram_limit.setVisible(has_gpu)
        if has_gpu:
            self.vram_limit.update_from(vram, request_floor(
                vram, budget if gov.get("kv_tier") == "vram" else None, context))

    def _context_length(self) -> int | None:
        value = ((self.ctx.model or {}).get("meta") or {}).get("context_length")
        return value if isinstance(value, int) and value > 0 else None
