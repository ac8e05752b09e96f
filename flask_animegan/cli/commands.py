"""``flask animegan ...``: list, download and batch-convert styles."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import click
import torch
from flask import Flask

from ..config import OUTPUT_FORMATS
from ..convert.colors import COLOR_MODES
from ..convert.request import FORMAT_ALIASES, PORTRAIT_MODES, ConvertRequest
from ..errors import ConversionError
from ..inputs.media import MediaInfo
from ..outputs.animations import sweep_leftovers
from ..runtime.download import DownloadError, pull_style
from ..runtime.weights import WeightsError, load_generator, torchscript_quietly
from ..service import get_service
from ..web.blueprint import blueprint
from .batch import (
    MOVING_SUFFIXES,
    Refused,
    collect,
    moving_name,
    output_names,
    read_entry,
    write_output,
)

cli = blueprint.cli
cli.help = """Photo-to-anime styles: list, download, convert.

\b
Examples:
  flask --app example_app animegan styles
  flask --app example_app animegan pull paprika
  flask --app example_app animegan convert photos/ -o anime/
  flask --app example_app animegan export paprika --torchscript paprika.ts
  flask --app example_app animegan export paprika --format onnx -o paprika.onnx
  flask --app example_app animegan bench --quick
"""


def site_command(app: Flask) -> str:
    """How this site's administrator runs the ``animegan`` group, for the page's hints: the
    command line that made the app (``flaskbb``, ``flask --app site``) when a Flask CLI
    made it, else ``flask --app MODULE``, which works for any site."""
    group = blueprint.cli.name or "animegan"
    made_by = click.get_current_context(silent=True)
    if made_by is not None:
        root = made_by.find_root()
        target = root.params.get("app") or os.environ.get("FLASK_APP")
        program = root.info_name or "flask"
        app_option = f" --app {shlex.quote(target)}" if target and program.endswith(
            "flask") else ""
        return f"{program}{app_option} {group}"
    target = os.environ.get("FLASK_APP") or app.import_name
    if target == "__main__":  # `python site.py`: the script's file
        target = Path(getattr(sys.modules["__main__"], "__file__", "app.py")).name
    return f"flask --app {shlex.quote(target)} {group}"


@cli.command("styles")
def styles_command() -> None:
    """List installed styles and the official ones you can pull, with their licences.

    \b
    Example:
      flask --app example_app animegan styles
    """
    service = get_service()
    for name in service.engine.styles:  # load each once, so broken files show as such
        try:
            service.engine.model(name)
        except ConversionError:
            pass
    for style in service.styles_info():
        if style["installed"]:
            state = "installed" + (", default" if style["default"] else "")
            if not style["usable"]:
                state = "BROKEN"
        else:
            state = f"pull with: flask animegan pull {style['name']}"
        crop = "  [faces: centre square]" if style["face_crop"] else ""
        click.echo(f"{style['name']:<20} {state}{crop}")
        click.echo(f"{'':<20} licence: {_licence_line(style)}")
        details = service.engine.pool.broken_details().get(style["name"])
        if details:
            click.echo(f"{'':<20} error: {details}")
    for file_name, why in service.engine.registry.skipped.items():
        click.echo(f"{file_name!r:<20} SKIPPED: {why}")
    for name, refused in sorted(service.engine.registry.refused.items()):
        click.echo(f"{name:<20} NOT ALLOWED: licence {refused.licence} is not among "
                   "ANIMEGAN_ALLOWED_LICENCES")


def _licence_line(style: dict[str, Any]) -> str:
    """``MIT (bryandlee/animegan2-pytorch) <https://...>``: the id, its note, its page."""
    note = f" ({style['licence_note']})" if style["licence_note"] else ""
    url = f" <{style['licence_url']}>" if style["licence_url"] else ""
    return f"{style['licence']}{note}{url}"


