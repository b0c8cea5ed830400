"""A plain git host (a stand-in for github.com or any other forge that is not the Gitea
instance): public repositories served over git's smart HTTP by the real `git http-backend`,
with no authentication, recording the headers of every request it gets.

    with GitHost.start(tmp_path / "githost") as host:
        host.commit("actions/hello", {"action.yml": "..."}, tags=["v1"])
        url = f"{host.url}/actions/hello"          # clone URL; `uses: {host.url}/actions/hello@v1`
        ...
        assert all("authorization" not in h for h in host.request_headers)

Repositories are written like the Gitea double's (`GitRepositories`, one `git fast-import`
per commit); unlike Gitea's, `uploadpack.allowAnySHA1InWant` stays off (git's default), so
a fetch of a commit no ref points at is refused, as some servers do.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dynrunner.doubles.gitea.gitrepos import Commit, GitRepositories, git_env

_CGI_TIMEOUT_S = 60


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._backend()

    def do_POST(self) -> None:
        self._backend()

    def _backend(self) -> None:
        headers = {key.lower(): value for key, value in self.headers.items()}
        with self.server.lock:
            self.server.request_headers.append(headers)
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(headers.get("content-length") or 0)) if self.command == "POST" else b""
        env = git_env(
            {
                "GIT_PROJECT_ROOT": str(self.server.repos.root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "PATH_INFO": path,
                "QUERY_STRING": query,
                "REQUEST_METHOD": self.command,
                "CONTENT_TYPE": headers.get("content-type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_ADDR": self.client_address[0],
            }
        )
        if "git-protocol" in headers:
            env["GIT_PROTOCOL"] = headers["git-protocol"]
        if headers.get("content-encoding") == "gzip":
            env["HTTP_CONTENT_ENCODING"] = "gzip"
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=_CGI_TIMEOUT_S, check=False
        )
        head, _, payload = done.stdout.partition(b"\r\n\r\n")
        status = 200
        reply_headers: list[tuple[str, str]] = []
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split(" ", 1)[0])
            elif name:
                reply_headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in reply_headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repos: GitRepositories) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos = repos
        self.lock = threading.Lock()
        self.request_headers: list[dict[str, str]] = []


class GitHost:
    def __init__(self, server: _Server) -> None:
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"

    @classmethod
    @contextmanager
    def start(cls, root: Path) -> Iterator[GitHost]:
        root.mkdir(parents=True, exist_ok=True)
        server = _Server(GitRepositories(root))
        thread = threading.Thread(target=server.serve_forever, name="githost", daemon=True)
        thread.start()
        try:
            yield cls(server)
        finally:
            server.shutdown()
            server.server_close()
            thread.join(10)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Every request's headers so far (names lower-cased), in order."""
        with self._server.lock:
            return list(self._server.request_headers)

    def commit(
        self, repository: str, files: Mapping[str, str | bytes], *, branch: str = "main", tags: Iterable[str] = ()
    ) -> Commit:
        owner, name = repository.split("/", 1)
        repos = self._server.repos
        commit = repos.commit(owner, name, "main", files, branch=branch, message="commit", when=0, tags=tags)
        subprocess.run(
            ["git", "config", "uploadpack.allowAnySHA1InWant", "false"],
            cwd=repos.path(owner, name),
            env=git_env(),
            check=True,
        )
        return commit
