"""Static images through kaleido: the files hold the drawing, and a missing Chromium is explained.

PNGs are decoded here (zlib, no imaging library) to count colours; PDFs are
checked for one page whose content streams paint the units' colours.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import kaleido
import plotly.graph_objects as go
import pytest
from views_models import analyze_tiny

from fsdpviz import ExportError, Report
from fsdpviz.export import save, write_image
from fsdpviz.views import PALETTE

UNIT_COLOURS = {tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in PALETTE[:4]}


@pytest.fixture(scope="module")
def report() -> Report:
    return analyze_tiny()


@pytest.fixture(scope="module")
def browser() -> Iterator[None]:
    """One Chromium for the module's images (kaleido starts one per image otherwise)."""
    kaleido.start_sync_server(silence_warnings=True)
    yield
    kaleido.stop_sync_server(silence_warnings=True)


@pytest.fixture
def no_browser_running() -> None:
    """The missing-Chromium tests need kaleido to look for a browser again."""
    kaleido.stop_sync_server(silence_warnings=True)


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, ...]]]:
    """Width, height and the RGB(A) pixels of an 8-bit truecolour PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        rows.append(line)
        prev = line
    pixels = [tuple(r[i : i + bpp]) for r in rows for i in range(0, stride, bpp)]
    return width, height, pixels


def test_png_of_the_explorer_shows_every_unit(
    report: Report, tmp_path: Path, browser: None
) -> None:
    path = save(report, tmp_path / "units.png", width=800, height=400)
    width, height, pixels = decode_png(path.read_bytes())
    assert (width, height) == (800, 400)
    colours = Counter(p[:3] for p in pixels)
    background = pixels[0][:3]
    assert background == (255, 255, 255)
    assert sum(n for c, n in colours.items() if c != background) > 0.5 * width * height
    for unit_colour in UNIT_COLOURS:
        assert colours[unit_colour] > 1000, unit_colour


def test_png_scale_theme_and_other_figures(report: Report, tmp_path: Path, browser: None) -> None:
    path = save(report, tmp_path / "dark.png", theme="dark", width=300, height=200, scale=2)
    width, height, pixels = decode_png(path.read_bytes())
    assert (width, height) == (600, 400)
    assert pixels[0][:3] == (17, 17, 17)  # the dark theme's #111111
    for name in ("prefetch", "timeline"):
        _, _, pixels = decode_png(save(report, tmp_path / f"{name}.png", figure=name).read_bytes())
        colours = Counter(p[:3] for p in pixels)
        assert len(colours) > 20
        assert sum(colours[c] for c in UNIT_COLOURS) > 200, name


def test_svg_names_the_units(report: Report, tmp_path: Path, browser: None) -> None:
    svg = save(report, tmp_path / "units.svg").read_text()
    assert svg.startswith("<svg")
    for k, name in enumerate(["blocks.0", "blocks.1", "blocks.2"], start=1):
        assert f"{name} [unit {k}]" in svg
    prefetch = save(report, tmp_path / "prefetch.svg", figure="prefetch").read_text()
    assert "backward prefetch" in prefetch and "blocks.2" in prefetch


def _pdf_fill_colours(data: bytes) -> set[tuple[int, int, int]]:
    colours = set()
    for m in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            content = zlib.decompress(m.group(1))
        except zlib.error:
            continue
        for r, g, b in re.findall(rb"([\d.]+) ([\d.]+) ([\d.]+) rg", content):
            colours.add(tuple(round(float(v) * 255) for v in (r, g, b)))
    return colours


def test_pdf_has_one_page_painting_the_units(report: Report, tmp_path: Path, browser: None) -> None:
    data = save(report, tmp_path / "units.PDF").read_bytes()
    assert data.startswith(b"%PDF-")
    assert len(re.findall(rb"/Type\s*/Page\b(?!s)", data)) == 1
    assert _pdf_fill_colours(data) >= UNIT_COLOURS


def test_jpeg_and_webp(report: Report, tmp_path: Path, browser: None) -> None:
    assert save(report, tmp_path / "u.jpeg").read_bytes()[:3] == b"\xff\xd8\xff"
    webp = save(report, tmp_path / "u.webp").read_bytes()
    assert webp[:4] == b"RIFF" and webp[8:12] == b"WEBP"


def test_write_image_takes_any_figure(tmp_path: Path, browser: None) -> None:
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 3], marker_color="#D55E00"))
    path = write_image(fig, tmp_path / "bar.png", width=400, height=300)
    width, height, pixels = decode_png(path.read_bytes())
    assert (width, height) == (400, 300)
    assert Counter(p[:3] for p in pixels)[(213, 94, 0)] > 500
    assert write_image(fig.to_dict(), tmp_path / "bar.out", format="svg").read_text()[:4] == "<svg"
    with pytest.raises(ValueError, match=r"unknown format '\.gif'"):
        write_image(fig, tmp_path / "bar.gif")


def test_no_chromium_at_browser_path(
    report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_browser_running: None
) -> None:
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "nowhere" / "chromium"))
    with pytest.raises(ExportError) as info:
        save(report, tmp_path / "units.png")
    message = str(info.value)
    assert f"no Chromium at BROWSER_PATH='{tmp_path / 'nowhere' / 'chromium'}'" in message
    assert "apt-get install -y chromium" in message
    assert not (tmp_path / "units.png").exists()


def test_no_chromium_anywhere(
    report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_browser_running: None
) -> None:
    from choreographer.browsers.chromium import Chromium

    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(Chromium, "find_browser", classmethod(lambda cls, **kw: None))
    with pytest.raises(ExportError) as info:
        save(report, tmp_path / "units.pdf")
    message = str(info.value)
    assert message.startswith(f"cannot write '{tmp_path / 'units.pdf'}': no Chromium-based browser")
    for hint in (
        "apt-get install -y chromium",
        "plotly_get_chrome",
        "kaleido.get_chrome_sync()",
        "BROWSER_PATH=/path/to/chromium",
    ):
        assert hint in message
    assert not (tmp_path / "units.pdf").exists()


def test_a_pipe_glitch_kaleido_recovers_from_stays_out_of_the_notebook(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """choreographer (kaleido's browser driver) logs a traceback when it cannot decode one
    message from the browser and goes on without it; the image is written all the same."""
    import logging

    from fsdpviz.export._image import _quiet_pipe_glitches

    logger = logging.getLogger("choreographer.channels.pipe")
    with caplog.at_level(logging.INFO, logger="choreographer.channels.pipe"):
        with _quiet_pipe_glitches():
            try:
                raise ValueError("Expecting ',' delimiter")
            except ValueError:
                logger.exception("JSONError decoding message. Ignoring")
            logger.error("Error in trying to decode JSON off our read.")  # still shown
        logger.exception("JSONError decoding message. Ignoring")  # outside an export: shown
    assert [r.getMessage() for r in caplog.records] == [
        "Error in trying to decode JSON off our read.",
        "JSONError decoding message. Ignoring",
    ]
