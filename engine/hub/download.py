"""Model downloads from the Hugging Face Hub (or anything speaking its API) into a model
folder: progress, cancel, resume, verification, errors in words. No Qt here: the app runs
:class:`Transfer` on a thread (``app.download``), the worker and ``python -m engine pull``
call it directly.

huggingface_hub (2.x) supplies the protocol: ``HfApi(endpoint=...).model_info`` (the
commit), ``list_repo_tree`` (paths, sizes, the sha256 of LFS files, the git oid of the
others), ``hf_hub_url``, ``build_hf_headers``, ``http_stream_backoff`` and
``hf_raise_for_status`` (its error types). The bytes are written here: huggingface_hub 2.x
writes each download to a process-unique temporary file and deletes it on failure (no
resume between calls), so a cancelled multi-gigabyte file would start again from zero.
Each file goes to ``<target>/.download/<name>.<oid>.part`` and is continued with an HTTP
``Range`` request; the oid in the name keeps bytes of another version from being
appended. Finished files are verified (sha256 for LFS files, the git blob hash for the
others), moved into place, and the folder gets the library's completeness check.

A repo ``owner/name`` with subfolder ``sub`` lands in ``models_dir/owner/name/sub``.
The endpoint: the app setting, else ``$HF_ENDPOINT``, else https://huggingface.co.
The free-space check asks ``free_space`` (``shutil.disk_usage`` unless a caller gives its
own, as the tests do to stand for a full disk).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import urlparse

from engine.model.folders import completeness_problem, human_size

DEFAULT_ENDPOINT = "https://huggingface.co"
PARTIAL_DIR = ".download"
_REPORT_EVERY_S = 0.1
_SPACE_MARGIN = 64 * 10**6


class DownloadError(Exception):
    """A download that cannot go on, in words."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DownloadCancelled(Exception):
    """The user pressed Cancel; the partial files stay for a resume."""


@dataclass(frozen=True)
class DownloadRequest:
    repo_id: str
    subfolder: str = ""
    revision: str = "main"
    endpoint: str = DEFAULT_ENDPOINT

    @property
    def label(self) -> str:
        return "/".join(p for p in (self.repo_id, self.subfolder.strip("/")) if p)


@dataclass(frozen=True)
class RemoteFile:
    path: str  # in the repo
    size: int
    sha256: str | None  # LFS files
    git_oid: str

    @property
    def tag(self) -> str:
        return (self.sha256 or self.git_oid)[:16]


@dataclass(frozen=True)
class DownloadOutcome:
    target: Path
    files: int
    total_bytes: int
    problem: str | None  # the completeness check's finding; None: a whole model


def hub_endpoint(configured: str = "") -> str:
    return (configured.strip() or os.environ.get("HF_ENDPOINT", "").strip()
            or DEFAULT_ENDPOINT).rstrip("/")


def target_folder(models_dir: Path, request: DownloadRequest) -> Path:
    sub = request.subfolder.strip("/")
    return models_dir.joinpath(*_safe_parts(request.repo_id, "repo id"),
                               *(_safe_parts(sub, "subfolder") if sub else ()))


def _safe_parts(path: str, what: str = "file") -> tuple[str, ...]:
    """``path``'s parts, each a plain name on every system: no ``..``, no anchor, no
    backslash or drive colon (Windows would read ``..\\x`` or ``C:\\x`` inside one part
    as a path of its own and write outside the library)."""
    parts = PurePosixPath(path).parts
    if (not parts or path.startswith("/") or ".." in parts
            or any("\\" in p or ":" in p or p in (".", "") for p in parts)
            or PureWindowsPath(path).anchor):
        raise DownloadError(f"the hub listed a {what} with an unsafe path: {path!r} (a "
                            "repository's files must be plain relative names)")
    return parts


