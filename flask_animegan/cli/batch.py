"""The files of ``flask animegan convert``: which entries, read how, written where.

Input entries are untrusted: each is opened without blocking, checked on the open
descriptor and read up to the upload limit, so a FIFO, a device, a folder or a huge
file is refused on one line instead of hanging or filling memory. Outputs are written
to a temporary file inside the output folder and renamed into place, which replaces a
symlink there instead of writing through it. Nothing here decodes an image: the bytes
go to the service's Decoder, as an upload would.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

__all__ = ["IMAGE_SUFFIXES", "MOVING_SUFFIXES", "Refused", "collect", "moving_name",
           "output_names", "read_entry", "write_output"]

#: What a folder's entries are converted by: photos, animations (GIF, WebP, APNG) and
#: short videos (MP4, MOV, WebM, Matroska).
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".apng", ".webp", ".gif", ".bmp", ".tif", ".tiff",
                  ".mp4", ".m4v", ".mov", ".webm", ".mkv"}
#: The output's suffix for an animation or a video, by the upload's format (MediaInfo):
#: an animation stays its kind, a video becomes MP4.
MOVING_SUFFIXES = {"GIF": "gif", "WEBP": "webp", "PNG": "png", "MP4": "mp4", "MOV": "mp4",
                   "WEBM": "mp4", "MKV": "mp4"}
#: What each kind of non-regular file is called in the refusal line.
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
_CHUNK = 1 << 20


class Refused(Exception):
    """An input entry that is not read: the message says why and what to do."""


def collect(inputs: Iterable[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The entries to convert, in order, and the folders that could not be listed.

    Each argument that is not a folder is an entry; so is each entry of a folder
    argument whose name ends in an image suffix, sorted (not recursive). The same path
    given twice counts once. Nothing is opened here: :func:`read_entry` checks each.
    """
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
    """One output file name per entry, unique within the batch.

    ``STEM.STYLE.FORMAT`` when no other entry has the same stem; otherwise the source
    extension stays in (``p.jpg.STYLE.FORMAT``, ``p.png.STYLE.FORMAT``); a name still
    taken by an earlier entry (the same file name in two folders) gets ``-2``, ``-3``...
    Names are compared ignoring case, so they stay distinct on case-insensitive disks.
    """
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
    """The output name of an animation or a video: ``name`` (from :func:`output_names`,
    ending in the still format ``fmt``) with the suffix of the job's output. The part before
    it is unique within the batch, so the name stays unique."""
    return f"{name.removesuffix(f'.{fmt}')}.{suffix}"


def _kind(mode: int) -> str | None:
    """What a non-regular file is (None for a regular file)."""
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
    try:  # a socket, say, cannot be opened at all: name the kind if we can
        kind = _kind(os.stat(path).st_mode)
    except OSError:
        kind = None
    if kind:
        return Refused(f"not a regular file ({kind})")
    return Refused(f"cannot be opened: {exc.strerror or exc}")


def read_entry(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (after symlinks) of at most ``limit``
    bytes; :class:`Refused` otherwise.

    The open never blocks (O_NONBLOCK: a FIFO opens at once), the kind and size come
    from the open descriptor (no window between a check and the read), and at most
    ``limit + 1`` bytes are read, so a file that grows while it is read stays bounded.
    """
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
                chunk = os.read(descriptor, min(left, _CHUNK))
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
    """Write ``data`` to ``folder/name`` through a temporary file in ``folder``, renamed
    into place: an existing file, or a symlink (never followed), is replaced whole."""
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
