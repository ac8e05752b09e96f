"""Print (or ``--write``) docs/configuration.md's table from config.SETTINGS;
tests/test_readme.py fails when the two disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flask_animegan.config import SETTINGS

README = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def format_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    return f"`{value}`"


def render_table() -> str:
    """The markdown table, one row per setting with the values the start-up check allows."""
    rows = ["| Name | Default | Values | Meaning |", "| --- | --- | --- | --- |"]
    for setting in SETTINGS:
        meaning = setting.meaning.replace("|", "\\|")
        allowed = setting.allowed().replace("|", "\\|")
        rows.append(f"| `{setting.name}` | {format_default(setting.default)} | {allowed} "
                    f"| {meaning} |")
    return "\n".join(rows)


def write_readme(path: Path = README) -> None:
    """Replace the text between the markers in ``path`` with the current table."""
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{render_table()}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_readme()
    else:
        print(render_table())
