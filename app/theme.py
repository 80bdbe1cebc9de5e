"""The window's colours: the system's light or dark scheme, or the one chosen in Settings.

``System`` follows the desktop's colour scheme (Qt's style hints; a change on the desktop
is followed while the app runs); ``Light`` and ``Dark`` hold whatever the desktop says.
The app draws with Qt's Fusion style, whose palette is set here: the same look on every
platform, in both schemes.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

THEMES = ("system", "light", "dark")
THEME_LABELS = {"system": "As the system", "light": "Light", "dark": "Dark"}
THEME_KEY = "appearance/theme"

_follower: dict[str, Any] = {}


def saved_theme(settings: Any) -> str:
    value = str(settings.value(THEME_KEY, "system"))
    return value if value in THEMES else "system"


def system_is_dark() -> bool:
    hints = QGuiApplication.styleHints()
    return hints is not None and hints.colorScheme() == Qt.ColorScheme.Dark


def dark_palette() -> QPalette:
    """Fusion's colours for a dark scheme."""
    p = QPalette()
    role, group = QPalette.ColorRole, QPalette.ColorGroup
    base, window, text = QColor(30, 31, 34), QColor(43, 45, 48), QColor(223, 225, 229)
    for r, c in ((role.Window, window), (role.WindowText, text), (role.Base, base),
                 (role.AlternateBase, QColor(50, 52, 56)), (role.ToolTipBase, QColor(60, 63, 68)),
                 (role.ToolTipText, text), (role.PlaceholderText, QColor(140, 143, 150)),
                 (role.Text, text), (role.Button, QColor(55, 57, 61)), (role.ButtonText, text),
                 (role.BrightText, QColor(255, 110, 110)), (role.Light, QColor(70, 72, 77)),
                 (role.Midlight, QColor(60, 62, 66)), (role.Mid, QColor(40, 41, 44)),
                 (role.Dark, QColor(22, 23, 25)), (role.Shadow, QColor(0, 0, 0)),
                 (role.Highlight, QColor(53, 116, 240)),
                 (role.HighlightedText, QColor(255, 255, 255)),
                 (role.Link, QColor(110, 160, 255)), (role.LinkVisited, QColor(170, 140, 255))):
        p.setColor(r, c)
    muted = QColor(120, 122, 128)
    for r in (role.WindowText, role.Text, role.ButtonText):
        p.setColor(group.Disabled, r, muted)
    return p


def is_dark(theme: str) -> bool:
    return theme == "dark" or (theme == "system" and system_is_dark())


def apply_theme(theme: str, app: QApplication | None = None) -> bool:
    """Colour the app for ``theme`` (system | light | dark); True when dark."""
    app = app or QApplication.instance()  # type: ignore[assignment]
    if not isinstance(app, QApplication):
        return False
    fusion = QStyleFactory.create("Fusion")
    if fusion is not None and app.style().name().lower() != "fusion":
        app.setStyle(fusion)
    dark = is_dark(theme)
    app.setPalette(dark_palette() if dark else app.style().standardPalette())
    _follow_system(app, theme)
    return dark


def _follow_system(app: QApplication, theme: str) -> None:
    """While the choice is System, a change of the desktop's scheme is followed."""
    hints = QGuiApplication.styleHints()
    _follower["theme"] = theme
    if hints is None or _follower.get("connected"):
        return
    hints.colorSchemeChanged.connect(
        lambda _scheme: _follower.get("theme") == "system" and apply_theme("system", app))
    _follower["connected"] = True
