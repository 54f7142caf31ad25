#!/usr/bin/env python
"""Regenerate the committed example reports, or check that they are not stale.

    python scripts/regenerate_examples.py           # rewrite reports/*.html and their screenshots
    python scripts/regenerate_examples.py --check   # exit 1 naming every stale example (CI runs this)

Why: an example report built five commits behind HEAD shows panels and numbers the
code no longer produces. Each example is rendered from committed inputs (the runs
under profiles/: the H200's measured bench and profile runs, read as one, and the
no-GPU run) and the shared Nsight Compute fixtures (../shared/fixtures/ncu,
or $CHARACTERIZE_NCU_FIXTURES; never copied into the repository).

The check renders every example to memory and compares it with the committed file:
the text exactly (the characterize version masked), the figures byte for byte when the
committed file was drawn by the same matplotlib version (recorded in its generator
tag) and by position and size otherwise, since another matplotlib draws other pixels.
It also checks that the full-page screenshot beside each example carries the hash of
that example's HTML (written into the PNG when the script took it), so a screenshot
cannot lag behind its report. No browser is needed to check; one is needed to
regenerate the screenshots (Debian's chromium).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import struct
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402 - matplotlib's own dependency

from characterize.report.render import report_html  # noqa: E402

REPORTS = ROOT / "reports"
#: how the fixture directory is written in the committed examples, wherever it is found
FIXTURES_SHOWN = "../shared/fixtures/ncu"
PNG_KEY = "characterize-report-sha256"


def fixtures_dir() -> Path:
    env = os.environ.get("CHARACTERIZE_NCU_FIXTURES")
    return Path(env) if env else ROOT.parent / "shared" / "fixtures" / "ncu"


@dataclass(frozen=True)
class Example:
    """One committed example: its file stem, title, sources (run directories relative to
    the repository, fixture file names) and whether later sources are compared."""

    name: str
    title: str
    runs: tuple[str, ...]
    fixtures: tuple[str, ...]
    compare: bool = True
    #: also a crop of its first screen (<name>-first-screen.png), the picture the README shows
    first_screen: bool = False

    def sources(self) -> list[str]:
        return list(self.runs) + [str(fixtures_dir() / f) for f in self.fixtures]


EXAMPLES: tuple[Example, ...] = (
    Example("example-h200", "characterize example: the paper's workload measured on an NVIDIA H200 (CUDA-event "
            "timings of every variant, Nsight Compute profiles of seven, the model beside them)",
            ("profiles/h200/paper-gpu", "profiles/h200/paper-gpu-profile"), (), compare=False, first_screen=True),
    Example("example-no-gpu", "characterize example: paper configuration without a GPU (static analysis, trace "
            "locality, model predictions) + Nsight Compute reports recorded by others on A100 and H800",
            ("profiles/static-paper",), ("a100_mistic_msdnew.ncu-rep", "h800_sglang.ncu-rep"), compare=False),
    Example("example-ncu-compare", "characterize example: two Nsight Compute reports of one A100 application "
            "compared (nodeByPoint vs nodeByPoint5)", (),
            ("a100_mistic_msdnew.ncu-rep", "a100_mistic_msdkt23.ncu-rep"), compare=True),
)


# ------------------------------------------------------------------ render
def render(ex: Example) -> str:
    """The example's HTML, rendered from the repository root, fixture paths written as
    FIXTURES_SHOWN so that the text does not depend on where the fixtures live."""
    missing = [f for f in ex.fixtures if not (fixtures_dir() / f).is_file()]
    if missing:
        raise SystemExit(f"{ex.name}: fixture(s) {', '.join(missing)} not found in {fixtures_dir()} (set "
                         "CHARACTERIZE_NCU_FIXTURES)")
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        html = report_html(ex.sources(), title=ex.title, compare=ex.compare)
    finally:
        os.chdir(cwd)
    return html.replace(str(fixtures_dir()), FIXTURES_SHOWN)


_VERSION = re.compile(r"characterize \d+\.\d+[\w.+-]*")
_IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" width="(\d+)" height="(\d+)"')
_MPL = re.compile(r'<meta name="generator" content="[^"]*matplotlib ([\w.+-]+)')


def normalized(html: str, keep_images: bool) -> str:
    """The HTML with the characterize version masked and, unless `keep_images`, each
    figure reduced to its size."""
    text = _VERSION.sub("characterize VERSION", html)
    if not keep_images:
        text = _IMG.sub(lambda m: f'<img src="(figure)" width="{m.group(2)}" height="{m.group(3)}"', text)
    return text


def digest(html: str) -> str:
    return hashlib.sha256(normalized(html, keep_images=True).encode()).hexdigest()


# -------------------------------------------------------------- PNG text
def png_with_text(data: bytes, key: str, value: str) -> bytes:
    """A PNG with a tEXt chunk (key, value) after its header chunk."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG")
    ihdr_end = 8 + 8 + struct.unpack(">I", data[8:12])[0] + 4
    body = key.encode("latin-1") + b"\0" + value.encode("latin-1")
    chunk = struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", zlib.crc32(b"tEXt" + body))
    return data[:ihdr_end] + chunk + data[ihdr_end:]


