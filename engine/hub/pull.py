"""``pull``: a catalog name or a repository into a model folder of the library.

``NAME`` (a catalog entry), ``REPO`` or ``REPO:FILE`` (a GGUF file, or its quantization:
``owner/name:Q8_0``). The steps, each reported to ``progress``:

1. read the repository (files, sizes, the model's shape) and choose what to take: an ONNX
   folder, or the GGUF file that fits best (Q4_K_M when several do), saying which;
2. check the disk before the first byte (the download, and for a GGUF its conversion);
3. download into a hidden staging folder of the library (``.pull-<name>``), resumed where a
   previous try stopped, every file verified against the Hub's hash;
4. GGUF: convert with the engine's importer; ONNX: check the folder is whole; write
   ``pull.json`` (where it came from; for a "fits with a shorter context (N tokens)" label,
   ``context_length`` N: the worker loads it with that context, :func:`pulled_context`);
5. rename the finished folder into place (atomic on one drive): the library never shows a
   half-written model. A failure leaves a clear message and no model folder (the staging
   folder stays only to resume an interrupted download; a corrupt file is removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import psutil

from engine.config import EngineConfig
from engine.errors import EngineError
from engine.hub.browse import NotSupported, Variant, best, variants
from engine.hub.catalog import CatalogEntry, find_entry
from engine.hub.download import (
    DownloadCancelled,
    DownloadError,
    DownloadRequest,
    FreeSpace,
    Transfer,
    check_space,
    disk_free,
    explain,
    hub_endpoint,
)
from engine.hub.fit import SHORTER, Bandwidth
from engine.model.folders import completeness_problem, human_size

PULL_FILE = "pull.json"
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class PullEvent:
    """One step: ``status`` in words; bytes ``completed`` of ``total`` while downloading."""

    status: str
    completed: int | None = None
    total: int | None = None
    digest: str | None = None


@dataclass(frozen=True)
class PullResult:
    folder: Path
    variant: Variant
    entry: CatalogEntry | None
    already: bool = False

    @property
    def summary(self) -> str:
        v = self.variant
        what = (f"{PurePosixPath(v.path).name} ({v.quant})" if v.format == "gguf"
                else f"{v.repo}/{v.path}" if v.path else v.repo)
        chosen = (f"took {what}, the best that fits here ({v.fit.text})"
                  if v.format == "gguf" else f"took {what} ({v.fit.text})")
        done = "already in the library" if self.already else "ready"
        short = (f"; it loads with a {self.context_length}-token context"
                 if self.context_length else "")
        return f"{chosen}{short}; {done}: {self.folder}"

    @property
    def context_length(self) -> int | None:
        """The shorter context the label gave (the one the model loads with), if any."""
        return shorter_context(self.variant)


def shorter_context(variant: Variant) -> int | None:
    """N of "fits with a shorter context (N tokens)"; None for the other labels."""
    return variant.fit.kv_tokens if variant.fit.label == SHORTER else None


def pulled_context(folder: Path) -> int | None:
    """The context a pulled model loads with: the N its label gave when it was pulled
    (``context_length`` in its ``pull.json``), or None (its own context)."""
    try:
        value = json.loads((Path(folder) / PULL_FILE).read_text(encoding="utf-8")
                           ).get("context_length")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 16 \
        else None


def parse_spec(spec: str, entries: tuple[CatalogEntry, ...] | None = None
               ) -> tuple[CatalogEntry | None, str, str | None]:
    """(catalog entry or None, repo, file or quantization or None) from ``NAME`` (of
    ``entries``, default the shipped catalog), ``REPO`` or ``REPO:FILE``."""
    text = spec.strip()
    entry = find_entry(text, entries)
    if entry is not None:
        return entry, entry.repo, None
    repo, _, file = text.partition(":")
    if not _REPO.fullmatch(repo):
        raise NotSupported(f"{spec!r} is neither a catalog name nor a repository: expected "
                           "NAME (python -m engine catalog lists them), owner/name or "
                           "owner/name:FILE.gguf (or owner/name:Q4_K_M)")
    return None, repo, file or None


def folder_name(entry: CatalogEntry | None, variant: Variant) -> str:
    base = entry.name if entry else variant.repo.split("/")[-1]
    if variant.format == "gguf":
        base = re.sub(r"-gguf$", "", base, flags=re.IGNORECASE)
        base = f"{base}-{variant.quant.lower()}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.") or "model"


def pull(spec: str, models_dir: Path, *, endpoint: str = "",
         config: EngineConfig | None = None, progress: Callable[[PullEvent], None] = print,
         cancelled: Callable[[], bool] = lambda: False,
         free_space: FreeSpace = disk_free,
         bandwidth: Bandwidth = None,
         entries: tuple[CatalogEntry, ...] | None = None) -> PullResult:
    """Pull ``spec`` into ``models_dir``; raises DownloadError (NotSupported,
    DownloadCancelled) with the sentence to show."""
    endpoint = hub_endpoint(endpoint)
    entry, repo, file = parse_spec(spec, entries)
    progress(PullEvent("pulling manifest"))
    try:
        found = variants(repo, endpoint=endpoint, config=config, bandwidth=bandwidth,
                         subfolder=entry.subfolder if entry and entry.format == "onnx" else None,
                         pattern=(entry.files if entry and entry.format == "gguf"
                                  else "*.gguf"))
    except DownloadError:
        raise
    except Exception as exc:
        raise DownloadError(explain(exc, DownloadRequest(repo, endpoint=endpoint))) from exc
    variant = best(found, file)
    if variant.fit.label == "too big":
        raise NotSupported(f"{variant.path or repo} is too big for this machine: "
                           f"{variant.fit.details()}")
    if variant.format == "gguf":
        progress(PullEvent(f"chose {PurePosixPath(variant.path).name} ({variant.quant}): "
                           f"{variant.fit.text}"))
    models_dir = Path(models_dir)
    final = models_dir / folder_name(entry, variant)
    if final.exists():
        if completeness_problem(final) is None:
            progress(PullEvent("success"))
            return PullResult(final, variant, entry, already=True)
        raise DownloadError(f"{final} exists but is not a whole model; remove it first")
    staging = models_dir / f".pull-{final.name}"
    models_dir.mkdir(parents=True, exist_ok=True)
    with _pulling(staging):
        return _pull_into(staging, final, spec, entry, variant, endpoint, progress, cancelled,
                          free_space)


@contextlib.contextmanager
def _pulling(staging: Path) -> Iterator[None]:
    """One pull of a model at a time (two threads of the worker, the CLI beside it): they
    would write the same staging files and remove them under each other. A lock file
    names the process; one left by a process that is gone is taken over."""
    lock = staging.with_name(staging.name + ".lock")
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(lock.read_text(encoding="utf-8").strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner and psutil.pid_exists(owner):
                raise DownloadError(
                    f"{staging.name[len('.pull-'):]} is already being pulled (process "
                    f"{owner}); wait for that pull to finish, or cancel it") from None
            lock.unlink(missing_ok=True)  # its process is gone: take it over
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(str(os.getpid()))
        break
    else:
        raise DownloadError(f"could not take the pull lock {lock}")
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _pull_into(staging: Path, final: Path, spec: str, entry: CatalogEntry | None,
               variant: Variant, endpoint: str, progress: Callable[[PullEvent], None],
               cancelled: Callable[[], bool], free_space: FreeSpace) -> PullResult:
    if final.exists() and completeness_problem(final) is None:  # the pull we waited on
        progress(PullEvent("success"))
        return PullResult(final, variant, entry, already=True)
    # the download, and for a GGUF the converted folder beside it
    needed = variant.download_bytes + (variant.fit.weights_bytes
                                       if variant.format == "gguf" else 0)
    have = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file()) \
        if staging.exists() else 0
    check_space(final.parent, max(0, needed - have), free_space)
    try:
        made = _download(variant, staging, endpoint, progress, cancelled, free_space)
        if variant.format == "gguf":
            progress(PullEvent(f"converting {PurePosixPath(variant.path).name} with the "
                               "engine's importer"))
            made = _convert(made, staging / "model", cancelled)
        problem = completeness_problem(made)
        if problem:
            raise _Unusable(f"the downloaded model is not usable: {problem}")
        progress(PullEvent("writing manifest"))
        (made / PULL_FILE).write_text(json.dumps(_record(spec, entry, variant), indent=2)
                                      + "\n", encoding="utf-8")
        os.replace(made, final)
    except (DownloadCancelled, KeyboardInterrupt):
        raise
    except (_Unusable, EngineError):  # what was downloaded cannot become a model
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except (DownloadError, OSError):
        # a dropped connection, a server error, a full disk, one file that failed its
        # checksum (removed by the transfer): the verified files and the parts stay, and
        # the next pull continues from them
        _drop_if_empty(staging)
        raise
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    progress(PullEvent("success"))
    return PullResult(final, variant, entry)


def _sentence(stage: str) -> str:
    text = stage.rstrip("…")
    return text[:1].lower() + text[1:]


class _Unusable(DownloadError):
    """What was downloaded is whole but cannot become a model: nothing to continue."""


def _drop_if_empty(staging: Path) -> None:
    if staging.exists() and not any(p.is_file() for p in staging.rglob("*")):
        shutil.rmtree(staging, ignore_errors=True)


def _download(variant: Variant, staging: Path, endpoint: str,
              progress: Callable[[PullEvent], None], cancelled: Callable[[], bool],
              free_space: FreeSpace) -> Path:
    """The files of ``variant`` under ``staging``; the model folder (ONNX) or the file
    (GGUF)."""
    request = DownloadRequest(variant.repo, variant.path if variant.format == "onnx" else "",
                              endpoint=endpoint)
    digest = variant.files[0].tag if variant.files else None

    def report(done: int, total: int, name: str) -> None:
        progress(PullEvent(f"downloading {name or variant.repo}", done, total, digest))

    transfer = Transfer(request, staging, report,
                        lambda stage: progress(PullEvent(_sentence(stage))),
                        cancelled, free_space=free_space,
                        files=(variant.commit, list(variant.files)))
    try:
        outcome = transfer.run()
    except (DownloadError, DownloadCancelled):
        raise
    except Exception as exc:
        raise DownloadError(explain(exc, request)) from exc
    if variant.format == "gguf":
        return staging.joinpath(*variant.repo.split("/"), *PurePosixPath(variant.path).parts)
    return outcome.target


def _convert(gguf: Path, out: Path, cancelled: Callable[[], bool]) -> Path:
    from engine.model.gguf import import_gguf

    shutil.rmtree(out, ignore_errors=True)
    try:
        import_gguf(gguf, out, cancel=cancelled)
    except EngineError as exc:
        raise _Unusable(f"{gguf.name} could not be converted: {exc}") from exc
    return out


def _record(spec: str, entry: CatalogEntry | None, v: Variant) -> dict[str, Any]:
    return {"pulled": spec, "catalog_entry": entry.name if entry else None, "repo": v.repo,
            "format": v.format, "path": v.path, "quantization": v.quant,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in v.files],
            "label_when_pulled": v.fit.text,
            # the model loads with this context (POST /v1/models/load, the app) so that
            # its KV stays within the limit the label was judged under
            "context_length": shorter_context(v),
            "download": human_size(v.download_bytes)}
