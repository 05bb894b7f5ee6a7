"""The browser toolset against a real Chromium and real pages served on loopback.

One browser serves the in-process tests of this module (a SharedResources the module keeps);
the batch runs start their own, as a user's run would. Pages live on 127.0.0.1 (allowlisted);
a trap listener on 127.0.0.2 (loopback, not allowlisted) counts every connection that reaches it,
so a refusal is proven to happen before any connection. Only loopback addresses are ever put to
this browser; private, link-local, CGNAT and metadata addresses and CIDR allowlist entries are
tested in test_browser_address_rules.py, with a browser whose every request goes to a trap proxy.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from hermes.data import journal
from hermes.netpolicy import NetPolicy
from hermes.tools import SharedResources, ToolContext, run_tool, toolset_settings_model
from hermes.tools.browser.launch import BASE, processes_using
from hermes.tools.browser.settings import BrowserSettings, available
from hermes.tools.vision import VisionSettings
from tests.helpers import read_jsonl, tool_responses, until, write_dataset

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(available(BrowserSettings(), lambda _: None) is not None and not os.environ.get("CI"),
                                reason=f"browser toolset unavailable: {available(BrowserSettings(), lambda _: None)}")


class Trap:
    """A listener on 127.0.0.2 that counts the connections it accepts (and answers nothing useful)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.2", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 21\r\nConnection: close\r\n\r\n"
                         b"<h1>trap reached</h1>")
            conn.close()


#: the name the site's download asks to be saved as: found nowhere on the host afterwards
DOWNLOAD = f"hermes-download-{uuid.uuid4().hex[:10]}.exe"


def page(title: str, body: str) -> bytes:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>".encode()


class Site(BaseHTTPRequestHandler):
    """The guestbook: /form sets a visitor cookie and local storage, /sign shows them, /second is a second page."""

    server: "SiteServer"

    def log_message(self, *a):
        pass

    def _send(self, body: bytes, status: int = 200, headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _cookie(self) -> str | None:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == "visitor":
                return value
        return None

    def do_GET(self):
        path = self.path.split("?")[0]
        self.server.log.append((path, self._cookie()))
        trap = f"http://127.0.0.2:{self.server.trap.port}"
        if path == "/form":
            if self.server.meet is not None:  # both prompts' first visits meet here: they browse at once
                try:
                    self.server.meet.wait()
                except threading.BrokenBarrierError:
                    self.server.met = False
            cookie = self._cookie()
            headers = {}
            if cookie:
                seen = f"returning visitor {cookie}"
            else:
                cookie = uuid.uuid4().hex[:12]
                headers["Set-Cookie"] = f"visitor={cookie}; Path=/"
                seen = "new visitor"
            self._send(page("Guestbook", f"<h1>Guestbook</h1><p>{seen}</p><p id=ls>storage unread</p>"
                                         "<form action=/sign method=post><label>Name <input name=name></label>"
                                         "<button type=submit>Sign</button></form>"
                                         "<script>const v = localStorage.getItem('visitor');"
                                         "document.getElementById('ls').textContent = v ? 'storage saw ' + v : 'storage empty';"
                                         f"if (!v) localStorage.setItem('visitor', 'ls-{cookie}');</script>"), headers=headers)
        elif path == "/get":
            self._send(page("Files", f"<h1>Files</h1><a href=/file download>Get the file</a>"))
        elif path == "/file":
            body = b"MZ downloaded payload"
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Disposition", f"attachment; filename={DOWNLOAD}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif path == "/second":
            self._send(page("Second", "<h1>Second page reached</h1>"))
        elif path == "/hang":
            self._send(page("Hang", "<p>looping</p><script>while (true) {}</script>"))
        elif path == "/stall":
            time.sleep(60)
        elif path == "/sub":
            self._send(page("Sub", f"<h1>Subrequests</h1><img src='{trap}/img' alt=trapped>"
                                   f"<iframe src='{trap}/frame'></iframe>"
                                   f"<script>fetch('{trap}/xhr').catch(() => console.log('xhr refused'))</script>"
                                   "<a href=/redirect>Onward</a>"))
        elif path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"{trap}/redirected")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(page("Missing", "<p>no such page</p>"), 404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        name = parse_qs(self.rfile.read(length).decode()).get("name", [""])[0]
        self.server.log.append((self.path, self._cookie()))
        self._send(page("Signed", f"<h1>Thanks, {name}!</h1><p>cookie={self._cookie()}</p><p id=ls></p>"
                                  "<script>document.getElementById('ls').textContent = 'storage=' + localStorage.getItem('visitor');</script>"
                                  "<a href=/second>Second page</a>"))


class SiteServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, trap: Trap):
        super().__init__(("127.0.0.1", 0), Site)
        self.trap = trap
        self.log: list[tuple[str, str | None]] = []
        self.meet: threading.Barrier | None = None
        self.met = True

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def trap():
    t = Trap()
    yield t
    t.sock.close()


