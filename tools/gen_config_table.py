"""Print the configuration tables of docs/configuration.md, generated from the registry
(flask_animegan.config): the app's settings, gunicorn.conf.py's and the old names.

    python tools/gen_config_table.py            # print the markdown tables
    python tools/gen_config_table.py --write    # replace them in docs/configuration.md

tests/test_readme.py fails when docs/configuration.md and the registry disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from flask_animegan.config import ALIASES, SERVER_SETTINGS, SETTINGS, Setting

README = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def format_default(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _settings_table(settings: tuple[Setting, ...], title: str) -> list[str]:
    rows = [f"| {title} | Default | Values | Meaning |", "| --- | --- | --- | --- |"]
    rows += [f"| `{s.name}` | {format_default(s.default)} | {_cell(s.allowed())} "
             f"| {_cell(s.meaning)} |" for s in settings]
    return rows


def render_table() -> str:
    """The markdown tables: one row per setting in the registry's order, with the values
    the start-up check allows, then one per old name with what replaces it."""
    rows = _settings_table(SETTINGS, "Name")
    rows += ["", *_settings_table(SERVER_SETTINGS, "gunicorn.conf.py (environment only)")]
    rows += ["", "| Old name (read for one release, with a warning) | What replaces it |",
             "| --- | --- |"]
    rows += [f"| `{old}` | " + (f"`{alias.new}` (same value)" if alias.new else _cell(alias.fix))
             + " |" for old, alias in ALIASES.items()]
    return "\n".join(rows)


def write_readme(path: Path = README) -> None:
    """Replace the text between the markers in ``path`` with the current tables."""
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{render_table()}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_readme()
    else:
        print(render_table())
