"""Dependency-free PNG charts (an RGB canvas written with zlib)."""

from __future__ import annotations

import struct
import zlib

PALETTE = [(200, 40, 40), (30, 90, 200), (40, 150, 60), (200, 140, 20), (120, 60, 160), (90, 90, 90)]


class Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = [[(255, 255, 255)] * width for _ in range(height)]

    def set(self, x: int, y: int, color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self.pixels[y][x] = color

    def line(self, p, q, color) -> None:
        steps = max(abs(q[0] - p[0]), abs(q[1] - p[1]), 1)
        for k in range(steps + 1):
            self.set(p[0] + (q[0] - p[0]) * k // steps, p[1] + (q[1] - p[1]) * k // steps, color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color) -> None:
        for y in range(min(y0, y1), max(y0, y1) + 1):
            for x in range(min(x0, x1), max(x0, x1) + 1):
                self.set(x, y, color)

    def save(self, path: str) -> None:
        raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in self.pixels)

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n"
                    + chunk(b"IHDR", struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def line_plot(path: str, series: dict[str, list[float]], width: int = 900, height: int = 320) -> None:
    """One line per series (first red, second blue, ...), a grey zero line."""
    values = [v for s in series.values() for v in s] or [0.0]
    lo, hi = min(min(values), 0.0), max(max(values), 0.0)
    span = (hi - lo) or 1.0
    canvas = Canvas(width, height)

    def y_of(v):
        return int((hi - v) / span * (height - 21)) + 10

    canvas.line((0, y_of(0.0)), (width - 1, y_of(0.0)), (150, 150, 150))
    for color, s in zip(PALETTE, series.values()):
        n = max(len(s) - 1, 1)
        points = [(int(i / n * (width - 1)), y_of(v)) for i, v in enumerate(s)]
        for p, q in zip(points, points[1:]):
            canvas.line(p, q, color)
    canvas.save(path)


def bar_chart(path: str, groups: list[list[float | None]], reference: float = 1.0,
              width: int = 900, height: int = 320) -> None:
    """Groups of bars (bar i of every group in color i) drawn from a grey line at
    ``reference`` up or down to their value; None draws nothing."""
    values = [v for g in groups for v in g if v is not None]
    span = max((abs(v - reference) for v in values), default=0.0) * 1.1 or 1.0
    canvas = Canvas(width, height)

    def y_of(v):
        return int((height - 1) / 2 - (v - reference) / span * (height / 2 - 10))

    slot = (width - 20) / max(len(groups), 1)
    for gi, group in enumerate(groups):
        bar = max(int(slot * 0.8 / max(len(group), 1)), 1)
        x0 = int(10 + gi * slot + slot * 0.1)
        for bi, v in enumerate(group):
            if v is not None:
                canvas.rect(x0 + bi * bar, y_of(reference), x0 + (bi + 1) * bar - 2, y_of(v), PALETTE[bi % len(PALETTE)])
    canvas.line((0, y_of(reference)), (width - 1, y_of(reference)), (150, 150, 150))
    canvas.save(path)