def png_text(data: bytes) -> dict[str, str]:
    """The tEXt chunks of a PNG."""
    out, i = {}, 8
    while i + 8 <= len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        kind = data[i + 4:i + 8]
        if kind == b"tEXt":
            k, _, v = data[i + 8:i + 8 + n].partition(b"\0")
            out[k.decode("latin-1")] = v.decode("latin-1")
        if kind == b"IEND":
            break
        i += 12 + n
    return out


#: the first screen's crop: a laptop's window at the screenshot's width
FIRST_SCREEN_PX = 1000


def first_screen_path(png_path: Path) -> Path:
    return png_path.with_name(png_path.stem + "-first-screen.png")


def screenshot(html_path: Path, png_path: Path, html: str, first_screen: bool = False) -> None:
    """A full-page screenshot of the report (headless Chromium), tagged with its hash, and
    with `first_screen` its top FIRST_SCREEN_PX pixels as a second picture, tagged alike."""
    from tests.report.browser import Browser, chromium_path  # noqa: PLC0415 - a dev tool, only here

    exe = chromium_path()
    if exe is None:
        raise SystemExit("chromium not found: install Debian's chromium (apt-get install -y chromium) or set "
                         "CHARACTERIZE_CHROMIUM to take the screenshots")
    with tempfile.TemporaryDirectory() as profile:
        b = Browser(exe, Path(profile))
        try:
            session = b.open_page(html_path.resolve().as_uri(), width=1300, height=1000)
            shot = png_path.with_suffix(".tmp.png")
            b.screenshot(session, shot, max_height=40000)
        finally:
            b.close()
    top = png_path.with_suffix(".top.png")
    with Image.open(shot) as im:  # 128 colours: a third of the bytes, text and figures still crisp
        if first_screen:
            im.convert("RGB").crop((0, 0, im.width, min(im.height, FIRST_SCREEN_PX))).save(top, optimize=True)
        im.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            shot, optimize=True)
    png_path.write_bytes(png_with_text(shot.read_bytes(), PNG_KEY, digest(html)))
    shot.unlink()
    if first_screen:
        first_screen_path(png_path).write_bytes(png_with_text(top.read_bytes(), PNG_KEY, digest(html)))
        top.unlink()


# ------------------------------------------------------------------- check
def stale(ex: Example) -> list[str]:
    """Why the committed example differs from what the code renders now (empty: fresh)."""
    html_path, png_path = REPORTS / f"{ex.name}.html", REPORTS / f"{ex.name}.png"
    if not html_path.is_file():
        return [f"{html_path.relative_to(ROOT)} is missing"]
    committed, fresh = html_path.read_text(), render(ex)
    problems = []
    m_old, m_new = _MPL.search(committed), _MPL.search(fresh)
    same_mpl = bool(m_old and m_new and m_old.group(1) == m_new.group(1))
    a, b = normalized(committed, same_mpl), normalized(fresh, same_mpl)
    if a != b:
        la, lb = a.splitlines(), b.splitlines()
        line = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
        shown = (la[line] if line < len(la) else "(end)")[:160]
        problems.append(f"{html_path.relative_to(ROOT)} is stale (first difference at line {line + 1}: {shown!r}"
                        f"{'' if same_mpl else '; figures compared by size: another matplotlib drew them'})")
    if not png_path.is_file():
        problems.append(f"{png_path.relative_to(ROOT)} is missing")
    elif png_text(png_path.read_bytes()).get(PNG_KEY) != digest(committed):
        problems.append(f"{png_path.relative_to(ROOT)} was not taken of the committed "
                        f"{html_path.relative_to(ROOT)}")
    top = first_screen_path(png_path)
    if ex.first_screen and not (top.is_file() and png_text(top.read_bytes()).get(PNG_KEY) == digest(committed)):
        problems.append(f"{top.relative_to(ROOT)} is missing or was not taken of the committed "
                        f"{html_path.relative_to(ROOT)}")
    return problems


def check() -> list[str]:
    return [p for ex in EXAMPLES for p in stale(ex)]


def regenerate(names: list[str] | None = None, shots: bool = True) -> None:
    REPORTS.mkdir(exist_ok=True)
    for ex in EXAMPLES:
        if names and ex.name not in names:
            continue
        html = render(ex)
        path = REPORTS / f"{ex.name}.html"
        path.write_text(html)
        print(f"wrote {path.relative_to(ROOT)} ({len(html) / 1e6:.1f} MB)")
        if shots:
            screenshot(path, path.with_suffix(".png"), html, ex.first_screen)
            print(f"wrote {path.with_suffix('.png').relative_to(ROOT)}" +
                  (f" and {first_screen_path(path.with_suffix('.png')).relative_to(ROOT)}" if ex.first_screen else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed example is stale")
    ap.add_argument("--no-screenshots", action="store_true", help="regenerate the HTML only")
    ap.add_argument("names", nargs="*", help="only these examples (default: all)")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("regenerate them with: python scripts/regenerate_examples.py", file=sys.stderr)
            return 1
        print(f"{len(EXAMPLES)} example report(s) up to date")
        return 0
    regenerate(args.names, shots=not args.no_screenshots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
