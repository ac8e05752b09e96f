"""Face: what the detector reports about one face, in the picture's own pixels."""

from __future__ import annotations

from dataclasses import dataclass, replace

#: The most faces converted in one picture, so a crowd costs a bounded time.
MAX_FACES = 8


@dataclass(frozen=True)
class Face:
    """One face: ``box`` is its square in its own upright frame (rolled by ``angle``, degrees
    counter-clockwise, about its centre); the eyes are found or estimated (``eyes_found``)."""

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

    def scaled(self, factor: float) -> Face:
        """The same face in a copy of the picture ``factor`` times as large."""
        x, y, w, h = self.box
        return replace(
            self, box=(round(x * factor), round(y * factor), round(w * factor), round(h * factor)),
            left_eye=(self.left_eye[0] * factor, self.left_eye[1] * factor),
            right_eye=(self.right_eye[0] * factor, self.right_eye[1] * factor))
