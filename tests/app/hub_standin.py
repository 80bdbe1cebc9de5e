"""A stand-in for the Hugging Face Hub on 127.0.0.1, for the download tests.

This is a FAKE of a remote service: tests never download anything (rule 8) and the real
hub cannot be reached here, so the download code is pointed (its endpoint setting, the
same knob as ``HF_ENDPOINT``) at this small server instead. It serves local folders (a
forged model) through the part of the hub's HTTP API that huggingface_hub uses to fetch a
repository, with the hub's headers and error codes:

- ``GET /api/models/{owner}/{name}[/revision/{rev}]``: repo info (``id``, ``sha``,
  ``siblings``);
- ``GET /api/models/{owner}/{name}/tree/{rev}[/{path}]?recursive=``: the listing, each
  file with ``size``, git ``oid`` and, for large (LFS) files, ``lfs.oid`` = sha256;
- ``GET /api/models?search=&filter=``: the repositories whose id holds the search text and
  whose files carry the filter (``gguf``: a .gguf file, ``onnx``: an .onnx file);
- ``HEAD|GET /{owner}/{name}/resolve/{rev}/{path}``: the bytes, with ``Range`` (206 and
  ``Content-Range``), ``ETag`` (``X-Linked-Etag`` = sha256 for LFS files),
  ``X-Repo-Commit``, ``X-Linked-Size``, ``Accept-Ranges``;
- 404 with ``X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound``.

``delay_s`` slows bodies (a pause after every ``chunk`` bytes) so a test can cancel in the
middle of a file; every request is logged with its ``Range`` header.

Faults a test can set: ``drop_after[suffix] = n`` ends the connection once after ``n``
bytes of a file whose path ends with ``suffix`` (the next request is served whole);
``corrupt`` (a set of suffixes) flips a byte of such files as they are sent (the listing
keeps the true hashes).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

LFS_MIN_BYTES = 10_000


@dataclass(frozen=True)
class HubFile:
    path: str
    local: Path
    size: int
    git_oid: str
    sha256: str
    lfs: bool


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None


class StandinRepo:
    """A local folder served as one hub repository at one commit."""

    def __init__(self, folder: Path) -> None:
        self.files: dict[str, HubFile] = {}
        for local in sorted(p for p in folder.rglob("*") if p.is_file()):
            size = local.stat().st_size
            rel = local.relative_to(folder).as_posix()
            git, sha = hashlib.sha1(f"blob {size}\0".encode()), hashlib.sha256()
            with local.open("rb") as f:  # in blocks: a served model may be gigabytes
                while block := f.read(16 * 2**20):
                    git.update(block)
                    sha.update(block)
            self.files[rel] = HubFile(rel, local, size, git.hexdigest(), sha.hexdigest(),
                                      size >= LFS_MIN_BYTES)
        self.commit = hashlib.sha1("".join(f.git_oid for f in self.files.values())
                                   .encode()).hexdigest()

    def folders(self) -> set[str]:
        out: set[str] = set()
        for path in self.files:
            parts = path.split("/")[:-1]
            out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        return out

    def tree(self, under: str, recursive: bool) -> list[dict[str, Any]]:
        prefix = f"{under}/" if under else ""
        entries: list[dict[str, Any]] = []
        for folder in sorted(self.folders()):
            if folder.startswith(prefix) and (recursive or "/" not in folder[len(prefix):]):
                entries.append({"type": "directory", "path": folder, "size": 0,
                                "oid": hashlib.sha1(folder.encode()).hexdigest()})
        for f in self.files.values():
            if f.path.startswith(prefix) and (recursive or "/" not in f.path[len(prefix):]):
                entry: dict[str, Any] = {"type": "file", "path": f.path, "size": f.size,
                                         "oid": f.git_oid}
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
                entries.append(entry)
        return entries


class HubStandin:
    """``HubStandin({"forge/tiny-onnx": folder})``: serves until ``close()``."""

    def __init__(self, repos: Mapping[str, Path], *, chunk: int = 64 * 1024,
                 delay_s: float = 0.0) -> None:
        self.repos = {repo_id: StandinRepo(folder) for repo_id, folder in repos.items()}
        self.chunk = chunk
        self.delay_s = delay_s
        self.requests: list[Logged] = []
        self.drop_after: dict[str, int] = {}
        self.corrupt: set[str] = set()
        #: file suffix -> an HTTP status its next download GET answers instead (once)
        self.fail_once: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def log(self, entry: Logged) -> None:
        with self._lock:
            self.requests.append(entry)

    def ranges(self, file_suffix: str) -> list[str | None]:
        """The Range headers of the GETs of files whose path ends with ``file_suffix``."""
        with self._lock:
            return [r.range for r in self.requests
                    if r.method == "GET" and "/resolve/" in r.path
                    and r.path.endswith(file_suffix)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HubStandin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handler_for(hub: HubStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(body=False)

        def do_GET(self) -> None:
            self._route(body=True)

        def _route(self, body: bool) -> None:
            split = urlsplit(self.path)
            hub.log(Logged(self.command, unquote(split.path), self.headers.get("Range")))
            parts = [unquote(p) for p in split.path.split("/") if p]
            query = parse_qs(split.query)
            try:
                if parts[:2] == ["api", "models"]:
                    self._api(parts[2:], query)
                elif len(parts) >= 5 and parts[2] == "resolve":
                    self._resolve(parts, body)
                else:
                    self._error(404, "NotFound", "no such route")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (a cancelled download)

        def _repo(self, owner: str, name: str) -> StandinRepo | None:
            repo = hub.repos.get(f"{owner}/{name}")
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            return repo

        def _revision_ok(self, repo: StandinRepo, rev: str) -> bool:
            if rev in ("main", repo.commit):
                return True
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return False

        def _search(self, query: dict[str, list[str]]) -> None:
            text = query.get("search", [""])[0].lower()
            wanted = set(query.get("filter", []))
            found = []
            for repo_id, repo in hub.repos.items():
                tags = {suffix for suffix in ("gguf", "onnx")
                        if any(p.endswith("." + suffix) for p in repo.files)}
                if text in repo_id.lower() and wanted <= tags:
                    found.append({"id": repo_id, "modelId": repo_id, "tags": sorted(tags),
                                  "downloads": 0, "pipeline_tag": "text-generation"})
            self._json(found)

        def _api(self, rest: list[str], query: dict[str, list[str]]) -> None:
            if not rest:
                self._search(query)
                return
            if len(rest) < 2:
                self._error(404, "NotFound", "no such route")
                return
            repo = self._repo(rest[0], rest[1])
            if repo is None:
                return
            repo_id = f"{rest[0]}/{rest[1]}"
            if len(rest) in (2, 4) and rest[2:3] in ([], ["revision"]):
                if len(rest) == 4 and not self._revision_ok(repo, rest[3]):
                    return
                self._json({"id": repo_id, "modelId": repo_id, "sha": repo.commit,
                            "private": False, "siblings": [{"rfilename": p}
                                                           for p in repo.files]})
            elif len(rest) >= 4 and rest[2] == "tree":
                if not self._revision_ok(repo, rest[3]):
                    return
                under = "/".join(rest[4:]).strip("/")
                if under and under not in repo.folders():
                    self._error(404, "EntryNotFound", f"{under} does not exist")
                    return
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                self._json(repo.tree(under, recursive))
            else:
                self._error(404, "NotFound", "no such route")

        def _resolve(self, parts: list[str], body: bool) -> None:
            repo = self._repo(parts[0], parts[1])
            if repo is None or not self._revision_ok(repo, parts[3]):
                return
            f = repo.files.get("/".join(parts[4:]))
            if f is None:
                self._error(404, "EntryNotFound", "Entry not found")
                return
            failing = next((k for k in hub.fail_once if f.path.endswith(k)), None)
            if body and failing is not None:
                status = hub.fail_once.pop(failing)
                self._error(status, "ServiceUnavailable", "the server is overloaded")
                return
            start, status = 0, 200
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if match:
                start, status = int(match.group(1)), 206
                if start >= f.size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{f.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(f.size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{f.git_oid}"')
            if f.lfs:
                self.send_header("X-Linked-Etag", f'"{f.sha256}"')
                self.send_header("X-Linked-Size", str(f.size))
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{f.size - 1}/{f.size}")
            self.end_headers()
            if body:
                self._send_bytes(f, start)

        def _send_bytes(self, f: HubFile, start: int) -> None:
            drop = next((n for suffix, n in hub.drop_after.items()
                         if f.path.endswith(suffix)), None)
            if drop is not None:
                hub.drop_after = {k: v for k, v in hub.drop_after.items()
                                  if not f.path.endswith(k)}
            flip = any(f.path.endswith(suffix) for suffix in hub.corrupt)
            sent = start
            with f.local.open("rb") as src:
                src.seek(start)
                while block := src.read(hub.chunk):
                    if flip and sent <= f.size // 2 < sent + len(block):
                        at = f.size // 2 - sent
                        block = block[:at] + bytes([block[at] ^ 0xFF]) + block[at + 1:]
                    if drop is not None and sent + len(block) > drop:
                        self.wfile.write(block[:max(0, drop - sent)])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self.wfile.write(block)
                    self.wfile.flush()
                    sent += len(block)
                    if hub.delay_s:
                        time.sleep(hub.delay_s)

        def _json(self, payload: Any) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        def _error(self, status: int, code: str, message: str) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler
