"""A small SearXNG-compatible search server with pages to read, for trying the web toolset offline.

    python -m mockllm.searxng --port 8888                 # built-in demo pages
    python -m mockllm.searxng --port 8888 --pages DIR     # DIR/*.html, *.txt, *.md

then run with ``--web_searxng_url http://127.0.0.1:8888`` (or SEARXNG_URL) and
``--web_allow_hosts 127.0.0.1`` (its pages are on loopback, which the fetch refuses otherwise).

Endpoints
---------
``GET /search?q=...&format=json``  SearXNG's JSON search API over the pages (word matches, best first;
                                   a query matching nothing lists every page, so any demo prompt finds some)
``GET /pages/NAME``                a page; ``/pages/`` lists them
``GET /redirect?to=URL``           302 to URL
``GET /slow?seconds=S``            a page after S seconds
``GET /flaky/ID?fail=N``           429 with Retry-After: 1 (or ``&retry_after=S``) the first N times for ID
                                   (default 1), then a page
``GET /large?kb=N``                an N KiB HTML page (default 512)
``GET /_stats``                    hits per path (tests check what was fetched, and how often)
"""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

DEMO_PAGES = {
    "fennec-fox.html": ("The fennec fox", "The fennec fox is a small nocturnal fox of the Sahara. Its large ears, "
                        "up to 15 cm long, shed desert heat and let it hear prey moving under the sand."),
    "sahara.html": ("The Sahara desert", "The Sahara is the largest hot desert on Earth, about 9.2 million square "
                    "kilometres across North Africa. Daytime temperatures can pass 45 degrees Celsius."),
    "tide-pools.html": ("Tide pools", "Tide pools are rocky pools on the seashore that fill with sea water at high "
                        "tide. Anemones, sea stars and small crabs live in them."),
}
TYPES = {".html": "text/html; charset=utf-8", ".htm": "text/html; charset=utf-8", ".txt": "text/plain; charset=utf-8",
         ".md": "text/markdown; charset=utf-8"}


def demo_html(title: str, body: str) -> str:
    """A page with the boilerplate real pages have (navigation, cookie banner, footer) around its article."""
    t, b = html.escape(title), html.escape(body)
    return (f"<!doctype html><html><head><title>{t}</title><meta charset='utf-8'></head><body>"
            "<nav><a href='/'>Home</a> | <a href='/about'>About</a> | <a href='/login'>Log in</a></nav>"
            "<div class='cookie-banner'>We use cookies. <button>Accept all</button></div>"
            f"<main><article><h1>{t}</h1><p>{b}</p><p>{b}</p></article></main>"
            "<footer>Copyright 2026 Example Pages Ltd. All rights reserved. Privacy | Terms</footer></body></html>")


class Pages:
    def __init__(self, folder: Path | None):
        self.files: dict[str, tuple[str, str]] = {}  # name -> (content type, text)
        if folder is None:
            self.files = {n: (TYPES[".html"], demo_html(t, b)) for n, (t, b) in DEMO_PAGES.items()}
        else:
            for path in sorted(Path(folder).iterdir()):
                if path.suffix.lower() in TYPES and path.is_file():
                    self.files[path.name] = (TYPES[path.suffix.lower()], path.read_text(encoding="utf-8", errors="replace"))
        if not self.files:
            raise ValueError(f"no .html, .txt or .md pages in {folder}")

    @staticmethod
    def title_and_text(kind: str, text: str) -> tuple[str, str]:
        if kind.startswith("text/html"):
            m = re.search(r"<title>(.*?)</title>", text, re.S | re.I)
            plain = re.sub(r"<(script|style|nav|footer|header)\b.*?</\1>|<[^>]+>", " ", text, flags=re.S | re.I)
            return html.unescape(m.group(1).strip()) if m else "", " ".join(html.unescape(plain).split())
        first = text.strip().splitlines()[0] if text.strip() else ""
        return first.lstrip("# ").strip(), " ".join(text.split())

    def search(self, query: str, base: str) -> list[dict]:
        words = {w for w in re.findall(r"\w+", query.lower()) if len(w) > 2}
        scored = []
        for name, (kind, text) in self.files.items():
            title, plain = self.title_and_text(kind, text)
            haystack = f"{title} {plain}".lower()
            scored.append((sum(haystack.count(w) for w in words), name, title or name, plain))
        matching = [s for s in scored if s[0] > 0] or scored
        matching.sort(key=lambda s: (-s[0], s[1]))
        return [{"url": f"{base}/pages/{quote(name)}", "title": title, "content": plain[:200],
                 "engine": "hermes-test", "engines": ["hermes-test"], "positions": [i], "score": float(score),
                 "category": "general"} for i, (score, name, title, plain) in enumerate(matching, 1)]


