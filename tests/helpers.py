"""Small helpers the end-to-end tests share: scripted prompts, dataset files, reading output."""
from __future__ import annotations

import json
import re
import secrets
import socket
import sys
import threading
import time
import traceback
from pathlib import Path


def unique_run(name: str) -> str:
    """A run name no other test uses: containers carry it as their label (hermes-batch.run), and tests
    that count a run's containers must not count those of a test running next to them (pytest-xdist
    workers, another checkout's suite on the same engine)."""
    return f"{name}-{secrets.token_hex(3)}"


def unique_sleep(seconds: int) -> str:
    """`sleep N.xxxxxx`: a command line no other test's process has, for tests that look for it in
    the host's `ps` (another pytest-xdist worker may be running its own `sleep 100` meanwhile)."""
    return f"sleep {seconds}.{secrets.randbelow(10**6):06d}"


def script(*turns: dict) -> str:
    """A prompt line that makes the bundled model server answer exactly these turns (mockllm)."""
    return "MOCK_SCRIPT: " + json.dumps({"turns": list(turns)})


def write_dataset(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tool_responses(entry: dict) -> list[dict]:
    """Every <tool_response> block of a trajectory entry, parsed, in order."""
    out = []
    for turn in entry["conversations"]:
        if turn["from"] == "tool":
            out += [json.loads(b) for b in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn["value"], re.S)]
    return out


def until(predicate, what: str, timeout: float = 120.0, every: float = 0.2, stacks: bool = False):
    """Poll until predicate() is truthy (a bound against hanging, not a timing assertion).
    stacks: on giving up, the message carries every thread's stack (what the hang waits on)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}" + (thread_stacks() if stacks else ""))
        time.sleep(every)


def until_named(what: str, check, timeout: float = 120.0):
    """until(), the thing waited for named first (the sandbox tests read better so)."""
    return until(check, what, timeout)


def thread_stacks() -> str:
    """Every thread of this process, with the stack it is in now."""
    frames = sys._current_frames()
    return "".join(f"\n--- thread {t.name} ---\n" + "".join(traceback.format_stack(frames[t.ident]))
                   for t in threading.enumerate() if t.ident in frames)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackListener:
    """A TCP listener of the test's own on this host's loopback, counting the connections it accepts.

    The target for "a sandbox cannot reach the host": traffic to it never leaves the machine, and
    `accepted` says whether anything got through (a refused dial alone could be a closed port).
    """

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[tuple[str, int]] = []
        self._stop = False
        import threading

        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        while not self._stop:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                continue
            self.accepted.append(peer)
            conn.close()

    def __enter__(self) -> "LoopbackListener":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(5)
        self.sock.close()


def closed_loopback_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    return free_port()


def unpullable_image(name: str = "never") -> str:
    """An image reference whose registry is a closed port on this host's loopback: a pull is
    refused at once, and no request goes to a public registry (docker.io would be asked for a
    bare name that is not present)."""
    return f"127.0.0.1:{closed_loopback_port()}/hermes-test/{name}:1"


def within(seconds: float, fn, *args, **kw):
    """fn(*args, **kw) on a thread; fail if it has not returned after `seconds` (a hang, not a speed check)."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"{getattr(fn, '__name__', fn)} did not return within {seconds}s: it hangs")
    if "error" in box:
        raise box["error"]
    return box["value"]


def interfaces(proc_net_dev: str) -> list[str]:
    """Interface names from the text of /proc/net/dev."""
    return sorted(line.split(":", 1)[0].strip() for line in proc_net_dev.splitlines()[2:] if ":" in line)


def routes(proc_net_route: str) -> list[str]:
    """The routing table's entries from the text of /proc/net/route (its header dropped)."""
    return [line for line in proc_net_route.splitlines()[1:] if line.strip()]


class HeaderRecorder:
    """A loopback HTTP hop in front of a model server that notes each request's Authorization
    header, then forwards the request unchanged and hands back the server's answer unchanged.

    The bundled model server records bodies, not headers; this is how a test sees which API key
    reached "the model" over the real wire.
    """

    def __init__(self, target_url: str):
        import http.server
        import threading

        import httpx

        recorder = self
        self.target = target_url.rstrip("/")
        self.authorizations: list[str | None] = []

        class Hop(http.server.BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.authorizations.append(self.headers.get("Authorization"))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request(self.command, recorder.target + self.path, content=body, headers=headers,
                                       timeout=120)
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = _forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hop)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> "HeaderRecorder":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


#: the browser toolset's tools (every entry's tool_stats lists them, zeros included)
BROWSER_TOOLS = ("browser_navigate", "browser_snapshot", "browser_click", "browser_type", "browser_scroll",
                 "browser_back", "browser_press", "browser_get_images", "browser_vision", "browser_console")


def own_host() -> str:
    """A host name of a test's own. Every run's start removes the sandboxes of dead owners on its
    host, whatever their run: a test that leaves some on purpose runs its processes under a host
    name no other test's processes have (a UTS namespace: hostname only, same pids and engine), so
    that what it left is its own to find, and only its own runs sweep it."""
    return f"hermes-test-{secrets.token_hex(4)}"


def on_host(host: str | None, cmd: list[str]) -> list[str]:
    """`cmd` run under host name `host` (own_host), or as it is when None."""
    return cmd if host is None else ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *cmd]
