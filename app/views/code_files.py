"""The Code pane's file bar: Open…, Save, Save as…, Recent, and the file's name and
language (from its extension: Python is coloured and indents after a colon; C-like
languages indent after a brace; anything else keeps the line's indentation).

Files are read and written as UTF-8 text; a file that is not is refused in words. The ten
files opened or saved last are kept in the settings (``code/recent``). Opening another
file over unsaved changes asks first. The dialogs are module functions so that tests can
answer them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QToolButton,
    QWidget,
)

from app.context import AppContext
from app.views.code_editor import CodeEditor

RECENT_KEY = "code/recent"
RECENT_MAX = 10
LANGUAGES = {
    ".py": ("Python", "python"), ".pyw": ("Python", "python"), ".pyi": ("Python", "python"),
    ".js": ("JavaScript", "c-like"), ".ts": ("TypeScript", "c-like"),
    ".c": ("C", "c-like"), ".h": ("C", "c-like"), ".cpp": ("C++", "c-like"),
    ".hpp": ("C++", "c-like"), ".cc": ("C++", "c-like"), ".java": ("Java", "c-like"),
    ".cs": ("C#", "c-like"), ".go": ("Go", "c-like"), ".rs": ("Rust", "c-like"),
    ".json": ("JSON", "c-like"), ".sh": ("Shell", "text"), ".md": ("Markdown", "text"),
    ".txt": ("Text", "text"), ".toml": ("TOML", "text"), ".yaml": ("YAML", "text"),
    ".yml": ("YAML", "text"),
}


def language_of(path: Path | None) -> tuple[str, str]:
    """(the language's name, how it indents) for a file name; untitled is Python."""
    if path is None:
        return "Python", "python"
    return LANGUAGES.get(path.suffix.lower(), ("Text", "text"))


def ask_open_path(parent: QWidget, start: Path) -> Path | None:
    name, _ = QFileDialog.getOpenFileName(parent, "Open a file", str(start))
    return Path(name) if name else None


def ask_save_path(parent: QWidget, start: Path) -> Path | None:
    name, _ = QFileDialog.getSaveFileName(parent, "Save the file as", str(start))
    return Path(name) if name else None


def confirm_discard(parent: QWidget, name: str) -> bool:
    answer = QMessageBox.question(parent, "Unsaved changes",
                                  f"{name} has changes that are not saved. Open another file "
                                  "and lose them?")
    return answer == QMessageBox.StandardButton.Yes


class CodeFiles(QObject):
    """Open / save for one editor; ``bar`` is the row of buttons above it."""

    opened = Signal(object)  # Path
    saved = Signal(object)  # Path
    problem = Signal(str)

    def __init__(self, ctx: AppContext, editor: CodeEditor, parent: QWidget) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.editor = editor
        self.path: Path | None = None
        self.bar = QWidget(parent)
        row = QHBoxLayout(self.bar)
        row.setContentsMargins(4, 2, 4, 2)
        self.open_button = self._button("Open…", "codeOpen", self.open)
        self.save_button = self._button("Save", "codeSave", self.save)
        self.save_as_button = self._button("Save as…", "codeSaveAs", self.save_as)
        self.recent_button = self._button("Recent", "codeRecent", None)
        self.recent_menu = QMenu(self.recent_button)
        self.recent_button.setMenu(self.recent_menu)
        self.recent_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.recent_menu.aboutToShow.connect(self._fill_recent)
        self.name = QLabel("")
        self.name.setObjectName("codeFileName")
        for widget in (self.open_button, self.save_button, self.save_as_button,
                       self.recent_button):
            row.addWidget(widget)
        row.addStretch(1)
        row.addWidget(self.name)
        editor.document().modificationChanged.connect(lambda _m: self._show_name())
        self._fill_recent()
        self._show_name()

    def _button(self, text: str, name: str, slot: object) -> QToolButton:
        button = QToolButton(self.bar)
        button.setText(text)
        button.setObjectName(name)
        if callable(slot):
            button.clicked.connect(lambda: slot())
        return button

    # --- actions --------------------------------------------------------------------------

    def recent(self) -> list[str]:
        value = self.ctx.settings.value(RECENT_KEY, [])
        return [str(v) for v in value] if isinstance(value, list) else []

    def open(self, path: Path | None = None) -> bool:
        """Open ``path`` (None: ask for one); unsaved changes are kept unless confirmed."""
        parent = self.bar.parentWidget() or self.bar
        if self.editor.document().isModified() and not confirm_discard(parent,
                                                                       self._title()):
            return False
        if path is None:
            path = ask_open_path(parent, self._folder())
            if path is None:
                return False
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            self.problem.emit(f"{path} is not UTF-8 text: it was not opened.")
            return False
        except OSError as exc:
            self.problem.emit(f"Could not open {path}: {exc.strerror or exc}.")
            return False
        self.path = Path(path)
        self.editor.setPlainText(text)
        self.editor.document().setModified(False)
        self._apply_language()
        self._remember(self.path)
        self.opened.emit(self.path)
        return True

    def save(self) -> bool:
        """Save to the file's path (asking for one the first time)."""
        return self._write(self.path) if self.path is not None else self.save_as()

    def save_as(self) -> bool:
        parent = self.bar.parentWidget() or self.bar
        start = self.path or (self._folder() / "untitled.py")
        path = ask_save_path(parent, start)
        return self._write(path) if path is not None else False

    # --- plumbing -------------------------------------------------------------------------

    def _write(self, path: Path) -> bool:
        try:
            Path(path).write_text(self.editor.toPlainText(), encoding="utf-8")
        except OSError as exc:
            self.problem.emit(f"Could not save {path}: {exc.strerror or exc}. Nothing was "
                              "lost: the text is still here.")
            return False
        self.path = Path(path)
        self.editor.document().setModified(False)
        self._apply_language()
        self._remember(self.path)
        self.saved.emit(self.path)
        return True

    def _apply_language(self) -> None:
        _name, indent = language_of(self.path)
        self.editor.language = indent
        self.editor.highlighter.setDocument(self.editor.document() if indent == "python"
                                            else None)
        self._show_name()

    def _remember(self, path: Path) -> None:
        entries = [str(path)] + [p for p in self.recent() if p != str(path)]
        self.ctx.settings.set_value(RECENT_KEY, entries[:RECENT_MAX])
        self._fill_recent()

    def _fill_recent(self) -> None:
        self.recent_menu.clear()
        entries = self.recent()
        for entry in entries:
            action = self.recent_menu.addAction(entry)
            action.triggered.connect(self._opener(Path(entry)))
        self.recent_button.setEnabled(bool(entries))

    def _opener(self, path: Path) -> Callable[[], bool]:
        return lambda: self.open(path)

    def _folder(self) -> Path:
        return self.path.parent if self.path is not None else Path.home()

    def _title(self) -> str:
        return self.path.name if self.path is not None else "The untitled file"

    def _show_name(self) -> None:
        language, _ = language_of(self.path)
        name = str(self.path) if self.path is not None else "untitled"
        star = " •" if self.editor.document().isModified() else ""
        self.name.setText(f"{name}{star} · {language}")
