"""What a `flask` CLI command costs with the extension, against importing torch alone
and a bare Flask app's `--help`. ``python -m bench.startup [--runs N]``

``init_app`` loads nothing heavy, so any command should cost about torch's import.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .report import num, table

REPO = Path(__file__).resolve().parent.parent
FLASK = str(Path(sys.executable).with_name("flask"))
BARE_APP = "from flask import Flask\napp = Flask(__name__)\n"
COMMANDS = {
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "flask --app bare_app --help (no extension)": [FLASK, "--app", "bare_app", "--help"],
    "flask --app example_app animegan --help": [FLASK, "--app", "example_app", "animegan",
                                                "--help"],
}


def measure(runs: int) -> dict[str, list[float]]:
    """Seconds per fresh process, ``runs`` of each command, interleaved."""
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "bare_app.py").write_text(BARE_APP)
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{folder}"}
        for _ in range(runs):
            for name, argv in COMMANDS.items():
                started = time.perf_counter()
                subprocess.run(argv, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
                seconds[name].append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup")
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    seconds = measure(args.runs)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    torch_s, bare_s, cli_s = medians.values()
    rows = [[name, num(medians[name], 3), num(min(seconds[name]), 3)] for name in COMMANDS]
    print(table(["command", f"median of {args.runs} (s)", "best (s)"], rows))
    print(f"\nthe CLI costs {cli_s - torch_s:+.3f} s beyond importing torch "
          f"(ratio {cli_s / torch_s:.2f}; target: at most +0.3 s); Flask's own CLI costs "
          f"{bare_s:.3f} s with no extension, so the extension adds "
          f"{cli_s - bare_s - torch_s:+.3f} s beyond torch and Flask's CLI")
    return 0


if __name__ == "__main__":
    sys.exit(main())
