"""Downloading official styles: pinned by hash, moved into place atomically."""

from __future__ import annotations

import contextlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .catalog import StyleInfo
from .weights import file_git_blob_sha1


class DownloadError(Exception):
    """The download failed or did not match its pin; nothing was installed."""


def pull_style(style: StyleInfo, models_dir: Path, *, base_url: str | None = None,
               on_start: Callable[[int | None], None] = lambda total: None,
               on_chunk: Callable[[int], None] = lambda n: None,
               timeout: float = 30.0) -> Path:
    """Download ``style`` into ``models_dir``; renamed into place only once its pin
    matches, so a failed or tampered download leaves nothing. Returns the path."""
    url = style.download_url(base_url)
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / f"{style.name}.pt"
    fd, tmp_name = tempfile.mkstemp(prefix=f".{style.name}.", suffix=".part", dir=models_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            received = 0
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    length = response.headers.get("Content-Length")
                    total = int(length) if length and length.isdigit() else None
                    on_start(total)
                    while chunk := response.read(64 * 1024):
                        out.write(chunk)
                        received += len(chunk)
                        on_chunk(len(chunk))
            except urllib.error.HTTPError as exc:
                exc.close()  # an HTTPError is an open response
                raise DownloadError(f"could not download {url}: HTTP {exc.code} {exc.reason}; "
                                    f"the server does not offer {style.name}.pt") from None
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
                reason = getattr(exc, "reason", None) or exc.__class__.__name__
                raise DownloadError(f"could not download {url}: {reason}; check the network "
                                    "or set ANIMEGAN_WEIGHTS_BASE_URL to a mirror") from exc
            if total is not None and received != total:
                raise DownloadError(f"download of {url} was truncated: got {received} of "
                                    f"{total} bytes; run the command again")
            out.flush()
            os.fsync(out.fileno())
        digest = file_git_blob_sha1(tmp)
        if digest != style.sha1:
            raise DownloadError(
                f"{url} does not match the pinned hash for {style.name!r}: expected "
                f"{style.sha1}, got {digest}; the file was discarded. If you use a mirror, "
                "make sure it serves the original file unchanged"
            )
        os.replace(tmp, target)
        with contextlib.suppress(OSError):  # the rename outlives a crash
            fd = os.open(models_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return target
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
