"""The window's views. Each takes the AppContext: ``View(ctx, parent=None)``."""

from __future__ import annotations

from typing import TypeVar

from PySide6.QtCore import QObject

T = TypeVar("T", bound=QObject)


def named(obj: T, name: str) -> T:
    """``obj`` with its objectName set (for tests, screenshots and style sheets)."""
    obj.setObjectName(name)
    return obj
