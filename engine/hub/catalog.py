"""The curated catalog shipped with the engine (``catalog.json`` beside this module, its
schema in ``catalog.schema.json``): chat, code-completion and reasoning models this engine
runs, each as an ONNX folder of a Hub repository or a GGUF repository (converted by the
engine's importer on download).

The file names repositories and folders only, with the public listing each came from; what
a repository holds (files, sizes, hashes) is read from the Hub when the catalog is shown
(:mod:`engine.hub.fit`) and when a model is pulled (:mod:`engine.hub.pull`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from engine.errors import InvalidOptionError

CATALOG_FILE = Path(__file__).with_name("catalog.json")
KINDS = ("chat", "code", "reasoning")
FORMATS = ("onnx", "gguf")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    title: str
    kind: str  # chat | code | reasoning
    size: str  # small | medium
    format: str  # onnx | gguf
    repo: str
    subfolder: str  # onnx: the model's folder in the repo ("" = the root)
    files: str  # gguf: a glob for the files to choose among
    parameters: str
    quantization: str
    context: int
    license: str
    fim: str | None
    tools: bool
    reasoning: bool
    source: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _entry(raw: Any, where: str) -> CatalogEntry:
    if not isinstance(raw, dict):
        raise InvalidOptionError("catalog", f"{where}: expected an object, got {raw!r}")
    fmt = raw.get("format")
    want: dict[str, type | tuple[type, ...]] = {
        "name": str, "title": str, "kind": str, "size": str, "format": str, "repo": str,
        "parameters": str, "quantization": str, "context": int, "license": str,
        "fim": (str, type(None)), "tools": bool, "reasoning": bool, "source": str,
        ("subfolder" if fmt == "onnx" else "files"): str}
    for key, kind in want.items():
        if key not in raw or not isinstance(raw[key], kind) or (
                kind is int and isinstance(raw[key], bool)):
            raise InvalidOptionError("catalog", f"{where}: field {key!r} is missing or of the "
                                     f"wrong type (got {raw.get(key)!r})",
                                     hint="see engine/hub/catalog.schema.json")
    unknown = set(raw) - set(want)
    problems = [
        (fmt not in FORMATS, f"format must be one of {', '.join(FORMATS)}"),
        (raw["kind"] not in KINDS, f"kind must be one of {', '.join(KINDS)}"),
        (raw["size"] not in ("small", "medium"), "size must be small or medium"),
        (not _NAME.fullmatch(raw["name"]), "name: lower-case letters, digits, . _ -"),
        (not _REPO.fullmatch(raw["repo"]), "repo must be owner/name"),
        (not raw["source"].startswith("https://"), "source must be an https:// address"),
        (bool(unknown), f"unknown fields {sorted(unknown)}"),
    ]
    for bad, why in problems:
        if bad:
            raise InvalidOptionError("catalog", f"{where} ({raw.get('name')!r}): {why}",
                                     hint="see engine/hub/catalog.schema.json")
    return CatalogEntry(raw["name"], raw["title"], raw["kind"], raw["size"], str(fmt),
                        raw["repo"], raw.get("subfolder", "").strip("/"),
                        raw.get("files", ""), raw["parameters"], raw["quantization"],
                        raw["context"], raw["license"], raw["fim"], raw["tools"],
                        raw["reasoning"], raw["source"])


def parse_catalog(data: Any) -> tuple[CatalogEntry, ...]:
    """The entries of a catalog document; InvalidOptionError naming the entry and field
    when one is malformed or two share a name."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise InvalidOptionError("catalog", "expected an object with a 'models' list")
    entries = tuple(_entry(raw, f"models[{i}]") for i, raw in enumerate(data["models"]))
    names = [e.name for e in entries]
    doubles = sorted({n for n in names if names.count(n) > 1})
    if doubles:
        raise InvalidOptionError("catalog", f"names used twice: {', '.join(doubles)}")
    return entries


@cache
def load_catalog(path: Path = CATALOG_FILE) -> tuple[CatalogEntry, ...]:
    return parse_catalog(json.loads(path.read_text(encoding="utf-8")))


def find_entry(name: str, entries: tuple[CatalogEntry, ...] | None = None
               ) -> CatalogEntry | None:
    for entry in load_catalog() if entries is None else entries:
        if entry.name == name.strip().lower():
            return entry
    return None
