"""Light and dark colours: the system's scheme by default, or the one chosen in Settings,
at once and again at the next start."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from app import theme
from app.context import AppContext
from app.views.main_window import MainWindow


def window_lightness(widget=None) -> int:
    palette = widget.palette() if widget is not None else QApplication.palette()
    return palette.color(QPalette.ColorRole.Window).lightness()


@pytest.fixture
def light_again() -> Iterator[None]:
    yield
    theme.apply_theme("light")  # the next tests see the usual colours


def test_settings_offers_system_light_and_dark_and_applies_at_once(qtbot, paths,
                                                                   light_again):
    win = MainWindow(AppContext(paths))
    qtbot.addWidget(win)
    win.show()
    settings: Any = win.show_view("settings")
    choice = settings.theme
    assert [choice.itemData(i) for i in range(choice.count())] == ["system", "light", "dark"]
    assert choice.currentData() == "system"  # the default: as the system
    choice.setCurrentIndex(choice.findData("dark"))
    chat: Any = win.show_view("chat")
    assert window_lightness() < 80
    qtbot.waitUntil(lambda: window_lightness(chat) < 80)  # every open widget follows
    assert window_lightness(win) < 80
    assert chat.input.palette().color(QPalette.ColorRole.Base).lightness() < 80
    choice.setCurrentIndex(choice.findData("light"))
    assert window_lightness() > 180
    qtbot.waitUntil(lambda: window_lightness(chat) > 180)
    choice.setCurrentIndex(choice.findData("dark"))
    # the choice is kept: the next start opens dark
    again = AppContext(paths)
    assert theme.saved_theme(again.settings) == "dark"
    theme.apply_theme("light")
    assert theme.apply_theme(theme.saved_theme(again.settings)) is True
    assert window_lightness() < 80


def test_system_follows_the_desktops_scheme(qtbot, light_again):
    hints = QGuiApplication.styleHints()
    dark = theme.apply_theme("system")
    assert dark == (hints.colorScheme() == Qt.ColorScheme.Dark)
    assert (window_lightness() < 80) == dark
