"""Models from the Hugging Face Hub (or anything speaking its API): the curated catalog,
fit labels for this machine, downloads with resume and verification, and ``pull``.

The app imports this package (and only this one below ``engine``) for its downloads.
"""

from engine.hub.bandwidth import ReadSpeed, read_bandwidth, read_speed
from engine.hub.browse import (
    CatalogRow,
    NotSupported,
    Variant,
    best_picks,
    catalog_rows,
    variants,
)
from engine.hub.catalog import CatalogEntry, find_entry, load_catalog
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
from engine.hub.fit import Fit
from engine.hub.pull import PullEvent, PullResult, pull
from engine.hub.search import SearchHit, search_hub

#: ``pull`` under a name no module of this package has (``engine.hub.pull`` is one)
pull_model = pull

__all__ = [
    "DEFAULT_ENDPOINT", "PARTIAL_DIR", "CatalogEntry", "CatalogRow", "DownloadCancelled",
    "DownloadError", "DownloadOutcome", "DownloadRequest", "Fit", "NotSupported",
    "PullEvent", "PullResult", "ReadSpeed", "RemoteFile", "SearchHit", "Transfer",
    "Variant", "best_picks", "catalog_rows",
    "check_space", "describe_outcome", "disk_free", "explain", "file_digest", "find_entry",
    "hub_endpoint", "list_files", "load_catalog", "pull", "pull_model", "read_bandwidth",
    "read_speed", "search_hub", "target_folder", "variants",
]
