"""Generate a local corpus of WARC-like crawl archives for the serverless-shell examples.

The seed's scripts (Figures 9-11, and the domain ranking of its section 4.3.4) mine Common
Crawl archives over the internet. These are their offline stand-in: gzip files holding WARC
response records, each with an HTTP ``Content-Length`` header and an HTML body whose links
point at domains drawn from a Zipf-like popularity law, so the examples compute the same
things (the average page size, the most-mentioned domains) on data that needs no network.
The WARC header gives its block's length as ``WARC-Block-Length``, so that the seed's
``grep ^Content-Length`` sees the pages' sizes only.

Usage: ``python examples/shell/make_corpus.py DIR [--archives 20] [--pages 200] [--seed 1]``
writes ``DIR/crawl-NNNN.warc.gz`` and ``DIR/index`` (one archive path per line, relative to
``DIR``). The output is a deterministic function of the arguments.
"""

from __future__ import annotations

import argparse
import gzip
import random
from pathlib import Path

TLDS = ["com", "org", "net", "io", "eu", "fr", "de", "es"]


def domains(count: int, rng: random.Random) -> list[str]:
    """``count`` distinct made-up domain names."""
    names: set[str] = set()
    while len(names) < count:
        stem = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(4, 10)))
        names.add(f"{stem}.{rng.choice(TLDS)}")
    return sorted(names)


def page(rng: random.Random, sites: list[str], weights: list[float]) -> bytes:
    """An HTML page with a few outgoing links and some filler text."""
    links = rng.choices(sites, weights=weights, k=rng.randint(1, 12))
    body = ["<html><body>"]
    for site in links:
        body.append(f'<p>see <a href="http://{site}/{rng.randint(1, 999)}.html">{site}</a></p>')
    body.append("<p>" + "lorem ipsum " * rng.randint(10, 400) + "</p></body></html>\n")
    return "".join(body).encode()


def record(uri: str, html: bytes) -> bytes:
    """One WARC response record wrapping an HTTP response with ``html`` as its body."""
    http = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
            + f"Content-Length: {len(html)}\r\n\r\n".encode() + html)
    head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: {uri}\r\n"
            f"WARC-Block-Length: {len(http)}\r\n\r\n").encode()
    return head + http + b"\r\n\r\n"


def make_corpus(out: Path, archives: int, pages: int, seed: int) -> list[Path]:
    rng = random.Random(seed)
    sites = domains(500, rng)
    weights = [1 / (rank + 1) for rank in range(len(sites))]  # Zipf, exponent 1
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for a in range(archives):
        path = out / f"crawl-{a:04d}.warc.gz"
        with gzip.open(path, "wb", compresslevel=6) as f:
            for p in range(pages):
                host = rng.choice(sites)
                f.write(record(f"http://{host}/page-{a}-{p}.html", page(rng, sites, weights)))
        paths.append(path)
    (out / "index").write_text("".join(f"{p.name}\n" for p in paths))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="where to write the archives and the index")
    ap.add_argument("--archives", type=int, default=20, help="gzip archives to write")
    ap.add_argument("--pages", type=int, default=200, help="pages per archive")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    paths = make_corpus(args.dir, args.archives, args.pages, args.seed)
    print(f"{len(paths)} archives of {args.pages} pages in {args.dir}")


if __name__ == "__main__":
    main()
