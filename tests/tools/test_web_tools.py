"""The web toolset against real HTTP servers on loopback: the SearXNG-compatible test server with its
pages (mockllm.searxng), local servers answering in each hosted provider's documented format, the
SSRF rules, and batch runs with --distribution minimal against the bundled model server.

No traffic leaves loopback: where a private address must be refused, the fetch runs over a
network layer that records every connection and refuses all but loopback, and the test asserts
the refusal came before any connection was attempted.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpcore
import pytest

from hermes.netpolicy import NetPolicy, UrlRefused
from hermes.settings import ToolsetSettings
from hermes.tools import ToolContext, run_tool
from hermes.tools.web.http import GuardedFetcher
from hermes.tools.web.settings import WebSettings, chosen_extract, chosen_search, unavailable_reason
from mockllm.searxng import SearxngServer, demo_html
from tests.helpers import free_port, read_jsonl, script, tool_responses, write_dataset

ROOT = Path(__file__).resolve().parents[2]
UA = "hermes-batch-test"
ARTICLE = "Axolotls can regrow limbs, parts of the heart and even of the brain."


@pytest.fixture
def pages(tmp_path: Path) -> Path:
    folder = tmp_path / "pages"
    folder.mkdir()
    (folder / "axolotl.html").write_text(demo_html("The axolotl", ARTICLE), encoding="utf-8")
    (folder / "notes.txt").write_text("Field notes\n\nAxolotls live in lake Xochimilco.\n", encoding="utf-8")
    return folder


@pytest.fixture
def searx(pages: Path):
    with SearxngServer(pages) as server:
        yield server


def web_ctx(tmp_path: Path | None = None, allow=("127.0.0.1",), secrets: dict | None = None, **web) -> ToolContext:
    settings = ToolsetSettings(web=WebSettings(**{"user_agent": UA, "searxng_url": None, **web}))
    return ToolContext(settings=settings, secret=(secrets or {}).get, net=NetPolicy.from_hosts(list(allow)), run_dir=tmp_path)


def call(ctx: ToolContext, name: str, **args) -> dict:
    return json.loads(run_tool(name, args, ctx))


class Recorder(httpcore.NetworkBackend):
    """A network layer that logs every connection and makes only loopback ones."""

    def __init__(self):
        self.connects: list[str] = []
        self.real = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.connects.append(host)
        if host not in ("127.0.0.1", "::1"):
            raise AssertionError(f"the test network refuses {host}: the policy should have refused it first")
        return self.real.connect_tcp(host, port, timeout=timeout, local_address=local_address, socket_options=socket_options)

    def sleep(self, seconds):
        self.real.sleep(seconds)


# --------------------------------------------------------------------------- built-in extract


def test_search_and_extract_through_searxng_and_the_builtin_fetch(tmp_path, searx):
    ctx = web_ctx(tmp_path, searxng_url=searx.base_url)
    found = call(ctx, "web_search", query="axolotl regrow", limit=5)
    assert found["success"] is True
    first = found["data"]["web"][0]
    assert first == {"title": "The axolotl", "url": f"{searx.base_url}/pages/axolotl.html",
                     "description": first["description"], "position": 1}
    assert "regrow limbs" in first["description"]
    assert [h["position"] for h in found["data"]["web"]] == list(range(1, len(found["data"]["web"]) + 1))
    assert len(call(ctx, "web_search", query="axolotl", limit=1)["data"]["web"]) == 1

    # a search result object is accepted as a URL, as the reference accepts it
    got = call(ctx, "web_extract", urls=[first, f"{searx.base_url}/pages/notes.txt"])
    page, notes = got["results"]
    assert "error" not in got and page["error"] is None and notes["error"] is None
    assert page["title"] == "The axolotl" and ARTICLE in page["content"]
    for boilerplate in ("cookies", "Log in", "Copyright", "Privacy"):  # navigation, banner, footer are gone
        assert boilerplate not in page["content"]
    assert "lake Xochimilco" in notes["content"] and notes["title"] == "Field notes"


def test_the_fetch_says_who_it_is(tmp_path):
    seen = {}

    class Echo(BaseHTTPRequestHandler):
        def do_GET(self):
            seen["ua"] = self.headers.get("User-Agent")
            body = b"<html><head><title>UA</title></head><body><p>hello there, this is a page</p></body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    with _serve(Echo) as port:
        got = call(web_ctx(tmp_path, extract_backend="builtin", user_agent=WebSettings().user_agent), "web_extract",
                   urls=[f"http://127.0.0.1:{port}/"])
    assert got["results"][0]["error"] is None
    assert seen["ua"].startswith("hermes-batch/") and "web_extract" in seen["ua"]


def test_large_pages_are_cut_head_and_tail_and_bytes_are_capped(tmp_path, searx):
    ctx = web_ctx(tmp_path, searxng_url=searx.base_url)
    (page,) = call(ctx, "web_extract", urls=[f"{searx.base_url}/large?kb=256"], char_limit=3000)["results"]
    content = page["content"]
    assert page["error"] is None and content.startswith("# A large page")
    assert "THE END OF THE LARGE PAGE." in content  # the tail is kept
    assert "[Content truncated:" in content and "characters omitted" in content
    assert len(content) < 3400

    capped = web_ctx(tmp_path / "capped", searxng_url=searx.base_url, max_bytes=40_000)
    (page,) = call(capped, "web_extract", urls=[f"{searx.base_url}/large?kb=256"], char_limit=200_000)["results"]
    assert "cut at 40000 bytes" in page["content"] and "THE END OF THE LARGE PAGE." not in page["content"]
    assert len(page["content"]) < 45_000


def test_rate_limited_pages_are_retried_and_slow_pages_time_out(tmp_path, searx):
    ctx = web_ctx(tmp_path, searxng_url=searx.base_url, timeout=2)
    (page,) = call(ctx, "web_extract", urls=[f"{searx.base_url}/flaky/a?fail=1"])["results"]
    assert page["error"] is None and "answered after a 429" in page["content"]
    assert searx.hits["/flaky/a"] == 2  # one 429, honoured Retry-After, one 200

    stubborn = call(web_ctx(tmp_path, searxng_url=searx.base_url, retries=1), "web_extract",
                    urls=[f"{searx.base_url}/flaky/b?fail=5"])
    assert "HTTP 429" in stubborn["error"] and searx.hits["/flaky/b"] == 2

    slow = call(ctx, "web_extract", urls=[f"{searx.base_url}/slow?seconds=4", f"{searx.base_url}/pages/axolotl.html"])
    assert "within 2s" in slow["results"][0]["error"]
    assert slow["results"][1]["error"] is None and "error" not in slow  # one bad page does not fail the call


def test_a_resumed_run_reads_extracted_pages_from_the_run_folder(tmp_path, searx):
    url = f"{searx.base_url}/pages/axolotl.html"
    first = call(web_ctx(tmp_path, searxng_url=searx.base_url), "web_extract", urls=[url])
    assert searx.hits["/pages/axolotl.html"] == 1 and list((tmp_path / "web_cache").glob("*.json"))
    # a new context on the same run folder (a resumed run, another process) does not fetch again
    again = call(web_ctx(tmp_path, searxng_url=searx.base_url), "web_extract", urls=[url], char_limit=500)
    assert searx.hits["/pages/axolotl.html"] == 1
    assert again["results"][0]["content"] == first["results"][0]["content"]
    # failures are not cached
    call(web_ctx(tmp_path, searxng_url=searx.base_url), "web_extract", urls=[f"{searx.base_url}/pages/none.html"])
    call(web_ctx(tmp_path, searxng_url=searx.base_url), "web_extract", urls=[f"{searx.base_url}/pages/none.html"])
    assert searx.hits["/pages/none.html"] == 2


# --------------------------------------------------------------------------- SSRF rules


def test_loopback_and_localhost_are_refused_without_the_allowlist(tmp_path, searx):
    ctx = web_ctx(tmp_path, allow=(), extract_backend="builtin")
    port = searx.base_url.rsplit(":", 1)[1]
    for url, says in [(f"{searx.base_url}/pages/axolotl.html", "127.0.0.1 is a loopback address"),
                      (f"http://localhost:{port}/pages/axolotl.html", "localhost resolves to 127.0.0.1 is a loopback"),
                      (f"http://[::1]:{port}/pages/axolotl.html", "::1 is a loopback address")]:
        got = call(ctx, "web_extract", urls=[url])
        assert says in got["results"][0]["error"] and "--web_allow_hosts" in got["error"], got
    assert searx.hits["/pages/axolotl.html"] == 0


@pytest.mark.parametrize("url, says", [
    ("http://10.1.2.3/", "10.1.2.3 is a private address"),
    ("http://192.168.0.9:8080/admin", "is a private address"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata"),
    ("file:///etc/passwd", "only http and https"),
    ("http://127.0.0.1:9/page?api_key=abcdef123456", "looks like a secret (query parameter 'api_key')"),
    ("http://user:pw@127.0.0.1:9/", "carries credentials"),
])
def test_forbidden_urls_are_refused_before_any_connection(url, says):
    recorder = Recorder()
    fetcher = GuardedFetcher(NetPolicy.from_hosts(["127.0.0.1"]), user_agent=UA, network=recorder)
    with pytest.raises(UrlRefused, match=re.escape(says)):
        fetcher.fetch(url)
    assert recorder.connects == []


def test_a_name_resolving_to_a_private_address_is_refused_and_connections_are_pinned(searx):
    recorder = Recorder()
    answers = {"intranet.test": ["10.20.30.40"], "mixed.test": ["127.0.0.1", "10.0.0.7"], "pages.test": ["127.0.0.1"]}
    lookups = []

    def resolver(host, port):
        lookups.append(host)
        return answers[host]

    fetcher = GuardedFetcher(NetPolicy.from_hosts(["127.0.0.1"]), user_agent=UA, resolver=resolver, network=recorder)
    with pytest.raises(UrlRefused, match="intranet.test resolves to 10.20.30.40 is a private address"):
        fetcher.fetch("http://intranet.test/")
    with pytest.raises(UrlRefused, match="mixed.test resolves to 10.0.0.7"):  # one bad address taints the name
        fetcher.fetch("http://mixed.test/")
    assert recorder.connects == []
    # an allowed name: resolved once, and the connection goes to the address that was checked
    port = searx.base_url.rsplit(":", 1)[1]
    got = fetcher.fetch(f"http://pages.test:{port}/pages/axolotl.html")
    assert got.status == 200 and b"regrow limbs" in got.body
    assert recorder.connects == ["127.0.0.1"] and lookups.count("pages.test") == 1


def test_redirects_are_checked_hop_by_hop(tmp_path, searx):
    recorder = Recorder()
    fetcher = GuardedFetcher(NetPolicy.from_hosts(["127.0.0.1"]), user_agent=UA, network=recorder, max_redirects=2)
    with pytest.raises(UrlRefused, match="10.9.8.7 is a private address"):
        fetcher.fetch(f"{searx.base_url}/redirect?to=http://10.9.8.7/secret")
    with pytest.raises(UrlRefused, match="only http and https"):
        fetcher.fetch(f"{searx.base_url}/redirect?to=file:///etc/passwd")
    with pytest.raises(UrlRefused, match="secret"):
        fetcher.fetch(f"{searx.base_url}/redirect?to=http://127.0.0.1:9/x%3Ftoken%3Dabcdef")
    assert set(recorder.connects) == {"127.0.0.1"}  # only the test server was ever connected to
    assert searx.hits["/redirect"] == 3
    # a redirect within the allowlist is followed; too many are not
    assert b"regrow" in fetcher.fetch(f"{searx.base_url}/redirect?to=/pages/axolotl.html").body
    chain = "/redirect?to=/redirect%3Fto%3D/redirect%253Fto%253D/pages/axolotl.html"
    got = call(web_ctx(tmp_path, extract_backend="builtin", max_redirects=2), "web_extract", urls=[searx.base_url + chain])
    assert "more than 2 redirects" in got["error"]


# --------------------------------------------------------------------------- hosted backends


class Provider:
    """A local server standing in for a hosted API: records requests, answers from `routes`."""

    def __init__(self, routes: dict):
        self.routes, self.requests = routes, []
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path, _, query = self.path.partition("?")
                req = {"method": self.command, "path": path, "query": query, "headers": dict(self.headers),
                       "json": json.loads(raw) if raw else None}
                provider.requests.append(req)
                status, body, *headers = provider.routes[(self.command, path)](req)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers[0] if headers else {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class _serve:
    def __init__(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self.httpd.server_address[1]

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def provider():
    made = []

    def make(routes):
        made.append(Provider(routes))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_brave_search_request_and_response(tmp_path, provider):
    api = provider({("GET", "/res/v1/web/search"): lambda r: (200, {
        "type": "search", "query": {"original": "axolotl"},
        "web": {"type": "search", "results": [
            {"title": "Axolotl - Wikipedia", "url": "https://en.wikipedia.org/wiki/Axolotl",
             "description": "The <strong>axolotl</strong> is a salamander.", "age": "2 days ago", "language": "en"},
            {"title": "Care sheet", "url": "https://axolotl.example/care", "description": "Keep them cool."}]}})})
    ctx = web_ctx(tmp_path, secrets={"BRAVE_API_KEY": "brave-key"}, brave_base_url=f"{api.url}/res/v1")
    got = call(ctx, "web_search", query="axolotl", limit=30)
    (req,) = api.requests
    assert req["headers"]["X-Subscription-Token"] == "brave-key" and req["headers"]["Accept"] == "application/json"
    assert "q=axolotl" in req["query"] and "count=20" in req["query"]  # Brave's count stops at 20
    assert got == {"success": True, "data": {"web": [
        {"title": "Axolotl - Wikipedia", "url": "https://en.wikipedia.org/wiki/Axolotl",
         "description": "The <strong>axolotl</strong> is a salamander.", "position": 1},
        {"title": "Care sheet", "url": "https://axolotl.example/care", "description": "Keep them cool.", "position": 2}]}}


def test_tavily_search_and_extract(tmp_path, provider):
    api = provider({
        ("POST", "/search"): lambda r: (200, {"query": r["json"]["query"], "answer": None, "images": [],
                                             "results": [{"title": "Axolotl facts", "url": "https://a.example/facts",
                                                          "content": "Axolotls are neotenic.", "score": 0.98,
                                                          "raw_content": None}], "response_time": 1.1}),
        ("POST", "/extract"): lambda r: (200, {"results": [{"url": "https://a.example/facts",
                                                            "raw_content": "# Axolotl facts\n\nThey regrow limbs.",
                                                            "images": []}],
                                              "failed_results": [{"url": "https://a.example/gone", "error": "404 Not Found"}],
                                              "response_time": 0.4})})
    ctx = web_ctx(tmp_path, secrets={"TAVILY_API_KEY": "tvly-key"}, tavily_base_url=api.url)
    found = call(ctx, "web_search", query="axolotl", limit=3)
    assert found["data"]["web"] == [{"title": "Axolotl facts", "url": "https://a.example/facts",
                                     "description": "Axolotls are neotenic.", "position": 1}]
    got = call(ctx, "web_extract", urls=["https://a.example/facts", "https://a.example/gone"])
    search_req, extract_req = api.requests
    assert search_req["headers"]["Authorization"] == "Bearer tvly-key"
    assert search_req["json"]["query"] == "axolotl" and search_req["json"]["max_results"] == 3
    assert extract_req["json"]["urls"] == ["https://a.example/facts", "https://a.example/gone"]
    ok, gone = got["results"]
    assert ok == {"url": "https://a.example/facts", "title": "Axolotl facts",
                  "content": "# Axolotl facts\n\nThey regrow limbs.", "error": None}
    assert "404 Not Found" in gone["error"] and "error" not in got


def test_exa_search_and_contents(tmp_path, provider):
    api = provider({
        ("POST", "/search"): lambda r: (200, {"requestId": "r1", "resolvedSearchType": "neural", "results": [
            {"id": "https://b.example/x", "url": "https://b.example/x", "title": "Exa hit", "score": 0.4,
             "publishedDate": "2025-01-01", "author": None, "highlights": ["Axolotls live in Mexico."]}]}),
        ("POST", "/contents"): lambda r: (200, {"requestId": "r2", "results": [
            {"id": "https://b.example/x", "url": "https://b.example/x", "title": "Exa hit", "text": "Full text here."}],
            "statuses": [{"id": "https://b.example/x", "status": "success"},
                         {"id": "https://b.example/y", "status": "error",
                          "error": {"tag": "CRAWL_NOT_FOUND", "httpStatusCode": 404}}]})})
    ctx = web_ctx(tmp_path, secrets={"EXA_API_KEY": "exa-key"}, exa_base_url=api.url)
    found = call(ctx, "web_search", query="axolotl habitat", limit=2)
    assert found["data"]["web"] == [{"title": "Exa hit", "url": "https://b.example/x",
                                     "description": "Axolotls live in Mexico.", "position": 1}]
    got = call(ctx, "web_extract", urls=["https://b.example/x", "https://b.example/y"])
    search_req, contents_req = api.requests
    assert search_req["headers"]["x-api-key"] == "exa-key" and search_req["json"]["numResults"] == 2
    assert contents_req["json"] == {"urls": ["https://b.example/x", "https://b.example/y"], "text": True}
    assert got["results"][0] == {"url": "https://b.example/x", "title": "Exa hit", "content": "Full text here.", "error": None}
    assert "CRAWL_NOT_FOUND (HTTP 404)" in got["results"][1]["error"]


def test_firecrawl_scrape_with_a_rate_limit_and_refusals_before_the_provider(tmp_path, provider):
    calls = {"n": 0}

    def scrape(req):
        calls["n"] += 1
        if calls["n"] == 1:
            return 429, {"success": False, "error": "Rate limit exceeded"}, {"Retry-After": "1"}
        return 200, {"success": True, "data": {"markdown": "# Scraped\n\nBody text.", "metadata": {
            "title": "Scraped page", "sourceURL": req["json"]["url"], "statusCode": 200}}}

    api = provider({("POST", "/v1/scrape"): scrape})
    ctx = web_ctx(tmp_path, secrets={"FIRECRAWL_API_KEY": "fc-key"}, firecrawl_base_url=api.url)
    got = call(ctx, "web_extract", urls=["https://c.example/page", "https://c.example/p?api_key=sekrit123"])
    limited, retried = api.requests  # the 429 and its retry; the secret-carrying URL never reached the provider
    for req in (limited, retried):
        assert req["headers"]["Authorization"] == "Bearer fc-key"
        assert req["json"] == {"url": "https://c.example/page", "formats": ["markdown"], "onlyMainContent": True}
    assert got["results"][0] == {"url": "https://c.example/page", "title": "Scraped page",
                                 "content": "# Scraped\n\nBody text.", "error": None}
    assert "secret" in got["results"][1]["error"]


def test_a_dead_backend_fails_the_call_not_the_caller(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    got = call(web_ctx(tmp_path, searxng_url=dead), "web_search", query="anything")
    assert got["success"] is False and "SearXNG is unreachable" in got["error"]
    got = call(web_ctx(tmp_path, secrets={"TAVILY_API_KEY": "k"}, tavily_base_url=dead), "web_extract", urls=["https://x.example/"])
    assert "Tavily is unreachable" in got["error"] and "Tavily is unreachable" in got["results"][0]["error"]


# --------------------------------------------------------------------------- backend choice


def test_backends_follow_what_is_configured():
    none = {}.get
    only_searx = WebSettings(searxng_url="http://127.0.0.1:8888")
    assert chosen_search(only_searx, none)[0] == "searxng" and chosen_extract(only_searx, none)[0] == "builtin"
    bare = WebSettings(searxng_url=None)
    assert "no search backend configured" in unavailable_reason(bare, none)
    assert unavailable_reason(WebSettings(searxng_url=None, extract_backend="builtin"), none) is None
    tavily = {"TAVILY_API_KEY": "k"}.get
    assert (chosen_search(bare, tavily)[0], chosen_extract(bare, tavily)[0]) == ("tavily", "tavily")
    both = {"BRAVE_API_KEY": "b", "FIRECRAWL_API_KEY": "f"}.get
    assert (chosen_search(bare, both)[0], chosen_extract(bare, both)[0]) == ("brave", "firecrawl")
    assert chosen_search(WebSettings(search_backend="exa"), none) == (None, "search backend exa needs EXA_API_KEY")
    # keys are never settings: nothing of the settings model holds one
    assert not [f for f in WebSettings.model_fields if "key" in f or "token" in f]


def test_list_distributions_says_whether_web_is_available():
    env = {k: v for k, v in os.environ.items() if k not in ("SEARXNG_URL", "BRAVE_API_KEY", "TAVILY_API_KEY",
                                                           "EXA_API_KEY", "FIRECRAWL_API_KEY")}
    env["PYTHONPATH"] = str(ROOT)

    def listing(extra):
        return subprocess.run([sys.executable, "-m", "flows.cli", "list-distributions"], capture_output=True, text=True,
                              cwd=ROOT, env={**env, **extra}, timeout=120).stdout

    assert "not available: web: no search backend configured" in listing({})
    here = listing({"SEARXNG_URL": "http://127.0.0.1:8888"})
    assert "available here: web" in here and "not available: web" not in here


# --------------------------------------------------------------------------- batch runs


def run_batch(tmp_path: Path, rows: list[dict], run_name: str, llm: str, searx: str, *extra: str):
    dataset = write_dataset(tmp_path / f"{run_name}-{len(rows)}.jsonl", rows)
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=2",
           f"--run_name={run_name}", f"--base_url={llm}", "--model=mock-model", "--num_workers=3",
           "--distribution=minimal", "--engine=direct", f"--web_searxng_url={searx}", "--web_allow_hosts", "127.0.0.1",
           "--web_timeout=2", *extra]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "SEARXNG_URL"}
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONPATH": str(ROOT), "HERMES_API_KEY": "x"})


def test_a_minimal_batch_run_searches_extracts_and_resumes_from_its_cache(tmp_path, mock_llm, searx):
    base = searx.base_url
    port = base.rsplit(":", 1)[1]
    odd_pages = [f"{base}/large?kb=128", f"{base}/slow?seconds=4", f"{base}/redirect?to=http://[::1]:{port}/pages/never.html",
                 # a short Retry-After: the wait and the retry fit in the 2 s limit however slow the first 429 is
                 f"{base}/flaky/batch?fail=1&retry_after=0.2"]
    rows = [{"prompt": "What can axolotls regrow?"}, {"prompt": "Where do axolotls live? Read the field notes."},
            {"prompt": "odd pages " + script(
                {"reasoning": "Read these.", "tool_calls": [{"name": "web_extract",
                                                             "arguments": {"urls": odd_pages, "char_limit": 2000}}]},
                {"reasoning": "Done.", "content": "Read them."})}]
    done = run_batch(tmp_path, rows, "web-min", mock_llm.base_url, base)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "data" / "web-min"
    entries = {e["conversations"][1]["value"][:9]: e for e in read_jsonl(out / "trajectories.jsonl")}
    assert len(entries) == 3

    for key in ("What can ", "Where do "):
        entry = entries[key]
        assert entry["completed"] and entry["toolsets_used"] == ["web"]
        search, extract = tool_responses(entry)
        assert search["name"] == "web_search" and search["content"]["success"] is True
        urls = [h["url"] for h in search["content"]["data"]["web"]]
        assert f"{base}/pages/axolotl.html" in urls
        assert extract["name"] == "web_extract"
        texts = {r["url"]: r["content"] for r in extract["content"]["results"]}
        assert ARTICLE in texts[f"{base}/pages/axolotl.html"] and "cookies" not in texts[f"{base}/pages/axolotl.html"]
        assert entry["tool_stats"]["web_search"] == {"count": 1, "success": 1, "failure": 0}
        assert entry["tool_stats"]["web_extract"] == {"count": 1, "success": 1, "failure": 0}

    (odd,) = tool_responses(entries["odd pages"])
    large, slow, redirect, flaky = odd["content"]["results"]
    assert "[Content truncated:" in large["content"] and "THE END OF THE LARGE PAGE." in large["content"]
    assert "within 2s" in slow["error"]
    assert "::1 is a loopback address" in redirect["error"] and searx.hits["/pages/never.html"] == 0
    assert flaky["error"] is None and searx.hits["/flaky/batch"] == 2

    stats = json.loads((out / "statistics.json").read_text())["tool_statistics"]
    assert stats["web_search"]["count"] == 2 and stats["web_extract"]["count"] == 3
    assert stats["web_extract"]["success"] == 3

    # resume with a new prompt that reads the same page: served from the run's cache, not fetched again
    fetched = searx.hits["/pages/axolotl.html"]
    assert fetched >= 1
    rows.append({"prompt": "Tell me about axolotl limbs"})
    done = run_batch(tmp_path, rows, "web-min", mock_llm.base_url, base, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    entries = read_jsonl(out / "trajectories.jsonl")
    assert len(entries) == 4
    (new,) = [e for e in entries if "axolotl limbs" in e["conversations"][1]["value"]]
    assert ARTICLE in json.dumps(tool_responses(new)[1]["content"])
    assert searx.hits["/pages/axolotl.html"] == fetched
    assert json.loads((out / "statistics.json").read_text())["tool_statistics"]["web_search"]["count"] == 3


@pytest.mark.prefect
def test_a_minimal_run_on_the_prefect_engine_carries_the_web_settings(tmp_path, mock_llm, searx):
    """The web settings travel as Prefect flow parameters (the form's tools.web section) and still pick SearXNG."""
    rows = [{"prompt": "What can axolotls regrow?"}, {"prompt": "Where do axolotls live?"}]
    done = run_batch(tmp_path, rows, "web-prefect", mock_llm.base_url, searx.base_url, "--engine=prefect")
    assert done.returncode == 0, done.stderr[-3000:]
    for entry in read_jsonl(tmp_path / "data" / "web-prefect" / "trajectories.jsonl"):
        search, extract = tool_responses(entry)
        assert search["content"]["data"]["web"][0]["url"].startswith(searx.base_url)
        assert any(ARTICLE in r["content"] for r in extract["content"]["results"])


# --------------------------------------------------------------------------- the command line's web flags

TIDES = ("<html><head><title>Tides</title></head><body><nav>Home | Log in</nav><article><h1>Tides</h1>"
         "<h2>Why the sea rises</h2><p>The moon pulls the oceans, and the <a href='https://example.org/sun'>sun</a> "
         "adds its own smaller pull twice a day.</p><ul><li>spring tides are the largest of the month</li>"
         "<li>neap tides are the smallest of the month</li></ul><p>Sailors have read the tide tables for "
         "centuries, long before anyone could explain them well.</p></article></body></html>")


def flags_ctx(tmp_path: Path, *flags: str) -> ToolContext:
    """The tools' context as `batch_runner.py` with these flags would make it."""
    from flows.run_command import run_parser, settings_from_args

    args = run_parser("batch_runner.py").parse_args(
        ["--dataset_file=d.jsonl", "--batch_size=1", "--run_name=flags", "--web_allow_hosts=127.0.0.1", *flags])
    settings = settings_from_args(args)
    return ToolContext(settings=settings.tools, secret={}.get,
                       net=NetPolicy.from_hosts(["127.0.0.1"]), run_dir=tmp_path)


@pytest.fixture
def tides(tmp_path: Path):
    folder = tmp_path / "tide-pages"
    folder.mkdir()
    (folder / "tides.html").write_text(TIDES, encoding="utf-8")
    with SearxngServer(folder) as server:
        yield server


def test_web_output_format_and_backend_flags_reach_the_tools(tmp_path, tides):
    searx, url = tides, f"{tides.base_url}/pages/tides.html"
    backends = (f"--web_searxng_url={searx.base_url}", "--web_search_backend=searxng", "--web_extract_backend=builtin")
    (md,) = call(flags_ctx(tmp_path / "md", *backends), "web_extract", urls=[url])["results"]
    (text,) = call(flags_ctx(tmp_path / "text", *backends, "--web_output_format", "text"), "web_extract",
                   urls=[url])["results"]
    assert md["error"] is None and text["error"] is None
    assert "# Tides" in md["content"] and "## Why the sea rises" in md["content"]  # the default: markdown
    assert "[sun](https://example.org/sun)" in md["content"]
    assert "Why the sea rises" in text["content"] and "sun adds its own smaller pull" in text["content"]
    assert "#" not in text["content"] and "](" not in text["content"]  # text: no markup, no link targets
    assert call(flags_ctx(tmp_path, *backends), "web_search", query="tides")["success"] is True

    keys = {"BRAVE_API_KEY": "b", "TAVILY_API_KEY": "t", "EXA_API_KEY": "e", "FIRECRAWL_API_KEY": "f"}.get
    for choice in ("searxng", "brave", "tavily", "exa"):  # each choice the flag offers is the one used
        s = flags_ctx(tmp_path, f"--web_search_backend={choice}", f"--web_searxng_url={searx.base_url}").settings.web
        assert chosen_search(s, keys)[0] == choice
    for choice in ("builtin", "firecrawl", "tavily", "exa"):
        assert chosen_extract(flags_ctx(tmp_path, f"--web_extract_backend={choice}").settings.web, keys)[0] == choice
    # a value no field takes is refused before anything runs, naming the flag as typed
    dataset = write_dataset(tmp_path / "d.jsonl", [{"prompt": "x"}])
    refused = subprocess.run([sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=1",
                              "--run_name=bad-flags", "--engine=direct", "--web_search_backend=google",
                              "--sandbox_memory=lots"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "--web_search_backend: Input should be 'auto', 'searxng'" in refused.stderr
    assert "--sandbox_memory: String should match" in refused.stderr
    assert not (tmp_path / "data" / "bad-flags").exists()
