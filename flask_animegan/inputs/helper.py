"""A helper process that decodes uploads for :mod:`flask_animegan.inputs.isolation`.

Run as ``python -m flask_animegan.inputs.helper``; it imports Pillow and NumPy only.
It reads requests from stdin and writes answers to stdout, one at a time:

* request: ``>II`` (header length, data length), a JSON header
  (``size``, ``square``, ``limits``, ``memory``), then the file's bytes;
* answer: ``>II`` (header length, payload length), a JSON header, then the RGB pixels
  of the fitted image. The header is ``ok: true``, the image's ``width`` and ``height``,
  and every other field of :class:`~flask_animegan.inputs.decoding.DecodedUpload`
  (:func:`answer_of` and :func:`upload_of` are the two ends); or ``ok: false`` with
  ``error`` (the exception's class name) and ``message``.

Each decode runs under an address-space limit of ``memory`` bytes above what the
process already uses, so a file that needs more fails here, not in the server. The
server kills a helper that takes too long and starts another. It exits when stdin
closes (its server is gone).
"""

from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any, BinaryIO

from PIL import Image

from ..errors import BadImage, ConversionError, ImageTooLarge
from .decoding import DecodedUpload, DecodeLimits, decode_upload
from .helper_process import FRAME, address_space_limit, read_exact, serve, write_answer

__all__ = ["FRAME", "MODULE", "NICENESS", "answer_of", "read_exact", "upload_of"]

#: What :class:`~.helper_process.HelperProcess` runs for photos.
MODULE = "flask_animegan.inputs.helper"
#: Helpers run at a lower CPU priority than the server: a flood of slow decodes then takes
#: only the CPU that the server's own threads (/healthz, the pages, inference) leave.
NICENESS = 10
#: The fields of a DecodedUpload that travel in the JSON header (the image is the payload).
_FIELDS = tuple(field.name for field in fields(DecodedUpload) if field.name != "image")


def answer_of(decoded: DecodedUpload) -> tuple[dict[str, Any], bytes]:
    """A successful decode as the helper sends it: the JSON header and the pixels."""
    header = {"ok": True, "width": decoded.image.width, "height": decoded.image.height}
    header.update({name: getattr(decoded, name) for name in _FIELDS})
    return header, decoded.image.tobytes()


def upload_of(header: dict[str, Any], pixels: bytes) -> DecodedUpload:
    """The DecodedUpload a successful answer carries (JSON's lists become tuples again)."""
    image = Image.frombytes("RGB", (int(header["width"]), int(header["height"])), pixels)
    values: dict[str, Any] = {name: header[name] for name in _FIELDS}
    values.update({name: tuple(value) for name, value in values.items()
                   if isinstance(value, list)})
    return DecodedUpload(image=image, **values)


def _decode(request: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
    try:
        with address_space_limit(int(request["memory"])), warnings.catch_warnings():
            # Pillow's complaints about hostile files ("Corrupt EXIF data", ...)
            # would fill the server's log; the bomb warning stays an error.
            warnings.simplefilter("ignore", UserWarning)
            decoded = decode_upload(data, DecodeLimits(**request["limits"]),
                                    size=int(request["size"]),
                                    square=bool(request["square"]))
            answer = answer_of(decoded)
    except ConversionError as exc:
        return {"ok": False, "error": exc.__class__.__name__, "message": str(exc)}, b""
    except MemoryError:
        return {"ok": False, "error": ImageTooLarge.__name__,
                "message": "the image needs more memory to decode than this server allows; "
                           "send a smaller image"}, b""
    except Exception as exc:  # noqa: BLE001 - never die on a file
        return {"ok": False, "error": BadImage.__name__,
                "message": f"the file cannot be decoded ({exc.__class__.__name__})"}, b""
    return answer


def _answer(out: BinaryIO, request: dict[str, Any], data: bytes) -> None:
    write_answer(out, *_decode(request, data))


def main() -> None:
    serve(_answer, niceness=NICENESS)


if __name__ == "__main__":
    main()
