"""The one conversion path: every caller (views, jobs, CLI, bench) goes through
:meth:`Converter.stylize`, so a frame and a photo of the same pixels convert alike."""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from PIL import Image

from ..config import PortraitLimits
from ..errors import ConversionError, Overloaded
from ..inputs.decoding import fit, fitted_size, to_rgb
from ..inputs.isolation import Decoder
from ..inputs.media import AudioTrack, Frame, MediaInfo
from ..outputs.labels import COMPOSITE, TRAINED, ContentLabel, Labelling
from ..outputs.segments import Segment, segment_frames
from ..outputs.stills import MIME_TYPES, encode
from ..runtime import tiles as tiling
from ..runtime.catalog import StyleInfo
from ..runtime.tiles import TileProgress
from . import repeats
from .colors import keep_colors
from .request import ConvertRequest
from .strength import FULL, mix_strength

if TYPE_CHECKING:  # pragma: no cover
    from ..cache import CachedResult, NearDuplicateCache
    from ..cache.near_duplicate import Fingerprint, Lookup
    from ..outputs.animations import FrameWriter
    from ..portrait import Face
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
    #: portrait=faces: per face, the matrix (a, b, c, d, e, f) from the input's pixels to
    #: its square in the result; None when not known (other modes, a cache hit)
    face_crops: list[tuple[float, ...]] | None = None
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
    stopped: str | None = None  # why it ends before the upload's last frame (StopFrames)


#: Called after each frame with (frames done, frames reused); raising stops the run.
Progress = Callable[[int, int], None]


