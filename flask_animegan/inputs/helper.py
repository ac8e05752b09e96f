"""A helper process that decodes uploads for :mod:`flask_animegan.inputs.isolation`.

Run as ``python -m flask_animegan.inputs.helper``; it imports Pillow and NumPy only.
It reads requests from stdin and writes answers to stdout, one at a time:

* request: ``>II`` (header length, data length), a JSON header
  (``size``, ``square``, ``limits``, ``memory``, and ``sample``: true for what the cache
  compares), then the file's bytes;
* answer: ``>II`` (header length, payload length), a JSON header, then RGB pixels.
  Without ``sample``: the fitted image's; the header is ``ok: true``, its ``width`` and
  ``height``, and every other field of
  :class:`~flask_animegan.inputs.decoding.DecodedUpload` (:func:`answer_of` and
  :func:`upload_of` are the two ends). With ``sample``
  (:func:`~flask_animegan.inputs.decoding.sample_upload`): the statistics
  (:meth:`.samples.Samples.to_bytes`), then the pixels of the fitted image if there is one
  (``width`` and ``height`` 0 if not), and the other fields of
  :class:`~flask_animegan.inputs.decoding.SampledUpload` (:func:`answer_of_sampled`
  and :func:`sampled_of`). Or ``ok: false`` with ``error`` (the exception's class name)
  and ``message``.

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
from .decoding import DecodedUpload, DecodeLimits, SampledUpload, decode_upload, sample_upload
from .samples import BYTES as STATISTICS_BYTES
from .samples import Samples
from .helper_process import FRAME, address_space_limit, read_exact, serve, write_answer

__all__ = ["FRAME", "MODULE", "NICENESS", "answer_of", "answer_of_sampled", "read_exact",
           "sampled_of", "upload_of"]

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


def answer_of_sampled(sampled: SampledUpload) -> tuple[dict[str, Any], bytes]:
    """A successful ``sample`` request as the helper sends it: the JSON header, then the
    statistics and the fitted image's pixels, if any."""
    fitted = sampled.fitted
    header = {"ok": True, "width": fitted.image.width if fitted else 0,
              "height": fitted.image.height if fitted else 0}
    header.update({name: getattr(sampled, name) for name in _FIELDS})
    statistics = sampled.samples.to_bytes()
    return header, statistics + fitted.image.tobytes() if fitted else statistics


def sampled_of(header: dict[str, Any], pixels: bytes) -> SampledUpload:
    """The SampledUpload a successful ``sample`` answer carries."""
    samples = Samples.from_bytes(pixels[:STATISTICS_BYTES])
    fitted = upload_of(header, pixels[STATISTICS_BYTES:]) if header["width"] else None
    values = {name: getattr(fitted, name) if fitted else header[name] for name in _FIELDS}
    if fitted is None:
        values.update({name: tuple(value) for name, value in values.items()
                       if isinstance(value, list)})
    return SampledUpload(samples, fitted=fitted, **values)


def _decode(request: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
    try:
        with address_space_limit(int(request["memory"])), warnings.catch_warnings():
            # Pillow's complaints about hostile files ("Corrupt EXIF data", ...)
            # would fill the server's log; the bomb warning stays an error.
            warnings.simplefilter("ignore", UserWarning)
            limits = DecodeLimits(**request["limits"])
            size, square = int(request["size"]), bool(request["square"])
            answer = (answer_of_sampled(sample_upload(data, limits, size=size, square=square))
                      if request.get("sample") else
                      answer_of(decode_upload(data, limits, size=size, square=square)))
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
