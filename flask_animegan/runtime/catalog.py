"""The official AnimeGANv2 styles: where to get them, how to verify them, their licences."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import LICENCE_ID

UPSTREAM_BASE_URL = "https://github.com/bryandlee/animegan2-pytorch/raw/main/weights"

#: The original AnimeGANv2 weights' terms: non-commercial use only (no SPDX id fits them).
NONCOMMERCIAL = "LicenseRef-AnimeGANv2-NonCommercial"
NONCOMMERCIAL_NOTE = ("non-commercial use only: converted from the original AnimeGANv2 "
                      "weights by TachibanaYoshino")
UPSTREAM_PORT = "MIT"
UPSTREAM_PORT_NOTE = "bryandlee/animegan2-pytorch"
#: The licence of a weights file put into the models folder, unless a catalogue entry of
#: its name declares another (ANIMEGAN_EXTRA_STYLES).
OWN = "own"
#: SPDX's word for "nobody said": an ANIMEGAN_EXTRA_STYLES entry without a licence.
NO_ASSERTION = "NOASSERTION"
#: Where the licences that are not on SPDX's list are written down.
LICENCE_URLS = {
    NONCOMMERCIAL: "https://github.com/TachibanaYoshino/AnimeGANv2#license",
    OWN: None,
    NO_ASSERTION: None,
}


def licence_url(licence: str) -> str | None:
    """The page of licence ``licence``: SPDX's for an SPDX id, else the known one (or None)."""
    if licence in LICENCE_URLS:
        return LICENCE_URLS[licence]
    if licence.startswith("LicenseRef-") or not LICENCE_ID.fullmatch(licence):
        return None
    return f"https://spdx.org/licenses/{licence}.html"

#: Style names are plain identifiers, so none reaches a file path; use ``fullmatch``.
STYLE_NAME = re.compile(r"[a-z0-9][a-z0-9_\-]{0,63}")


@dataclass(frozen=True)
class StyleInfo:
    """A style that can be pulled (``sha1``, ``url``), is installed (``path``), or both."""

    name: str
    licence: str  # an SPDX identifier, a LicenseRef-..., ``own`` or ``NOASSERTION``
    description: str
    face: bool = False  # face styles convert the centre square, as upstream's face2paint
    sha1: str | None = None  # git blob SHA-1 of the file, as listed in the upstream tree
    url: str | None = None  # None: UPSTREAM_BASE_URL (or the configured mirror) + /NAME.pt
    path: Path | None = None  # the weights file, once installed
    licence_note: str = ""  # whose weights, and what the licence asks, in words
    licence_url: str | None = None  # None: licence_url(licence)

    def __post_init__(self) -> None:
        if self.licence_url is None:  # frozen: the one way to fill a derived field
            object.__setattr__(self, "licence_url", licence_url(self.licence))

    def download_url(self, base_url: str | None = None) -> str:
        if self.url:
            return self.url
        return f"{(base_url or UPSTREAM_BASE_URL).rstrip('/')}/{self.name}.pt"


OFFICIAL_STYLES: dict[str, StyleInfo] = {
    s.name: s for s in (
        StyleInfo("paprika", NONCOMMERCIAL,
                  "General photos and landscapes, full frame (Paprika film look).",
                  sha1="58086c9db9fc7a9e5c2876ca31b8079599352643",
                  licence_note=NONCOMMERCIAL_NOTE),
        StyleInfo("celeba_distill", UPSTREAM_PORT,
                  "Faces, trained at 256 px; converts the centre square.", face=True,
                  sha1="3b7ea61b02254980831cc3bc77af30666dbc999c",
                  licence_note=UPSTREAM_PORT_NOTE),
        StyleInfo("face_paint_512_v1", UPSTREAM_PORT,
                  "Faces, trained at 512 px; converts the centre square.", face=True,
                  sha1="19c1a1da4d9580186109a2b055d91044e5127de6",
                  licence_note=UPSTREAM_PORT_NOTE),
        StyleInfo("face_paint_512_v2", UPSTREAM_PORT,
                  "Faces, trained at 512 px, stronger stylisation; converts the centre square.",
                  face=True, sha1="d75102f8f201ddaf8dbe6b913b1a97585b55f838",
                  licence_note=UPSTREAM_PORT_NOTE),
    )
}


