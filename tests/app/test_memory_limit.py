"""The memory slider keeps its word: the user's limit survives a worker restart and a model
switch, is never shown inside a range it is below, the panel names no token count before
the model's context is known, and what kept chats hold can be freed from it."""

from __future__ import annotations

import os
import re
import signal
from typing import Any

import httpx

from app.context import AppContext
from app.paths import AppPaths
from app.views.gauge_bar import MIB, human
from app.views.gauges import GaugesPanel
from tests.app.conftest import SLOW, TINY
from tests.app.test_gauges import Worker, _own_ctx, _panel, workers  # noqa: F401


def _resources(url: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=30) as http:
        body = http.get("/v1/resources").json()
    assert isinstance(body, dict)
    return body


def _ram_limit(url: str) -> int:
    return int(_resources(url)["governor"]["host_ram"]["limit"])


def test_the_limit_is_kept_through_a_model_switch_and_a_worker_restart(qtbot, paths: AppPaths,
                                                                       models_root):
    ctx = AppContext(paths)
    ctx.settings.set_model_roots([str(models_root)])
    with qtbot.waitSignal(ctx.model_changed, timeout=60_000):
        ctx.start_local(str(models_root / SLOW))
    try:
        panel = _panel(qtbot, ctx)
        ram = panel.ram_limit
        qtbot.waitUntil(lambda: ram.slider.isEnabled(), timeout=10_000)
        chosen = ram.slider.minimum() + 300  # MiB
        ram.slider.setValue(chosen)
        qtbot.waitUntil(lambda: ram.outcome.text().startswith("RAM limit set"), timeout=10_000)
        assert _ram_limit(ctx.client.base_url) == chosen * MIB

        # another model: the worker applies the user's limit to it too
        with httpx.Client(base_url=ctx.client.base_url, timeout=120, headers={
                "Authorization": f"Bearer {ctx.client.admin_token}"}) as http:
            loaded = http.post("/v1/models/load", json={"model": TINY})
        assert loaded.status_code == 200, loaded.text
        assert _ram_limit(ctx.client.base_url) == chosen * MIB
        with qtbot.waitSignal(ctx.model_changed, timeout=10_000):
            ctx.refresh_model()

        # the worker dies and comes back: it starts with the user's limit
        assert ctx.worker is not None and ctx.worker.pid is not None
        first = ctx.worker.pid
        with qtbot.waitSignal(ctx.model_changed, timeout=90_000,
                              check_params_cb=lambda card: card is not None):
            os.kill(first, signal.SIGKILL)
        assert ctx.worker.pid != first
        assert _ram_limit(ctx.client.base_url) == chosen * MIB
        assert (ctx.model or {}).get("id", "").endswith(TINY)
        qtbot.waitUntil(lambda: ram.label.text().startswith(
            f"RAM limit: {human(chosen * MIB)} (from"), timeout=15_000)
        assert f"set to {human(chosen * MIB)}" in ram.outcome.text()
    finally:
        ctx.shutdown()


def _shown_limit_and_low(text: str) -> tuple[str, str] | None:
    match = re.match(r"RAM limit: (\S+ \S+) \(from (\S+ \S+) to", text)
    return (match.group(1), match.group(2)) if match else None


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * UNITS[unit]


def _panel_on_its_own_worker(qtbot, paths, running, models_root, app_home
                             ) -> tuple[Worker, GaugesPanel]:
    """A worker of the test's own, and the panel (its RAM slider ready) talking to it."""
    worker = Worker(models_root, app_home)
    running.append(worker)
    panel = _panel(qtbot, _own_ctx(qtbot, paths, worker))
    qtbot.waitUntil(lambda: panel.ram_limit.slider.isEnabled(), timeout=10_000)
    return worker, panel


def test_a_limit_below_the_lowest_is_never_shown_inside_the_range(qtbot, paths, workers,  # noqa: F811
                                                                 models_root, app_home):
    worker, panel = _panel_on_its_own_worker(qtbot, paths, workers, models_root, app_home)
    ram = panel.ram_limit
    seen: list[str] = []
    with httpx.Client(base_url=worker.url, timeout=30,
                      headers={"Authorization": f"Bearer {worker.token}"}) as http:
        assert http.put("/v1/limits", json={"host_ram": str(64 * MIB)}).status_code == 200
    for _ in range(3):  # a few snapshots after the change
        count = panel.feed.events
        qtbot.waitUntil(lambda seen_at=count: panel.feed.events > seen_at, timeout=10_000)
        seen.append(ram.label.text())
    for text in seen:
        shown = _shown_limit_and_low(text)
        assert shown is None or _bytes(shown[0]) >= _bytes(shown[1]), text
    assert seen[-1].startswith(f"RAM limit: {human(64 * MIB)}, below the "), seen[-1]
    assert "move the slider up" in seen[-1]
    floor = ram.floor_label.text()  # what "Lowest" means, in one sentence
    assert floor.count(". ") == 0 and floor.endswith(".")
    assert "kept chats are not counted" in floor


