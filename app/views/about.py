"""Help → About: the app's version and the versions it runs on (ONNX Runtime, Qt,
PySide6, Python), whether the engine's own decode-attention kernel is in use, and the
built-in model's licence and where it comes from, read from the files in its folder
(``resources/models/smollm2-135m-instruct``): ``LICENSE``, ``PROVENANCE.md`` when there is
one, ``MODEL_CARD.md`` (Markdown rendered, every line wrapped to the dialog's width). What
the folder lacks is said, not guessed."""

from __future__ import annotations

import html
import platform
import re
from importlib import metadata
from pathlib import Path

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QTextDocument, QTextOption
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout, QWidget

from app.paths import resources_dir
from engine import kernel_status

BUILTIN_NAME = "smollm2-135m-instruct"
_LICENSES = (("Apache License", "Version 2.0", "Apache-2.0"),
             ("MIT License", "", "MIT"),
             ("GNU GENERAL PUBLIC LICENSE", "Version 3", "GPL-3.0"))
_CARD_LICENSE = re.compile(r"^\s*license:\s*(\S+)", re.MULTILINE | re.IGNORECASE)
EXCERPT_LINES = 40


def builtin_model_dir() -> Path:
    return resources_dir() / "models" / BUILTIN_NAME


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def versions() -> dict[str, str]:
    ort = next(((d, metadata.version(d)) for d in ("onnxruntime", "onnxruntime-gpu",
                                                    "onnxruntime-directml")
                if _version(d) != "not installed"), ("onnxruntime", "not installed"))
    return {"ONNX Local LLM": _version("onnx-local-llm"),
            f"ONNX Runtime ({ort[0]})": ort[1],
            "Qt": qVersion(), "PySide6": pyside_version,
            "Python": platform.python_version()}


def license_name(text: str) -> str | None:
    """The SPDX name of a licence text, for the ones models ship with."""
    head = text[:2000]
    for title, version, spdx in _LICENSES:
        if title.lower() in head.lower() and version.lower() in head.lower():
            return spdx
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)
_BODY = re.compile(r"<body[^>]*>(.*)</body>", re.DOTALL)


def _excerpt(text: str, markdown: bool) -> str:
    """The first lines of a file as HTML: Markdown rendered (headings, lists, tables,
    links; a card's YAML header left out), plain text as paragraphs. Lines wrap."""
    if markdown:
        text = _FRONT_MATTER.sub("", text.lstrip())
    lines = text.strip().splitlines()
    more = len(lines) > EXCERPT_LINES
    body = "\n".join(lines[:EXCERPT_LINES]) + ("\n\n…" if more else "")
    if not markdown:
        paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", body))
        return "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs if p)
    document = QTextDocument()
    document.setMarkdown(body)
    match = _BODY.search(document.toHtml())
    return match.group(1) if match else f"<p>{html.escape(body)}</p>"


def model_section(folder: Path) -> str:
    """The built-in model's licence and origin, as HTML, from its folder's files."""
    parts = [f"<h3>Built-in model: {html.escape(folder.name)}</h3>"]
    if not folder.is_dir():
        return parts[0] + (f"<p>Not installed here (no folder {html.escape(str(folder))}): "
                           "no licence to show.</p>")
    licence, card = _read(folder / "LICENSE"), _read(folder / "MODEL_CARD.md")
    provenance = _read(folder / "PROVENANCE.md")
    name = license_name(licence) if licence else None
    if name is None and card:
        match = _CARD_LICENSE.search(card)
        name = match.group(1) if match else None
    parts.append(f"<p>Licence: <b>{html.escape(name or 'not stated in its files')}</b>"
                 + ("" if licence else " (the folder has no LICENSE file)") + "</p>")
    for title, text, markdown in (("Where it comes from (PROVENANCE.md)", provenance, True),
                                  ("Model card (MODEL_CARD.md)", card, True),
                                  ("LICENSE", licence, False)):
        if text:
            parts.append(f"<h4>{title}</h4>{_excerpt(text, markdown)}")
    if not (licence or card or provenance):
        files = sorted(p.name for p in folder.iterdir())
        parts.append("<p>The folder has no LICENSE, PROVENANCE.md or MODEL_CARD.md; it holds: "
                     f"{html.escape(', '.join(files) or 'nothing')}.</p>")
    return "".join(parts)


def kernels_section() -> str:
    """Whether this install runs the engine's own decode-attention kernel, why not, and the
    fix (engine.kernels.status: the worker runs on the same install)."""
    found = kernel_status()
    return (f"<p>Engine kernels: <b>{html.escape(found.state)}</b> — "
            f"{html.escape(found.line())}</p>")


def about_html(folder: Path | None = None) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>"
                   for k, v in versions().items())
    return ("<h2>ONNX Local LLM</h2><p>Chat and code completion with language models that "
            "run on this computer.</p>"
            f"<table cellspacing='4'>{rows}</table>"
            + kernels_section()
            + model_section(folder or builtin_model_dir()))


class AboutDialog(QDialog):
    def __init__(self, parent: QWidget | None = None, folder: Path | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("aboutDialog")
        self.setWindowTitle("About ONNX Local LLM")
        self.resize(620, 560)
        self.text = QTextBrowser(self)
        self.text.setObjectName("aboutText")
        self.text.setOpenExternalLinks(True)
        # long words (hashes, paths) break anywhere rather than scroll the text sideways
        self.text.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.text.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.text.setHtml(about_html(folder))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)
