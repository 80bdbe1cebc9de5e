"""The documentation speaks of the project, not of how it was made: a figure carries its
date, the machine and the command that reproduces it (or the commit it was measured on),
never "the ninth session's run"; the history is in git."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Folders that hold no documentation of the project's own.
SKIPPED = {".git", ".venv", ".venv-peers", "node_modules", "build", "dist", "out"}

_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|"
             "twelfth|thirteenth|fourteenth|fifteenth|[0-9]+(?:st|nd|rd|th)|last|previous|"
             "earlier|prior")
#: "the ninth session", "Eleventh session's", "the last session's run", "session 12", "the
#: previous attempt": a stage of the work, which a reader of the documentation knows nothing
#: of. (An ONNX Runtime session or a chat session is named otherwise and passes.)
HISTORY = re.compile(rf"\b(?:(?:{_ORDINALS})\s+(?:work\s+)?sessions?\b"
                     r"|sessions?\s+#?[0-9]+\b(?!\s*(?:ms|s|MiB|MB|GB)\b)"
                     r"|(?:previous|earlier|prior)\s+attempts?\b)", re.IGNORECASE)


def _documents() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts
        if not any(part in SKIPPED or part.startswith(".") for part in parts[:-1]):
            found.append(path)
    return found


def history_words(text: str) -> list[str]:
    """Each mention of the work's history in ``text`` (one may wrap over two lines), as
    ``line: words``."""
    return [f"{text.count(chr(10), 0, match.start()) + 1}: {' '.join(match[0].split())}"
            for match in HISTORY.finditer(text)]


def test_the_check_finds_history_words():
    text = ("Results, 2026-12-02, eleventh session.\nThe ninth\nsession's run; the last "
            "session's table; session 12; the previous attempt.\n"
            "ONNX Runtime creates its InferenceSession; X-Session-Id names a chat session;\n"
            "`--max-sessions`, DELETE /v1/sessions/NAME, open sessions' KV; session 320 ms.\n")
    assert history_words(text) == ["1: eleventh session", "2: ninth session",
                                   "3: last session", "3: session 12", "3: previous attempt"]


def test_the_documentation_names_no_stage_of_the_work():
    documents = _documents()
    assert ROOT / "README.md" in documents and ROOT / "bench" / "README.md" in documents
    found = [f"{path.relative_to(ROOT)}:{mention}" for path in documents
             for mention in history_words(path.read_text(encoding="utf-8"))]
    assert found == [], ("the documentation speaks of the work's history (give a figure its "
                         "date, machine and command, or the commit it was measured on):\n"
                         + "\n".join(found))
