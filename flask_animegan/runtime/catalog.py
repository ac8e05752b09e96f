"""The official AnimeGANv2 styles: where to get them, how to verify them, their licences."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

UPSTREAM_BASE_URL = "https://github.com/bryandlee/animegan2-pytorch/raw/main/weights"

NONCOMMERCIAL = ("non-commercial use only (converted from the original AnimeGANv2 "
                 "weights by TachibanaYoshino)")
UPSTREAM_PORT = "MIT (bryandlee/animegan2-pytorch)"

#: Style names are plain identifiers, so none reaches a file path; use ``fullmatch``.
STYLE_NAME = re.compile(r"[a-z0-9][a-z0-9_\-]{0,63}")


@dataclass(frozen=True)
class StyleInfo:
    """A style that can be pulled (``sha1``, ``url``), is installed (``path``), or both."""

    name: str
    licence: str
    description: str
    face: bool = False  # face styles convert the centre square, as upstream's face2paint
    sha1: str | None = None  # git blob SHA-1 of the file, as listed in the upstream tree
    url: str | None = None  # None: UPSTREAM_BASE_URL (or the configured mirror) + /NAME.pt
    path: Path | None = None  # the weights file, once installed

    def download_url(self, base_url: str | None = None) -> str:
        if self.url:
            return self.url
        return f"{(base_url or UPSTREAM_BASE_URL).rstrip('/')}/{self.name}.pt"


OFFICIAL_STYLES: dict[str, StyleInfo] = {
    s.name: s for s in (
        StyleInfo("paprika", NONCOMMERCIAL,
                  "General photos and landscapes, full frame (Paprika film look).",
                  sha1="58086c9db9fc7a9e5c2876ca31b8079599352643"),
        StyleInfo("celeba_distill", UPSTREAM_PORT,
                  "Faces, trained at 256 px; converts the centre square.", face=True,
                  sha1="3b7ea61b02254980831cc3bc77af30666dbc999c"),
        StyleInfo("face_paint_512_v1", UPSTREAM_PORT,
                  "Faces, trained at 512 px; converts the centre square.", face=True,
                  sha1="19c1a1da4d9580186109a2b055d91044e5127de6"),
        StyleInfo("face_paint_512_v2", UPSTREAM_PORT,
                  "Faces, trained at 512 px, stronger stylisation; converts the centre square.",
                  face=True, sha1="d75102f8f201ddaf8dbe6b913b1a97585b55f838"),
    )
}


#: Styles shipped in the package: what the page says of them (no hash: a models folder
#: may hold another file of that name).
SHIPPED_STYLES: dict[str, StyleInfo] = {
    "toon_demo": StyleInfo("toon_demo",
                           "MIT (this project; model card: flask_animegan/shipped_styles/README.md)",
                           "A cartoon look (flat colour, a saturation lift, dark contour "
                           "lines) distilled from a classic filter into this network; not an "
                           "official AnimeGANv2 style (pull paprika for that)."),
}


def describe(name: str, path: Path, catalog: Mapping[str, StyleInfo]) -> StyleInfo:
    """The StyleInfo of a weights file at ``path``, from the catalogue when it knows it."""
    known = catalog.get(name) or SHIPPED_STYLES.get(name)
    if known is None:
        known = StyleInfo(name, "unknown (a file you installed)", "")
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
        styles[name] = StyleInfo(
            name=name, sha1=spec["sha1"], url=spec["url"],
            licence=spec.get("licence", "see the provider"),
            description=spec.get("description", ""), face=bool(spec.get("face", False)),
        )
    return styles