#: Styles shipped in the package: what the page says of them (no hash: a models folder
#: may hold another file of that name).
SHIPPED_STYLES: dict[str, StyleInfo] = {
    "toon_demo": StyleInfo("toon_demo", "MIT",
                           "A cartoon look (flat colour, a saturation lift, dark contour "
                           "lines) distilled from a classic filter into this network; not an "
                           "official AnimeGANv2 style (pull paprika for that).",
                           licence_note="this project's own weights; model card: "
                                        "flask_animegan/shipped_styles/README.md"),
}


def describe(name: str, path: Path, catalog: Mapping[str, StyleInfo]) -> StyleInfo:
    """The StyleInfo of a weights file at ``path``, from the catalogue when it knows it."""
    known = catalog.get(name) or SHIPPED_STYLES.get(name)
    if known is None:
        known = StyleInfo(name, OWN, "", licence_note="a file you installed")
    return replace(known, path=path)


def known_styles(extra: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, StyleInfo]:
    """The official styles plus ``ANIMEGAN_EXTRA_STYLES`` entries (which may override them)."""
    styles = dict(OFFICIAL_STYLES)
    for name, spec in (extra or {}).items():
        if not STYLE_NAME.fullmatch(name):
            raise ValueError(f"ANIMEGAN_EXTRA_STYLES: {name!r} is not a valid style name "
                             "(lowercase letters, digits, '_' and '-')")
        if not re.fullmatch(r"[0-9a-f]{40}", str(spec.get("sha1", ""))) or not spec.get("url"):
            raise ValueError(f"ANIMEGAN_EXTRA_STYLES[{name!r}] needs 'url' and a 40-hex 'sha1' "
                             "(the file's git blob SHA-1, see `git hash-object FILE`)")
        licence = str(spec.get("licence", NO_ASSERTION))
        if not LICENCE_ID.fullmatch(licence):
            raise ValueError(f"ANIMEGAN_EXTRA_STYLES[{name!r}]['licence']={licence!r} is not a "
                             "licence identifier: give its SPDX id, e.g. 'CC-BY-4.0' "
                             "(https://spdx.org/licenses/), or 'LicenseRef-NAME' for other "
                             "terms, and put the words into 'licence_note'")
        styles[name] = StyleInfo(
            name=name, sha1=spec["sha1"], url=spec["url"], licence=licence,
            licence_note=str(spec.get("licence_note", "see the provider")),
            licence_url=spec.get("licence_url"),
            description=spec.get("description", ""), face=bool(spec.get("face", False)),
        )
    return styles


@dataclass(frozen=True)
class LicencePolicy:
    """Which licences a site serves (ANIMEGAN_ALLOWED_LICENCES); ``allowed`` None: all."""

    allowed: tuple[str, ...] | None = None  # as configured; SPDX ids match in any case

    @classmethod
    def of(cls, allowed: Iterable[str] | None) -> LicencePolicy:
        return cls(None if allowed is None else tuple(allowed))

    def allows(self, style: StyleInfo) -> bool:
        if self.allowed is None:
            return True
        return style.licence.lower() in {licence.lower() for licence in self.allowed}

    def refusal(self, style: StyleInfo) -> str:
        """Why ``style`` is not offered, naming its licence and the setting."""
        return (f"style {style.name!r} is not offered here: its licence {style.licence} is not "
                "among this site's allowed licences (ANIMEGAN_ALLOWED_LICENCES)")


#: The policy without ANIMEGAN_ALLOWED_LICENCES: every licence is served.
EVERY_LICENCE = LicencePolicy()
