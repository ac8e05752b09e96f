"""The one conversion path: every caller (views, jobs, CLI, bench) goes through
:meth:`Converter.stylize`, so a frame and a photo of the same pixels convert alike."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

from ..config import PortraitLimits
from ..errors import ConversionError, Overloaded
from ..inputs.decoding import centre_square, fit, to_rgb
from ..inputs.isolation import Decoder
from ..inputs.media import Frame, MediaInfo
from ..outputs.stills import MIME_TYPES, encode
from ..runtime.catalog import StyleInfo
from . import repeats
from .colors import keep_colors
from .request import ConvertRequest
from .strength import FULL, mix_strength

if TYPE_CHECKING:  # pragma: no cover
    from ..cache import CachedResult, NearDuplicateCache
    from ..cache.near_duplicate import Fingerprint, Lookup
    from ..runtime.engine import InferenceEngine


@dataclass
class Conversion:
    """The outcome of converting one upload."""

    data: bytes
    mimetype: str
    format: str
    style: str
    size: tuple[int, int]
    cache_hit: bool
    face_crop: bool  # the centre square was converted
    faces: int | None = None  # None: portrait mode did not run
    colors: str = "off"
    timings: dict[str, float] = field(default_factory=dict)  # stage -> milliseconds
    strength: int = FULL
    #: the full-strength result (what the cache keeps); ``data`` is it mixed at ``strength``
    full_data: bytes = field(default=b"", repr=False)
    #: the fitted input; a cache hit decodes it only if the result page asks
    input_image: Image.Image | None = field(default=None, repr=False)
    input_loader: Callable[[], Image.Image] | None = field(default=None, repr=False)

    def input(self) -> Image.Image:
        """The fitted input (decoding it now if the result came undecoded)."""
        if self.input_image is None:
            assert self.input_loader is not None
            self.input_image = self.input_loader()
        return self.input_image

    def full(self) -> bytes:
        """The result at full strength (``data`` itself unless a strength was asked)."""
        return self.full_data or self.data


@dataclass
class MediaResult:
    """A converted animation or video: the file, its type, its first frame as a JPEG."""

    data: bytes
    mimetype: str
    preview: bytes


#: Called after each frame with (frames done, frames reused); raising stops the run.
Progress = Callable[[int, int], None]


class _Laps:
    """Milliseconds per stage, in order."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._clock = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round((now - self._clock) * 1000, 2)
        self._clock = now


