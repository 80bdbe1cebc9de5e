"""The window's views. Each takes the AppContext: ``View(ctx, parent=None)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import shiboken6
from PySide6.QtCore import QObject

T = TypeVar("T", bound=QObject)


def named(obj: T, name: str) -> T:
    """``obj`` with its objectName set (for tests, screenshots and style sheets)."""
    obj.setObjectName(name)
    return obj


def while_alive(owner: QObject, fn: Callable[..., None]) -> Callable[..., None]:
    """``fn`` for a reply's signal: skipped once ``owner`` is gone. Replies belong to the
    client and outlive the view that asked (an answer may arrive after its window closed);
    a lambda connected to them is not dropped with the view the way a bound slot is."""
    def call(*args: Any) -> None:
        if shiboken6.isValid(owner):
            fn(*args)
    return call
