"""The Mandelbrot set rendered by a distributed parallel for (CRUCIAL, Listing 3).

`spindle.parallel_for` splits the image's row bands statically over `--tasks` functions
(CRUCIAL's `invokeIterativeTask`). Each iteration computes the escape counts of one band of
rows and writes them into the image, a shared `spindle.Array` of shape (height, width): the
band travels zero-padded to the image's shape and `Array.add` places it in the server, since
the rows of different bands are disjoint. The main program then reads the finished image and
saves it as a PNG.

    spindle run examples/mandelbrot.py [--width 800] [--height 600] [--tasks 4] [-o mandelbrot.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import spindle

# The region of the complex plane that is drawn.
RE_MIN, RE_MAX, IM_MIN, IM_MAX = -2.2, 1.0, -1.2, 1.2


def compute_rows(first: int, last: int, width: int, height: int, max_iter: int) -> np.ndarray:
    """Escape iteration of every pixel of rows [first, last); max_iter for points in the set."""
    re = np.linspace(RE_MIN, RE_MAX, width)
    im = IM_MAX - (IM_MAX - IM_MIN) * np.arange(first, last) / max(height - 1, 1)
    c = re[None, :] + 1j * im[:, None]
    z = np.zeros_like(c)
    counts = np.full(c.shape, max_iter, dtype=np.int64)
    alive = np.ones(c.shape, dtype=bool)
    for i in range(max_iter):
        z[alive] = z[alive] * z[alive] + c[alive]
        escaped = alive & (z.real * z.real + z.imag * z.imag > 4.0)
        counts[escaped] = i
        alive &= ~escaped
        if not alive.any():
            break
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=800)
    ap.add_argument("--height", type=int, default=600)
    ap.add_argument("--max-iter", type=int, default=200, help="iterations per pixel at most")
    ap.add_argument("--tasks", type=int, default=4, help="functions sharing the rows")
    ap.add_argument("--band", type=int, default=25, help="rows per parallel-for iteration")
    ap.add_argument("-o", "--output", default="mandelbrot.png")
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = ap.parse_args()
    width, height, max_iter, band = args.width, args.height, args.max_iter, args.band

    spindle.connect()
    image = spindle.Array((height, width), "int64")  # the shared image, zeros to start

    def render_band(b: int) -> None:  # runs in a function, once per band of rows
        first, last = b * band, min((b + 1) * band, height)
        frame = np.zeros((height, width), dtype=np.int64)
        frame[first:last] = compute_rows(first, last, width, height, max_iter)
        image.add(frame)  # the band lands in the shared image, in the server

    bands = (height + band - 1) // band
    print(f"{width}x{height}, {bands} bands of {band} rows over {args.tasks} functions",
          file=sys.stderr)
    start = time.perf_counter()
    spindle.parallel_for(render_band, range(bands), tasks=args.tasks)
    elapsed = time.perf_counter() - start

    counts = image.get()
    save_png(counts, max_iter, args.output)
    inside = float(np.mean(counts == max_iter))
    print(f"rendered {width}x{height} in {elapsed:.2f} s with {args.tasks} tasks; "
          f"{inside:.1%} of the pixels are in the set; saved {args.output}")
    if args.json:
        print(json.dumps({"width": width, "height": height, "seconds": elapsed,
                          "inside": inside, "output": args.output}))


def colour(counts: np.ndarray, max_iter: int) -> np.ndarray:
    """RGB pixels for the escape counts, the set itself in black."""
    from matplotlib import colormaps

    shade = 0.15 + 0.85 * np.log1p(counts) / np.log1p(max_iter)
    rgb = (colormaps["magma"](shade)[..., :3] * 255).astype(np.uint8)
    rgb[counts == max_iter] = 0
    return rgb


def save_png(counts: np.ndarray, max_iter: int, path: str) -> None:
    from PIL import Image

    Image.fromarray(colour(counts, max_iter)).save(path)


if __name__ == "__main__":
    main()
