"""The resources panel against real workers: live figures, the chart, the RAM limit slider
and the feed surviving a worker restart."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.context import AppContext
from app.paths import AppPaths
from app.resources_feed import ResourcesFeed, Sample
from app.views.gauge_bar import MIB, human
from app.views.gauge_chart import LiveChart
from app.views.gauge_slider import describe_outcome
from app.views.gauges import GaugesPanel
from tests.app.conftest import SLOW, start_worker

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def _get(url: str, path: str) -> Any:
    with httpx.Client(base_url=url, timeout=30) as http:
        return http.get(path).json()


class Worker:
    """A worker of this test's own (``start_worker``), stopped at the end."""

    def __init__(self, models_root: Path, home: Path, extra: list[str] | None = None) -> None:
        self.proc, ready = start_worker(models_root / SLOW, [models_root], home, extra)
        self.url: str = ready["url"]
        self.port: int = ready["port"]
        self.token: str = ready["admin_token"]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


def _own_ctx(qtbot, paths: AppPaths, worker: Worker) -> AppContext:
    ctx = AppContext(paths)
    ctx.client.configure(worker.url, None, worker.token)
    with qtbot.waitSignal(ctx.model_changed, timeout=10_000):
        ctx.refresh_model()
    return ctx


def _panel(qtbot, ctx: AppContext) -> GaugesPanel:
    panel = GaugesPanel(ctx)
    qtbot.addWidget(panel)
    panel.resize(360, 900)
    panel.show()
    return panel


def test_panel_shows_the_workers_ram_figures_and_says_it_runs_on_the_cpu(qtbot, ctx):
    panel = _panel(qtbot, ctx)
    qtbot.waitUntil(lambda: panel.feed.events >= 1, timeout=10_000)
    truth = _get(ctx.client.base_url, "/v1/resources")["governor"]["host_ram"]
    seen = panel.feed.events
    qtbot.waitUntil(lambda: panel.feed.events > seen, timeout=5_000)  # one refresh later
    shown = re.match(r"(\S+ \S+) used / (\S+ \S+) limit / (\S+ \S+) headroom",
                     panel.ram.figures.text())
    assert shown is not None, panel.ram.figures.text()
    assert shown.group(2) == human(truth["limit"])
    assert abs(_bytes(shown.group(1)) - truth["used"]) < 0.02 * truth["used"] + 4 * MIB
    assert abs(_bytes(shown.group(3)) - truth["headroom"]) < 0.02 * truth["headroom"] + 4 * MIB
    legend = panel.ram.legend.text()
    assert "weights&nbsp;" in legend and "other&nbsp;programs&nbsp;" in legend  # no break
    assert f"{truth['weights_bytes']:,} bytes" in panel.ram.toolTip()
    assert "Runs on: CPU" in panel.provider.text()
    assert panel.vram.bar.message == "no GPU" and "CPU" in panel.vram.figures.text()
    assert not panel.vram_limit.isVisible()  # no GPU: no VRAM slider
    assert "held of" in panel.kv.figures.text()


def test_chart_gets_points_over_time_and_the_last_answer_speed_shows(qtbot, ctx):
    panel = _panel(qtbot, ctx)
    qtbot.waitUntil(lambda: panel.chart.ram.count() >= 1, timeout=10_000)
    stream = ctx.client.chat([{"role": "user", "content": "count to ten"}],
                             {"max_tokens": 16, "temperature": 0})
    with qtbot.waitSignal(stream.finished, timeout=30_000):
        pass
    qtbot.waitUntil(lambda: panel.chart.ram.count() >= 3 and panel.chart.tps.count() >= 1,
                    timeout=10_000)
    xs = [p.x() for p in panel.chart.ram.points()]
    assert xs == sorted(xs) and xs[-1] <= 0 and xs[0] < xs[-1]  # seconds ago, in order
    # a few seconds of history fill a 30 s axis, not the right edge of three minutes
    assert panel.chart.x_axis.min() == -30 and panel.chart.x_axis.max() == 0
    assert xs[0] >= -30
    assert all(p.y() > 0 for p in panel.chart.ram.points())  # RAM in use is never zero
    assert panel.feed.last is not None
    last = panel.feed.last["throughput"]["last"]
    assert last["tokens_per_s"] > 0 and panel.chart.tps.points()[-1].y() == pytest.approx(
        last["tokens_per_s"])
    text = panel.throughput.text()
    assert f"{last['tokens_per_s']:.1f} tokens/s" in text and "first token after" in text


