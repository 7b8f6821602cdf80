"""Resumable downloads of DPR's public Natural Questions files.

A download grows ``name.part`` (kept between runs, so a cut download resumes with a Range request)
and is renamed to ``name`` once whole; decompression goes through the atomic writer.
"""

from __future__ import annotations

import gzip
import os
import shutil
import urllib.error
import urllib.request
import zlib
from pathlib import Path

from tqdm import tqdm

from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_atomic

DPR_URL_ROOT = "https://dl.fbaipublicfiles.com/dpr"
# File name -> path under DPR_URL_ROOT (from DPR's dpr/data/download_data.py resource map).
NQ_FILES = {
    "biencoder-nq-train.json.gz": "data/retriever/biencoder-nq-train.json.gz",
    "biencoder-nq-dev.json.gz": "data/retriever/biencoder-nq-dev.json.gz",
    "nq-test.qa.csv": "data/retriever/nq-test.qa.csv",
    "psgs_w100.tsv.gz": "wikipedia_split/psgs_w100.tsv.gz",
}
# Also available on request: DPR's NQ dev/train qas files and the NQ licence files.
EXTRA_FILES = {
    "nq-dev.qa.csv": "data/retriever/nq-dev.qa.csv",
    "nq-train.qa.csv": "data/retriever/nq-train.qa.csv",
    "LICENSE": "nq_license/LICENSE",
    "README": "nq_license/README",
}
_CHUNK = 1 << 20
DEFAULT_OUT = Path("data/nq")  # `dpr-cache data nq`'s folder


def fetch_hint(path: Path) -> str:
    """For a missing file that is one of DPR's NQ files (compressed or not), the command that
    downloads it, as the end of its error (``"; DPR's NQ files are downloaded by: dpr-cache data nq
    --gunzip"``); else ''."""
    by_name = {n.removesuffix(".gz"): n for n in [*NQ_FILES, "nq-dev.qa.csv", "nq-train.qa.csv"]}
    name = by_name.get(path.name.removesuffix(".gz"))
    if name is None:
        return ""
    out = "" if path.parent == DEFAULT_OUT else f" --out {path.parent}"
    file = "" if name in NQ_FILES else f" --file {name}"
    return f"; DPR's NQ files are downloaded by: dpr-cache data nq --gunzip{out}{file}"


def _total_size(response: urllib.response.addinfourl, offset: int) -> int | None:
    """The full file size from Content-Range (206) or Content-Length (200)."""
    if response.status == 206:
        content_range = response.headers.get("Content-Range", "")
        total = content_range.rpartition("/")[2]
        return int(total) if total.isdigit() else None
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


class _RangeNotSatisfiable(Exception):
    """HTTP 416 for a resume request; ``total`` is the size the server reports, if any."""

    def __init__(self, total: int | None):
        self.total = total


def _open(url: str, offset: int, timeout: float) -> urllib.response.addinfourl:
    """Open ``url`` from byte ``offset`` (a Range request when ``offset`` > 0)."""
    request = urllib.request.Request(url, headers={"User-Agent": "dpr-cache"})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # nothing past our partial copy: is it whole?
            total = e.headers.get("Content-Range", "").rpartition("/")[2]
            e.close()
            raise _RangeNotSatisfiable(int(total) if total.isdigit() else None) from None
        raise InputError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise InputError(f"{url}: cannot download ({reason})") from None


def download_file(url: str, dest: Path, *, progress: bool = True, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` via ``dest.part``, resuming a partial file with a Range request.

    Skips the download when ``dest`` already exists. Raises InputError on HTTP or network errors,
    or when the server sends fewer bytes than it announced.
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    part = dest.with_name(dest.name + ".part")
    offset = part.stat().st_size if part.exists() else 0
    try:
        response = _open(url, offset, timeout)
    except _RangeNotSatisfiable as e:
        if e.total == offset:  # the partial copy is already whole
            os.replace(part, dest)
            return dest
        offset = 0  # the partial copy does not match the remote file: start over
        response = _open(url, offset, timeout)
    with response:
        # the folder is made once the server answers: a download that cannot start leaves none
        dest.parent.mkdir(parents=True, exist_ok=True)
        if response.status != 206:  # the server ignored the Range header: start over
            offset = 0
        total = _total_size(response, offset)
        mode = "ab" if offset else "wb"
        with (
            open(part, mode) as out,
            tqdm(
                total=total,
                initial=offset,
                unit="B",
                unit_scale=True,
                desc=dest.name,
                disable=not progress,
            ) as bar,
        ):
            try:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
            except OSError as e:
                raise InputError(
                    f"{url}: download interrupted ({e}); run again to resume"
                ) from None
    size = part.stat().st_size
    if total is not None and size != total:
        raise InputError(f"{url}: got {size} of {total} bytes; run again to resume")
    os.replace(part, dest)
    return dest


def gunzip_file(src: Path, *, remove: bool = True) -> Path:
    """Decompress ``name.gz`` to ``name`` (atomically); skip if ``name`` exists."""
    dest = src.with_suffix("")
    if not dest.exists():

        def write(tmp: Path) -> None:
            with gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, _CHUNK)

        try:
            write_atomic(dest, write)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise InputError(f"{src}: cannot decompress ({e})") from None
    if remove:
        src.unlink(missing_ok=True)
    return dest


def download_nq(
    out_dir: Path,
    *,
    files: list[str] | None = None,
    base_url: str = DPR_URL_ROOT,
    gunzip: bool = False,
    progress: bool = True,
) -> list[Path]:
    """Download DPR's NQ files into ``out_dir``; return their local paths.

    ``files`` are names from NQ_FILES or EXTRA_FILES (default: all of NQ_FILES: the biencoder
    train and dev JSON, ``nq-test.qa.csv`` and the 21M-passage ``psgs_w100.tsv.gz``), or paths
    relative to ``base_url``. Complete files are skipped, partial ones resumed. With ``gunzip``,
    ``.gz`` files are decompressed (the loaders read ``.gz`` directly, so this is optional).
    """
    out_dir = Path(out_dir)
    known = {**NQ_FILES, **EXTRA_FILES}
    paths = []
    for name in files if files is not None else list(NQ_FILES):
        rel = known.get(name, name)
        local = out_dir / rel.rsplit("/", 1)[-1]
        if gunzip and local.suffix == ".gz" and local.with_suffix("").exists():
            paths.append(local.with_suffix(""))
            continue
        path = download_file(f"{base_url.rstrip('/')}/{rel}", local, progress=progress)
        paths.append(gunzip_file(path) if gunzip and path.suffix == ".gz" else path)
    return paths
