"""A repository's file names become paths in the user's library: each must stay a plain
relative name on every system (a backslash or a drive inside one name would, on Windows,
write outside the library before the checksum is even read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.hub.download import (
    DownloadError,
    DownloadRequest,
    RemoteFile,
    Transfer,
    target_folder,
)


@pytest.mark.parametrize("name", ["..\\..\\AppData\\Roaming\\x.bat", "C:\\Users\\x\\evil.dll",
                                  "a/../../b.onnx", "/etc/passwd", "model/c:stream",
                                  "sub\\..\\..\\x"])
def test_a_file_name_that_leaves_the_folder_is_refused(tmp_path: Path, name: str):
    transfer = Transfer.__new__(Transfer)  # only the path mapping is exercised
    transfer.models_dir, transfer.request = tmp_path, DownloadRequest("org/model")
    with pytest.raises(DownloadError, match="unsafe path"):
        transfer._local(_remote(name))


def test_plain_names_map_inside_the_repository_folder(tmp_path: Path):
    transfer = Transfer.__new__(Transfer)
    transfer.models_dir, transfer.request = tmp_path, DownloadRequest("org/model")
    local = transfer._local(_remote("onnx/model.onnx"))
    assert local == tmp_path / "org" / "model" / "onnx" / "model.onnx"
    assert target_folder(tmp_path, DownloadRequest("org/model", "cpu/int4")) == \
        tmp_path / "org" / "model" / "cpu" / "int4"
    with pytest.raises(DownloadError, match="unsafe path"):
        target_folder(tmp_path, DownloadRequest("org/model", "..\\..\\x"))


def _remote(path: str) -> RemoteFile:
    return RemoteFile(path, 1, None, "0" * 40)
