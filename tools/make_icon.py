"""Draw the app icon: ``python tools/make_icon.py`` writes resources/icons/.

One drawing, described once in a 256-unit square (``SHAPES``), rendered three ways:

- PNGs at 16..512 px with QPainter (offscreen Qt; no fonts, so every machine draws the
  same pixels),
- ``app.svg`` from the same numbers, as text,
- ``app.ico`` (Windows: PNG-compressed entries, 16..256 px) and ``app.icns`` (macOS),
  packed here by hand so that no image plug-in is needed.

The picture: a blue-to-violet rounded square, a white speech bubble (chat) holding a pair
of code brackets ``< >`` and an amber text cursor (code completion).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "resources" / "icons"
PNG_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICO_SIZES = (16, 24, 32, 48, 64, 128, 256)
# icns chunk types holding PNG data, by pixel size
ICNS_TYPES = {16: b"icp4", 32: b"icp5", 64: b"icp6", 128: b"ic07", 256: b"ic08",
              512: b"ic09"}

UNIT = 256.0
BACKGROUND = (8.0, 8.0, 240.0, 240.0, 52.0)  # x, y, w, h, corner radius
GRADIENT = ("#2b6cb0", "#5a3fa6")  # top-left -> bottom-right
BUBBLE = (40.0, 52.0, 176.0, 124.0, 30.0)
TAIL = ((78.0, 168.0), (66.0, 214.0), (126.0, 172.0))
BRACKETS = (((104.0, 86.0), (74.0, 114.0), (104.0, 142.0)),
            ((152.0, 86.0), (182.0, 114.0), (152.0, 142.0)))
BRACKET_COLOUR = "#3c4fae"
BRACKET_WIDTH = 16.0
CURSOR = (120.0, 88.0, 16.0, 52.0, 4.0)
CURSOR_COLOUR = "#f6a23c"


def svg() -> str:
    """The icon as an SVG document (the same shapes as the PNGs)."""
    bx, by, bw, bh, br = BACKGROUND
    ux, uy, uw, uh, ur = BUBBLE
    cx, cy, cw, ch, cr = CURSOR
    tail = " ".join(f"{x:g},{y:g}" for x, y in TAIL)
    brackets = "\n".join(
        f'  <polyline points="{" ".join(f"{x:g},{y:g}" for x, y in line)}" fill="none" '
        f'stroke="{BRACKET_COLOUR}" stroke-width="{BRACKET_WIDTH:g}" '
        'stroke-linecap="round" stroke-linejoin="round"/>' for line in BRACKETS)
    return f"""<svg xmlns="http://www.w3.org/2000/svg" width="256" height="256" \
viewBox="0 0 256 256">
  <title>ONNX Local LLM</title>
  <defs>
    <linearGradient id="bg" x1="0" y1="0" x2="1" y2="1">
      <stop offset="0" stop-color="{GRADIENT[0]}"/>
      <stop offset="1" stop-color="{GRADIENT[1]}"/>
    </linearGradient>
  </defs>
  <rect x="{bx:g}" y="{by:g}" width="{bw:g}" height="{bh:g}" rx="{br:g}" fill="url(#bg)"/>
  <rect x="{ux:g}" y="{uy:g}" width="{uw:g}" height="{uh:g}" rx="{ur:g}" fill="#ffffff"/>
  <polygon points="{tail}" fill="#ffffff"/>
{brackets}
  <rect x="{cx:g}" y="{cy:g}" width="{cw:g}" height="{ch:g}" rx="{cr:g}" \
fill="{CURSOR_COLOUR}"/>
</svg>
"""


def render_png(size: int) -> bytes:
    """The icon at ``size`` px, PNG-encoded (QPainter, antialiased)."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPointF, QRectF, Qt
    from PySide6.QtGui import (
        QBrush,
        QColor,
        QImage,
        QLinearGradient,
        QPainter,
        QPainterPath,
        QPen,
        QPolygonF,
    )

    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.scale(size / UNIT, size / UNIT)
    painter.setPen(Qt.PenStyle.NoPen)

    bx, by, bw, bh, br = BACKGROUND
    gradient = QLinearGradient(QPointF(bx, by), QPointF(bx + bw, by + bh))
    gradient.setColorAt(0.0, QColor(GRADIENT[0]))
    gradient.setColorAt(1.0, QColor(GRADIENT[1]))
    painter.setBrush(QBrush(gradient))
    painter.drawRoundedRect(QRectF(bx, by, bw, bh), br, br)

    ux, uy, uw, uh, ur = BUBBLE
    bubble = QPainterPath()
    bubble.addRoundedRect(QRectF(ux, uy, uw, uh), ur, ur)
    tail = QPainterPath()
    tail.addPolygon(QPolygonF([QPointF(x, y) for x, y in TAIL]))
    painter.setBrush(QColor("#ffffff"))
    painter.drawPath(bubble.united(tail))  # one outline: no seam where they meet

    pen = QPen(QColor(BRACKET_COLOUR), BRACKET_WIDTH)
    pen.setCapStyle(Qt.PenCapStyle.RoundCap)
    pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
    painter.setPen(pen)
    painter.setBrush(Qt.BrushStyle.NoBrush)
    for line in BRACKETS:
        painter.drawPolyline(QPolygonF([QPointF(x, y) for x, y in line]))

    cx, cy, cw, ch, cr = CURSOR
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor(CURSOR_COLOUR))
    painter.drawRoundedRect(QRectF(cx, cy, cw, ch), cr, cr)
    painter.end()

    data = QByteArray()
    buffer = QBuffer(data)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    if not image.save(buffer, "PNG"):  # type: ignore[call-overload]  # str works; stubs want bytes
        raise RuntimeError(f"Qt could not encode the {size} px icon as PNG")
    buffer.close()
    return bytes(data.data())


def pack_ico(pngs: dict[int, bytes]) -> bytes:
    """A Windows .ico whose entries are PNG streams (Windows Vista and later)."""
    sizes = sorted(pngs)
    header = struct.pack("<HHH", 0, 1, len(sizes))
    offset = len(header) + 16 * len(sizes)
    entries, blobs = b"", b""
    for size in sizes:
        blob = pngs[size]
        side = 0 if size >= 256 else size  # 0 means 256
        entries += struct.pack("<BBBBHHII", side, side, 0, 0, 1, 32, len(blob), offset)
        blobs += blob
        offset += len(blob)
    return header + entries + blobs


def pack_icns(pngs: dict[int, bytes]) -> bytes:
    """A macOS .icns of PNG chunks."""
    chunks = b"".join(ICNS_TYPES[size] + struct.pack(">I", 8 + len(pngs[size])) + pngs[size]
                      for size in sorted(pngs) if size in ICNS_TYPES)
    return b"icns" + struct.pack(">I", 8 + len(chunks)) + chunks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write (default: "
                        "resources/icons)")
    args = parser.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    pngs = {size: render_png(size) for size in PNG_SIZES}
    for size, blob in pngs.items():
        (out / f"app-{size}.png").write_bytes(blob)
    (out / "app.png").write_bytes(pngs[256])  # what the window and the .desktop use
    (out / "app.svg").write_text(svg(), encoding="utf-8")
    (out / "app.ico").write_bytes(pack_ico({s: pngs[s] for s in ICO_SIZES}))
    (out / "app.icns").write_bytes(pack_icns(pngs))
    del app
    print(f"wrote {len(pngs) + 4} files to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
