"""A stand-in for the Hugging Face Hub that serves local folders as its repositories, for rehearsals.

A rehearsal runs ``stateloop prefetch`` (huggingface_hub's ``hf_hub_download`` and
``snapshot_download``) against this server (``HF_ENDPOINT``) into an empty cache, then stops it
before the DAG runs offline, as on compute nodes without network. Served, per repository
(``(repo_type, repo_id) -> folder``, one revision whose hash is a digest of the files): the info
and tree endpoints of ``/api/{models,datasets}/{repo_id}``, ``HEAD``/``GET .../resolve/{rev}/{path}``
with the headers ``hf_hub_download`` reads and ``Range``, and else a 404 with the Hub's
``X-Error-Code``. Only what those two functions use is served: it is not a Hub.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

REVISION = "main"


class Repo:
    """A folder served as one repository at one commit."""

    def __init__(self, repo_type: str, repo_id: str, folder: str | Path):
        self.repo_type, self.repo_id, self.folder = repo_type, repo_id, Path(folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"{self.folder}: folder of {repo_type} {repo_id} not found")
        self.files: dict[str, tuple[int, str]] = {}  # path -> (size, git blob id)
        for path in sorted(self.folder.rglob("*")):
            rel = path.relative_to(self.folder)
            if path.is_file() and not any(part.startswith(".") for part in rel.parts):
                data = path.read_bytes()
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
                self.files[rel.as_posix()] = (len(data), blob)
        listing = "".join(f"{p}\0{blob}\n" for p, (_, blob) in self.files.items())
        self.sha = hashlib.sha1(f"{repo_type}/{repo_id}\n{listing}".encode()).hexdigest()

    def info(self) -> dict:
        return {"id": self.repo_id, "sha": self.sha, "private": False, "gated": False, "disabled": False,
                "lastModified": "2026-01-01T00:00:00.000Z", "tags": [], "downloads": 0, "likes": 0,
                "siblings": [{"rfilename": p} for p in self.files]}

    def tree(self, prefix: str, recursive: bool) -> list[dict]:
        prefix = prefix.strip("/")
        out, folders = [], set()
        for path, (size, blob) in self.files.items():
            if prefix and not path.startswith(prefix + "/"):
                continue
            rest = path[len(prefix) + 1:] if prefix else path
            parts = rest.split("/")
            for depth in range(1, len(parts)):  # the folders on the way
                if recursive or depth == 1:
                    folders.add("/".join(([prefix] if prefix else []) + parts[:depth]))
            if recursive or len(parts) == 1:
                out.append({"type": "file", "oid": blob, "size": size, "path": path})
        out += [{"type": "directory", "oid": hashlib.sha1(f.encode()).hexdigest(), "size": 0, "path": f}
                for f in sorted(folders)]
        return out


class _Handler(BaseHTTPRequestHandler):
    repos: dict[tuple[str, str], Repo] = {}
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

    def _json(self, value) -> None:
        self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _repo(self, repo_type: str, parts: list[str]) -> tuple[Repo | None, list[str]]:
        """The repository named by the first two path parts (org/name), and the parts after."""
        if len(parts) < 2:
            return None, []
        return self.repos.get((repo_type, f"{parts[0]}/{parts[1]}")), parts[2:]

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 2 and parts[1] in ("models", "datasets"):
            repo, rest = self._repo(parts[1][:-1], parts[2:])
            if repo is None:
                return self._error(404, "RepoNotFound", "Repository not found", head)
            if rest and rest[0] in ("revision", "tree") and (len(rest) < 2 or rest[1] not in (REVISION, repo.sha)):
                return self._error(404, "RevisionNotFound", "Invalid rev id", head)
            if not rest or rest[0] == "revision":
                return self._json(repo.info())
            if rest[0] == "tree":
                return self._json(repo.tree("/".join(rest[2:]), "recursive=true" in url.query.lower()))
            return self._error(404, "EntryNotFound", "Not served by this stand-in", head)
        repo_type = "model"
        if parts[:1] == ["datasets"]:
            repo_type, parts = "dataset", parts[1:]
        repo, rest = self._repo(repo_type, parts)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", head)
        if len(rest) < 3 or rest[0] != "resolve":
            return self._error(404, "EntryNotFound", "Not served by this stand-in", head)
        if rest[1] not in (REVISION, repo.sha):
            return self._error(404, "RevisionNotFound", "Invalid rev id", head)
        rel = "/".join(rest[2:])
        if rel not in repo.files:
            return self._error(404, "EntryNotFound", f"{rel} does not exist", head)
        size, blob = repo.files[rel]
        data = b"" if head else (repo.folder / rel).read_bytes()
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{blob}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        start = 0
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged[6:].split("-")[0].isdigit():
            start = int(ranged[6:].split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        headers["Content-Length"] = str(size - start)
        self._send(206 if ranged else 200, data[start:], headers, head)


@contextmanager
def serve_hub(repos: list[Repo]) -> Iterator[str]:
    """Serve ``repos`` on a free loopback port while inside ``with``; yields the endpoint URL
    (``HF_ENDPOINT``). The server is gone after the block: nothing answers there any more."""
    handler = type("Handler", (_Handler,), {"repos": {(r.repo_type, r.repo_id): r for r in repos}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="stateloop-hub", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