def test_the_ram_slider_starts_at_what_one_request_needs_and_is_saved(qtbot, paths, workers,
                                                                    models_root, app_home):
    worker = Worker(models_root, app_home)
    workers.append(worker)
    with httpx.Client(base_url=worker.url, timeout=60) as http:  # fill the prefix cache
        for prompt in ("def f(x):\n" * 60, "import os\n" * 60):
            assert http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2}
                             ).status_code == 200
    ctx = _own_ctx(qtbot, paths, worker)
    panel = _panel(qtbot, ctx)
    ram = panel.ram_limit
    qtbot.waitUntil(lambda: ram.slider.isEnabled(), timeout=10_000)
    before = _get(worker.url, "/v1/resources")["governor"]["host_ram"]
    assert ram.slider.maximum() == before["capacity"] // MIB  # the machine's RAM
    # the lower end: what the model needs to answer one request, more than the weights
    assert ram.slider.minimum() * MIB > before["weights_bytes"]
    assert ram.slider.minimum() * MIB >= before["used"]
    low = ram.slider.minimum()
    floor_text = ram.floor_label.text()
    assert floor_text.startswith(f"Lowest: {human(low * MIB)}, what this model needs to "
                                 "answer one request") and "1,024-token request" in floor_text

    ram.slider.setValue(low)  # the debounced path: no release, ~300 ms later
    # said before it is applied: what will be freed (nothing: the floor is above the use)
    assert ram.outcome.text().startswith(f"RAM limit {human(low * MIB)}: ")
    assert "nothing will be freed" in ram.outcome.text()
    qtbot.waitUntil(lambda: ram.outcome.text().startswith("RAM limit set"), timeout=10_000)
    text = ram.outcome.text()
    assert human(low * MIB) in text and "was auto" in text
    assert "--" not in text
    assert _get(worker.url, "/v1/resources")["governor"]["host_ram"]["limit"] == low * MIB
    assert ctx.settings.host_ram_limit == str(low * MIB)  # the next worker starts with it
    qtbot.waitUntil(lambda: human(low * MIB) + " limit" in panel.ram.figures.text(),
                    timeout=5_000)
    with httpx.Client(base_url=worker.url, timeout=60) as http:  # and it still answers
        answer = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi " * 300}], "max_tokens": 8})
    assert answer.status_code == 200, answer.text

    high = ram.slider.maximum()  # back up, by dragging and releasing
    ram.slider.setSliderDown(True)
    ram.slider.setValue(high)
    ram.slider.setSliderDown(False)  # sliderReleased: sent at once
    qtbot.waitUntil(lambda: ram.outcome.text().startswith(f"RAM limit set to {human(high * MIB)}"),
                    timeout=10_000)
    assert "nothing had to be freed" in ram.outcome.text()
    assert _get(worker.url, "/v1/resources")["governor"]["host_ram"]["limit"] == high * MIB
    assert ctx.settings.host_ram_limit == str(high * MIB)


def test_a_refused_limit_change_is_shown_in_words(qtbot, paths, workers, models_root,
                                                  app_home):
    worker = Worker(models_root, app_home)
    workers.append(worker)
    ctx = _own_ctx(qtbot, paths, worker)
    panel = _panel(qtbot, ctx)
    ram = panel.ram_limit
    qtbot.waitUntil(lambda: ram.slider.isEnabled(), timeout=10_000)
    ctx.client.configure(worker.url, None, "not-the-admin-token")
    ram.slider.setValue(ram.slider.minimum())
    qtbot.waitUntil(lambda: "not changed" in ram.outcome.text(), timeout=10_000)
    assert "Traceback" not in ram.outcome.text()
    assert ctx.settings.host_ram_limit == "auto"  # nothing saved


def test_outcome_sentences_say_what_was_done():
    change = {"tier": "host_ram", "previous": "8GiB", "configured": "2GiB",
              "limit_bytes": 2 << 30, "clamped": False, "used_bytes": 3 << 30,
              "excess_bytes": 1 << 30, "note": "weights and overhead alone exceed it"}
    text = describe_outcome({"change": change, "bytes_freed": 1288490189, "pages_evicted": 310,
                             "sessions_spilled": 2, "requests_preempted": 0,
                             "still_over": True})
    assert text.startswith("RAM limit set to 2.00 GiB, was 8GiB; freed 1.20 GiB: evicted 310 "
                           "cached pages, released the KV of 2 idle chats")
    assert "Still over the limit (weights and overhead alone exceed it)" in text


