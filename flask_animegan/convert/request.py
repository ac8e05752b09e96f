"""The one parser of a conversion's parameters, for the views, the job door, the CLI and
the rate limit's cost: raw strings in, a typed :class:`ConvertRequest` out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import OUTPUT_FORMATS
from ..errors import BadParameter
from ..runtime.engine import MIN_SIDE
from .colors import COLOR_MODES

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime.catalog import StyleInfo
    from ..runtime.engine import InferenceEngine

#: ``portrait``: auto (on for the face styles), on, off, or faces (only the faces, each a
#: crop of its own, side by side).
PORTRAIT_MODES = ("auto", "on", "off", "faces")
FORMAT_ALIASES = {"jpg": "jpeg"}
#: What a parameter may carry around its value: spaces and tabs only (str.strip() would
#: also drop \x1c-\x1f, which the OpenAPI document's patterns cannot say the same way).
PARAMETER_SPACE = " \t"


@dataclass(frozen=True)
class Sizes:
    """The sizes and format a request may ask for, derived once from the settings."""

    default: int  # ANIMEGAN_MAX_SIDE: a request without a size
    photo: int  # the largest for a photo (ANIMEGAN_MAX_OUTPUT_SIDE; above default: tiles)
    media: int  # the largest for an animation or a video
    default_format: str


@dataclass(frozen=True)
class Options:
    """What a conversion asks for beside its style, size and format."""

    colors: str = "off"  # COLOR_MODES
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
class ConvertRequest:
    """One conversion as asked: the style, the output's long side, its format, the options."""

    style: StyleInfo
    size: int
    format: str
    options: Options = Options()


def parameter_word(raw: Any) -> str:
    """A word parameter as compared with its values: without spaces and tabs around it, in
    lower case if it is ASCII (Python's lower() maps the Kelvin sign to "k"). The OpenAPI
    document's patterns say exactly this."""
    text = str(raw).strip(PARAMETER_SPACE)
    return text.lower() if text.isascii() else text


def parse_size(raw: Any, *, default: int, largest: int) -> int:
    """A long side in pixels from MIN_SIDE to ``largest``; unset or empty: ``default``."""
    if raw is None or raw == "":
        return default
    text = str(raw).strip(PARAMETER_SPACE)
    # ASCII digits only: int() also reads "٦٤", "６４" and "1_6"
    size = int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else -1
    if not MIN_SIDE <= size <= largest:
        raise BadParameter(f"size must be a whole number of pixels from {MIN_SIDE} to "
                           f"{largest}, got {str(raw)[:20]!r}")
    return size


def parse_format(raw: Any, default: str) -> str:
    if raw is None or raw == "":
        return default
    word = parameter_word(raw)
    fmt = FORMAT_ALIASES.get(word, word)
    if fmt not in OUTPUT_FORMATS:
        raise BadParameter(f"format must be one of {', '.join(OUTPUT_FORMATS)}, "
                           f"got {str(raw)[:20]!r}")
    return fmt


def parse_choice(name: str, raw: Any, choices: tuple[str, ...], default: str) -> str:
    """A parameter that is one of ``choices`` (any case; unset or empty: ``default``)."""
    if raw is None or raw == "":
        return default
    value = parameter_word(raw)
    if value not in choices:
        raise BadParameter(f"{name} must be one of {', '.join(choices)}, got {str(raw)[:20]!r}")
    return value


def parse_options(colors: Any = None, portrait: Any = None) -> Options:
    return Options(colors=parse_choice("colors", colors, COLOR_MODES, "off"),
                   portrait=parse_choice("portrait", portrait, PORTRAIT_MODES, "auto"))


def parse_request(params: Mapping[str, Any], engine: InferenceEngine, sizes: Sizes, *,
                  media: bool = False) -> ConvertRequest:
    """The request ``params`` ask for (``style``, ``size``, ``format``, ``colors``,
    ``portrait``), checked before anything is decoded: an unknown style raises
    StyleNotFound (404), a bad value BadParameter (400). ``media``: for the frames of an
    animation or a video, whose size is at most ``sizes.media`` and which have no
    portrait mode."""
    style = engine.style(params.get("style") or None)
    size = parse_size(params.get("size"), default=sizes.default,
                      largest=sizes.media if media else sizes.photo)
    fmt = parse_format(params.get("format"), sizes.default_format)
    options = parse_options(params.get("colors"), params.get("portrait"))
    if media and options.portrait in ("on", "faces"):
        raise BadParameter("portrait mode is for photos: a job converts each frame as a "
                           "whole; leave portrait out (or send portrait=off)")
    return ConvertRequest(style, size, fmt, options)


def requested_size(params: Mapping[str, Any], sizes: Sizes) -> int | None:
    """The size a photo request asks for, or None when it is missing or bad (the view
    refuses it then): the rate limit's cost reads it before the view runs."""
    try:
        return parse_size(params.get("size"), default=sizes.default, largest=sizes.photo)
    except BadParameter:
        return None
