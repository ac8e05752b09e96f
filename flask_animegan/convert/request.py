"""The one parser of a conversion's parameters: raw strings in, a :class:`ConvertRequest` out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import OUTPUT_FORMATS
from ..errors import BadParameter
from ..runtime.engine import MIN_SIDE
from .colors import COLOR_MODES
from .strength import FULL

if TYPE_CHECKING:  # pragma: no cover
    from ..runtime.catalog import StyleInfo
    from ..runtime.engine import InferenceEngine

#: auto: on for the face styles; faces: only the faces, side by side.
PORTRAIT_MODES = ("auto", "on", "off", "faces")
FORMAT_ALIASES = {"jpg": "jpeg"}
#: Stripped around a value: not str.strip(), whose \x1c-\x1f the OpenAPI patterns cannot say.
PARAMETER_SPACE = " \t"


@dataclass(frozen=True)
class Sizes:
    """The sizes and format a request may ask for, derived once from the settings."""

    default: int  # ANIMEGAN_MAX_SIDE
    photo: int  # ANIMEGAN_MAX_OUTPUT_SIDE (above default: tiles)
    media: int  # the largest for an animation or a video
    default_format: str


@dataclass(frozen=True)
class Options:
    """What a conversion asks for beside its style, size and format."""

    colors: str = "off"
    portrait: str = "auto"
    #: percent of the style, mixed after the full-strength result (which the cache keeps)
    strength: int = FULL

    def __post_init__(self) -> None:
        if (self.colors not in COLOR_MODES or self.portrait not in PORTRAIT_MODES
                or not 0 <= self.strength <= FULL):
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
    """A word parameter as compared (as the OpenAPI patterns say): stripped, lower-cased
    only if ASCII (lower() maps the Kelvin sign to "k")."""
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


def parse_strength(raw: Any) -> int:
    """A strength in whole percent from 0 to 100; unset or empty: 100 (the style as it is)."""
    if raw is None or raw == "":
        return FULL
    text = str(raw).strip(PARAMETER_SPACE)
    strength = int(text) if text.isascii() and text.isdigit() and len(text) <= 3 else -1
    if not 0 <= strength <= FULL:
        raise BadParameter(f"strength must be a whole percent from 0 to {FULL}, "
                           f"got {str(raw)[:20]!r}")
    return strength


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


def parse_request(params: Mapping[str, Any], engine: InferenceEngine, sizes: Sizes, *,
                  media: bool = False) -> ConvertRequest:
    """The request ``params`` ask for, checked before anything is decoded (StyleNotFound,
    BadParameter). ``media``: for animations and videos (smaller sizes, no portrait mode)."""
    style = engine.style(params.get("style") or None)
    size = parse_size(params.get("size"), default=sizes.default,
                      largest=sizes.media if media else sizes.photo)
    fmt = parse_format(params.get("format"), sizes.default_format)
    options = Options(
        colors=parse_choice("colors", params.get("colors"), COLOR_MODES, "off"),
        portrait=parse_choice("portrait", params.get("portrait"), PORTRAIT_MODES, "auto"),
        strength=parse_strength(params.get("strength")))
    if media and options.portrait in ("on", "faces"):
        raise BadParameter("portrait mode is for photos: a job converts each frame as a "
                           "whole; leave portrait out (or send portrait=off)")
    if options.portrait == "faces" and options.strength < FULL:
        raise BadParameter("strength mixes the result with the photo, and portrait=faces "
                           "returns the faces alone: leave strength out with it")
    return ConvertRequest(style, size, fmt, options)
