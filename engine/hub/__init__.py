"""Models from the Hugging Face Hub (or anything speaking its API): the curated catalog,
fit labels for this machine, downloads with resume and verification, and ``pull``.

The app imports this package (and only this one below ``engine``) for its downloads.
"""

from engine.hub.download import (
    DEFAULT_ENDPOINT,
    PARTIAL_DIR,
    DownloadCancelled,
    DownloadError,
    DownloadOutcome,
    DownloadRequest,
    RemoteFile,
    Transfer,
    check_space,
    describe_outcome,
    disk_free,
    explain,
    file_digest,
    hub_endpoint,
    list_files,
    target_folder,
)

__all__ = [
    "DEFAULT_ENDPOINT", "PARTIAL_DIR", "DownloadCancelled", "DownloadError",
    "DownloadOutcome", "DownloadRequest", "RemoteFile", "Transfer", "check_space",
    "describe_outcome", "disk_free", "explain", "file_digest", "hub_endpoint", "list_files",
    "target_folder",
]