class StopFrames(Exception):
    """Raised by a Progress callback: the result ends with the frames written so far, and
    its ``stopped`` says why (the exception's message)."""


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
                 tile_above: int | None = None, audio_timeout: float | None = None,
                 labelling: Labelling | None = None) -> None:
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
        #: what results say about how they were made (None: ANIMEGAN_CONTENT_LABELS off)
        self.labelling = labelling

    def label(self, style: StyleInfo, colors: str = "off", scene: StyleInfo | None = None,
              strength: int = FULL) -> ContentLabel | None:
        """What a result of ``style`` (faces pasted on a ``scene`` of another style) says
        about how it was made; None with labels off. Only the photo's own pixels (colours
        ``keep``, a strength below 100) make it a composite: portrait mode converts the
        scene too."""
        if self.labelling is None:
            return None
        name, licence = style.name, style.licence
        if scene is not None and scene.name != style.name:
            name = f"{style.name} (faces), {scene.name} (scene)"
            if scene.licence != style.licence:
                licence = f"{style.licence} (faces), {scene.licence} (scene)"
        composite = colors == "keep" or strength < FULL
        return ContentLabel(COMPOSITE if composite else TRAINED, name, licence,
                            self.labelling.software)

    def _photo_label(self, style: StyleInfo, colors: str, portrait: str,
                     faces: int | None) -> ContentLabel | None:
        """A photo's label: a face style's faces on the scene style name both styles."""
        scene = None
        if faces and portrait != "faces" and style.face:
            scene = self.engine.style(self.portrait.scene_style)
        return self.label(style, colors, scene)

    def _signed(self, data: bytes, mimetype: str, label: ContentLabel | None,
                upload: bytes) -> bytes:
        """``data`` with a C2PA manifest when a certificate is configured; a photo's is
        signed for each answer, so that its ingredient is this upload even on a cache hit."""
        if label is None or self.labelling is None or self.labelling.signer is None:
            return data
        return self.labelling.signer.sign(data, mimetype, label, upload)

    def stylize(self, picture: Image.Image, style: str, colors: str, *,
                progress: TileProgress | None = None,
                on_busy: Callable[[], None] | None = None) -> Image.Image:
        """The network on ``picture`` (tiled above ``tile_above``: ``progress`` and
        ``on_busy`` as :meth:`InferenceEngine.run`'s), colours kept as asked."""
        tiled = self.tile_above is not None and max(picture.size) > self.tile_above
        result = self.engine.run(picture, style, tiled=tiled, progress=progress,
                                 on_busy=on_busy)
        return keep_colors(result, picture, colors)

    def fitted_for(self, source_size: tuple[int, int], request: ConvertRequest) -> tuple[int, int]:
        """The size the network sees for a photo of ``source_size`` at ``request``."""
        square = request.style.face and request.options.portrait_for(request.style) == "off"
        return fitted_size(source_size, request.size, square=square)

    def tiles_for(self, source_size: tuple[int, int], request: ConvertRequest) -> int:
        """How many tiles a photo of ``source_size`` takes at ``request`` (0: run whole)."""
        if not self.may_tile(request):
            return 0
        width, height = self.fitted_for(source_size, request)
        if max(width, height) <= (self.tile_above or 0):
            return 0
        return len(tiling.tiles(height, width, tiling.TILE, tiling.MARGIN))

    def may_tile(self, request: ConvertRequest) -> bool:
        """Whether a photo at ``request``'s size may run in tiles (a large enough one)."""
        return self.tile_above is not None and request.size > self.tile_above

    def find_faces(self, picture: Image.Image, work: Image.Image | None = None) -> list[Face]:
        """The faces of ``picture``, searched on ``work`` (a larger copy of it, from the same
        decode) when given, so that a small output loses no face a large one finds."""
        from ..portrait import find_faces

        limits = self.portrait
        work = work if work is not None and work.width > picture.width else picture
        found = find_faces(work, min_size=limits.min_face, max_faces=limits.max_faces)
        if work is picture:
            return found
        return [face.scaled(picture.width / work.width) for face in found]

    def _portrait(self, picture: Image.Image, style: StyleInfo, mode: str, colors: str,
                  lap: _Laps, work: Image.Image | None = None,
                  progress: TileProgress | None = None,
                  on_busy: Callable[[], None] | None = None) -> tuple[Image.Image, list[Face]]:
        """Each face converted with ``style`` over the scene (mode "faces": side by side), and
        the faces. No face: the picture converted (a face style's: unconverted), and none."""
        from ..portrait import face_crops, paste_faces

        limits = self.portrait
        found = self.find_faces(picture, work)
        lap("faces")
        if not found:
            return (picture if style.face else self.stylize(
                picture, style.name, colors, progress=progress, on_busy=on_busy)), []

        def convert_face(crop: Image.Image) -> Image.Image:
            return self.stylize(crop, style.name, colors)

        if mode == "faces":
            return strip(face_crops(picture, found, convert_face)), found
        scene_style = (self.engine.style(limits.scene_style) if style.face else style).name
        scene = self.stylize(picture, scene_style, colors, progress=progress, on_busy=on_busy)
        return paste_faces(picture, found, scene, convert_face), found

    def photo(self, data: bytes, request: ConvertRequest, scope: str | None = None, *,
              progress: TileProgress | None = None,
              on_busy: Callable[[], None] | None = None) -> Conversion:
        """Convert an image file. With a cache, the same file sent again within ``scope``
        (None: everyone) is answered undecoded, and the same photo before the network runs;
        ``progress`` and ``on_busy``: for a picture that runs in tiles (:meth:`stylize`)."""
        style, size, fmt, options = (request.style, request.size, request.format,
                                     request.options)
        lap = _Laps()
        portrait = options.portrait_for(style)
        square = style.face and portrait == "off"
        # a cached result carries its labels: they part the entries as the options do
        labels = self.labelling.software if self.labelling is not None else ""
        namespace = (scope, style.name, size, fmt, options.colors, portrait, labels)
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
        # serves both, fitted so that its centre square is ``size`` a side; portrait mode
        # searches faces on that decode, at least ``detect_side`` long
        cover = style.face and portrait != "off"
        work_side = size if portrait == "off" else max(size, self.portrait.detect_side)
        decoded = self.decoder.decode(data, size=work_side, square=square, cover=cover)
        fitted = decoded.image  # what the network sees
        if cover or work_side != size:
            fitted = fit(decoded.image, size, source_size=decoded.source_size)
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
        crops: list[tuple[float, ...]] | None = None
        if portrait == "off":
            result = self.stylize(fitted, style.name, options.colors, progress=progress,
                                  on_busy=on_busy)
        else:
            result, found = self._portrait(fitted, style, portrait, options.colors, lap,
                                           work=decoded.image, progress=progress,
                                           on_busy=on_busy)
            faces = len(found)
            if not faces and style.face:
                # no face: as without portrait mode, the centre square at full resolution
                square = True
                fitted = fit(decoded.image, size, square=True, source_size=decoded.source_size)
                result = self.stylize(fitted, style.name, options.colors, progress=progress,
                                      on_busy=on_busy)
            elif faces and portrait == "faces":
                # the result is the faces side by side: so is the input it is compared with
                fitted, crops = face_sheet(fitted, found)
        lap("infer")
        label = self._photo_label(style, options.colors, portrait, faces)
        encoded = encode(result, fmt, self.quality, label)
        lap("encode")
        if lookup is not None:  # at full strength: every strength is mixed from it
            lookup.cache.put(namespace, fingerprint, encoded, stored_size,
                             -1 if faces is None else faces, upload=upload)
        conversion = Conversion(encoded, MIME_TYPES[fmt], fmt, style.name, fitted.size,
                                cache_hit=False, face_crop=square, input_image=fitted,
                                timings=lap.timings, faces=faces, colors=options.colors,
                                face_crops=crops)
        return self._finish(conversion, options.strength, label, data, result)

    def _finish(self, conversion: Conversion, strength: int, label: ContentLabel | None,
                upload: bytes, result: Image.Image | None = None) -> Conversion:
        """``conversion`` mixed with its input at ``strength`` (no inference; the
        full-strength result kept in ``full_data``), then signed for this ``upload``."""
        if strength != FULL:
            started = time.perf_counter()
            full = self._signed(conversion.data, conversion.mimetype, label, upload)
            label = None if label is None else replace(label, source_type=COMPOSITE)
            conversion.full_data, conversion.strength = full, strength
            conversion.data = self.remix(conversion.data if result is None else result,
                                         conversion.input(), strength, conversion.format,
                                         label)
            conversion.timings["strength"] = round((time.perf_counter() - started) * 1000, 2)
        conversion.data = self._signed(conversion.data, conversion.mimetype, label, upload)
        return conversion

    def remix(self, result: bytes | Image.Image, photo: Image.Image, strength: int,
              fmt: str, label: ContentLabel | None = None) -> bytes:
        """A full-strength ``result`` (encoded, or pixels) of ``photo`` mixed at ``strength``
        and encoded as ``fmt`` with ``label``: what a change of strength costs instead of an
        inference."""
        if isinstance(result, bytes):
            with Image.open(io.BytesIO(result)) as stored:
                pixels = stored.convert("RGB")
        else:
            pixels = result
        return encode(mix_strength(pixels, photo, strength), fmt, self.quality, label)

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
        sheet = bool(faces) and request.options.portrait_for(style) == "faces"
        if sheet:
            fitted = None  # the faces side by side, found again if a page asks
        if square or sheet:
            with Image.open(io.BytesIO(cached.data)) as stored:
                out_size = stored.size

        def input_image() -> Image.Image:
            if not sheet:
                return self.decoder.decode(data, size=size, square=square).image
            work_side = max(size, self.portrait.detect_side)
            decoded = self.decoder.decode(data, size=work_side, cover=style.face)
            picture = fit(decoded.image, size, source_size=decoded.source_size)
            return face_sheet(picture, self.find_faces(picture, decoded.image))[0]

        label = self._photo_label(style, request.options.colors,
                                  request.options.portrait_for(style), faces)
        conversion = Conversion(cached.data, MIME_TYPES[fmt], fmt, style.name, out_size,
                                cache_hit=True, face_crop=square, input_image=fitted,
                                input_loader=input_image, timings=timings, faces=faces,
                                colors=request.options.colors)
        return self._finish(conversion, request.options.strength, label, data)

    def image(self, image: Image.Image, request: ConvertRequest) -> Image.Image:
        """Convert a PIL image (any mode) already in memory; no decode, no cache."""
        style, options = request.style, request.options
        portrait = options.portrait_for(style)
        rgb = to_rgb(image)
        if portrait != "off":
            picture = fit(rgb, request.size)
            work = fit(rgb, max(request.size, self.portrait.detect_side))
            result, found = self._portrait(picture, style, portrait, options.colors, _Laps(),
                                           work=work)
            if found or not style.face:
                return mix_strength(result, picture, options.strength)
        picture = fit(rgb, request.size, square=style.face)
        return mix_strength(self.stylize(picture, style.name, options.colors), picture,
                            options.strength)

    def frames(self, frames: Iterator[Frame], style: str, colors: str,
               on_busy: Callable[[], None] | None = None, strength: int = FULL,
               fresh_every: int = 0) -> Iterator[tuple[Frame, Image.Image, bool]]:
        """Each frame, its converted picture (mixed at ``strength``), and whether it reused
        the last one's (never across a multiple of ``fresh_every``, where a segment starts);
        while the model's queue is full, ``on_busy`` is called (it may raise) and the frame
        retried."""
        anchor: repeats.Picture | None = None  # the last frame converted
        converted: Image.Image | None = None
        for frame in frames:
            if fresh_every and frame.index % fresh_every == 0:
                anchor = converted = None
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

    def segments(self, data: bytes, info: MediaInfo, request: ConvertRequest, *,
                 start: int = 0, progress: Progress | None = None,
                 on_busy: Callable[[], None] | None = None,
                 timeout_total: float | None = None) -> Iterator[Segment]:
        """Convert an animation or a video from its segment ``start`` on, yielding each
        segment once encoded (the first with its preview). ``progress`` gets the frames
        done in all and those reused since ``start``; its StopFrames ends the segment and
        the frames there."""
        encoders = _encoders()
        style, options = request.style, request.options
        label = self.label(style, options.colors, strength=options.strength)
        per = segment_frames(info)
        frames = self.decoder.frames(data, info, size=request.size, square=style.face,
                                     start=start * per, total_timeout=timeout_total)
        writer: FrameWriter | None = None
        segment = Segment(start, start * per, 0, 0, 0.0, 0.0, b"")
        reused = 0
        try:
            for frame, picture, again in self.frames(frames, style.name, options.colors,
                                                     on_busy, options.strength, per):
                if writer is None:
                    writer, _ = encoders.writer_for(info, quality=self.quality, label=label)
                    segment = Segment(frame.index // per, frame.index, 0, 0, frame.pts,
                                      frame.pts, b"")
                    if segment.index == 0:
                        segment.preview = encoders.preview(picture, self.quality, label)
                writer.add(picture, frame.duration_ms, frame.disposal,
                           pts=frame.pts - segment.start_s)
                segment.frames += 1
                segment.reused += again
                segment.end_s = frame.pts + frame.duration_ms / 1000
                reused += again
                if progress is not None:
                    try:
                        progress(frame.index + 1, reused)
                    except StopFrames as stop:
                        segment.stopped = str(stop)
                if segment.stopped or (frame.index + 1) % per == 0:
                    segment.data, writer = writer.finish(), None
                    yield segment
                    if segment.stopped:
                        return
            if writer is not None:  # the last segment, shorter
                segment.data, writer = writer.finish(), None
                yield segment
        finally:
            if writer is not None:
                writer.close()  # an abandoned segment: its temporary file goes
            getattr(frames, "close", lambda: None)()  # the helper, killed

    def join(self, data: bytes, info: MediaInfo, request: ConvertRequest,
             segments: Sequence[Segment], audio: AudioTrack | None = None, *,
             audio_error: str | None = None, partial: bool = False) -> bytes:
        """The result of ``segments`` (the first ones of the upload ``data``, in order) in
        the upload's kind, with the video's ``audio``, labelled and signed; ``partial``:
        the part converted so far, its audio ending with its frames, unsigned."""
        encoders = _encoders()
        options = request.options
        label = self.label(request.style, options.colors, strength=options.strength)
        joined: bytes = encoders.join(info, segments, audio, audio_error=audio_error,
                                      label=label, overrun=0.0 if partial
                                      else encoders.AUDIO_OVERRUN_S)
        return joined if partial else self._signed(joined, self.media_type(info), label, data)

    @staticmethod
    def media_type(info: MediaInfo) -> str:
        """The MIME type of an animation's or a video's result."""
        mimetype: str = _encoders().mimetype_for(info)
        return mimetype

    def audio(self, data: bytes, info: MediaInfo) -> tuple[AudioTrack | None, str | None]:
        """The video's audio track as the result carries it, and why not when it cannot."""
        encoders = _encoders()
        found: tuple[AudioTrack | None, str | None] = encoders.read_track(
            info, lambda: self.decoder.audio(
                data, info, timeout=self.audio_timeout or encoders.AUDIO_TIMEOUT_S))
        return found

    def media(self, data: bytes, info: MediaInfo, request: ConvertRequest, *,
              progress: Progress | None = None, on_busy: Callable[[], None] | None = None,
              timeout_total: float | None = None) -> MediaResult:
        """Convert an animation or a video in one go: its segments, joined."""
        audio, error = self.audio(data, info)
        segments = list(self.segments(data, info, request, progress=progress,
                                      on_busy=on_busy, timeout_total=timeout_total))
        if not segments:
            raise ConversionError("the file holds no frame to convert")
        result = self.join(data, info, request, segments, audio, audio_error=error)
        return MediaResult(result, self.media_type(info), segments[0].preview,
                           segments[-1].stopped)


