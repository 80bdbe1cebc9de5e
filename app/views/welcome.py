"""The first-run welcome: where the model runs, which model is loaded, where chats and
models live, and how to connect an editor. Shown once (Help → Welcome shows it again)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from app.context import AppContext
from app.paths import resources_dir
from app.views import named


def welcome_html(ctx: AppContext) -> str:
    card: dict[str, Any] = ctx.model or {}
    meta = card.get("meta") or {}
    provider = str(meta.get("provider") or "")
    where = "a GPU" if ("CUDA" in provider or "Dml" in provider) else "this computer's CPU"
    model = card.get("id") or "the default model (loading…)"
    url = ctx.client.base_url or "(starting…)"
    path = str(meta.get("path") or "")
    builtin_note = (" — the small built-in model, for trying things out"
                    if path.startswith(str(resources_dir())) or not card else "")
    p = ctx.paths
    return (
        "<h2>Welcome</h2>"
        f"<p>Models run on <b>{where}</b>. Loaded: <b>{model}</b>{builtin_note}; add "
        "bigger models under <i>Models</i>.</p>"
        f"<p>Your chats are kept in <code>{p.chats_db}</code>; downloaded models go to "
        f"<code>{p.models_dir}</code>. Nothing leaves this computer.</p>"
        f"<p>Editors (llama.vscode, llama.vim, Continue, Tabby) connect to <code>{url}</code>: "
        "the <i>Editors</i> page has settings to paste and a Test button.</p>"
        "<p>Drag the memory slider in the Resources panel to keep the model within a limit.</p>")


class WelcomeDialog(QDialog):
    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcome")
        self.setWindowTitle("Welcome")
        self.ctx = ctx
        layout = QVBoxLayout(self)
        self.text = named(QLabel(welcome_html(ctx)), "welcomeText")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setMinimumWidth(480)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok)
        buttons.accepted.connect(self.accept)
        layout.addWidget(self.text)
        layout.addWidget(buttons)
        ctx.model_changed.connect(lambda _card: self.text.setText(welcome_html(ctx)))
        ctx.settings.set_value("welcome/shown", True)
