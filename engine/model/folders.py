"""Which folders are models, and what one holds: the one rule the app's library and the
worker's ``/v1/library`` share.

A folder is a model when it has ``genai_config.json`` (onnxruntime-genai, Foundry Local),
``inference_metadata.yaml`` (ours) or any ``.onnx`` file (optimum exports and bare graphs);
hidden folders are never searched. :func:`inspect_folder` reads metadata, the graph's
structure and the tokenizer (no weights, nothing runs) and never raises for a bad model:
what is wrong comes back as ``problem``, in words.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.model.model_dir import load_model_dir
from engine.model.onnx_scan import ScanError, scan_onnx
from engine.text.fim import detect_fim_family
from engine.text.tokenizer import Tokenizer

MODEL_MARKERS = ("genai_config.json", "inference_metadata.yaml")
#: (marker file, format) in the order a folder's format is decided.
FORMATS = (("genai_config.json", "genai"), ("inference_metadata.yaml", "metadata"),
           ("config.json", "optimum"))
MAX_DEPTH = 8


def is_model_dir(folder: Path) -> bool:
    try:
        if any((folder / m).is_file() for m in MODEL_MARKERS):
            return True
        return any(e.name.endswith(".onnx") and e.is_file() for e in os.scandir(folder))
    except OSError:
        return False


def find_model_dirs(root: Path, max_depth: int = MAX_DEPTH, *, include_root: bool = True,
                    stay_inside: bool = False) -> Iterator[Path]:
    """Model folders under ``root`` (itself too with ``include_root``), depth first, in name
    order; hidden folders are skipped, a model folder is not searched further, and each real
    folder is visited once (symlink cycles end). ``stay_inside``: links that lead out of
    ``root`` are not followed (the worker loads only what is under its roots)."""
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Path, int]] = [(root, 0)]
    real_root = root.resolve() if stay_inside else root
    while stack:
        folder, depth = stack.pop()
        try:
            st = os.stat(folder)
            if stay_inside and not folder.resolve().is_relative_to(real_root):
                continue
        except (OSError, RuntimeError):
            continue  # a dangling link, a link loop (ELOOP), no permission
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        if (depth > 0 or include_root) and is_model_dir(folder):
            yield folder
            continue
        if depth >= max_depth:
            continue
        try:
            children = sorted((e for e in os.scandir(folder)
                               if not e.name.startswith(".") and e.is_dir()),
                              key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        stack.extend((Path(e.path), depth + 1) for e in children)


def import_work_dir(out_dir: Path) -> Path:
    """Where an import into ``out_dir`` writes until it is complete: a hidden sibling, so a
    library scan (hidden folders are skipped) never lists a half-written model."""
    return out_dir.with_name(f".{out_dir.name}.importing")


def folder_format(folder: Path) -> str:
    """"genai", "metadata", "optimum" or "convention" (names and shapes guessed)."""
    for marker, fmt in FORMATS:
        if (folder / marker).is_file():
            return fmt
    return "convention"


def folder_size(folder: Path) -> int:
    """Bytes of the files in the folder (links followed: the HF cache links to blobs)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def human_size(n: int | None) -> str:
    """Decimal units as file managers show them: ``1.2 MB``."""
    if n is None:
        return "?"
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def completeness_problem(folder: Path) -> str | None:
    """None when every ``.onnx`` file parses and each external-data file it references is
    present at the size the graph reads; else what is wrong, in words."""
    try:
        onnx_files = sorted(p for p in folder.iterdir() if p.suffix == ".onnx" and p.is_file())
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if not onnx_files:
        return "incomplete: no .onnx file in the folder"
    for model_file in onnx_files:
        try:
            scanned = scan_onnx(model_file)
        except (ScanError, OSError):
            return (f"incomplete: {model_file.name} ({human_size(model_file.stat().st_size)}) "
                    "is not a whole ONNX file (truncated download?)")
        expected: dict[str, int] = {}
        for tensor in scanned.initializers:
            if tensor.data_location == 1:  # EXTERNAL
                entry = tensor.external
                end = int(entry.get("offset", 0) or 0) + int(entry.get("length", 0) or 0)
                loc = entry.get("location", "")
                expected[loc] = max(expected.get(loc, 0), end)
        for loc, need in sorted(expected.items()):
            data = model_file.parent / loc
            if not data.is_file():
                return f"incomplete: {loc} is missing (expected {human_size(need)})"
            size = data.stat().st_size
            if size < need:
                return (f"incomplete: {loc} is {human_size(size)}, expected "
                        f"{human_size(need)}")
    return None


def declared_context(folder: Path) -> int | None:
    """The context length a folder's JSON config declares (cheap; for broken folders)."""
    for name, keys in (("genai_config.json", ("model", "context_length")),
                       ("config.json", ("max_position_embeddings",))):
        try:
            value: Any = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class FolderFacts:
    """What a library shows about one model folder."""

    path: Path
    format: str  # see folder_format
    size_bytes: int
    weights_bytes: int
    context_length: int | None
    quantization: str  # "int4", "int8" or "" (float: see logits_dtype)
    logits_dtype: str
    fim: str | None  # the FIM token family; None: prefix-only completion
    chat_template: bool
    problem: str | None = None  # None: complete and readable
    warnings: tuple[str, ...] = ()


def _tokenizer_facts(folder: Path) -> tuple[str | None, bool, str | None]:
    """(FIM family, has a chat template, problem)."""
    try:
        tokenizer = Tokenizer.from_dir(folder)
    except EngineError as exc:
        return None, False, exc.message
    family = detect_fim_family(tokenizer)
    return (family.name if family else None), tokenizer.has_chat_template, None


def inspect_folder(folder: Path) -> FolderFacts:
    """Everything a library shows about one folder; never raises for a bad model."""
    size = folder_size(folder)
    fim, template, tok_problem = _tokenizer_facts(folder)
    fmt = folder_format(folder)
    try:
        md = load_model_dir(folder)
    except EngineError as exc:
        problem = completeness_problem(folder) or exc.message
        return FolderFacts(folder, fmt, size, 0, declared_context(folder), "", "", fim,
                           template, problem)
    except (OSError, ValueError) as exc:  # a file vanished or is unreadable mid-scan
        return FolderFacts(folder, fmt, size, 0, None, "", "", fim, template,
                           f"unreadable: {exc}")
    outputs = md.graph.outputs
    logits = outputs.get("logits") or next(iter(outputs.values()), None)
    return FolderFacts(folder, md.format, size, md.weights_bytes, md.context_length,
                       md.graph.quantization, str(getattr(logits, "dtype", "") or ""), fim,
                       template, tok_problem, tuple(md.warnings))
