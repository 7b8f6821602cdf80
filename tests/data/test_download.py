"""Resumable downloads against a local HTTP server (127.0.0.1, ephemeral port, Range support)."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dpr_cache.data.download import NQ_FILES, download_nq
from dpr_cache.errors import InputError

TRAIN = b'[{"question": "q", "positive_ctxs": []}]' * 200
QAS = b'who sang thriller\t["Michael Jackson"]\n'


class Server:
    """Serves ``files`` (URL path -> bytes) and records each request's Range header."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.ranges: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                body = outer.files.get(self.path)
                rng = self.headers.get("Range")
                outer.ranges.append(rng)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                start = int(rng.removeprefix("bytes=").rstrip("-")) if rng else 0
                if start >= len(body) and rng:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.end_headers()
                    return
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                self.wfile.write(body[start:])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/dpr"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")  # never route the local server via a proxy
    files = {
        "/dpr/" + NQ_FILES["biencoder-nq-train.json.gz"]: gzip.compress(TRAIN),
        "/dpr/" + NQ_FILES["nq-test.qa.csv"]: QAS,
    }
    srv = Server(files)
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


NAMES = ["biencoder-nq-train.json.gz", "nq-test.qa.csv"]


def test_full_download_then_skip(server, tmp_path: Path) -> None:
    paths = download_nq(tmp_path, files=NAMES, base_url=server.url, progress=False)
    assert [p.name for p in paths] == NAMES
    assert gzip.decompress(paths[0].read_bytes()) == TRAIN and paths[1].read_bytes() == QAS
    assert not list(tmp_path.glob("*.part"))
    n = len(server.ranges)
    download_nq(tmp_path, files=NAMES, base_url=server.url, progress=False)
    assert len(server.ranges) == n  # complete files are not fetched again


def test_resume_from_partial_file(server, tmp_path: Path) -> None:
    body = server.files["/dpr/" + NQ_FILES["biencoder-nq-train.json.gz"]]
    (tmp_path / "biencoder-nq-train.json.gz.part").write_bytes(body[:100])
    (path,) = download_nq(
        tmp_path, files=NAMES[:1], base_url=server.url, gunzip=True, progress=False
    )
    assert server.ranges == ["bytes=100-"]
    assert path.name == "biencoder-nq-train.json" and path.read_bytes() == TRAIN


def test_whole_partial_file_is_kept(server, tmp_path: Path) -> None:
    (tmp_path / "nq-test.qa.csv.part").write_bytes(QAS)  # complete, but not yet renamed
    (path,) = download_nq(tmp_path, files=NAMES[1:], base_url=server.url, progress=False)
    assert path.read_bytes() == QAS and server.ranges == [f"bytes={len(QAS)}-"]


def test_missing_file_is_a_clear_error(server, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"/dpr/wikipedia_split/psgs_w100\.tsv\.gz: HTTP 404"):
        download_nq(tmp_path, files=["psgs_w100.tsv.gz"], base_url=server.url, progress=False)
    assert not (tmp_path / "psgs_w100.tsv.gz").exists()
