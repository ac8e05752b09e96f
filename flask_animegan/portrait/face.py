"""Face: what the detector reports about one face, in the picture's own pixels."""

from __future__ import annotations

from dataclasses import dataclass

#: At most this many faces are converted in one picture (the largest-scoring first), so a
#: crowd costs a bounded number of face conversions.
MAX_FACES = 8


@dataclass(frozen=True)
class Face:
    """One face. ``box`` is x, y, width, height of the face's square *in its own upright
    frame*, centred on the face's centre (for a rolled face: the square rolled by ``angle``
    about that centre, which is what :func:`~flask_animegan.portrait.align.align_face` cuts
    around); ``left_eye``/``right_eye`` are the eyes on the picture's left and right (found by
    the eye cascade, or estimated from the box when it finds none: ``eyes_found``); ``angle``
    is the roll in degrees, counter-clockwise as seen; ``score`` the detector's confidence."""

    box: tuple[int, int, int, int]
    left_eye: tuple[float, float]
    right_eye: tuple[float, float]
    angle: float
    score: float
    eyes_found: bool = False

    @property
    def centre(self) -> tuple[float, float]:
        x, y, w, h = self.box
        return (x + w / 2, y + h / 2)
