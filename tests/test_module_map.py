"""docs/development.md's module map follows the code: every module and room of the package
has a row, and every row names one that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flask_animegan"
MAP = ROOT / "docs" / "development.md"
HEADING = "## Module map"
#: A row of the map: its first cell is a path relative to flask_animegan/, in backticks.
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")


def map_rows(text: str) -> list[str]:
    """The paths of the map's rows, in order (a room's path ends with ``/``)."""
    assert HEADING in text, f"docs/development.md has no {HEADING!r} section"
    section = re.split(r"\n#{1,3} ", text.split(HEADING, 1)[1], maxsplit=1)[0]
    return [match.group(1) for line in section.splitlines() if (match := ROW.match(line))]


def package_entries() -> set[str]:
    """Every module of the package but ``__init__.py``, and every room (a folder with one)."""
    entries = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name != "__init__.py":
            entries.add(relative.as_posix())
        elif relative.parent != Path("."):
            entries.add(f"{relative.parent.as_posix()}/")
    return entries


def missing_rows(text: str) -> list[str]:
    """Modules and rooms of the package that the map has no row for."""
    return sorted(package_entries() - set(map_rows(text)))


def stale_rows(text: str) -> list[str]:
    """Rows that name no module or room of the package, and rows given twice."""
    rows = map_rows(text)
    gone = [row for row in rows if not (
        (PACKAGE / row / "__init__.py").is_file() if row.endswith("/")
        else row.endswith(".py") and (PACKAGE / row).is_file())]
    return gone + sorted({row for row in rows if rows.count(row) > 1})


def test_the_map_has_a_row_per_module_and_room() -> None:
    missing = missing_rows(MAP.read_text(encoding="utf-8"))
    assert not missing, f"add rows to docs/development.md's module map for: {missing}"


def test_every_row_names_a_module_or_room_that_exists() -> None:
    stale = stale_rows(MAP.read_text(encoding="utf-8"))
    assert not stale, f"docs/development.md's module map: no such module, or twice: {stale}"


def test_a_dropped_or_renamed_row_is_reported() -> None:
    text = MAP.read_text(encoding="utf-8")
    assert missing_rows(text.replace("| `runtime/engine.py` |", "| runtime/engine.py |")) == [
        "runtime/engine.py"]
    renamed = text.replace("| `runtime/engine.py` |", "| `runtime/motor.py` |")
    assert missing_rows(renamed) == ["runtime/engine.py"]
    assert stale_rows(renamed) == ["runtime/motor.py"]
    assert stale_rows(text.replace("| `web/` |", "| `web/views.py` |")) == ["web/views.py"]
