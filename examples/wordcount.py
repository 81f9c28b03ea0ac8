"""Word count by functions, merged in the server with `Dict.merge_many` (seed §3.1.3).

A `spindle.Executor` runs one function per chunk of the text. Each function reads only its
own chunk, counts its words locally and merges the counts into one shared `Dict` with a
single `merge_many(..., op="sum")`: the sums are made in the server, so no reduce phase and no
read-modify-write. As Listing 4 advises, what travels to a function is a reference to its
chunk (a file path and a byte range, or a seed for generated text), never the text itself.

    spindle run examples/wordcount.py [FILE] [--chunks 8] [--workers 4] [--words 2000000]

Without FILE, the text is generated: `--words` words drawn from the Zen of Python's
vocabulary with Zipf-like frequencies.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import json
import os
import re
import sys
import time
from collections import Counter

import spindle

WORD = re.compile(rb"[A-Za-z']+")


def words_of(data: bytes) -> list[str]:
    return [w.decode().lower() for w in WORD.findall(data)]


def vocabulary() -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return sorted(set(words_of(codecs.decode(this.s, "rot13").encode())))


def generated_chunk(seed: int, chunk: int, words: int) -> bytes:
    """Chunk `chunk` of the generated text: `words` words, the same every time."""
    import numpy as np

    vocab = vocabulary()
    rng = np.random.default_rng([seed, chunk])
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    picks = rng.choice(len(vocab), size=words, p=weights / weights.sum())
    lines = [" ".join(vocab[i] for i in picks[j:j + 12]) for j in range(0, words, 12)]
    return ("\n".join(lines) + "\n").encode()


def file_chunk(path: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of a file, moved to word boundaries: a word belongs to the chunk
    where it starts."""
    with open(path, "rb") as f:
        if start > 0:
            f.seek(start - 1)
            data = f.read(end - start + 1)
            skip = re.match(rb"[A-Za-z']*", data).end() if WORD.match(data[:1]) else 1
            data = data[skip:]
        else:
            data = f.read(end)
        while data and WORD.match(data[-1:]):  # finish the last word
            more = f.read(1)
            if not more or not WORD.match(more):
                break
            data += more
    return data


def count_chunk(source: tuple, chunk: int, counts: spindle.Dict) -> int:
    """One function: count the words of one chunk and merge them into the shared Dict."""
    if source[0] == "file":
        _, path, bounds = source
        data = file_chunk(path, bounds[chunk], bounds[chunk + 1])
    else:
        _, seed, words = source
        data = generated_chunk(seed, chunk, words)
    local = Counter(words_of(data))
    counts.merge_many(dict(local), op="sum")  # one call; the sums are made in the server
    return sum(local.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", help="a text file (default: generated text)")
    ap.add_argument("--chunks", type=int, default=8, help="functions, one per chunk")
    ap.add_argument("--workers", type=int, default=4, help="functions running at once")
    ap.add_argument("--words", type=int, default=2_000_000, help="generated words in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="also print every count as JSON")
    args = ap.parse_args()

    if args.file:
        size = os.path.getsize(args.file)
        bounds = [size * i // args.chunks for i in range(args.chunks + 1)]
        source: tuple = ("file", os.path.abspath(args.file), bounds)
        what = f"{args.file} ({size:,} bytes)"
    else:
        source = ("generated", args.seed, args.words // args.chunks)
        what = f"{args.words // args.chunks * args.chunks:,} generated words"

    spindle.connect()
    counts = spindle.Dict()  # the shared result
    print(f"counting the words of {what} in {args.chunks} functions", file=sys.stderr)
    start = time.perf_counter()
    with spindle.Executor(max_workers=args.workers) as ex:
        futures = [ex.submit(count_chunk, source, i, counts) for i in range(args.chunks)]
        total = 0
        for done, future in enumerate(futures, 1):
            total += future.result()
            print(f"  chunk {done}/{args.chunks} merged", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start

    result = counts.copy()
    top = sorted(result.items(), key=lambda kv: (-kv[1], kv[0]))[:args.top]
    print(f"{total:,} words, {len(result):,} distinct, in {elapsed:.2f} s; most common: "
          + ", ".join(f"{w} ({n:,})" for w, n in top))
    if args.json:
        print(json.dumps({"total": total, "seconds": elapsed, "counts": result}))


if __name__ == "__main__":
    main()
