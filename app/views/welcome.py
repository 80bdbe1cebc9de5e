"""The first-run welcome: where the model runs, which model is loaded, where chats and
models live, and how to connect an editor. Shown once (Help → Welcome shows it again).

It also suggests two models from the catalog (:mod:`engine.hub`), read from the Hub on a
thread when the dialog opens: the best chat model and the best code model that fit this
machine (:func:`engine.hub.best_picks`), one **Get** button each, which starts the same Get
as the Models page's Catalog tab (:meth:`CatalogPanel.get_entry
<app.views.catalog_panel.CatalogPanel.get_entry>`). When the built-in model is the one
loaded it says that model is small. When the Hub cannot be reached it says so and the
built-in model stays in use.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.context import AppContext
from app.paths import resources_dir
from app.views import named
from engine import EngineConfig, human_size
from engine.hub import (
    CatalogEntry,
    CatalogRow,
    best_picks,
    catalog_rows,
    hub_endpoint,
    load_catalog,
)

#: What each suggestion is for, by catalog kind.
PICKS = {"chat": "for chat", "code": "for code completion in your editor"}


def is_builtin(card: dict[str, Any] | None) -> bool:
    path = str(((card or {}).get("meta") or {}).get("path") or "")
    return not card or path.startswith(str(resources_dir()))


def welcome_html(ctx: AppContext) -> str:
    card: dict[str, Any] = ctx.model or {}
    meta = card.get("meta") or {}
    provider = str(meta.get("provider") or "")
    where = "a GPU" if ("CUDA" in provider or "Dml" in provider) else "this computer's CPU"
    model = card.get("id") or "the default model (loading…)"
    url = ctx.client.base_url or "(starting…)"
    builtin_note = (" — the small built-in model, for trying things out"
                    if is_builtin(card) else "")
    small = ("<p>The built-in model is small (135M parameters): it answers quickly but "
             "often wrongly. A bigger model that fits this computer is one click below."
             "</p>" if is_builtin(card) else "")
    p = ctx.paths
    return (
        "<h2>Welcome</h2>"
        f"<p>Models run on <b>{where}</b>. Loaded: <b>{model}</b>{builtin_note}; add "
        f"bigger models under <i>Models</i>.</p>{small}"
        f"<p>Your chats are kept in <code>{p.chats_db}</code>; downloaded models go to "
        f"<code>{p.models_dir}</code>. Nothing leaves this computer.</p>"
        f"<p>Editors (llama.vscode, llama.vim, Continue, Tabby) connect to <code>{url}</code>: "
        "the <i>Editors</i> page has settings to paste and a Test button.</p>"
        "<p>Drag the memory slider in the Resources panel to keep the model within a limit.</p>")


def pick_text(kind: str, row: CatalogRow) -> str:
    """The button's words: the model, what it is for, its download and its label here."""
    c = row.choice
    assert c is not None
    speed = (f", about {c.fit.tokens_per_second:.0f} tokens/s here"
             if c.fit.tokens_per_second else "")
    return (f"Get {row.entry.title} ({row.entry.parameters}) {PICKS[kind]}: "
            f"{human_size(c.download_bytes)}, {c.fit.text}{speed}")


class WelcomeDialog(QDialog):
    #: A suggestion's Get was clicked: the catalog entry to get (the main window starts
    #: the Catalog tab's Get with it).
    get_requested = Signal(object)

    def __init__(self, ctx: AppContext, parent: QWidget | None = None,
                 entries: tuple[CatalogEntry, ...] | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("welcome")
        self.setWindowTitle("Welcome")
        self.ctx = ctx
        self.entries = load_catalog() if entries is None else entries
        self.picks: dict[str, CatalogRow] = {}
        layout = QVBoxLayout(self)
        self.text = named(QLabel(welcome_html(ctx)), "welcomeText")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setMinimumWidth(480)
        self.suggest = named(QLabel(""), "welcomeSuggest")
        self.suggest.setWordWrap(True)
        self.pick_buttons: dict[str, QPushButton] = {}
        layout.addWidget(self.text)
        layout.addWidget(self.suggest)
        for kind in PICKS:
            button = named(QPushButton(""), f"welcomeGet_{kind}")
            button.setVisible(False)
            button.clicked.connect(lambda _=False, k=kind: self._get(k))
            self.pick_buttons[kind] = button
            layout.addWidget(button)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)
        ctx.model_changed.connect(lambda _card: self.text.setText(welcome_html(ctx)))
        ctx.settings.set_value("welcome/shown", True)
        self.check_job: Any = None
        self._check()

    # --- the suggestions ----------------------------------------------------------------

    def _endpoint(self) -> str:
        from app.views.download_panel import ENDPOINT_KEY

        return hub_endpoint(self.ctx.settings.value(ENDPOINT_KEY, ""))

    def _check(self) -> None:
        from app.views.catalog_panel import _Job
        from engine.hub import read_speed

        endpoint = self._endpoint()
        s = self.ctx.settings
        config = EngineConfig(host_ram_limit=s.host_ram_limit, vram_limit=s.vram_limit)
        entries = tuple(e for e in self.entries if e.kind in PICKS)
        self.suggest.setText(f"Looking on {endpoint} for the models that fit this computer…")
        job = _Job(lambda _report, _stop: catalog_rows(
            endpoint=endpoint, config=config, bandwidth=read_speed, entries=entries), self)
        job.succeeded.connect(self._on_checked)
        job.failed.connect(lambda text: self._offline(endpoint, text))
        job.finished.connect(self._check_ended)
        self.check_job = job
        job.start()

    def _check_ended(self) -> None:
        self.check_job = None

    def _offline(self, endpoint: str, why: str) -> None:
        builtin = ("the built-in model stays in use" if is_builtin(self.ctx.model)
                   else "the loaded model stays in use")
        self.suggest.setText(f"The Hub ({endpoint}) could not be reached, so no model is "
                             f"suggested: {builtin}. <i>Models → Catalog</i> can look again "
                             f"later, and <i>Models → Library</i> adds a model already on "
                             f"this computer. ({why})")
        self.adjustSize()  # the dialog grows to the text: nothing is clipped

    def _on_checked(self, rows: list[CatalogRow]) -> None:
        if rows and all(r.choice is None for r in rows):
            # the rows say the same thing, some with the detail: the fullest one
            reason = max((r.problem or "" for r in rows), key=len)
            self._offline(self._endpoint(), reason[:300])
            return
        self.picks = best_picks(rows, tuple(PICKS))
        for kind, button in self.pick_buttons.items():
            row = self.picks.get(kind)
            button.setVisible(row is not None)
            if row is not None:
                button.setText(pick_text(kind, row))
                button.setToolTip(row.choice.fit.details() if row.choice else "")
        self.suggest.setText(
            "<b>Models that fit this computer</b> (the largest that fits and decodes at a "
            "reading pace here; <i>Models → Catalog</i> lists them all):"
            if self.picks else "None of the catalog's chat or code models fits this "
            "computer's memory limit: the built-in model stays in use.")
        self.adjustSize()

    def _get(self, kind: str) -> None:
        row = self.picks.get(kind)
        if row is not None:
            self.get_requested.emit(row.entry)
            self.accept()
