"""The styles installed in a models folder or shipped in the package, and which is the default."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from ..errors import StyleUnavailable, UnknownStyle
from .catalog import EVERY_LICENCE, STYLE_NAME, LicencePolicy, StyleInfo, describe
from .weights import find_style_files

log = logging.getLogger("flask_animegan")

#: The default without ANIMEGAN_DEFAULT_STYLE: the first of these installed, else the
#: folder's first style, else a shipped one (an installed style beats the demo).
PREFERRED_DEFAULTS = ("paprika", "face_paint_512_v2")

#: Styles shipped in the package; a file of the same name in the models folder wins.
SHIPPED_STYLES_DIR = Path(__file__).resolve().parent.parent / "shipped_styles"


class StyleRegistry:
    """The ``NAME.pt`` files of the models folder and the package; the default is fixed
    when made, so a later ``pull`` never changes it. Styles whose licence ``policy`` does
    not allow are in ``refused``, neither installed nor pullable."""

    def __init__(self, models_dir: Path, catalog: Mapping[str, StyleInfo],
                 default: str | None = None, *,
                 shipped_dir: Path | None = SHIPPED_STYLES_DIR,
                 policy: LicencePolicy = EVERY_LICENCE) -> None:
        self.models_dir = models_dir
        self.shipped_dir = shipped_dir
        self.shipped: set[str] = set()  # served from shipped_dir (none of models_dir's names)
        self.policy = policy
        self.catalog = {name: s for name, s in catalog.items() if policy.allows(s)}
        self._full_catalog = dict(catalog)
        self.refused: dict[str, StyleInfo] = {}  # name -> a style whose licence is not allowed
        self._installed: dict[str, StyleInfo] = {}
        self.skipped: dict[str, str] = {}  # file name -> why it is not a style
        self.rescan()
        self.default: str | None = default or self._preferred_default()

    def rescan(self) -> None:
        """Pick up weights files added to (or removed from) the models folder."""
        own, skipped = find_style_files(self.models_dir)
        shipped = find_style_files(self.shipped_dir)[0] if self.shipped_dir else {}
        self.shipped = set(shipped) - set(own)
        files = {**shipped, **own}
        described = [describe(name, files[name], self._full_catalog) for name in sorted(files)]
        self._installed = {s.name: s for s in described if self.policy.allows(s)}
        self.refused = {name: s for name, s in self._full_catalog.items()
                        if not self.policy.allows(s)}
        self.refused.update((s.name, s) for s in described if not self.policy.allows(s))
        for name, why in skipped.items():
            if name not in self.skipped:
                log.warning("flask_animegan: ignoring %s in %s: %s", name, self.models_dir, why)
        self.skipped = skipped

    @property
    def installed(self) -> dict[str, StyleInfo]:
        return dict(self._installed)

    def _preferred_default(self) -> str | None:
        own = sorted(set(self._installed) - self.shipped)
        for name in PREFERRED_DEFAULTS:
            if name in own:
                return name
        return next(iter(own or sorted(self.shipped & set(self._installed))), None)

    def get(self, name: str | None) -> StyleInfo:
        """The installed style ``name`` (None: the default), else UnknownStyle/StyleUnavailable."""
        if name is None:
            name = self.default
            if name is None:
                raise StyleUnavailable(
                    "no style is installed; run `flask animegan pull paprika` (or put a "
                    f"NAME.pt file into {self.models_dir}) and restart the server")
        if not STYLE_NAME.fullmatch(name):
            raise UnknownStyle(f"{name!r} is not a valid style name")
        if name not in self._installed:
            self.rescan()
        if name in self.refused:
            raise UnknownStyle(self.policy.refusal(self.refused[name]))
        if name not in self._installed:
            hint = (f"; it is an official style: run `flask animegan pull {name}`"
                    if name in self.catalog else "")
            raise UnknownStyle(f"style {name!r} is not installed{hint}. "
                               f"Installed: {', '.join(sorted(self._installed)) or 'none'}")
        return self._installed[name]
