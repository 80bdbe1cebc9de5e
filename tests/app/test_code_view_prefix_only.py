"""The code pane on a model without FIM tokens: a worker process serves a forged model
without them whose logits follow a script (tests/engine/scripted_model.py); the pane
shows the worker's prefix-only answer as it is, one line mid-line, never an empty one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.context import AppContext
from app.paths import AppPaths
from app.views.code_view import CodeView
from tests.app.conftest import connected, start_worker
from tests.engine.scripted_model import FIRST, SECOND, Scenario, write_scripted_model

SCENARIOS = {
    # mid-line in print(...): the model wants to close it first, then writes g() and
    # closes print's bracket, which the suffix has (the worker cuts there)
    "mid_line": Scenario("import os\n\n\nprint(", ")\nx = 1\n",
                         ({")": FIRST, "g": SECOND}, "()", ")", "\n")),
    # a new line: the model's first choice is another line break
    "new_line": Scenario("import os\n", "\nprint(x)\n",
                         ("\n", {"\n": FIRST, "x": SECOND}, " =", " ", "1", "\n", "\n")),
}


@pytest.fixture(scope="module")
def scripted_worker(tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[tuple[tuple[str, str], dict[str, Scenario]]]:
    folder: Path = tmp_path_factory.mktemp("scripted-app") / "plain-coder"
    placed = write_scripted_model(folder, list(SCENARIOS.values()))
    proc, ready = start_worker(folder, [], tmp_path_factory.mktemp("scripted-home"))
    yield (ready["url"], ready["admin_token"]), dict(zip(SCENARIOS, placed, strict=True))
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def scripted_ctx(qtbot, paths: AppPaths, scripted_worker) -> Iterator[AppContext]:
    yield from connected(qtbot, paths, scripted_worker[0])


def _suggest(qtbot, ctx: AppContext, scenario: Scenario) -> CodeView:
    """The pane with the scenario's text, the cursor between its prefix and suffix."""
    view = CodeView(ctx)
    qtbot.addWidget(view)
    view.debounce_ms = 60_000  # only request_now asks
    view.editor.setPlainText(scenario.prefix + scenario.suffix.removesuffix("\n"))
    cursor = view.editor.textCursor()
    cursor.setPosition(len(scenario.prefix))
    view.editor.setTextCursor(cursor)
    view.request_now()
    qtbot.waitUntil(lambda: not view.in_flight, timeout=30_000)
    return view


def test_mid_line_the_suggestion_is_the_workers_trimmed_line(qtbot, scripted_ctx,
                                                             scripted_worker):
    view = _suggest(qtbot, scripted_ctx, scripted_worker[1]["mid_line"])
    # "g()" closes its own bracket: the pane must not cut it as a repeat of the ")" after
    # the cursor; print's own ")" the worker already left out
    assert view.suggestion == "g()", view.status.text()


def test_a_new_line_gets_a_line_not_nothing(qtbot, scripted_ctx, scripted_worker):
    view = _suggest(qtbot, scripted_ctx, scripted_worker[1]["new_line"])
    assert view.suggestion == "x = 1", view.status.text()
