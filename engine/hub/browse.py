"""What a repository offers this machine: its runnable variants (an ONNX folder, or each
GGUF file with its quantization), each with its size read from the Hub and its fit label
(:mod:`engine.hub.fit`); and the catalog's entries with theirs.

A repository holding nothing this engine runs (safetensors only, an ONNX export without a
decoder config, a GGUF of an architecture the importer does not convert) is refused with
:class:`NotSupported`, saying why and what would do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from engine.config import EngineConfig
from engine.hub.catalog import CatalogEntry, load_catalog
from engine.hub.download import DownloadError, RemoteFile, explain, hub_endpoint
from engine.hub.fit import FITS, SHORTER, Bandwidth, Fit, assess, import_factor
from engine.hub.remote import (
    Listing,
    gguf_files,
    gguf_metadata,
    gguf_shape,
    list_repo,
    onnx_kv_bytes,
    onnx_shape,
    quant_of,
    read_json,
)

PREFERRED_QUANT = "Q4_K_M"
_WEIGHT_SUFFIXES = (".onnx", ".onnx.data", ".onnx_data", ".data")


class NotSupported(DownloadError):
    """A repository (or file) this engine cannot run, and why."""


@dataclass(frozen=True)
class Variant:
    """One thing to pull: an ONNX folder, or one GGUF file."""

    repo: str
    format: str  # onnx | gguf
    path: str  # onnx: the folder ("" = root); gguf: the file
    quant: str
    download_bytes: int
    fit: Fit
    files: tuple[RemoteFile, ...]
    commit: str = "main"

    def as_dict(self) -> dict[str, Any]:
        return {"repo": self.repo, "format": self.format, "path": self.path,
                "quantization": self.quant, "download_bytes": self.download_bytes,
                "fit": self.fit.as_dict()}


def _folder(path: str) -> str:
    parent = str(PurePosixPath(path).parent)
    return "" if parent == "." else parent


def _onnx_folders(listing: Listing) -> list[str]:
    return sorted({_folder(f.path) for f in listing.files if f.path.endswith(".onnx")})


def onnx_variant(listing: Listing, folder: str, config: EngineConfig,
                 bandwidth: Bandwidth) -> Variant:
    repo, endpoint = listing.request.repo_id, listing.request.endpoint
    files = [f for f in listing.under(folder) if _folder(f.path) == folder.strip("/")]
    names = {PurePosixPath(f.path).name for f in files}
    prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
    if "genai_config.json" in names:
        config_json, genai = read_json(repo, prefix + "genai_config.json", endpoint,
                                       listing.commit), True
    elif "config.json" in names:
        config_json, genai = read_json(repo, prefix + "config.json", endpoint,
                                       listing.commit), False
    else:
        raise NotSupported(f"{repo}/{folder or '.'} has an ONNX file but no genai_config.json "
                           "or config.json: the engine cannot tell the model's shape")
    if "tokenizer.json" not in names:
        raise NotSupported(f"{repo}/{folder or '.'} has no tokenizer.json beside the model")
    shape = onnx_shape(config_json, genai, onnx_kv_bytes(folder))
    weights = sum(f.size for f in files if f.path.endswith(_WEIGHT_SUFFIXES))
    quant = "int4" if "int4" in folder.lower() else ("fp16" if "fp16" in folder.lower()
                                                    else "as exported")
    fit = assess(weights, shape, config, bandwidth=bandwidth, quantized=quant == "int4")
    return Variant(repo, "onnx", folder.strip("/"), quant, sum(f.size for f in files), fit,
                   tuple(files), listing.commit)


def gguf_variants(listing: Listing, pattern: str, config: EngineConfig,
                  bandwidth: Bandwidth) -> list[Variant]:
    repo, endpoint = listing.request.repo_id, listing.request.endpoint
    found = gguf_files(listing.files, pattern)
    if not found:
        return []
    # one header read: the quantizations of a repository share the model's shape
    shape = gguf_shape(gguf_metadata(repo, found[0].path, endpoint, listing.commit))
    out = []
    for f in sorted(found, key=lambda f: f.size):
        quant = quant_of(f.path) or "unknown"
        weights = int(f.size * import_factor(quant))
        fit = assess(weights, shape, config, bandwidth=bandwidth, estimated=True,
                     quantized=not quant.upper().startswith(("F16", "F32", "BF16")))
        out.append(Variant(repo, "gguf", f.path, quant, f.size, fit, (f,), listing.commit))
    return out


def variants(repo: str, *, endpoint: str = "", subfolder: str | None = None,
             pattern: str = "*.gguf", config: EngineConfig | None = None,
             bandwidth: Bandwidth = None) -> list[Variant]:
    """Everything ``repo`` offers that this engine runs, smallest first; NotSupported when
    nothing."""
    config = config or EngineConfig()
    listing = list_repo(repo, hub_endpoint(endpoint))
    ggufs = gguf_variants(listing, pattern, config, bandwidth)
    if ggufs:
        return ggufs
    folders = [subfolder.strip("/")] if subfolder is not None else _onnx_folders(listing)
    folders = [f for f in folders if any(x.path.endswith(".onnx") for x in listing.under(f))]
    if not folders:
        kinds = sorted({PurePosixPath(f.path).suffix or PurePosixPath(f.path).name
                        for f in listing.files})
        where = f"the folder '{subfolder}' of " if subfolder else ""
        raise NotSupported(
            f"{where}'{repo}' holds nothing this engine runs ({', '.join(kinds[:8])}): it runs "
            "ONNX exports (onnxruntime-genai's builder, optimum) and GGUF files (llama, "
            "mistral, qwen2, qwen3); pick a repository with an ONNX export or GGUF files, or "
            "export this one with onnxruntime-genai's builder")
    return [onnx_variant(listing, f, config, bandwidth) for f in folders]


def best(found: list[Variant], quant: str | None = None) -> Variant:
    """The one to pull: the file asked for; else the best that fits — Q4_K_M when several
    do, otherwise the largest that fits — then the best that fits with a shorter context;
    NotSupported (with the governor's figures) when every one is too big."""
    if quant:
        named = [v for v in found if v.quant.upper() == quant.upper()
                 or PurePosixPath(v.path).name == quant]
        if not named:
            raise NotSupported(f"no file {quant!r} in {found[0].repo if found else 'it'}; "
                               f"it has: {', '.join(v.quant for v in found)}")
        return named[0]
    for label in (FITS, SHORTER):
        fitting = [v for v in found if v.fit.label == label]
        preferred = [v for v in fitting if v.quant.upper() == PREFERRED_QUANT]
        if preferred or fitting:
            return (preferred or sorted(fitting, key=lambda v: v.download_bytes))[-1]
    smallest = min(found, key=lambda v: v.download_bytes)
    raise NotSupported(f"too big for this machine: even {smallest.path or smallest.repo} "
                       f"({smallest.quant}) does not fit. {smallest.fit.details()}")


@dataclass(frozen=True)
class CatalogRow:
    entry: CatalogEntry
    choice: Variant | None
    problem: str | None  # why there is no label (Hub not reached, not supported...)

    def as_dict(self) -> dict[str, Any]:
        return {**self.entry.as_dict(),
                "choice": None if self.choice is None else self.choice.as_dict(),
                "problem": self.problem}


def catalog_rows(*, endpoint: str = "", config: EngineConfig | None = None,
                 bandwidth: Bandwidth = None,
                 entries: tuple[CatalogEntry, ...] | None = None) -> list[CatalogRow]:
    """Each catalog entry with what this machine would get and its label; an entry whose
    repository could not be read carries the reason instead."""
    from engine.hub.download import DownloadRequest

    rows = []
    reached = True
    for entry in load_catalog() if entries is None else entries:
        if not reached:
            rows.append(CatalogRow(entry, None, "the Hub was not reached"))
            continue
        try:
            found = variants(entry.repo, endpoint=endpoint, config=config, bandwidth=bandwidth,
                             subfolder=(entry.subfolder or None) if entry.format == "onnx"
                             else None,
                             pattern=entry.files or "*.gguf")
            try:
                choice = best(found)
            except NotSupported:
                choice = min(found, key=lambda v: v.download_bytes)
            rows.append(CatalogRow(entry, choice, None))
        except Exception as exc:
            where = hub_endpoint(endpoint)
            why = explain(exc, DownloadRequest(entry.repo, endpoint=where))
            if why.startswith("no network"):
                reached = False
                why = f"the Hub was not reached ({where}: {type(exc).__name__})"
            rows.append(CatalogRow(entry, None, why))
    return rows


#: The welcome's suggestions decode at least this fast here (when the speed is known): a
#: reading pace, so a bigger model that would crawl is not the one suggested.
PICK_TOKENS_PER_SECOND = 5.0


def billions(parameters: str) -> float:
    """``"1.5B"`` -> 1.5, ``"135M"`` -> 0.135 (0 when unreadable)."""
    text = parameters.strip().upper()
    scale = {"B": 1.0, "M": 1e-3}.get(text[-1:], 0.0)
    try:
        return float(text[:-1]) * scale
    except ValueError:
        return 0.0


def best_picks(rows: list[CatalogRow], kinds: tuple[str, ...] = ("chat", "code")
               ) -> dict[str, CatalogRow]:
    """For each of ``kinds``, the catalog entry to suggest on this machine: among those
    labelled "fits" (their whole context), the largest that decodes at
    :data:`PICK_TOKENS_PER_SECOND` or more here; when none is that fast, the fastest one
    that fits. A kind with nothing that fits has no pick."""
    def speed(row: CatalogRow) -> float | None:
        return row.choice.fit.tokens_per_second if row.choice is not None else None

    picks: dict[str, CatalogRow] = {}
    for kind in kinds:
        fitting = [r for r in rows if r.entry.kind == kind and r.choice is not None
                   and r.choice.fit.label == FITS]
        quick = [r for r in fitting if (speed(r) or PICK_TOKENS_PER_SECOND)
                 >= PICK_TOKENS_PER_SECOND]
        if quick:
            picks[kind] = max(quick, key=lambda r: billions(r.entry.parameters))
        elif fitting:
            picks[kind] = max(fitting, key=lambda r: speed(r) or 0.0)
    return picks
