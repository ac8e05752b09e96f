"""Census of upload outcomes: every variant of tests/upload_variants.py through every
transport of a Flask test app, counted by status, with contract breaks and escaped errors.

It uses whichever ``flask_animegan`` is importable, so it can compare a fix with the code
before it (``PYTHONPATH=/tmp/before python tools/upload_census.py`` on a worktree of HEAD).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from conftest import save_random_generator  # noqa: E402
from flask import Flask, got_request_exception  # noqa: E402
from upload_variants import GROUPS, TRANSPORTS, contract_violation, post, variants  # noqa: E402

import flask_animegan  # noqa: E402

MAX_SIDE = 64
#: As in tests/test_upload_transports.py: prefixes and bit flips are converted at 16 px.
DERIVED_SIZE = 16
COLUMNS = ("200", "303", "400", "413", "415", "other", "5xx")


def make_app(models_dir: Path, threads: int) -> Flask:
    app = Flask("upload_census")
    app.config.update(ANIMEGAN_MODELS_DIR=str(models_dir), ANIMEGAN_WARMUP_SIZE=0,
                      ANIMEGAN_RATE_LIMIT="", ANIMEGAN_MAX_SIDE=MAX_SIDE, ANIMEGAN_CACHE_TTL=0,
                      ANIMEGAN_SAMPLE_SIZE=0, ANIMEGAN_PRECISION="fp32", ANIMEGAN_CSRF=False,
                      ANIMEGAN_TORCH_THREADS=threads)
    flask_animegan.AnimeGAN(app)
    # 5xx tracebacks are counted below; printing thousands of them would bury the table
    app.logger.setLevel(logging.CRITICAL)
    return app


@contextlib.contextmanager
def quiet_stderr(enabled: bool):
    """libtiff and libjpeg print their complaints straight to file descriptor 2."""
    if not enabled:
        yield
        return
    saved = os.dup(2)
    with open(os.devnull, "wb") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def column(status: int) -> str:
    if status >= 500:
        return "5xx"
    return str(status) if str(status) in COLUMNS else "other"


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as folder:
        save_random_generator(Path(folder) / "test_style.pt", seed=0)
        app = make_app(Path(folder), args.threads)
        client = app.test_client()
        escaped: list[BaseException] = []
        got_request_exception.connect(lambda sender, exception, **extra:
                                      escaped.append(exception), app, weak=False)

        counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
        by_group: dict[tuple[str, str], Counter] = defaultdict(Counter)
        violations: dict[tuple[str, str], int] = Counter()
        exceptions: Counter = Counter()
        examples: dict[str, str] = {}
        slowest: list[tuple[float, str]] = []
        special_rows: dict[str, list[str]] = defaultdict(list)
        seconds: Counter = Counter()
        groups = args.groups or GROUPS
        with quiet_stderr(not args.show_stderr):
            for group in groups:
                for variant in variants(group, args.seed):
                    size = None if variant.cls in ("base", "special") else args.derived_size
                    for transport in args.transports:
                        escaped.clear()
                        start = time.perf_counter()
                        response = post(client, transport, variant.body, size)
                        elapsed = time.perf_counter() - start
                        seconds[transport] += elapsed
                        label = f"{group}/{variant.cls}/{variant.name} via {transport}"
                        slowest = sorted(slowest + [(elapsed, label)], reverse=True)[:8]
                        key = (variant.cls, transport)
                        status = column(response.status_code)
                        counts[key][status] += 1
                        by_group[(group, transport)][status] += 1
                        if variant.cls == "special":
                            special_rows[variant.name].append(
                                f"{response.status_code} {elapsed:5.2f}s")
                        if contract_violation(response, transport, MAX_SIDE) is not None:
                            violations[key] += 1
                        for exc in escaped:
                            name = exc.__class__.__name__
                            exceptions[name] += 1
                            examples.setdefault(name, f"{label}: {str(exc)[:100]}")

    print(f"flask_animegan from {Path(flask_animegan.__file__).parent}")
    print(f"seed {args.seed}, groups: {', '.join(groups)}\n")
    print_table("class", counts, violations, args.transports)
    if args.by_format:
        print()
        print_table("format", by_group, None, args.transports)
    if special_rows:
        print(f"\n{'special':46}" + "".join(f"{t:>16}" for t in args.transports))
        for name, cells in special_rows.items():
            print(f"{name[:46]:46}" + "".join(f"{cell:>16}" for cell in cells))
    if exceptions:
        print("\nexceptions that escaped the views (5xx):")
        for name, count in exceptions.most_common():
            print(f"  {count:6}  {name:24} e.g. {examples[name]}")
    print("\nseconds per transport: " + ", ".join(f"{t} {seconds[t]:.1f}"
                                                    for t in args.transports))
    print("slowest requests:")
    for elapsed, label in slowest:
        print(f"  {elapsed:7.2f} s  {label}")
    return 0


def print_table(first: str, counts, violations, transports) -> None:
    header = f"{first:16} {'transport':14}" + "".join(f"{c:>7}" for c in COLUMNS)
    header += f"{'total':>8}" + (f"{'broken':>8}" if violations is not None else "")
    print(header)
    print("-" * len(header))
    totals: dict[str, Counter] = defaultdict(Counter)
    all_broken = 0
    for (row, transport), counter in counts.items():
        line = f"{row:16} {transport:14}" + "".join(f"{counter[c]:7}" for c in COLUMNS)
        line += f"{sum(counter.values()):8}"
        if violations is not None:
            line += f"{violations[(row, transport)]:8}"
            all_broken += violations[(row, transport)]
        print(line)
        totals[transport].update(counter)
    print("-" * len(header))
    grand: Counter = Counter()
    for transport in transports:
        counter = totals[transport]
        grand.update(counter)
        broken = sum(n for (_, t), n in violations.items() if t == transport) if violations \
            is not None else None
        print(f"{'total':16} {transport:14}" + "".join(f"{counter[c]:7}" for c in COLUMNS)
              + f"{sum(counter.values()):8}" + (f"{broken:8}" if broken is not None else ""))
    print(f"{'total':16} {'all':14}" + "".join(f"{grand[c]:7}" for c in COLUMNS)
          + f"{sum(grand.values()):8}" + (f"{all_broken:8}" if violations is not None else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="variant seed (default 0)")
    parser.add_argument("--groups", nargs="*", choices=GROUPS,
                        help="base files (and 'specials') to use; default all")
    parser.add_argument("--transports", nargs="*", choices=TRANSPORTS, default=list(TRANSPORTS))
    parser.add_argument("--derived-size", type=int, default=DERIVED_SIZE,
                        help="output size asked for prefixes and bit flips")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--by-format", action="store_true",
                        help="also print a table per base file")
    parser.add_argument("--show-stderr", action="store_true",
                        help="let the image libraries' messages through")
    args = parser.parse_args(argv)
    # Pillow warns about corrupt TIFF/EXIF metadata and carries on, as a server's would
    warnings.filterwarnings("ignore", category=UserWarning, module="PIL.TiffImagePlugin")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
