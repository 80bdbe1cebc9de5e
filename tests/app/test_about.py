"""Help → About through the real window: versions, and the built-in model's licence read
from its folder's files (or what the folder lacks)."""

from __future__ import annotations

import onnxruntime
from PySide6 import __version__ as pyside_version
from PySide6.QtCore import qVersion
from PySide6.QtGui import QAction

from app.context import AppContext
from app.views import about
from app.views.main_window import MainWindow

APACHE = ("\n                                 Apache License\n"
          "                           Version 2.0, January 2004\n"
          "                        http://www.apache.org/licenses/\n")


def _open_about(qtbot, paths):
    win = MainWindow(AppContext(paths))
    qtbot.addWidget(win)
    win.show()
    action = next(a for a in win.findChildren(QAction) if a.text() == "About ONNX Local LLM")
    action.trigger()
    dialog = win.findChild(about.AboutDialog)
    assert dialog is not None and dialog.isVisible()
    return dialog.text.toPlainText()


def test_about_shows_versions_and_the_models_licence_and_provenance(qtbot, paths, tmp_path,
                                                                    monkeypatch):
    folder = tmp_path / about.BUILTIN_NAME
    folder.mkdir()
    (folder / "LICENSE").write_text(APACHE, encoding="utf-8")
    (folder / "MODEL_CARD.md").write_text("---\nlicense: apache-2.0\n---\n# SmolLM2-135M\n",
                                          encoding="utf-8")
    (folder / "PROVENANCE.md").write_text("From HuggingFaceTB/SmolLM2-135M-Instruct.\n",
                                          encoding="utf-8")
    monkeypatch.setattr(about, "builtin_model_dir", lambda: folder)
    text = _open_about(qtbot, paths)
    assert f"ONNX Runtime (onnxruntime)\t{onnxruntime.__version__}" in text or \
        onnxruntime.__version__ in text
    assert qVersion() in text and pyside_version in text and "0.1.0" in text
    assert "Licence: Apache-2.0" in text
    assert "From HuggingFaceTB/SmolLM2-135M-Instruct." in text
    assert "SmolLM2-135M" in text and "Apache License" in text
    assert "license: apache-2.0" not in text  # the card's YAML header is not shown


def test_about_renders_the_markdown_and_wraps_it(qtbot, paths, tmp_path, monkeypatch):
    folder = tmp_path / about.BUILTIN_NAME
    folder.mkdir()
    sha = "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4" * 2
    (folder / "PROVENANCE.md").write_text(
        "# Provenance\n\nSource: **SmolLM2** " + "with a long line of words " * 30
        + "\n\n| file | sha256 |\n|---|---|\n| `LICENSE` | `" + sha + "` |\n",
        encoding="utf-8")
    monkeypatch.setattr(about, "builtin_model_dir", lambda: folder)
    win = MainWindow(AppContext(paths))
    qtbot.addWidget(win)
    win.show()
    dialog = win.show_about()
    assert isinstance(dialog, about.AboutDialog)
    qtbot.waitExposed(dialog)
    text = dialog.text.toPlainText()
    assert "Provenance" in text and "# Provenance" not in text  # a heading, not its marks
    assert "**SmolLM2**" not in text and "|---|" not in text
    # nothing scrolls sideways: every line fits the dialog's width
    bar = dialog.text.horizontalScrollBar()
    assert bar.maximum() == 0
    width = dialog.text.document().idealWidth()
    assert width <= dialog.text.viewport().width()


def test_about_says_what_the_models_folder_lacks(qtbot, paths, tmp_path, monkeypatch):
    folder = tmp_path / about.BUILTIN_NAME
    folder.mkdir()
    (folder / "genai_config.json").write_text("{}", encoding="utf-8")
    monkeypatch.setattr(about, "builtin_model_dir", lambda: folder)
    text = _open_about(qtbot, paths)
    assert "Licence: not stated in its files (the folder has no LICENSE file)" in text
    assert "it holds: genai_config.json." in text
    monkeypatch.setattr(about, "builtin_model_dir", lambda: tmp_path / "absent")
    assert "Not installed here" in _open_about(qtbot, paths)


def test_about_says_whether_the_engines_kernel_is_in_use_and_why_not(qtbot, paths, tmp_path,
                                                                     monkeypatch):
    from engine import kernels

    monkeypatch.setenv(kernels.LIBRARY_ENV, str(tmp_path / "absent.ortops"))
    text = _open_about(qtbot, paths)
    assert "Engine kernels: not built" in text
    assert f"kernels are not built: no absent.ortops in {tmp_path}" in text
    assert "re-run the install" in text
    monkeypatch.setenv(kernels.ENV, "0")
    assert "Engine kernels: off — the engine kernels are turned off: " \
        "ONNX_GENAI_KERNELS=0" in _open_about(qtbot, paths)
