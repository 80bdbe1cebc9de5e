"""The training corpus: the running interpreter's standard-library ``.py`` files (PSF licence).

Files are listed in sorted order; a file is held out when the SHA-1 of its path relative to
the stdlib falls in the held-out bucket, so the split does not depend on file order or on
which other files exist.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_SKIP_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test",
                         "__pycache__"})
HELDOUT_BUCKETS = 20  # 1 file in 20 is held out


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, posix
    text: str


@dataclass(frozen=True)
class Corpus:
    train: tuple[SourceFile, ...]
    heldout: tuple[SourceFile, ...]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha1(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_BUCKETS == 0


def _keep(rel: Path) -> bool:
    if any(part in _SKIP_PARTS for part in rel.parts):
        return False
    name = rel.name
    return not (name.startswith("_sysconfigdata") or name.startswith("test_"))


def _generated(text: str) -> bool:
    """Generated tables rather than code: the ``encodings`` charmap codecs and other
    digit-heavy files (a tiny model learns to babble hex from them)."""
    head = text[:1000]
    digits = sum(c.isdigit() for c in text) / len(text)
    return ("gencodec.py" in head or digits > 0.1
            or ("Character Mapping Codec" in head and digits > 0.05))


def load_corpus(root: Path | None = None, max_file_bytes: int = 400_000) -> Corpus:
    """The stdlib's ``.py`` files (no tests, no site-packages, no generated codec tables),
    split train/held-out."""
    root = root or stdlib_root()
    train: list[SourceFile] = []
    heldout: list[SourceFile] = []
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root)
        if not _keep(rel) or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        text = text.replace("\r\n", "\n")
        if not text.strip() or len(text) > max_file_bytes or _generated(text):
            continue
        item = SourceFile(rel.as_posix(), text)
        (heldout if is_heldout(item.path) else train).append(item)
    return Corpus(tuple(train), tuple(heldout))


@dataclass(frozen=True)
class ChatExample:
    user: str
    assistant: str


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = ast.unparse(node.args)
    return f"{node.name}({args})"


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Top-level functions and the methods of top-level classes, with their owner's name."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(("", node))
        elif isinstance(node, ast.ClassDef):
            found += [(node.name, item) for item in node.body
                      if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found


def _function_sources(files: tuple[SourceFile, ...]) -> Iterator[
        tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """(owner, node, dedented source with decorators) of every function of ``_functions``
    in files that parse, in file order, then source order."""
    for item in files:
        try:
            tree = ast.parse(item.text)
        except (SyntaxError, ValueError):
            continue
        lines = item.text.splitlines(keepends=True)
        for owner, node in _functions(tree):
            if node.end_lineno is None:
                continue
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            yield owner, node, textwrap.dedent("".join(lines[start - 1: node.end_lineno])).rstrip()


def chat_examples(files: tuple[SourceFile, ...], max_chars: int = 1200) -> list[ChatExample]:
    """(request, code) pairs: a function's docstring first line as the request, the
    function's source as the answer. Deterministic (file order, then source order)."""
    out: list[ChatExample] = []
    for owner, node, source in _function_sources(files):
        doc = ast.get_docstring(node)
        if not doc or node.name.startswith("_"):
            continue
        first = doc.strip().splitlines()[0].strip()
        if len(first) < 8 or len(source) > max_chars:
            continue
        what = f"method `{owner}.{_signature(node)}`" if owner \
            else f"function `{_signature(node)}`"
        out.append(ChatExample(f"Write a Python {what}: {first}",
                               f"```python\n{source}\n```"))
    return out


@dataclass(frozen=True)
class EditExample:
    """A function and the names it binds that occur at least twice in it (candidates for
    a rename edit: its parameters, then its local assignments)."""

    source: str
    names: tuple[str, ...]


def edit_examples(files: tuple[SourceFile, ...], max_chars: int = 900) -> list[EditExample]:
    """Functions of the training files short enough for a rename edit (the function and its
    rewrite fit one row). Deterministic (file order, then source order)."""
    out: list[EditExample] = []
    for _, node, source in _function_sources(files):
        if len(source) > max_chars or source.count("\n") < 3:
            continue
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args,
                                  *node.args.kwonlyargs) if a.arg not in ("self", "cls")]
        stored = sorted({n.id for n in ast.walk(node)
                         if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
        names = tuple(dict.fromkeys(
            n for n in [*params, *stored]
            if len(re.findall(rf"\b{re.escape(n)}\b", source)) >= 2))
        if names:
            out.append(EditExample(source, names))
    return out
