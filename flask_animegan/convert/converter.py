"""The one conversion path: photos, frames of animations and videos, and in-memory images.

Every caller (the views, the job runner, the CLI, the bench) converts through a
:class:`Converter`, whose infer stage (:meth:`Converter.stylize`: tiles above
ANIMEGAN_MAX_SIDE, then colours; portrait mode around it for photos) is the same for all.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

from ..config import PortraitLimits
from ..errors import ConversionError, Overloaded
from ..inputs.decoding import DecodedUpload, fit, fitted_size, to_rgb
from ..outputs.stills import MIME_TYPES, encode
from ..inputs.isolation import Decoder
from ..inputs.media import Frame, MediaInfo
from . import repeats
from ..runtime.catalog import StyleInfo
from .colors import keep_colors
from .request import ConvertRequest, Options

if TYPE_CHECKING:  # pragma: no cover
    from ..cache import CachedResult, NearDuplicateCache
    from ..cache.fingerprint import Fingerprint
    from ..cache.near_duplicate import Lookup
    from ..runtime.engine import InferenceEngine

#: Seconds between two tries of a frame while web conversions fill the model's queue.
BUSY_WAIT = 0.5


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
    #: the fitted input (what the network saw); a file sent again is answered undecoded,
    #: and decoded only if the form's page asks for it
    input_image: Image.Image | None = field(default=None, repr=False)
    input_loader: Callable[[], Image.Image] | None = field(default=None, repr=False)

    def input(self) -> Image.Image:
        """The fitted input (decoding it now if the result came undecoded)."""
        if self.input_image is None:
            assert self.input_loader is not None
            self.input_image = self.input_loader()
        return self.input_image


@dataclass
class MediaResult:
    """A converted animation or video: the file, its type, its first frame as a JPEG."""

    data: bytes
    mimetype: str
    preview: bytes
    frames_done: int
    frames_reused: int


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
        #: pictures with a longer side run in tiles (None: never)
        self.tile_above = tile_above
        self.audio_timeout = audio_timeout
        #: reuse the last converted frame's result for a frame that repeats it
        #: (convert/repeats.py); bench/jobs.py turns it off to measure the saving
        self.reuse_repeats = True

    # -- the infer stage ---------------------------------------------------------------
    def stylize(self, picture: Image.Image, style: str, colors: str) -> Image.Image:
        """The network on ``picture`` (in tiles when larger than ``tile_above``), its
        colours kept as ``colors`` asks: what every photo, face and frame goes through."""
        tiled = self.tile_above is not None and max(picture.size) > self.tile_above
        return keep_colors(self.engine.run(picture, style, tiled=tiled), picture, colors)

    def _portrait(self, picture: Image.Image, style: StyleInfo, mode: str, colors: str,
                  lap: _Laps) -> tuple[Image.Image, int]:
        """Portrait mode: the faces found, each converted with ``style`` and pasted over
        the whole converted with the scene style; for "faces", only the faces, side by
        side. Without a face: the picture with ``style`` (a face style's caller converts
        the centre square instead) and 0."""
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

    # -- photos ------------------------------------------------------------------------
    def photo(self, data: bytes, request: ConvertRequest,
              scope: str | None = None) -> Conversion:
        """Convert ``data`` (an image file) as ``request`` asks.

        With a cache, the same file sent again within ``scope`` (None: shared by
        everyone) is answered before it is decoded, and the same photo, after its one
        decode, before the network runs.
        """
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
                return self._sent_again(data, again, request, square, lap.timings)
        fingerprint: Fingerprint | None = None
        decoded: DecodedUpload | None = None
        if lookup is not None:
            # the cache compares statistics of the decoded upload: a hit needs no fit
            sampled = self.decoder.sample(data, size=size, square=square)
            looked_up = fitted_size(sampled.source_size, size, square)
            lap("sample")
            fingerprint = lookup.cache.fingerprint(sampled.samples, size=looked_up,
                                                   source=sampled.source_size,
                                                   jpeg_tables=sampled.jpeg_tables)
            cached = self._from_cache(lookup, fmt, fingerprint, looked_up)
            lap("cache")
            if cached is not None:
                return self._near_hit(data, cached, request, square, looked_up,
                                      sampled.fitted, lap.timings)
            decoded = sampled.fitted
        if decoded is None:
            decoded = self.decoder.decode(data, size=size, square=square)
            lap("decode")
        fitted = decoded.image  # what the network sees
        faces: int | None = None
        if portrait == "off":
            result = self.stylize(fitted, style.name, options.colors)
        else:
            result, faces = self._portrait(fitted, style, portrait, options.colors, lap)
            if not faces and style.face:
                # no face: as without portrait mode, the centre square (decoded anew,
                # so it has the size's full resolution)
                square = True
                fitted = self.decoder.decode(data, size=size, square=True).image
                result = self.stylize(fitted, style.name, options.colors)
        lap("infer")
        encoded = encode(result, fmt, self.quality)
        lap("encode")
        if lookup is not None and fingerprint is not None:
            lookup.cache.put(namespace, fingerprint, encoded, decoded.image.size,
                             -1 if faces is None else faces, upload=upload)
        return Conversion(encoded, MIME_TYPES[fmt], fmt, style.name, fitted.size,
                          cache_hit=False, face_crop=square, input_image=fitted,
                          timings=lap.timings, faces=faces, colors=options.colors)

    def _sent_again(self, data: bytes, cached: CachedResult, request: ConvertRequest,
                    square: bool, timings: dict[str, float]) -> Conversion:
        """The conversion of a file converted before (the same bytes), from its cached
        result; its input decoded only if someone asks."""
        style, size, fmt = request.style, request.size, request.format
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
                          timings=timings, faces=faces, colors=request.options.colors)

    def _near_hit(self, data: bytes, cached: tuple[bytes, int | None],
                  request: ConvertRequest, square: bool, fitted: tuple[int, int],
                  decoded: DecodedUpload | None, timings: dict[str, float]) -> Conversion:
        """The conversion of the same photo as one converted before, from its cached
        result: its input fitted only if someone asks."""
        style, size, fmt = request.style, request.size, request.format
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
                          colors=request.options.colors)

    def _from_cache(self, lookup: Lookup, fmt: str, fingerprint: Fingerprint,
                    size: tuple[int, int]) -> tuple[bytes, int | None] | None:
        """The cached result for this input and its faces, resized to ``size`` if it was
        sent at a slightly different size; None on a miss."""
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

    def image(self, image: Image.Image, request: ConvertRequest) -> Image.Image:
        """Convert a PIL image (any mode) already in memory; no decode, no cache."""
        style, options = request.style, request.options
        portrait = options.portrait_for(style)
        rgb = to_rgb(image)
        if portrait != "off":
            picture = fit(rgb, request.size)
            result, faces = self._portrait(picture, style, portrait, options.colors, _Laps())
            if faces or not style.face:
                return result
        picture = fit(rgb, request.size, square=style.face)
        return self.stylize(picture, style.name, options.colors)

    # -- animations and videos ---------------------------------------------------------
    def frames(self, frames: Iterator[Frame], style: str, colors: str,
               on_busy: Callable[[], None] | None = None,
               ) -> Iterator[tuple[Frame, Image.Image, bool]]:
        """Each frame with its converted picture and whether it was reused: a frame that
        repeats the last converted one (convert/repeats.py's rule) reuses its result, any
        other goes through :meth:`stylize`. While web conversions fill the model's
        queue, ``on_busy`` is called (it may raise to stop) and the frame tried again."""
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
                    converted = self.stylize(frame.image, style, colors)
                    break
                except Overloaded:
                    if on_busy is None:
                        raise
                    on_busy()
                    time.sleep(BUSY_WAIT)
            anchor = picture
            yield frame, converted, False

    def media(self, data: bytes, info: MediaInfo, request: ConvertRequest, *,
              progress: Progress | None = None, on_busy: Callable[[], None] | None = None,
              timeout_total: float | None = None) -> MediaResult:
        """Convert an animation or a video probed as ``info``: frames decoded one at a
        time, converted through :meth:`frames`, written in the upload's kind (GIF, WebP,
        APNG, or MP4 with the source's audio). ``progress`` is called after each frame."""
        encoders = _encoders()
        style = request.style
        writer, mimetype = encoders.writer_for(
            info, lambda: self.decoder.audio(data, info,
                                             self.audio_timeout or encoders.AUDIO_TIMEOUT_S),
            quality=self.quality)
        frames = self.decoder.frames(data, info, size=request.size, square=style.face,
                                     timeout_total=timeout_total)
        done = reused = 0
        first: Image.Image | None = None
        try:
            for frame, picture, again in self.frames(frames, style.name,
                                                     request.options.colors, on_busy):
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
        return MediaResult(result, mimetype, encoders.preview(first, self.quality), done, reused)


def _encoders() -> Any:
    """outputs/animations.py, imported on first use: it needs PyAV (the `jobs` extra), which an
    app that converts only photos need not install."""
    try:
        from ..outputs import animations as encoders
    except ImportError as exc:
        raise ConversionError("animations and videos need PyAV on this server: pip install "
                              "'flask-animegan[jobs]'") from exc
    return encoders


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
