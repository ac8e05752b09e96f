"""One conversion, stage by stage: (cache: sample -> lookup) -> decode -> fit -> infer -> encode.

The service (API and form), the CLI and ``bench/`` all convert through
:meth:`Pipeline.convert`, so what is measured is what is served.

Two options change the infer stage (:class:`Options`): portrait mode finds the faces
(``portrait/``), converts each, aligned, with the face style and pastes it back over
the whole picture converted with the scene style; ``colors`` keeps the input's
brightness or colours (``inputs/colors.py``), on the whole picture and on each face.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

from .inputs.colors import COLOR_MODES, keep_colors
from .cache.samples import of_picture
from .inputs.decoding import DecodedUpload, fit, to_rgb
from .inputs.formats import MIME_TYPES, encode
from .inputs.isolation import Decoder
from .runtime.catalog import StyleInfo

if TYPE_CHECKING:  # pragma: no cover
    from .cache import CachedResult, NearDuplicateCache
    from .cache.fingerprint import Fingerprint
    from .cache.near_duplicate import Lookup
    from .runtime.engine import InferenceEngine


#: ``portrait``: auto (on for the face styles), on, off, or faces (only the faces, each a
#: crop of its own, side by side).
PORTRAIT_MODES = ("auto", "on", "off", "faces")


@dataclass(frozen=True)
class Options:
    """What a conversion asks for beside its style, size and format."""

    colors: str = "off"  # inputs/colors.py COLOR_MODES
    portrait: str = "auto"  # PORTRAIT_MODES

    def __post_init__(self) -> None:
        if self.colors not in COLOR_MODES or self.portrait not in PORTRAIT_MODES:
            raise ValueError(f"unknown options {self}")

    def portrait_for(self, style: StyleInfo) -> str:
        """"off", "on" or "faces" for ``style`` ("auto" is "on" for a face style)."""
        if self.portrait == "auto":
            return "on" if style.face else "off"
        return self.portrait


@dataclass(frozen=True)
class PortraitSettings:
    """Portrait mode's settings (ANIMEGAN_PORTRAIT_*): the scene style (None: the
    default style), the smallest face converted, the most faces per picture."""

    scene_style: str | None = None
    min_face: int = 48
    max_faces: int = 8


@dataclass
class Conversion:
    """The outcome of converting one upload."""

    data: bytes
    mimetype: str
    format: str
    style: str
    size: tuple[int, int]
    cache_hit: bool
    face_crop: bool  # the centre square was converted (a face style without portrait mode)
    faces: int | None = None  # faces found and converted in portrait mode; None: not run
    colors: str = "off"
    timings: dict[str, float] = field(default_factory=dict)  # stage -> milliseconds
    #: the decoded, fitted input (what the network saw); a file sent again is answered
    #: from the cache undecoded, and decoded only if this is asked for (the form's page)
    input_image: Image.Image | None = field(default=None, repr=False)
    input_loader: Callable[[], Image.Image] | None = field(default=None, repr=False)

    def input(self) -> Image.Image:
        """The decoded, fitted input (decoding it now if the result came undecoded)."""
        if self.input_image is None:
            assert self.input_loader is not None
            self.input_image = self.input_loader()
        return self.input_image


class _Laps:
    """Milliseconds per stage, in order."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._clock = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round((now - self._clock) * 1000, 2)
        self._clock = now