def list_files(request: DownloadRequest) -> tuple[str, list[RemoteFile]]:
    """(commit, the files under the subfolder) from the hub's metadata."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import EntryNotFoundError

    api = HfApi(endpoint=request.endpoint)
    info = api.model_info(request.repo_id, revision=request.revision)
    commit = info.sha or request.revision
    sub = request.subfolder.strip("/") or None
    try:
        entries = list(api.list_repo_tree(request.repo_id, path_in_repo=sub, recursive=True,
                                          revision=commit))
    except EntryNotFoundError as exc:
        raise DownloadError(f"'{request.repo_id}' has no folder '{sub}'") from exc
    files = [RemoteFile(e.path, int(e.size), e.lfs.sha256 if e.lfs else None, e.blob_id)
             for e in entries if isinstance(e, RepoFile)]
    if not files:
        where = f"the folder '{sub}' of " if sub else ""
        raise DownloadError(f"{where}'{request.repo_id}' holds no files")
    return commit, files


FreeSpace = Callable[[Path], int]


def disk_free(folder: Path) -> int:
    """Free bytes on the drive of ``folder`` (the nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_space(folder: Path, needed: int, free_space: FreeSpace = disk_free) -> None:
    """Raise DownloadError, naming both sizes, when ``needed`` bytes (and a 64 MB margin)
    are more than ``folder``'s drive has free."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = free_space(probe)
    if needed + _SPACE_MARGIN > free:
        raise DownloadError(f"disk full: the download needs {human_size(needed)} more and "
                            f"{human_size(free)} is free on {probe}; free some space or "
                            "download to another drive")


def file_digest(path: Path, remote: RemoteFile) -> str:
    """sha256 for LFS files, else the git blob hash (sha1 of ``blob <size>\\0`` + bytes)."""
    if remote.sha256:
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1()
        digest.update(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class Transfer:
    """One download run: counts bytes, reports progress at most every 0.1 s, and raises
    DownloadCancelled between two network reads once ``cancelled()`` is true."""

    def __init__(self, request: DownloadRequest, models_dir: Path,
                 progress: Callable[[int, int, str], None], stage: Callable[[str], None],
                 cancelled: Callable[[], bool], *, free_space: FreeSpace = disk_free,
                 files: tuple[str, list[RemoteFile]] | None = None) -> None:
        self.request = request
        self.free_space = free_space
        self._listing = files  # (commit, files) already read from the hub, or None
        self.models_dir = models_dir
        self.target = target_folder(models_dir, request)
        self.partial = self.target / PARTIAL_DIR
        self._progress, self._stage, self._cancelled = progress, stage, cancelled
        self.done = self.total = 0
        self._last = 0.0

    def run(self) -> DownloadOutcome:
        self._stage(f"Asking {urlparse(self.request.endpoint).netloc} about "
                    f"{self.request.label}…")
        commit, files = self._listing or list_files(self.request)
        self.total = sum(f.size for f in files)
        todo = [f for f in files if not self._complete(f)]
        self.done = self.total - sum(f.size for f in todo)
        self.done += sum(min(self._part(f).stat().st_size, f.size) for f in todo
                         if self._part(f).is_file())
        check_space(self.target, self.total - self.done, self.free_space)
        self._report("", force=True)
        for remote in todo:
            self._fetch(remote, commit)
        shutil.rmtree(self.partial, ignore_errors=True)
        self._stage("Checking the model folder…")
        return DownloadOutcome(self.target, len(files), self.total,
                               completeness_problem(self.target))

    def _local(self, remote: RemoteFile) -> Path:
        return self.models_dir.joinpath(*self.request.repo_id.split("/"),
                                        *_safe_parts(remote.path))

    def _part(self, remote: RemoteFile) -> Path:
        return self.partial / f"{'__'.join(_safe_parts(remote.path))}.{remote.tag}.part"

    def _complete(self, remote: RemoteFile) -> bool:
        local = self._local(remote)
        return local.is_file() and local.stat().st_size == remote.size

    def _report(self, name: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= _REPORT_EVERY_S:
            self._last = now
            self._progress(self.done, self.total, name)

    def _fetch(self, remote: RemoteFile, commit: str) -> None:
        part = self._part(remote)
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.is_file() else 0
        if have > remote.size:
            self.done -= min(have, remote.size)
            part.unlink()
            have = 0
        if have < remote.size:
            self._stream(remote, commit, part, have)
        self._stage(f"Verifying {remote.path}…")
        if file_digest(part, remote) != (remote.sha256 or remote.git_oid):
            part.unlink()
            self.done -= remote.size
            raise DownloadError(f"{remote.path} failed verification (its checksum differs "
                                "from the hub's); the file was removed: download again")
        local = self._local(remote)
        local.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, local)
        self._report(remote.path, force=True)

    def _stream(self, remote: RemoteFile, commit: str, part: Path, have: int) -> None:
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

        url = hf_hub_url(self.request.repo_id, remote.path, revision=commit,
                         endpoint=self.request.endpoint)
        headers = build_hf_headers()
        if have:
            headers["Range"] = f"bytes={have}-"
        self._stage(f"Downloading {remote.path}")
        with http_stream_backoff("GET", url, headers=headers,
                                 timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                                 retry_on_exceptions=(),
                                 retry_on_status_codes=(408, 429)) as response:
            hf_raise_for_status(response)
            if have and response.status_code == 200:  # the server ignored the Range
                self.done -= have
                have = 0
            with part.open("ab" if have else "wb") as out:
                for chunk in response.iter_bytes():
                    if self._cancelled():
                        raise DownloadCancelled
                    out.write(chunk)
                    self.done += len(chunk)
                    self._report(remote.path)
        if part.stat().st_size != remote.size:
            raise DownloadError(f"{remote.path}: the connection ended after "
                                f"{human_size(part.stat().st_size)} of "
                                f"{human_size(remote.size)}; download again to continue")


def explain(exc: BaseException, request: DownloadRequest) -> str:
    """An exception from a download, as a sentence a user can act on."""
    import httpx2
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    host = urlparse(request.endpoint).netloc or request.endpoint
    if isinstance(exc, DownloadError):
        return exc.message
    if isinstance(exc, GatedRepoError):
        return (f"'{request.repo_id}' is gated: accept its terms on {host} and log in "
                "(hf auth login), then download again")
    if isinstance(exc, RepositoryNotFoundError):
        return (f"the repository '{request.repo_id}' was not found on {host}; check its name "
                "(owner/name) — a private repository also needs a login (hf auth login)")
    if isinstance(exc, RevisionNotFoundError):
        return f"'{request.repo_id}' has no revision '{request.revision}'"
    if isinstance(exc, EntryNotFoundError):
        return f"a file listed by '{request.repo_id}' is not on {host} any more"
    if isinstance(exc, HFValidationError):
        return (f"'{request.repo_id}' is not a repository id: expected owner/name, e.g. "
                "microsoft/Phi-3-mini-4k-instruct-onnx")
    if isinstance(exc, (httpx2.TransportError, OfflineModeIsEnabled, ConnectionError)):
        return (f"no network: {host} could not be reached ({type(exc).__name__}); try again "
                "later (a download continues where it stopped)")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return f"{host} answered HTTP {status}: {str(exc).splitlines()[0]}"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return "disk full: free some space, then download again (it continues where it stopped)"
    if isinstance(exc, OSError):
        return f"could not write the model files: {exc.strerror or exc}"
    return f"the download failed: {type(exc).__name__}: {exc}"


def describe_outcome(outcome: DownloadOutcome) -> str:
    """The sentence shown when a download ends."""
    where = f"{outcome.files} files, {human_size(outcome.total_bytes)} in {outcome.target}"
    if outcome.problem:
        return f"Downloaded {where}, but the model is not usable: {outcome.problem}"
    return f"Downloaded and verified {where}"