class Converter:
    """Turns uploads, frames and images into anime pictures, through one infer stage."""

    def __init__(self, decoder: Decoder, engine: InferenceEngine, *, quality: int,
                 cache: NearDuplicateCache | None = None,
                 portrait: PortraitLimits | None = None,
                 tile_above: int | None = None, audio_timeout: float | None = None) -> None:
        self.decoder = decoder
        self.engine = engine
        self.quality = quality
        self.cache = cache if cache is not None and cache.enabled else None
        self.portrait = portrait or PortraitLimits()
        #: pictures with a longer side run in tiles
        self.tile_above = tile_above
        self.audio_timeout = audio_timeout
        #: reuse the result of a frame that repeats the last one (off: the bench's baseline)
        self.reuse_repeats = True

    def stylize(self, picture: Image.Image, style: str, colors: str) -> Image.Image:
        """The network on ``picture`` (tiled above ``tile_above``), colours kept as asked."""
        tiled = self.tile_above is not None and max(picture.size) > self.tile_above
        return keep_colors(self.engine.run(picture, style, tiled=tiled), picture, colors)

    def _portrait(self, picture: Image.Image, style: StyleInfo, mode: str, colors: str,
                  lap: _Laps) -> tuple[Image.Image, int]:
        """Each face converted with ``style`` over the scene (mode "faces": side by side), and
        how many. No face: the picture converted (a face style's: unconverted), and 0."""
        from ..portrait import face_crops, find_faces, paste_faces

        limits = self.portrait
        found = find_faces(picture, min_size=limits.min_face, max_faces=limits.max_faces)
        lap("faces")
        if not found:
            return (picture if style.face else self.stylize(picture, style.name, colors)), 0

        def convert_face(crop: Image.Image) -> Image.Image:
            return self.stylize(crop, style.name, colors)

        if mode == "faces":
            return strip(face_crops(picture, found, convert_face)), len(found)
        scene_style = (self.engine.style(limits.scene_style) if style.face else style).name
        scene = self.stylize(picture, scene_style, colors)
        return paste_faces(picture, found, scene, convert_face), len(found)

    def photo(self, data: bytes, request: ConvertRequest,
              scope: str | None = None) -> Conversion:
        """Convert an image file. With a cache, the same file sent again within ``scope``
        (None: everyone) is answered undecoded, and the same photo before the network runs."""
        style, size, fmt, options = (request.style, request.size, request.format,
                                     request.options)
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
                return self._cached(data, again, request, square, None, lap.timings)
        # a face style that looks for faces may fall back to the centre square: one decode
        # serves both, fitted so that its centre square is ``size`` a side
        cover = style.face and portrait != "off"
        decoded = self.decoder.decode(data, size=size, square=square, cover=cover)
        fitted = fit(decoded.image, size) if cover else decoded.image  # what the network sees
        lap("decode")
        fingerprint: Fingerprint | None = None
        if lookup is not None:
            # the same photo, compared on what the network sees: a hit needs no resize
            if lookup.cache.near:
                fingerprint = lookup.cache.fingerprint(fitted)
            cached = lookup.same_photo(fingerprint)
            lap("cache")
            if cached is not None:
                return self._cached(data, cached, request, square, fitted, lap.timings)
        stored_size = fitted.size
        faces: int | None = None
        if portrait == "off":
            result = self.stylize(fitted, style.name, options.colors)
        else:
            result, faces = self._portrait(fitted, style, portrait, options.colors, lap)
            if not faces and style.face:
                # no face: as without portrait mode, the centre square at full resolution
                square = True
                fitted = decoded.image.crop(centre_square(decoded.image.size))
                result = self.stylize(fitted, style.name, options.colors)
        lap("infer")
        encoded = encode(result, fmt, self.quality)
        lap("encode")
        if lookup is not None:  # at full strength: every strength is mixed from it
            lookup.cache.put(namespace, fingerprint, encoded, stored_size,
                             -1 if faces is None else faces, upload=upload)
        conversion = Conversion(encoded, MIME_TYPES[fmt], fmt, style.name, fitted.size,
                                cache_hit=False, face_crop=square, input_image=fitted,
                                timings=lap.timings, faces=faces, colors=options.colors)
        return self._at_strength(conversion, options.strength, result)

    def _at_strength(self, conversion: Conversion, strength: int,
                     result: Image.Image | None = None) -> Conversion:
        """``conversion`` mixed with its input at ``strength`` (no inference): its ``data``
        re-encoded, the full-strength result kept in ``full_data``."""
        if strength == FULL:
            return conversion
        started = time.perf_counter()
        conversion.full_data, conversion.strength = conversion.data, strength
        conversion.data = self.remix(conversion.data if result is None else result,
                                     conversion.input(), strength, conversion.format)
        conversion.timings["strength"] = round((time.perf_counter() - started) * 1000, 2)
        return conversion

    def remix(self, result: bytes | Image.Image, photo: Image.Image, strength: int,
              fmt: str) -> bytes:
        """A full-strength ``result`` (encoded, or pixels) of ``photo`` mixed at ``strength``
        and encoded as ``fmt``: what a change of strength costs instead of an inference."""
        if isinstance(result, bytes):
            with Image.open(io.BytesIO(result)) as stored:
                pixels = stored.convert("RGB")
        else:
            pixels = result
        return encode(mix_strength(pixels, photo, strength), fmt, self.quality)

    def _cached(self, data: bytes, cached: CachedResult, request: ConvertRequest,
                square: bool, fitted: Image.Image | None,
                timings: dict[str, float]) -> Conversion:
        """A conversion answered from the cache: the same bytes (``fitted`` None) or the same
        photo (``fitted``, its decoded input); an input not at hand is decoded if a page asks."""
        style, size, fmt = request.style, request.size, request.format
        faces = None if cached.faces < 0 else cached.faces
        out_size = fitted.size if fitted is not None else cached.size
        if style.face and faces == 0 and not square:
            # a face style whose portrait mode found no face converted the centre square
            square, fitted = True, None
        if square:
            with Image.open(io.BytesIO(cached.data)) as stored:
                out_size = stored.size

        def input_image() -> Image.Image:
            return self.decoder.decode(data, size=size, square=square).image

        conversion = Conversion(cached.data, MIME_TYPES[fmt], fmt, style.name, out_size,
                                cache_hit=True, face_crop=square, input_image=fitted,
                                input_loader=input_image, timings=timings, faces=faces,
                                colors=request.options.colors)
        return self._at_strength(conversion, request.options.strength)

    def image(self, image: Image.Image, request: ConvertRequest) -> Image.Image:
        """Convert a PIL image (any mode) already in memory; no decode, no cache."""
        style, options = request.style, request.options
        portrait = options.portrait_for(style)
        rgb = to_rgb(image)
        if portrait != "off":
            picture = fit(rgb, request.size)
            result, faces = self._portrait(picture, style, portrait, options.colors, _Laps())
            if faces or not style.face:
                return mix_strength(result, picture, options.strength)
        picture = fit(rgb, request.size, square=style.face)
        return mix_strength(self.stylize(picture, style.name, options.colors), picture,
                            options.strength)

    def frames(self, frames: Iterator[Frame], style: str, colors: str,
               on_busy: Callable[[], None] | None = None, strength: int = FULL,
               ) -> Iterator[tuple[Frame, Image.Image, bool]]:
        """Each frame, its converted picture (mixed at ``strength``), and whether it reused
        the last one's; while the model's queue is full, ``on_busy`` is called (it may
        raise) and the frame retried."""
        anchor: repeats.Picture | None = None  # the last frame converted
        converted: Image.Image | None = None
        for frame in frames:
            picture = repeats.Picture.of(frame.image) if self.reuse_repeats else None
            if (picture is not None and converted is not None
                    and repeats.is_repeat(picture, anchor)):
                yield frame, converted, True
                continue
            while True:
                try:
                    converted = mix_strength(self.stylize(frame.image, style, colors),
                                             frame.image, strength)
                    break
                except Overloaded:
                    if on_busy is None:
                        raise
                    on_busy()
                    time.sleep(0.5)  # web conversions fill the model's queue: try again soon
            anchor = picture
            yield frame, converted, False

    def media(self, data: bytes, info: MediaInfo, request: ConvertRequest, *,
              progress: Progress | None = None, on_busy: Callable[[], None] | None = None,
              timeout_total: float | None = None) -> MediaResult:
        """Convert an animation or a video frame by frame into the upload's kind."""
        try:  # imported on first use: an app of photos only needs no PyAV
            from ..outputs import animations as encoders
        except ImportError as exc:
            raise ConversionError("animations and videos need PyAV on this server: pip "
                                  "install 'flask-animegan[jobs]'") from exc
        style = request.style
        writer, mimetype = encoders.writer_for(
            info, lambda: self.decoder.audio(
                data, info, timeout=self.audio_timeout or encoders.AUDIO_TIMEOUT_S),
            quality=self.quality)
        frames = self.decoder.frames(data, info, size=request.size, square=style.face,
                                     total_timeout=timeout_total)
        done = reused = 0
        first: Image.Image | None = None
        try:
            for frame, picture, again in self.frames(frames, style.name,
                                                     request.options.colors, on_busy,
                                                     request.options.strength):
                first = first or picture
                writer.add(picture, frame.duration_ms, frame.disposal, pts=frame.pts)
                done, reused = done + 1, reused + again
                if progress is not None:
                    progress(done, reused)
            if first is None:
                raise ConversionError("the file holds no frame to convert")
            result = writer.finish()
        finally:
            writer.close()  # an abandoned result: its temporary file goes
            getattr(frames, "close", lambda: None)()  # the helper, killed
        return MediaResult(result, mimetype, encoders.preview(first, self.quality))


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
    """``stage;dur=<ms>, ...`` for a Server-Timing header."""
    return ", ".join(f"{stage};dur={ms}" for stage, ms in timings.items())
