"""GGUF files the user already has: Ollama's blob store and LM Studio's models folders.

- Ollama: ``$OLLAMA_MODELS``, else ``~/.ollama/models``. Each manifest under
  ``manifests/<registry>/<namespace>/<model>/<tag>`` lists its layers; the one of media type
  ``application/vnd.ollama.image.model`` is the GGUF, stored as
  ``blobs/sha256-<hex>``. The name shown is ``model:tag`` (``namespace/model:tag`` outside
  the ``library`` namespace).
- LM Studio: ``~/.lmstudio/models`` and the older ``~/.cache/lm-studio/models``, holding
  ``publisher/repo/file.gguf``; vision projectors (``mmproj*``) are not models and are left
  out.

No Qt here; reading manifests and listing folders is cheap (no GGUF is opened).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.paths import engine_command
from engine import import_work_dir

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    name: str  # what the user knows it as: "llama3.2:1b", "bartowski/Qwen.../file.gguf"
    source: str  # "Ollama" | "LM Studio"
    size: int

    @property
    def folder_name(self) -> str:
        """A model folder name for its import: letters, digits, ``.``, ``-`` and ``_``."""
        base = self.name.rsplit("/", 1)[-1]
        base = re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE).replace(":", "-")
        return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "gguf-model"


def ollama_models_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get("OLLAMA_MODELS"):
        return Path(env["OLLAMA_MODELS"]).expanduser()
    return Path.home() / ".ollama" / "models"


def lmstudio_dirs() -> list[Path]:
    return [Path.home() / ".lmstudio" / "models",
            Path.home() / ".cache" / "lm-studio" / "models"]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def find_ollama(models_dir: Path) -> Iterator[GGUFFile]:
    manifests = models_dir / "manifests"
    if not manifests.is_dir():
        return
    for dirpath, _dirs, files in os.walk(manifests):
        for tag in sorted(files):
            manifest = Path(dirpath) / tag
            try:
                layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
            except (OSError, ValueError, AttributeError):
                continue
            digest = next((layer.get("digest", "") for layer in layers
                           if isinstance(layer, dict)
                           and layer.get("mediaType") == OLLAMA_MODEL_LAYER), "")
            blob = models_dir / "blobs" / digest.replace(":", "-")
            if not digest or not blob.is_file():
                continue
            parts = manifest.relative_to(manifests).parts  # registry, namespace, model, tag
            model = "/".join(parts[1:-1]) if len(parts) >= 3 else parts[0]
            model = model.removeprefix("library/")
            yield GGUFFile(blob, f"{model}:{tag}", "Ollama", _size(blob))


def find_lmstudio(root: Path) -> Iterator[GGUFFile]:
    if not root.is_dir():
        return
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.lower().endswith(".gguf") or name.lower().startswith("mmproj"):
                continue
            path = Path(dirpath) / name
            yield GGUFFile(path, path.relative_to(root).as_posix(), "LM Studio", _size(path))


def find_gguf_files(env: Mapping[str, str] | None = None) -> list[GGUFFile]:
    """Every GGUF in Ollama's and LM Studio's default folders (each file once)."""
    found: list[GGUFFile] = []
    seen: set[str] = set()
    sources = [find_ollama(ollama_models_dir(env)), *map(find_lmstudio, lmstudio_dirs())]
    for source in sources:
        for item in source:
            key = str(item.path.resolve())
            if key not in seen:
                seen.add(key)
                found.append(item)
    return found


def import_command(gguf: Path, out_dir: Path) -> tuple[str, list[str]]:
    """The program and arguments that convert ``gguf`` into ``out_dir`` in a child process:
    the frozen app runs the engine's command line through ``--worker``."""
    return engine_command(["import-gguf", str(gguf), str(out_dir)])


def free_folder(parent: Path, name: str) -> Path:
    """``parent/name``, or ``name-2``, ``name-3``... when taken."""
    candidate, n = parent / name, 1
    while candidate.exists() or import_work_dir(candidate).exists():
        n += 1
        candidate = parent / f"{name}-{n}"
    return candidate