def test_no_token_count_before_the_models_context_is_known(qtbot, paths, live_worker):
    ctx = AppContext(paths)
    url, token = live_worker
    ctx.client.configure(url, None, token)  # the model card is not fetched yet
    try:
        panel = GaugesPanel(ctx)
        qtbot.addWidget(panel)
        qtbot.waitUntil(lambda: panel.feed.events >= 2, timeout=10_000)
        assert ctx.model is None
        assert "held of" in panel.kv.figures.text()
        assert "room for" not in panel.kv.figures.text()
        assert not re.search(r"\d tokens", panel.kv.figures.text())
        with qtbot.waitSignal(ctx.model_changed, timeout=10_000):
            ctx.refresh_model()
        count = panel.feed.events
        qtbot.waitUntil(lambda: panel.feed.events > count, timeout=10_000)
        context = ctx.model["meta"]["context_length"]  # type: ignore[index]
        assert f"{context:,} tokens" in panel.kv.figures.text()
        panel.feed.stop()
    finally:
        ctx.shutdown()


def _keep_chats(url: str, count: int) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        for index in range(count):
            response = http.post("/v1/chat/completions", headers={"X-Session-Id": f"kept-{index}"},
                                 json={"messages": [{"role": "user",
                                                     "content": f"{index} " + "tell me " * 80}],
                                       "max_tokens": 2, "temperature": 0})
            assert response.status_code == 200, response.text


def test_lowest_leaves_kept_chats_out_and_free_frees_them(qtbot, paths, workers,  # noqa: F811
                                                          models_root, app_home):
    worker, panel = _panel_on_its_own_worker(qtbot, paths, workers, models_root, app_home)
    ram = panel.ram_limit
    assert not panel.free_button.isEnabled()  # nothing kept yet

    _keep_chats(worker.url, 6)
    kept = _resources(worker.url)["kv"]
    assert kept["sessions"]["named"] == 6
    held = kept["held_bytes"]

    def settled() -> None:
        count = panel.feed.events
        qtbot.waitUntil(lambda: panel.feed.events > count + 1, timeout=10_000)

    settled()
    used = panel.feed.last["governor"]["host_ram"]["used"]  # type: ignore[index]
    # "Lowest" leaves the kept chats out: the slider goes below what the app holds now,
    # and that is what frees them
    assert ram.slider.minimum() * MIB < used, (ram.slider.minimum(), used, held)
    lowest = ram.slider.minimum()
    assert panel.free_label.text().startswith("Kept: 6 chats")

    qtbot.waitUntil(panel.free_button.isEnabled, timeout=5_000)
    panel.free_button.click()
    qtbot.waitUntil(lambda: panel.free_label.text().startswith("Freed"), timeout=10_000)
    assert "closed 6 kept chats" in panel.free_label.text()
    after = _resources(worker.url)["kv"]
    assert after["sessions"]["named"] == 0
    assert after["held_bytes"] < held / 2
    assert after["prefix_cache"]["pages"] == 0
    freed = re.search(r"Freed (\S+ [KMGT]?i?B)", panel.free_label.text())
    assert freed is not None and _bytes(freed.group(1)) > held / 2
    settled()
    # what was freed left the process too: "Lowest" did not climb by it (without handing
    # the heap back it climbs by ~90% of it; with it, 0-56% were seen, by what else the
    # allocator holds at that moment)
    assert (ram.slider.minimum() - lowest) * MIB < held * 3 / 4, \
        (lowest, ram.slider.minimum(), held)
    now = panel.feed.last["governor"]["host_ram"]["used"]  # type: ignore[index]
    assert now < used - held / 4, (used, now, held)
    with httpx.Client(base_url=worker.url, timeout=120) as http:  # the chats go on
        again = http.post("/v1/chat/completions", headers={"X-Session-Id": "kept-0"},
                          json={"messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 2})
    assert again.status_code == 200, again.text