@pytest.fixture(scope="module")
def site(trap):
    server = SiteServer(trap)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@pytest.fixture(scope="module")
def shared():
    resources = SharedResources()  # one browser for the module's in-process prompts
    yield resources
    resources.close()


@pytest.fixture
def prompt(shared):
    """Make prompt contexts (closed at test end) on the module's browser."""
    made = []

    def make(allow=("127.0.0.1",), **settings) -> ToolContext:
        ctx = ToolContext(settings=toolset_settings_model()(browser=BrowserSettings(**settings)),
                          net=NetPolicy.from_hosts(list(allow)), shared=shared)
        made.append(ctx)
        return ctx
    yield make
    for ctx in made:
        ctx.close()


def png_facts(data: bytes) -> str:
    """What the mock's vision model says of a PNG: format, size, bytes, digest (mockllm/vision.py)."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), data[:16]
    width, height = struct.unpack(">II", data[16:24])
    return f"The image is a PNG, {width}x{height} pixels, {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]}."


def call(ctx: ToolContext, name: str, **args) -> dict:
    return json.loads(run_tool(name, args, ctx))


def run_batch(tmp_path: Path, rows: list[dict], run_name: str, base_url: str, *extra: str, wait: bool = True):
    dataset = write_dataset(tmp_path / f"{run_name}.jsonl", rows)
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=2",
           f"--run_name={run_name}", f"--base_url={base_url}", "--model=mock-model", "--num_workers=2",
           "--engine=direct", "--distribution=browser_only", "--web_allow_hosts=127.0.0.1", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("BROWSER_CDP_URL", None)
    if not wait:
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)


# --------------------------------------------------------------------------- batch runs

def test_browser_only_run_submits_a_form_reaches_a_second_page_and_keeps_prompts_apart(tmp_path, mock_llm, site):
    site.meet = threading.Barrier(2, timeout=60)
    try:
        rows = [{"prompt": f"Sign the guestbook at {site.base}/form as visitor {i}."} for i in range(2)]
        done = run_batch(tmp_path, rows, "browse", mock_llm.base_url)
    finally:
        site.meet = None
    assert done.returncode == 0, done.stderr[-3000:]
    assert site.met, "the two prompts did not browse at the same time"
    entries = read_jsonl(tmp_path / "data" / "browse" / "trajectories.jsonl")
    assert len(entries) == 2
    cookies, screenshots = set(), set()
    for entry in entries:
        assert entry["toolsets_used"] == ["browser"] and entry["completed"], entry["hermes"]
        calls = [r["name"] for r in tool_responses(entry)]
        assert calls == ["browser_navigate", "browser_type", "browser_click", "browser_snapshot", "browser_click",
                         "browser_snapshot", "browser_vision"]
        nav, typed, submit, signed, follow, second, seen = (r["content"] for r in tool_responses(entry))
        # first visit: a new visitor, nothing in local storage -- nothing leaked from the other prompt
        assert "new visitor" in nav["snapshot"] and "storage empty" in nav["snapshot"], nav["snapshot"]
        assert typed["success"] and typed["typed"].startswith("hermes-")
        # the form was submitted: the page changed, showing what was typed and this prompt's own cookie
        assert submit["url"].endswith("/sign")
        assert f"Thanks, {typed['typed']}!" in signed["snapshot"]
        cookie = signed["snapshot"].split("cookie=")[1].split()[0].strip('"')
        assert cookie != "None" and f"storage=ls-{cookie}" in signed["snapshot"]
        cookies.add(cookie)
        # a second page reached through a link the snapshot named
        assert follow["success"] and follow["url"].endswith("/second")
        assert "Second page reached" in second["snapshot"]
        assert entry["tool_stats"]["browser_click"] == {"count": 2, "success": 2, "failure": 0}
        # browser_vision: the run's own (mock) model, as the vision toolset defaults to, saw the screenshot
        assert seen["success"], seen
        shot = tmp_path / "data" / "browse" / seen["screenshot_path"]
        assert png_facts(shot.read_bytes()) in seen["analysis"] and "What does the page look like?" in seen["analysis"]
        screenshots.add(seen["screenshot_path"])
    assert len(cookies) == 2  # each prompt had its own cookie jar
    run_dir = tmp_path / "data" / "browse"
    records = [e["hermes"] for _, path in journal.batch_files(run_dir) for e in journal.read(path)]
    assert len(screenshots) == 2 and sorted(f for h in records for f in h["files"]) == sorted(screenshots)
    for h in records:  # named by prompt key and call id; the vision call counted apart from the agent's
        assert re.fullmatch(rf"images/{h['key']}-call_\w+\.png", h["files"][0]), h["files"]
        assert h["aux_usage"]["vision"]["calls"] == 1 and h["aux_usage"]["vision"]["prompt_tokens"] > 0
    assert not [p for p in (BASE.iterdir() if BASE.is_dir() else []) if p.name.startswith(f"{os.getpid()}-")]


def test_a_run_killed_mid_browse_leaves_no_browser_after_the_next_run_starts(tmp_path, mock_llm, site):
    proc = run_batch(tmp_path, [{"prompt": f"Look at {site.base}/hang please."}], "killed", mock_llm.base_url,
                     "--browser_timeout=300", wait=False)
    try:
        profile = until(lambda: next((p for p in (BASE.iterdir() if BASE.is_dir() else [])
                                      if p.is_dir() and p.name.startswith(f"{proc.pid}-")), None),
                        "the run's browser profile", timeout=180)
        until(lambda: ("/hang", None) in site.log, "the run's browser to open the hanging page", timeout=120)
        assert processes_using(profile), "the run's browser is not running"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    done = run_batch(tmp_path, [{"prompt": f"Open {site.base}/second now."}], "next", mock_llm.base_url)
    assert done.returncode == 0, done.stderr[-3000:]
    (entry,) = read_jsonl(tmp_path / "data" / "next" / "trajectories.jsonl")
    assert "Second page reached" in tool_responses(entry)[0]["content"]["snapshot"]
    assert processes_using(profile) == [] and not profile.exists()


# --------------------------------------------------------------------------- in process

def test_browser_vision_uses_the_vision_settings_and_annotate_draws_the_refs(prompt, site, shared, tmp_path):
    from mockllm import MockLLM

    unset = prompt()  # no vision model anywhere: a clear error, not a crash
    call(unset, "browser_navigate", url=site.base + "/form")
    result = call(unset, "browser_vision", question="What is on the page?")
    assert result["success"] is False and "no vision model is configured" in result["error"], result
    with MockLLM() as mock:
        # the run's own endpoint is unset: only the vision toolset's settings name the model
        ctx = ToolContext(settings=toolset_settings_model()(vision=VisionSettings(base_url=mock.base_url, model="eyes")),
                          net=NetPolicy.from_hosts(["127.0.0.1"]), shared=shared, run_dir=tmp_path, key="k1")
        try:
            assert call(ctx, "browser_navigate", url=site.base + "/form")["success"]
            shots = []
            for n, annotate in enumerate([False, True, False], 1):
                result = json.loads(run_tool("browser_vision", {"question": "Where is the Sign button?",
                                                                "annotate": annotate}, ctx, call_id=f"c{n}"))
                assert result["success"], result
                assert result["screenshot_path"] == f"images/k1-c{n}.png"
                data = (tmp_path / result["screenshot_path"]).read_bytes()
                assert png_facts(data) in result["analysis"] and "Where is the Sign button?" in result["analysis"]
                shots.append(data)
            asked = [body for body in mock.requests() if body.get("model") == "eyes"]
        finally:
            ctx.close()
    plain, annotated, plain_again = shots
    assert plain == plain_again  # the page renders the same each time, and the labels were taken off again
    assert annotated != plain    # ... so the difference is the refs drawn on it
    assert ctx.files == ["images/k1-c1.png", "images/k1-c2.png", "images/k1-c3.png"]
    assert ctx.aux_usage["vision"]["calls"] == 3 and len(asked) == 3
    texts = [body["messages"][0]["content"][0]["text"] for body in asked]
    assert ["labelled with their refs" in t for t in texts] == [False, True, False]


def test_a_page_that_hangs_or_loops_is_cut_off_and_the_prompt_browses_on(prompt, site):
    ctx = prompt(timeout=4)
    for path in ("/hang", "/stall"):
        result = call(ctx, "browser_navigate", url=site.base + path)
        assert result["success"] is False and "did not finish within 4 s" in result["error"], result
        after = call(ctx, "browser_navigate", url=site.base + "/second")
        assert after["success"] and "Second page reached" in after["snapshot"]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "chrome://settings", "about:blank", "data:text/html,<h1>x</h1>",
                                 "javascript:alert(1)", "view-source:http://127.0.0.1/", "ftp://127.0.0.1/x"])
def test_refused_schemes(prompt, url):
    ctx = prompt()
    result = call(ctx, "browser_navigate", url=url)
    assert result["success"] is False and "only http and https" in result["error"], result
    assert "browser" not in ctx.prompt_state  # refused before the browser was even asked


# Loopback only: were the rule broken, this browser would connect (its policy proxy dials the address
# itself). Addresses off the machine: test_browser_address_rules.py, whose browser only reaches a trap.
@pytest.mark.parametrize("url, kind", [
    ("http://[::1]/", "loopback"), ("http://localhost/", "loopback"), ("http://127.0.0.3/", "loopback"),
    ("http://0.0.0.0/", "private")])
def test_refused_addresses_never_reach_the_browser(prompt, url, kind):
    ctx = prompt(allow=())
    result = call(ctx, "browser_navigate", url=url)
    assert result["success"] is False and f"is a {kind} address" in result["error"], result
    assert "browser" not in ctx.prompt_state


def test_every_request_of_a_page_is_checked_before_it_connects(prompt, site, trap):
    ctx = prompt()
    before = trap.connections
    result = call(ctx, "browser_navigate", url=f"http://127.0.0.2:{trap.port}/direct")
    assert result["success"] is False and "127.0.0.2 is a loopback address" in result["error"]
    page = call(ctx, "browser_navigate", url=site.base + "/sub")  # allowed page, refused image, frame, fetch
    assert page["success"] and "Subrequests" in page["snapshot"]
    refused = [url for url, _ in ctx.prompt_state["browser"].refused]
    assert {f"http://127.0.0.2:{trap.port}/img", f"http://127.0.0.2:{trap.port}/xhr"} <= set(refused), refused
    redirect = call(ctx, "browser_navigate", url=site.base + "/redirect")  # an allowed URL redirecting to a refused one
    assert redirect["success"] is False and "127.0.0.2 is a loopback address" in redirect["error"], redirect
    assert trap.connections == before
    # the control: allowlisted, the same trap is reached -- it would have counted a leak
    open_ctx = prompt(allow=("127.0.0.1", "127.0.0.2"))
    assert call(open_ctx, "browser_navigate", url=f"http://127.0.0.2:{trap.port}/direct")["success"]
    assert trap.connections > before


def test_refs_console_images_scroll_back_press_and_a_cut_snapshot(prompt, site):
    ctx = prompt(snapshot_chars=500)
    nav = call(ctx, "browser_navigate", url=site.base + "/form")
    assert nav["success"] and "[ref=@e" in nav["snapshot"]
    assert "unknown ref" in call(ctx, "browser_click", ref="@e999")["error"]
    assert call(ctx, "browser_console", expression="document.title")["result"] == "Guestbook"
    assert call(ctx, "browser_get_images")["count"] == 0
    assert call(ctx, "browser_scroll", direction="down")["success"]
    textbox = next(line for line in nav["snapshot"].splitlines() if "textbox" in line).split("[ref=")[1].rstrip("]: ")
    assert call(ctx, "browser_type", ref=textbox, text="pressed")["success"]
    assert call(ctx, "browser_press", key="Enter")["url"].endswith("/sign")  # Enter submits the form
    assert call(ctx, "browser_back")["url"].endswith("/form")
    call(ctx, "browser_navigate", url=site.base + "/sub")
    messages = call(ctx, "browser_console", clear=True)["console_messages"]
    assert any("xhr refused" in m["text"] for m in messages)
    assert call(ctx, "browser_console")["console_messages"] == []
    long_ctx = prompt(snapshot_chars=500)
    call(long_ctx, "browser_navigate", url=site.base + "/form")
    big = call(long_ctx, "browser_console", expression="document.body.innerHTML += '<p>word</p>'.repeat(400); 1")
    assert big["result"] == 1
    cut = call(long_ctx, "browser_snapshot", full=True)
    assert cut["truncated"] and "[snapshot cut:" in cut["snapshot"] and len(cut["snapshot"]) < 800


def test_a_dead_browser_fails_only_its_prompt_and_is_replaced(prompt, site, shared):
    held = prompt()
    assert call(held, "browser_navigate", url=site.base + "/second")["success"]
    service = shared.peek("browser")
    old_pid = service.local.proc.pid
    os.kill(old_pid, signal.SIGKILL)
    until(lambda: not service.alive(held.prompt_state["browser"].generation), "the browser's death to be seen", 60)
    lost = call(held, "browser_snapshot")
    assert lost["success"] is False and "stopped" in lost["error"]
    fresh = prompt()
    assert call(fresh, "browser_navigate", url=site.base + "/second")["success"]
    assert service.local.proc.pid != old_pid
    assert call(held, "browser_snapshot")["success"] is False  # the lost session stays lost


def test_live_contexts_are_capped_per_process(site):
    shared = SharedResources()
    settings = toolset_settings_model()(browser=BrowserSettings(max_contexts=1, context_wait=1))
    first, second = (ToolContext(settings=settings, net=NetPolicy.from_hosts(["127.0.0.1"]), shared=shared)
                     for _ in range(2))
    try:
        assert call(first, "browser_navigate", url=site.base + "/second")["success"]
        waited = call(second, "browser_navigate", url=site.base + "/second")
        assert waited["success"] is False and "no browser context free" in waited["error"]
        first.close()  # the prompt ends: its context closes and the slot is free
        assert call(second, "browser_navigate", url=site.base + "/second")["success"]
    finally:
        second.close()
        shared.close()


def test_chromium_runs_as_browser_user_and_a_download_lands_nowhere(site, tmp_path):
    import pwd

    shared = SharedResources()  # a browser of its own: the module's was launched with the default user
    ctx = ToolContext(settings=toolset_settings_model()(browser=BrowserSettings(user="nobody")),
                      net=NetPolicy.from_hosts(["127.0.0.1"]), shared=shared)
    try:
        nav = call(ctx, "browser_navigate", url=site.base + "/get")
        assert nav["success"], nav
        chromium = shared.peek("browser").local.proc.pid
        nobody = pwd.getpwnam("nobody").pw_uid
        uids = {int(u) for u in Path(f"/proc/{chromium}/status").read_text().split("Uid:")[1].split("\n")[0].split()}
        assert uids == {nobody}, uids  # real, effective, saved and filesystem uid: nobody, never root
        link = next(line for line in nav["snapshot"].splitlines() if "Get the file" in line).split("[ref=")[1].rstrip("]: ")
        clicked = call(ctx, "browser_click", ref=link)
        assert "error" not in clicked or "download" in str(clicked).lower(), clicked
        profile = shared.peek("browser").local.profile
    finally:
        ctx.close()
        shared.close()
    # whatever the site asked, nothing was saved: not in the browser's profile, homes or temporary folders.
    # Two things see to it (the context's accept_downloads=False, and a browser user who cannot
    # write where Playwright would put a download): this sees the outcome, not which of them held.
    places = [profile, Path("/tmp"), Path("/var/tmp"), Path("/root"), Path(pwd.getpwnam("nobody").pw_dir),
              Path(pwd.getpwnam("hermes-browser").pw_dir) if _has_user("hermes-browser") else Path("/nonexistent")]
    # os.walk, not rglob: other tests' sandbox folders come and go in /tmp meanwhile (rglob raises then)
    found = [os.path.join(d, f) for place in places if place.exists() for d, _, files in os.walk(place)
             for f in files if f == DOWNLOAD]
    assert found == []


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