class Pipeline:
    """Turns uploaded bytes into an encoded anime picture."""

    def __init__(self, decoder: Decoder, engine: InferenceEngine, *, quality: int,
                 cache: NearDuplicateCache | None = None,
                 portrait: PortraitSettings | None = None,
                 tile_above: int | None = None) -> None:
        self.decoder = decoder
        self.engine = engine
        self.quality = quality
        self.cache = cache if cache is not None and cache.enabled else None
        self.portrait = portrait or PortraitSettings()
        #: pictures with a longer side run in tiles (ANIMEGAN_MAX_SIDE; None: never)
        self.tile_above = tile_above

    def convert(self, data: bytes, style: StyleInfo, size: int, fmt: str,
                scope: str | None = None, options: Options = Options()) -> Conversion:
        """Convert ``data`` (an image file) with ``style`` to long side ``size`` in ``fmt``.

        With a cache, a near-identical input converted before within ``scope`` (None:
        shared by everyone) with the same options reuses that result instead of running
        the network; the very same file sent again reuses it before it is even decoded.
        """
        lap = _Laps()
        portrait = options.portrait_for(style)
        square = style.face and portrait == "off"
        namespace = (scope, style.name, size, fmt, options.colors, portrait)
        lookup: Lookup | None = None
        upload = b""
        if self.cache is not None:
            upload = self.cache.upload_digest(data)
            lookup = self.cache.lookup(namespace)
            again = lookup.same_upload(upload)
            lap("lookup")
            if again is not None:
                return self._sent_again(data, again, style, size, fmt, square, options,
                                        lap.timings)
        fingerprint: Fingerprint | None = None
        decoded: DecodedUpload | None = None
        if lookup is not None:
            # the cache compares statistics of the fitted picture
            decoded = self.decoder.decode(data, size=size, square=square)
            lap("decode")
            looked_up = decoded.image.size
            fingerprint = lookup.cache.fingerprint(of_picture(decoded.image), size=looked_up,
                                                   source=decoded.source_size)
            cached = self._from_cache(lookup, fmt, fingerprint, looked_up)
            lap("cache")
            if cached is not None:
                return self._near_hit(data, cached, style, size, fmt, square, options,
                                      looked_up, decoded, lap.timings)
        if decoded is None:
            decoded = self.decoder.decode(data, size=size, square=square)
            lap("decode")
        fitted = decoded.image  # what the network sees
        faces: int | None = None
        if portrait == "off":
            result = self._run(fitted, style.name, options.colors)
        else:
            result, faces = self._portrait(fitted, style, portrait, options.colors, lap)
            if not faces and style.face:
                # no face: as without portrait mode, the centre square (decoded anew,
                # so it has the size's full resolution)
                square = True
                fitted = self.decoder.decode(data, size=size, square=True).image
                result = self._run(fitted, style.name, options.colors)
        lap("infer")
        encoded = encode(result, fmt, self.quality)
        lap("encode")
        if lookup is not None and fingerprint is not None:
            lookup.cache.put(namespace, fingerprint, encoded, decoded.image.size,
                             -1 if faces is None else faces, upload=upload)
        return Conversion(encoded, MIME_TYPES[fmt], fmt, style.name, fitted.size,
                          cache_hit=False, face_crop=square, input_image=fitted,
                          timings=lap.timings, faces=faces, colors=options.colors)

    def _sent_again(self, data: bytes, cached: CachedResult, style: StyleInfo, size: int,
                    fmt: str, square: bool, options: Options,
                    timings: dict[str, float]) -> Conversion:
        """The conversion of a file converted before (the same bytes), from its cached
        result: what the miss said of it, its input decoded only if someone asks."""
        faces = None if cached.faces < 0 else cached.faces
        # a face style whose portrait mode found no face converted the centre square
        square = square or (style.face and faces == 0)
        out_size = cached.size
        if square:
            with Image.open(io.BytesIO(cached.data)) as stored:
                out_size = stored.size

        def input_image() -> Image.Image:
            return self.decoder.decode(data, size=size, square=square).image

        return Conversion(cached.data, MIME_TYPES[fmt], fmt, style.name, out_size,
                          cache_hit=True, face_crop=square, input_loader=input_image,
                          timings=timings, faces=faces, colors=options.colors)

    def _near_hit(self, data: bytes, cached: tuple[bytes, int | None], style: StyleInfo,
                  size: int, fmt: str, square: bool, options: Options, fitted: tuple[int, int],
                  decoded: DecodedUpload | None, timings: dict[str, float]) -> Conversion:
        """The conversion of the same photo as one converted before, from its cached
        result (resized to ``fitted``, this upload's fitted size): its input fitted only
        if someone asks (unless the sample's decode fitted it already)."""
        data_out, faces = cached
        if style.face and faces == 0 and not square:
            # a face style whose portrait mode found no face converted the centre square
            square, decoded = True, None
            with Image.open(io.BytesIO(data_out)) as stored:
                fitted = stored.size

        def input_image() -> Image.Image:
            return self.decoder.decode(data, size=size, square=square).image

        return Conversion(data_out, MIME_TYPES[fmt], fmt, style.name, fitted,
                          cache_hit=True, face_crop=square,
                          input_image=decoded.image if decoded is not None else None,
                          input_loader=input_image, timings=timings, faces=faces,
                          colors=options.colors)

    def _run(self, picture: Image.Image, style: str, colors: str) -> Image.Image:
        """The network on ``picture`` (in tiles if larger than ``tile_above``), its colours
        kept as ``colors`` asks."""
        tiled = self.tile_above is not None and max(picture.size) > self.tile_above
        return keep_colors(self.engine.run(picture, style, tiled=tiled), picture, colors)

    def _portrait(self, picture: Image.Image, style: StyleInfo, mode: str, colors: str,
                  lap: _Laps) -> tuple[Image.Image, int]:
        """Portrait mode: the faces found in ``picture``, each converted with the face
        style (``style``) and pasted over the whole converted with the scene style (a
        face style's: ANIMEGAN_PORTRAIT_SCENE_STYLE, else the default style; another
        style is its own scene style); or, for "faces", only the faces, side by side.
        Without a face: the whole picture with ``style`` (the caller redoes a face
        style's as the centre square) and 0."""
        from .portrait import face_crops, find_faces, paste_faces

        settings = self.portrait
        found = find_faces(picture, min_size=settings.min_face)
        found = sorted(found, key=lambda face: face.box[2] * face.box[3],
                       reverse=True)[:settings.max_faces]
        lap("faces")
        if not found:
            return (picture if style.face else self._run(picture, style.name, colors)), 0

        def convert_face(crop: Image.Image) -> Image.Image:
            return self._run(crop, style.name, colors)

        if mode == "faces":
            return strip(face_crops(picture, found, convert_face)), len(found)
        scene_style = (self.engine.style(settings.scene_style) if style.face else style).name
        scene = self._run(picture, scene_style, colors)
        return paste_faces(picture, found, scene, convert_face), len(found)

    def _from_cache(self, lookup: Lookup, fmt: str, fingerprint: Fingerprint,
                    size: tuple[int, int]) -> tuple[bytes, int | None] | None:
        """The cached result for this input and its faces (None: portrait mode did not
        run), resized to ``size`` if it was sent at a slightly different size; None on
        a miss."""
        cached = lookup.same_photo(fingerprint)
        if cached is None:
            return None
        faces = None if cached.faces < 0 else cached.faces
        if cached.size == size:
            return cached.data, faces
        with Image.open(io.BytesIO(cached.data)) as stored:
            if stored.size != cached.size:  # not the picture's shape: the faces, a square
                return cached.data, faces
            result = stored.convert("RGB").resize(size, Image.Resampling.LANCZOS)
        return encode(result, fmt, self.quality), faces

    def convert_image(self, image: Image.Image, style: StyleInfo, size: int,
                      options: Options = Options()) -> Image.Image:
        """Convert a PIL image (any mode) already in memory; no decode, no cache."""
        portrait = options.portrait_for(style)
        rgb = to_rgb(image)
        if portrait != "off":
            picture = fit(rgb, size)
            result, faces = self._portrait(picture, style, portrait, options.colors, _Laps())
            if faces or not style.face:
                return result
        picture = fit(rgb, size, square=style.face)
        return self._run(picture, style.name, options.colors)


def strip(crops: list[Image.Image]) -> Image.Image:
    """The crops side by side, in one picture (portrait=faces)."""
    width = sum(crop.width for crop in crops)
    height = max(crop.height for crop in crops)
    sheet = Image.new("RGB", (width, height), "white")
    left = 0
    for crop in crops:
        sheet.paste(crop, (left, 0))
        left += crop.width
    return sheet


def describe_timings(timings: dict[str, Any]) -> str:
    """``decode;dur=3.1, infer;dur=410.2, ...`` for a Server-Timing header."""
    return ", ".join(f"{stage};dur={ms}" for stage, ms in timings.items())
