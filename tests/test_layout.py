"""The package's shape: imports run one way between its rooms, and there are no cycles.

    extension -> {web, cli} -> service -> jobs -> convert
        -> {inputs, outputs, runtime, portrait, cache} -> storage -> {config, errors, process, metrics}

Of the five siblings, one door only: outputs -> inputs (a video's audio track, read from
the upload, is written into the result).

Every import counts, at module level or inside a function, under TYPE_CHECKING or not:
a lazy import is still a door between two rooms.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flask_animegan"

#: The rooms, highest first; a module may import its own room and any room below it.
LAYERS = {
    "extension": 8, "gunicorn_conf": 8,
    "web": 7, "cli": 7,
    "service": 6,
    "jobs": 5,
    "convert": 4,
    "inputs": 3, "outputs": 3, "runtime": 3, "cache": 3, "portrait": 3,
    "storage": 2,
    "config": 1, "errors": 1, "process": 1, "metrics": 1, "gate": 1,
}
#: Rooms of one layer that must not import one another...
SIBLINGS = {"inputs", "outputs", "runtime", "cache", "portrait"}
#: ...but through these doors (importer, imported).
DOORS = {("outputs", "inputs")}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (a name imported from a package that is itself
    a module counts as that module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target] + [f"{target}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = {name: imports_of(name, path, set(modules())) for name, path in modules().items()}


def test_every_module_is_in_a_room():
    rooms = {room(name) for name in GRAPH} - {""}
    assert rooms <= set(LAYERS), f"modules outside the map: {sorted(rooms - set(LAYERS))}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if room(m)))
def test_imports_run_one_way(module):
    here = room(module)
    wrong = []
    for target in sorted(GRAPH[module]):
        there = room(target)
        if not there or there == here:
            continue
        if LAYERS[there] > LAYERS[here] or (LAYERS[there] == LAYERS[here]
                                             and {here, there} <= SIBLINGS
                                             and (here, there) not in DOORS):
            wrong.append(target)
    assert not wrong, f"{module} imports {wrong}, against the one-way map"


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    assert cycles == []


def test_inputs_import_neither_torch_nor_flask():
    """The decode helper processes import the inputs room only: a fresh interpreter shows
    that it loads neither torch nor Flask."""
    inputs = sorted(m for m in GRAPH if room(m) == "inputs")
    code = ("import importlib, json, sys\n"
            f"for name in {inputs!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'flask', 'flask_limiter', 'werkzeug'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    assert json.loads(out.stdout) == []


def test_portrait_imports_neither_torch_nor_flask_nor_opencv():
    """Portrait mode's room is light: importing all of it loads neither torch, Flask nor
    OpenCV (cv2 loads on the first search)."""
    portrait = sorted(m for m in GRAPH if room(m) == "portrait")
    assert portrait, "the portrait room is missing"
    code = ("import importlib, json, sys\n"
            f"for name in {portrait!r}: importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'flask', 'flask_limiter', 'werkzeug', 'cv2'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=PACKAGE.parent)
    assert json.loads(out.stdout) == []