class _DownloadProgress:
    """A click progress bar on stderr, created once the download's length is known."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None  # click.progressbar returns a ProgressBar

    def start(self, total: int | None) -> None:
        self.bar = click.progressbar(length=total or 0, label=self.label, file=sys.stderr,
                                     show_eta=True)
        self.bar.render_progress()

    def advance(self, count: int) -> None:
        if self.bar is not None:
            self.bar.update(count)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.render_finish()


@cli.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="Download even if the style is installed.")
@click.option("--base-url", metavar="URL",
              help="Mirror to download from ({URL}/{NAME}.pt); default: "
                   "ANIMEGAN_WEIGHTS_BASE_URL or GitHub. The pinned hash still applies.")
def pull_command(name: str, force: bool, base_url: str | None) -> None:
    """Download the official style NAME, verify its pinned hash, install it.

    A failed or mismatching download leaves nothing behind.

    \b
    Example:
      flask --app example_app animegan pull paprika
    """
    service = get_service()
    catalog = service.engine.catalog
    refused = service.engine.registry.refused.get(name)
    if refused is not None:
        raise click.ClickException(
            f"{service.engine.registry.policy.refusal(refused)}; not downloaded. Add "
            f"{refused.licence} to ANIMEGAN_ALLOWED_LICENCES if this site may use it")
    if name not in catalog:
        raise click.ClickException(f"unknown style {name!r}; pullable styles: "
                                   f"{', '.join(sorted(catalog))}")
    style = catalog[name]
    target = service.engine.models_dir / f"{name}.pt"
    if target.exists() and not force:
        click.echo(f"{name} is already installed at {target} (use --force to download again)")
        return
    click.echo(f"{name}: {style.description or '(no description)'}\n"
               f"licence: {style.licence}" + (f" ({style.licence_note})" if style.licence_note
                                              else ""))
    base = base_url or service.settings.weights_base_url
    progress = _DownloadProgress(f"downloading {name}")
    try:
        path = pull_style(style, service.engine.models_dir, base_url=base,
                          on_start=progress.start, on_chunk=progress.advance)
    except DownloadError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        progress.finish()
    service.engine.registry.rescan()
    click.echo(f"installed {path} (hash verified); restart the server to serve it")


@cli.command("convert")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_dir", required=True,
              type=click.Path(file_okay=False, path_type=Path), help="Output folder.")
@click.option("--style", help="Style name (default: the app's default style).")
@click.option("--size", type=int, help="Long side of the output in pixels (default: MAX_SIDE; "
              "photos up to MAX_OUTPUT_SIDE, animations and videos up to MAX_SIDE).")
# the API's words, in any case
@click.option("--format", "fmt",
              type=click.Choice([*OUTPUT_FORMATS, *FORMAT_ALIASES], case_sensitive=False),
              help="Output format (default: ANIMEGAN_OUTPUT_FORMAT).")
@click.option("--colors", type=click.Choice(COLOR_MODES, case_sensitive=False), default="off",
              show_default=True,
              help="Keep the photo's brightness (luma) or its colours (keep).")
@click.option("--portrait", type=click.Choice(PORTRAIT_MODES, case_sensitive=False),
              default="auto", show_default=True,
              help="Portrait mode: find the faces and convert each on its own (auto: with "
                   "the face styles); faces: write only the faces, side by side.")
@click.option("--strength", type=click.IntRange(0, 100), default=100, show_default=True,
              help="Percent of the style: lower keeps more of the photo (mixed after the "
                   "conversion, as the API's strength).")
@click.option("--overwrite", is_flag=True,
              help="Convert again files already converted (replacing what is there, "
                   "a symlink included, never writing through it).")
def convert_command(inputs: tuple[Path, ...], out_dir: Path, style: str | None,
                    size: int | None, fmt: str | None, colors: str, portrait: str,
                    strength: int, overwrite: bool) -> None:
    """Convert image files, animations, videos and folders (not recursive) into OUT.

    photo.jpg -> OUT/photo.paprika.jpeg, existing outputs skipped; exit status 1 if any
    entry was refused or failed (docs/cli.md).

    \b
    Example:
      flask --app example_app animegan convert holiday/ cat.gif -o anime/ --style paprika
    """
    service = get_service()
    params = {"style": style, "size": size, "format": fmt, "colors": colors,
              "strength": strength}
    try:
        photo = service.parse({**params, "portrait": portrait})  # animations: per file
    except ConversionError as exc:
        raise click.ClickException(str(exc)) from None
    chosen, fmt = photo.style.name, photo.format
    entries, unlisted = collect(inputs)
    names = output_names(entries, chosen, fmt)
    out_dir.mkdir(parents=True, exist_ok=True)
    on_terminal = getattr(sys.stderr, "isatty", lambda: False)()
    # a visible bar leaves its line open
    line_start = "\n" if on_terminal else ""

    def report(path: Path, message: str) -> None:
        click.echo(f"{line_start}{path}: {message}", err=True)

    def skip(path: Path, name: str) -> None:
        if not on_terminal:  # a terminal's bar counts them
            report(path, f"skipped, {out_dir / name} exists (--overwrite converts it again)")

    converted = skipped = failed = 0
    refused = len(unlisted)
    for folder, why in unlisted:
        report(folder, f"refused: {why}")
    with _batch_progress(list(zip(entries, names)), on_terminal) as bar:
        for path, name in bar:
            if not overwrite and os.path.lexists(out_dir / name):
                skipped += 1
                skip(path, name)
                continue
            started, frames = time.perf_counter(), ""
            try:
                data = read_entry(path, service.settings.max_upload_bytes)
            except Refused as exc:
                refused += 1
                report(path, f"refused: {exc}")
                continue
            try:
                moving = service.route(data)
                if moving is not None:
                    name = moving_name(name, fmt, MOVING_SUFFIXES[moving.format])
                    if not overwrite and os.path.lexists(out_dir / name):
                        skipped += 1
                        skip(path, name)
                        continue
                    frames = f" ({moving.frames} frames)"
                    output = _convert_moving(path, data, moving,
                                             service.parse(params, media=True), on_terminal)
                else:
                    conversion = service.convert_upload(data, photo)
                    output = conversion.data
                    if conversion.faces is not None:
                        report(path, f"{conversion.faces} face(s) found")
            except ConversionError as exc:
                failed += 1
                report(path, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - one file's bug must not end the batch
                failed += 1
                report(path, f"failed unexpectedly ({type(exc).__name__}: {exc}); the "
                             "other files went on: please report this with the file")
                continue
            try:
                write_output(out_dir, name, output)
            except OSError as exc:
                failed += 1
                report(path, f"cannot write {out_dir / name}: {exc.strerror or exc}; "
                             "check the output folder")
                continue
            converted += 1
            if not on_terminal:  # a log or a pipe gets a line per file instead of the bar
                click.echo(f"{path}{frames} -> {out_dir / name}  "
                           f"{time.perf_counter() - started:.2f} s", err=True)
    unread = f" ({refused} of them refused unread)" if refused else ""
    click.echo(f"converted {converted}, skipped {skipped} already converted, failed "
               f"{failed + refused}{unread}; output in {out_dir}")
    if failed or refused:
        sys.exit(1)


def _batch_progress(items: list[tuple[Path, str]], on_terminal: bool,
                    ) -> AbstractContextManager[Iterable[tuple[Path, str]]]:
    """The batch's entries under a progress bar on a terminal; elsewhere (a log, a pipe,
    where a bar shows only its label) as they are, each file then reported on its line."""
    if not on_terminal:
        return nullcontext(items)
    return click.progressbar(items, label="converting", file=sys.stderr, show_eta=True,
                             item_show_func=lambda item: item[0].name if item else None)


def _convert_moving(path: Path, data: bytes, info: MediaInfo, request: ConvertRequest,
                    on_terminal: bool) -> bytes:
    """Convert an animation or a video here as a job would, with no job store; its bytes,
    with a progress bar of its frames on a terminal."""
    converter = get_service().converter
    if not on_terminal:
        return converter.media(data, info, request).data
    click.echo("\n", err=True, nl=False)
    with click.progressbar(length=info.frames, label=f"{path.name} ({info.frames} frames)",
                           file=sys.stderr, show_eta=True, show_pos=True) as bar:
        shown = 0

        def progress(done: int, reused: int) -> None:
            nonlocal shown
            bar.update(done - shown)
            shown = done

        return converter.media(data, info, request, progress=progress).data


@cli.command("export")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["torchscript", "onnx"]),
              help="torchscript (for torch.jit.load) or onnx (onnxruntime, on phones and in "
                   "browsers; needs pip install 'flask-animegan[onnx]'); default: from the "
                   "output's suffix (.onnx: onnx).")
@click.option("--output", "-o", "target", metavar="PATH",
              type=click.Path(dir_okay=False, path_type=Path), help="Where to write the model.")
@click.option("--torchscript", "torchscript", metavar="PATH",
              type=click.Path(dir_okay=False, path_type=Path),
              help="Same as --format torchscript --output PATH.")
def export_command(name: str, fmt: str | None, target: Path | None,
                   torchscript: Path | None) -> None:
    """Save the installed style NAME as TorchScript or ONNX, checked against the original.

    Both map an (N, 3, H, W) RGB tensor in [-1, 1] to the anime picture in [-1, 1], of any
    height and width, without this package. ONNX writes a model card beside the model
    (NAME.card.json: licence, input, sizes, opset). Styles whose licence
    ANIMEGAN_ALLOWED_LICENCES does not allow are not exported.

    \b
    Examples:
      flask --app example_app animegan export toon_demo --format onnx --output toon_demo.onnx
      flask --app example_app animegan export toon_demo --torchscript toon_demo.ts
    """
    if torchscript is not None:
        if target is not None or fmt == "onnx":
            raise click.UsageError("--torchscript PATH is --format torchscript --output PATH: "
                                   "give one of the two")
        target, fmt = torchscript, "torchscript"
    if target is None:
        raise click.UsageError("give --output PATH (or --torchscript PATH)")
    fmt = fmt or ("onnx" if target.suffix.lower() == ".onnx" else "torchscript")
    service = get_service()
    try:
        style = service.engine.style(name)
        assert style.path is not None  # an installed style has its file
        model = load_generator(style.path)
    except (ConversionError, WeightsError) as exc:
        raise click.ClickException(str(exc)) from None
    if fmt == "onnx":
        from ..runtime.onnx_export import ExportError, card_path, export_onnx

        try:
            card = export_onnx(model, style, target, max_side=service.settings.max_side)
        except ExportError as exc:
            raise click.ClickException(str(exc)) from None
        checked = ", ".join(f"{size} px {db} dB" for size, db in
                            card["checked"]["psnr_db_against_torch_fp32"].items())
        click.echo(f"exported {name} to {target} ({card['bytes'] / 2**20:.1f} MiB, ONNX opset "
                   f"{card['opset']}, licence {style.licence}; onnxruntime against torch: "
                   f"{checked}); model card: {card_path(target)}")
        return
    _export_torchscript(name, style.path, model, target)


def _export_torchscript(name: str, source: Path, model: torch.nn.Module, target: Path) -> None:
    """Script ``model``, save it to ``target`` once the reloaded file matches it."""
    with torchscript_quietly():  # TorchScript files still load everywhere
        scripted = torch.jit.script(model)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part")
        try:
            scripted.save(str(partial))
            reloaded = torch.jit.load(str(partial))
            probe = torch.rand(1, 3, 96, 80, generator=torch.Generator().manual_seed(0)) * 2 - 1
            with torch.inference_mode():
                difference = (reloaded(probe) - model(probe)).abs().max().item()
            if difference > 1e-4:
                raise click.ClickException(f"the exported model differs from {source} "
                                           f"(max abs difference {difference:.2g}); not saved")
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    click.echo(f"exported {name} to {target} ({target.stat().st_size / 2**20:.1f} MiB; "
               f"checked: max abs difference {difference:.1g})")


@cli.command("worker")
@click.option("--burst", is_flag=True, help="Stop when the queue is empty.")
@click.option("--name", help="The worker's name in RQ (default: host and process id).")
def worker_command(burst: bool, name: str | None) -> None:
    """Convert queued jobs (animations, videos) from the RQ queue on Redis, one at a time.

    Run as many as you like, on any machine that reaches the Redis of
    ANIMEGAN_STATE_STORAGE_URI (else ANIMEGAN_STORAGE_URI), with the web app's settings and styles.

    \b
    Example:
      flask --app example_app animegan worker
    """
    service = get_service()
    from ..jobs.queues import RQQueue

    queue = service.jobs.queue if service.jobs is not None else None
    if not isinstance(queue, RQQueue):
        raise click.UsageError(
            "this app's jobs run in its own process (ANIMEGAN_JOB_QUEUE is local, or auto "
            "without Redis): set ANIMEGAN_STATE_STORAGE_URI or ANIMEGAN_STORAGE_URI to "
            "redis://host:6380/0 to queue them on RQ for workers")
    sweep_leftovers(service.settings.result_ttl)  # of this host's runs that died
    service.warm_up()
    queue.work(burst=burst, name=name)


def _bench_root() -> Path | None:
    """The source checkout holding bench/ (the benchmark is not part of the package)."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "bench" / "__main__.py").is_file():
            return root
    return None


@cli.command("bench")
@click.option("--quick", is_flag=True, help="Fewer sizes and repeats (about 3 minutes).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="JSON results file (default: bench/results/latest.json).")
def bench_command(quick: bool, out: Path | None) -> None:
    """Run the performance benchmark (python -m bench) and print its report.

    Needs a source checkout (bench/ is not installed) and pip install -e '.[bench]'.

    \b
    Example:
      flask --app example_app animegan bench --quick
    """
    root = _bench_root()
    if root is None:
        raise click.ClickException("the benchmark lives in the source repository's bench/ "
                                   "folder, which is not installed with the package: run "
                                   "this from a clone of flask-animegan")
    args = [sys.executable, "-m", "bench"] + (["--quick"] if quick else [])
    if out is not None:
        args += ["--out", str(out.resolve())]
    code = subprocess.run(args, check=False, cwd=root).returncode
    if code:
        raise click.ClickException(f"the benchmark failed (exit status {code}); its output "
                                   "above says where")
