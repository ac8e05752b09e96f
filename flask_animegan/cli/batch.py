"""The files of ``flask animegan convert``. Entries are untrusted: a FIFO, a device or a
huge file is refused rather than hanging or filling memory; outputs are renamed into place,
replacing a symlink rather than writing through it."""

from __future__ import annotations

import os
import secrets
import stat
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

__all__ = ["IMAGE_SUFFIXES", "MOVING_SUFFIXES", "Refused", "collect", "moving_name",
           "output_names", "read_entry", "write_output"]

#: A folder's entries that are converted: photos, animations and videos.
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".apng", ".webp", ".gif", ".bmp", ".tif", ".tiff",
                  ".mp4", ".m4v", ".mov", ".webm", ".mkv"}
#: The output's suffix by MediaInfo format: an animation stays its kind, a video is MP4.
MOVING_SUFFIXES = {"GIF": "gif", "WEBP": "webp", "PNG": "png", "MP4": "mp4", "MOV": "mp4",
                   "WEBM": "mp4", "MKV": "mp4"}
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class Refused(Exception):
    """An input entry that is not read: the message says why and what to do."""


def collect(inputs: Iterable[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The entries to convert (files, and a folder's image files, sorted; each path once)
    and the folders that could not be listed. Nothing is opened here."""
    entries: dict[str, Path] = {}
    unlisted: list[tuple[Path, str]] = []
    for item in inputs:
        found = [item]
        if item.is_dir():
            try:
                found = sorted(p for p in item.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            except OSError as exc:
                unlisted.append((item, f"cannot list the folder: {exc.strerror or exc}"))
                continue
        for path in found:
            entries.setdefault(os.path.abspath(path), path)
    return list(entries.values()), unlisted


def output_names(entries: list[Path], style: str, fmt: str) -> list[str]:
    """One output name per entry, ``STEM.STYLE.FORMAT``, unique within the batch even on
    case-insensitive disks (the extension kept on a shared stem, then ``-2``, ``-3``...)."""
    stems = Counter(path.stem.casefold() for path in entries)
    taken: set[str] = set()
    names = []
    for path in entries:
        base = path.stem if stems[path.stem.casefold()] == 1 else path.name
        name, number = f"{base}.{style}.{fmt}", 2
        while name.casefold() in taken:
            name, number = f"{base}-{number}.{style}.{fmt}", number + 1
        taken.add(name.casefold())
        names.append(name)
    return names


def moving_name(name: str, fmt: str, suffix: str) -> str:
    """``name`` with the animation's or video's suffix in place of the still format ``fmt``."""
    return f"{name.removesuffix(f'.{fmt}')}.{suffix}"


def _kind(mode: int) -> str | None:
    """What a non-regular file is called (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def _open_failure(path: Path, exc: OSError) -> Refused:
    if isinstance(exc, FileNotFoundError):
        if os.path.islink(path):
            return Refused(f"a symlink to {os.readlink(path)!r}, which does not exist")
        return Refused("no such file")
    if isinstance(exc, PermissionError):
        return Refused("cannot be opened: permission denied (check its permissions, "
                       "or run as a user who may read it)")
    try:  # a socket cannot be opened at all: name the kind if we can
        kind = _kind(os.stat(path).st_mode)
    except OSError:
        kind = None
    if kind:
        return Refused(f"not a regular file ({kind})")
    return Refused(f"cannot be opened: {exc.strerror or exc}")


def read_entry(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, else :class:`Refused`; opened
    without blocking and checked on the descriptor, so no race between check and read."""
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise _open_failure(path, exc) from None
    try:
        info = os.fstat(descriptor)
        kind = _kind(info.st_mode)
        if kind:
            raise Refused(f"not a regular file ({kind})")
        if info.st_size > limit:
            raise Refused(f"{info.st_size:,} bytes, over the {limit:,}-byte upload limit "
                          "(ANIMEGAN_MAX_UPLOAD_BYTES); shrink it or raise the limit")
        chunks, left = [], limit + 1
        while left > 0:
            try:
                chunk = os.read(descriptor, min(left, 1 << 20))
            except OSError as exc:
                raise Refused(f"cannot be read: {exc.strerror or exc}") from None
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(descriptor)
    if left <= 0:
        raise Refused(f"grew past the {limit:,}-byte upload limit (ANIMEGAN_MAX_UPLOAD_BYTES) "
                      "while it was read; convert it once it is complete")
    return b"".join(chunks)


def write_output(folder: Path, name: str, data: bytes) -> Path:
    """Write ``folder/name`` through a temporary file renamed into place (a symlink replaced)."""
    target = folder / name
    partial = folder / f".{name}.{secrets.token_hex(4)}.part"
    # O_EXCL never follows a symlink; the mode honours the umask like any new file
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                         | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with open(descriptor, "wb", closefd=True) as file:
            file.write(data)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target
