"""The result pages of form uploads (post/redirect/get) under unguessable ids, each one value
in the storage as explicit bytes, never pickle: a shared Redis must not run code here."""

from __future__ import annotations

import re
import secrets
import struct
from dataclasses import dataclass

from ..errors import ImageTooLarge
from . import MemoryStorage, Storage
from .memory import ITEM_OVERHEAD

_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")
_PAGE = struct.Struct("<4sIIHHHII")  # magic, width, height, then the five fields' lengths
_PAGE_MAGIC = b"AGP2"


@dataclass(frozen=True)
class StoredResult:
    original: bytes  # JPEG of the (fitted) input, shown beside the result
    result: bytes
    mimetype: str
    style: str
    size: tuple[int, int]
    note: str = ""  # shown under the result: faces found, colours kept

    @property
    def nbytes(self) -> int:
        """What keeping it costs in a ``MemoryStorage``."""
        return len(encode_page(self)) + ITEM_OVERHEAD


def encode_page(result: StoredResult) -> bytes:
    mimetype, style, note = result.mimetype.encode(), result.style.encode(), result.note.encode()
    return b"".join((_PAGE.pack(_PAGE_MAGIC, *result.size, len(mimetype), len(style), len(note),
                                len(result.original), len(result.result)),
                     mimetype, style, note, result.original, result.result))


def decode_page(blob: bytes | None) -> StoredResult | None:
    """The stored result page in ``blob``, or ``None`` if there is none or it does not parse."""
    if not isinstance(blob, bytes) or len(blob) < _PAGE.size:
        return None
    magic, width, height, *lengths = _PAGE.unpack_from(blob)
    if magic != _PAGE_MAGIC or _PAGE.size + sum(lengths) != len(blob):
        return None
    fields, offset = [], _PAGE.size
    for length in lengths:
        fields.append(blob[offset:offset + length])
        offset += length
    mimetype, style, note, original, result = fields
    try:
        return StoredResult(original, result, mimetype.decode(), style.decode(), (width, height),
                            note.decode())
    except UnicodeDecodeError:
        return None


class ResultStore:
    """Results of form uploads under unguessable ids, in ``storage`` only, so no instance
    hands out an id the others cannot find (the upload answers inline instead)."""

    def __init__(self, storage: Storage | None = None, *, ttl: float, max_bytes: int) -> None:
        self.storage = storage if storage is not None else MemoryStorage(max_bytes)
        self.ttl = ttl
        self.max_bytes = max_bytes

    def add(self, result: StoredResult) -> str | None:
        """Keep ``result`` for ``ttl`` seconds; its random id, or ``None`` if not stored."""
        blob = encode_page(result)
        if len(blob) + ITEM_OVERHEAD > self.max_bytes:
            raise ImageTooLarge("the result is too large to keep for its page; choose a "
                                "smaller size or raise ANIMEGAN_RESULT_MAX_BYTES")
        token = secrets.token_urlsafe(24)
        return token if self.storage.set(token, blob, self.ttl) else None

    def get(self, token: str) -> StoredResult | None:
        """The result kept under ``token``, or ``None`` (unknown, expired, or unreachable)."""
        if not _TOKEN.fullmatch(token):  # not one of ours: no round trip
            return None
        return decode_page(self.storage.get(token))