class SearxngServer:
    """The server in-process: ``with SearxngServer(pages_dir) as s: s.base_url``; ``s.hits`` counts requests by path."""

    def __init__(self, pages: Path | None = None, host: str = "127.0.0.1", port: int = 0):
        self.pages = Pages(pages)
        self.hits: Counter[str] = Counter()
        self._flaky: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="searxng-test", daemon=True)
        self._thread.start()
        return self.base_url

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "SearxngServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def flaky_attempt(self, key: str) -> int:
        with self._lock:
            self._flaky[key] += 1
            return self._flaky[key]


def _handler(server: SearxngServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "hermes-searxng-test/1"

        def log_message(self, *a) -> None:  # quiet: tests and demos read /_stats instead
            pass

        def send(self, status: int, body: str | bytes, kind: str = "application/json", **headers: str) -> None:
            data = body.encode("utf-8") if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k.replace("_", "-"), v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
            with server._lock:
                server.hits[path] += 1
            base = f"http://{self.headers.get('Host') or server.base_url.split('//', 1)[1]}"
            if path == "/search":
                if query.get("format") != "json":
                    return self.send(403, "only format=json is served here", "text/plain")
                q = query.get("q", "")
                results = server.pages.search(q, base)
                return self.send(200, json.dumps({"query": q, "number_of_results": len(results), "results": results,
                                                  "answers": [], "corrections": [], "infoboxes": [],
                                                  "suggestions": [], "unresponsive_engines": []}))
            if path in ("/pages", "/pages/"):
                links = "".join(f"<li><a href='/pages/{quote(n)}'>{html.escape(n)}</a></li>" for n in server.pages.files)
                return self.send(200, f"<html><body><ul>{links}</ul></body></html>", TYPES[".html"])
            if path.startswith("/pages/"):
                name = path.removeprefix("/pages/")
                if name in server.pages.files:
                    kind, text = server.pages.files[name]
                    return self.send(200, text, kind)
                return self.send(404, "no such page", "text/plain")
            if path == "/redirect":
                return self.send(302, "", "text/plain", Location=query.get("to", "/pages/"))
            if path == "/slow":
                time.sleep(float(query.get("seconds", "5")))
                return self.send(200, demo_html("A slow page", "This page took its time."), TYPES[".html"])
            if path.startswith("/flaky/"):
                if server.flaky_attempt(path) <= int(query.get("fail", "1")):
                    return self.send(429, '{"error": "rate limited"}', Retry_After=query.get("retry_after", "1"))
                return self.send(200, demo_html("A rate-limited page", "This page answered after a 429."), TYPES[".html"])
            if path == "/large":
                kb = int(query.get("kb", "512"))
                para = "<p>Paragraph {}: " + "all work and no play makes a large page. " * 24 + "</p>"
                paras = "".join(para.format(i) for i in range(kb * 1024 // len(para) + 1))  # distinct: extractors drop repeats
                body = demo_html("A large page", "It goes on.").replace("</article>", paras + "<p>THE END OF THE LARGE PAGE.</p></article>")
                return self.send(200, body, TYPES[".html"])
            if path == "/_stats":
                with server._lock:
                    return self.send(200, json.dumps(dict(server.hits)))
            return self.send(404, "no route", "text/plain")

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mockllm.searxng", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8888, help="port (0 picks a free one; the URL is printed)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--pages", type=Path, default=None, help="folder of .html/.txt/.md pages (default: built-in demo pages)")
    args = p.parse_args(argv)
    try:
        server = SearxngServer(args.pages, args.host, args.port)
    except (ValueError, OSError) as e:
        print(f"searxng test server: {e}", file=sys.stderr)
        return 2
    print(f"SearXNG-compatible test server on {server.start()} ({len(server.pages.files)} pages)", flush=True)
    from mockllm.cli import serve_until_stopped

    serve_until_stopped(server.stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