def _encoders() -> Any:
    """The animation and video encoders, imported on first use: an app of photos only
    needs no PyAV."""
    try:
        from ..outputs import animations
    except ImportError as exc:
        raise ConversionError("animations and videos need PyAV on this server: pip "
                              "install 'flask-animegan[jobs]'") from exc
    return animations


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


def face_sheet(picture: Image.Image,
               faces: list[Face]) -> tuple[Image.Image, list[tuple[float, ...]]]:
    """The faces of ``picture`` side by side as portrait=faces converts them, unconverted,
    and per face the matrix from a point of the picture to one of its square, both in
    fractions of their sides (a page draws the same from the photo it holds)."""
    import numpy as np

    from ..portrait import face_crops
    from ..portrait.align import crop_matrix

    crops = face_crops(picture, faces, lambda crop: crop)
    to_fraction = np.diag([picture.width, picture.height, 1.0])
    matrices = []
    for face, crop in zip(faces, crops, strict=True):
        to_square = np.diag([1 / crop.width, 1 / crop.height, 1.0])
        matrix = to_square @ np.linalg.inv(crop_matrix(face, crop.width)) @ to_fraction
        matrices.append(tuple(round(float(v), 5) for v in matrix[:2].reshape(-1)))
    return strip(crops), matrices


def describe_timings(timings: dict[str, Any]) -> str:
    """``stage;dur=<ms>, ...`` for a Server-Timing header."""
    return ", ".join(f"{stage};dur={ms}" for stage, ms in timings.items())
