"""Fetch pages with a ThreadPoolExecutor (the concurrent.futures documentation's example),
from a local http.server so that the run needs no network."""

import hashlib
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from spindle.concurrent import futures


class Pages(BaseHTTPRequestHandler):
    def do_GET(self):
        size = int(self.path.rsplit("/", 1)[-1])
        body = (self.path * size).encode()[:size * 100]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def load_url(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as conn:
        return conn.read()


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    urls = [f"{base}/page/{n}" for n in (3, 1, 4, 15, 9, 26)]
    pages = {}
    with futures.ThreadPoolExecutor(max_workers=5) as executor:
        future_to_url = {executor.submit(load_url, url, 60): url for url in urls}
        for future in futures.as_completed(future_to_url):
            pages[future_to_url[future]] = future.result()
    server.shutdown()
    for url in sorted(pages):
        digest = hashlib.sha256(pages[url]).hexdigest()[:12]
        print(f"{url.replace(base, '')} page is {len(pages[url])} bytes, sha256 {digest}")


if __name__ == "__main__":
    main()