def test_the_feed_comes_back_after_the_worker_restarts(qtbot, paths, workers, models_root,
                                                       app_home):
    first = Worker(models_root, app_home)
    workers.append(first)
    ctx = AppContext(paths)
    ctx.client.configure(first.url, None, first.token)
    feed = ResourcesFeed(ctx, interval_s=0.2)
    qtbot.waitUntil(lambda: feed.state == "live", timeout=10_000)

    first.kill()  # the app notices (ctx.down), a new worker starts on another port
    ctx.down.emit("The worker was killed.")
    assert feed.state == "down"
    second = Worker(models_root, app_home)
    workers.append(second)
    count = feed.events
    qtbot.wait(300)
    assert feed.events == count  # down: no retrying until the worker is ready again
    ctx.client.configure(second.url, None, second.token)
    ctx.ready.emit()
    qtbot.waitUntil(lambda: feed.events > count and feed.state == "live", timeout=10_000)

    second.kill()  # a dropped stream without ctx.down: back-off, then the same address again
    qtbot.waitUntil(lambda: feed.state == "retrying", timeout=10_000)
    workers.append(Worker(models_root, app_home, ["--port", str(second.port)]))
    count = feed.events
    qtbot.waitUntil(lambda: feed.events > count and feed.state == "live", timeout=20_000)
    assert feed.last is not None and feed.last["model"] == "qwen-coder-slow-coder"
    feed.stop()


def test_the_chart_axis_grows_with_the_history_up_to_its_window(qtbot):
    chart = LiveChart(window_s=180.0)
    qtbot.addWidget(chart)

    def history(seconds: float) -> list[Sample]:
        return [Sample(t=1000.0 - seconds + i, ram_used=(100 + i) * MIB, vram_used=None,
                       kv_bytes=MIB, tokens_per_s=None, ttft_ms=None)
                for i in range(int(seconds) + 1)]

    for seconds, low in ((5, -30), (31, -60), (100, -120), (400, -180)):
        chart.show_history(history(seconds), now=1000.0)
        assert (chart.x_axis.min(), chart.x_axis.max()) == (low, 0), seconds
        shown = [p.x() for p in chart.ram.points()]
        assert shown[0] >= max(low, -seconds) and shown[-1] == 0  # older points dropped


def test_kv_capacity_is_capped_by_the_models_context_in_words(qtbot, ctx):
    panel = _panel(qtbot, ctx)
    qtbot.waitUntil(lambda: panel.last is not None and "governor" in panel.last,
                    timeout=10_000)
    text = panel.kv.figures.text()
    assert "room for a conversation at the model's full context (1,024 tokens)" in text
    assert panel.last is not None
    tokens = panel.last["governor"]["budget"]["kv_tokens"]
    assert f"{tokens:,} tokens" not in text  # never the pool's millions of tokens


def test_an_answer_refused_for_memory_says_which_control_to_move(qtbot, paths, workers,
                                                                 models_root, app_home):
    from app.store import ChatStore
    from app.views.chat_view import ChatView

    worker = Worker(models_root, app_home)
    workers.append(worker)
    with httpx.Client(base_url=worker.url, timeout=30) as http:  # as a saved low limit
        assert http.put("/v1/limits", json={"host_ram": str(64 * MIB)},
                        headers={"Authorization": f"Bearer {worker.token}"}).status_code == 200
    ctx = _own_ctx(qtbot, paths, worker)
    ctx.store = ChatStore(paths.chats_db)
    view = ChatView(ctx)
    qtbot.addWidget(view)
    view.show()
    with qtbot.waitSignal(view.answer_finished, timeout=60_000) as done:
        view.send("hello")
    message = done.args[0]
    assert message.state == "failed"
    widget = view.message_widgets()[-1]
    shown = widget.info.text()
    assert shown.startswith("Not answered: the RAM limit is too low for this request. Move "
                            "the Resources panel's RAM limit slider")
    assert re.search(r"up to at least [\d.]+ ?MiB", shown), shown
    assert "--" not in shown and widget.info.isEnabled()  # not the faint grey of small print
    ctx.store.close()


def test_a_lost_feed_is_said_in_one_sentence_without_doubled_brackets(qtbot, paths):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = AppContext(paths)
    ctx.client.configure(f"http://127.0.0.1:{port}", None)
    feed = ResourcesFeed(ctx, interval_s=0.2)
    with qtbot.waitSignal(feed.problem, timeout=10_000) as said:
        pass
    text = said.args[0]
    assert text.startswith("Lost the worker's figures: the worker did not answer")
    assert "))" not in text and ");" not in text and "Trying again in" in text
    feed.stop()


def test_the_preview_says_what_a_lower_limit_will_free_before_it_is_applied(qtbot, ctx):
    panel = _panel(qtbot, ctx)
    ram = panel.ram_limit
    ram.held, ram.held_kv = 300 * MIB, 40 * MIB
    assert ram.preview(320 * MIB) == ("RAM limit 320 MiB: above what this app holds now "
                                      "(300 MiB); nothing will be freed.")
    text = ram.preview(280 * MIB)
    assert text.startswith("RAM limit 280 MiB: below the 300 MiB this app holds; about "
                           "20.0 MiB of cached chat memory (KV) will be freed")
    assert "may be refused" in ram.preview(200 * MIB)  # more than the cached KV
