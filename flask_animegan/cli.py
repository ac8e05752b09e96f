"""``flask animegan ...``: list, download and batch-convert styles."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from flask import current_app

from .download import DownloadError, pull_style
from .errors import ConversionError
from .service import get_service
from .views import blueprint

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
cli = blueprint.cli
cli.help = """Photo-to-anime styles: list, download, convert.

\b
Examples:
  flask --app example_app animegan styles
  flask --app example_app animegan pull paprika
  flask --app example_app animegan convert photos/ -o anime/
"""


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
        click.echo(f"{'':<20} licence: {style['licence']}")
        if style.get("error"):
            click.echo(f"{'':<20} error: {style['error']}")


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

    The file is checked against its git blob SHA-1 before it is moved into the
    models folder; a failed or mismatching download leaves nothing behind.

    \b
    Examples:
      flask --app example_app animegan pull paprika
      flask --app example_app animegan pull face_paint_512_v2 --base-url http://mirror.local/weights
    """
    service = get_service()
    catalog = service.engine.catalog
    if name not in catalog:
        raise click.ClickException(f"unknown style {name!r}; pullable styles: "
                                   f"{', '.join(sorted(catalog))}")
    style = catalog[name]
    target = service.engine.models_dir / f"{name}.pt"
    if target.exists() and not force:
        click.echo(f"{name} is already installed at {target} (use --force to download again)")
        return
    click.echo(f"{name}: {style.description or '(no description)'}\nlicence: {style.licence}")
    base = base_url or current_app.config["ANIMEGAN_WEIGHTS_BASE_URL"]
    progress = _DownloadProgress(f"downloading {name}")
    try:
        path = pull_style(style, service.engine.models_dir, base_url=base,
                          on_start=progress.start, on_chunk=progress.advance)
    except DownloadError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        progress.finish()
    service.engine.rescan()
    click.echo(f"installed {path} (hash verified); restart the server to serve it")


@cli.command("convert")
@click.argument("inputs", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=True, path_type=Path))
@click.option("-o", "--out", "out_dir", required=True,
              type=click.Path(file_okay=False, path_type=Path), help="Output folder.")
@click.option("--style", help="Style name (default: the app's default style).")
@click.option("--size", type=int, help="Long side of the output in pixels (default: MAX_SIDE).")
@click.option("--format", "fmt", type=click.Choice(["jpeg", "png", "webp"]),
              help="Output format (default: ANIMEGAN_OUTPUT_FORMAT).")
@click.option("--overwrite", is_flag=True, help="Convert again files already converted.")
def convert_command(inputs: tuple[Path, ...], out_dir: Path, style: str | None,
                    size: int | None, fmt: str | None, overwrite: bool) -> None:
    """Convert image files and folders (not recursive) into OUT.

    Output files are named after the input with the style and format, e.g.
    photo.jpg -> OUT/photo.paprika.jpeg; existing outputs are skipped.

    \b
    Example:
      flask --app example_app animegan convert holiday/ me.png -o anime/ --style paprika
    """
    service = get_service()
    try:
        chosen = service.engine.style(style).name
        fmt = service.parse_format(fmt)
        service.parse_size(size)
    except ConversionError as exc:
        raise click.ClickException(str(exc)) from None
    files: list[Path] = []
    for item in inputs:
        if item.is_dir():
            files += sorted(p for p in item.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        else:
            files.append(item)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = skipped = 0
    with click.progressbar(files, label="converting", file=sys.stderr, show_eta=True,
                           item_show_func=lambda p: p.name if p else None) as bar:
        for path in bar:
            target = out_dir / f"{path.stem}.{chosen}.{fmt}"
            if target.exists() and not overwrite:
                skipped += 1
                continue
            try:
                result = service.convert_upload(path.read_bytes(), chosen, size, fmt)
            except ConversionError as exc:
                failed += 1
                click.echo(f"\n{path}: {exc}", err=True)
                continue
            target.write_bytes(result.data)
    click.echo(f"converted {len(files) - failed - skipped}, skipped {skipped} already "
               f"converted, failed {failed}; output in {out_dir}")
    if failed:
        sys.exit(1)
