"""vision_analyze and image_generate against real HTTP servers on loopback: the bundled model server
(chat with image parts, the OpenAI images API), a server of the test's own serving images, and one
answering in FAL's documented format; batch runs through the real CLI (--engine direct)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hermes.data import journal
from hermes.data.dataset import load_rows
from hermes.data.distributions import DISTRIBUTIONS, sample
from hermes.netpolicy import NetPolicy
from hermes.settings import ToolsetSettings
from hermes.tools import ModelEndpoint, ToolContext, availability, run_tool
from mockllm import MockLLM
from tests.helpers import read_jsonl, script, tool_responses, write_dataset

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- helpers

def png(width: int, height: int, noise: bool = False) -> bytes:
    """A real PNG written here (independent of the code under test); noise makes it incompressible."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + (os.urandom(width * 3) if noise else bytes([40, 90, 200]) * width) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def png_size(data: bytes) -> tuple[int, int]:
    """Check a PNG whole (signature, every chunk's CRC, pixel data of the right length); (width, height)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
            assert body[8:10] == b"\x08\x02", "8-bit RGB expected"
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
        if kind == b"IEND":
            break
    assert pos == len(data) and size is not None
    assert len(zlib.decompress(idat)) == size[1] * (1 + 3 * size[0])
    return size


def sha12(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def token(prompt: str) -> str:
    """The mock's conversation token k (mockllm.conversation.conversation_token)."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:8]


def cli(tmp_path: Path, dataset: Path, run_name: str, base_url: str, *extra: str, popen: bool = False):
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", "--batch_size=2",
           f"--run_name={run_name}", f"--base_url={base_url}", "--model=mock-model", "--engine=direct", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAL_KEY": "", "HERMES_IMAGE_BASE_URL": "",
           "HERMES_VISION_BASE_URL": ""}
    if popen:
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def prompts_drawing(tmp_path: Path, distribution: str, needs: set[str], count: int, stem: str,
                    tail: str = "") -> list[str]:
    """`count` prompts (stem + a number + tail) whose seeded draw from `distribution` includes `needs`.

    The draw is keyed by the whole prompt, so the tail (a script naming this run's ports) is part
    of what is searched, not added afterwards."""
    out, i = [], 0
    while len(out) < count:
        candidates = [f"{stem} {n} {tail}".rstrip() for n in range(i, i + 50)]
        rows = load_rows(write_dataset(tmp_path / "probe.jsonl", [{"prompt": p} for p in candidates]))[0]
        out += [r.row.prompt for r in rows if needs <= set(sample(DISTRIBUTIONS[distribution], 0, r.key))]
        i += 50
    return out[:count]


def context(mock: MockLLM, run_dir: Path | None = None, key: str = "k-0", net: NetPolicy | None = None,
            secret=lambda name: None, sandbox=None, **toolsets) -> ToolContext:
    kw = {"sandbox": sandbox} if sandbox is not None else {}
    return ToolContext(settings=ToolsetSettings(**toolsets), endpoint=ModelEndpoint(mock.base_url, "mock-model", "k"),
                       run_dir=run_dir, key=key, net=net or NetPolicy(), secret=secret, **kw)


def call(name: str, args: dict, ctx: ToolContext, call_id: str = "call_1") -> dict:
    return json.loads(run_tool(name, args, ctx, call_id=call_id))


class Files(ThreadingHTTPServer):
    """A loopback server of the test's own: path -> (status, headers, body); logs every GET."""

    daemon_threads = True

    def __init__(self, routes: dict[str, tuple[int, dict, bytes]]):
        self.routes, self.seen, self.posts = routes, [], []
        routes_of = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                routes_of.seen.append(self.path)
                status, headers, body = routes_of.routes.get(self.path, (404, {}, b"no"))
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                routes_of.posts.append((self.path, dict(self.headers), json.loads(body)))
                status, headers, answer = routes_of.routes.get("POST " + self.path, (404, {}, b"{}"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()


# --------------------------------------------------------------------------- batch runs

def test_creative_run_saves_generated_images_and_analyses_them(tmp_path):
    with MockLLM() as mock:
        rows = [{"prompt": f"Paint something for me, please ({i})"} for i in range(8)]
        cli(tmp_path, write_dataset(tmp_path / "d.jsonl", rows), "creative", mock.base_url,
            "--distribution=creative", "--num_workers=3")
    run_dir = tmp_path / "data" / "creative"
    entries = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(entries) == 8
    referenced, generated, analysed = [], 0, 0
    for e in entries:
        assert set(e["toolsets_used"]) <= {"vision", "image_gen"} and e["completed"]
        responses = {r["name"]: r["content"] for r in tool_responses(e)}
        image = None
        if "image_gen" in e["toolsets_used"]:
            made = responses["image_generate"]
            assert made["success"] is True and made["modality"] == "image" and made["error"] is None
            image = made["image"]
            assert re.fullmatch(r"images/[0-9a-f]{32}-\d+-call_[0-9a-f]{8}_0_0\.png", image), image
            data = (run_dir / image).read_bytes()
            assert png_size(data) == (1024, 1024) == (made["width"], made["height"])  # square
            referenced.append(image)
            generated += 1
        if "vision" in e["toolsets_used"]:
            analysis = responses["vision_analyze"]["analysis"]
            if image:  # the vision model saw exactly the saved file's bytes
                assert f"PNG, 1024x1024 pixels, {len(data)} bytes, sha256 {sha12(data)}" in analysis
            else:
                assert "PNG, 32x24 pixels" in analysis
            analysed += 1
        final = e["conversations"][-1]["value"]
        if image:
            assert f"image={image}" in final  # the model quoted the saved image's reference
    assert generated and analysed and generated + analysed > len(entries)  # some prompts did both
    # exactly the referenced images are in the run folder: none twice, none stray, no temp files
    assert sorted(p.name for p in (run_dir / "images").iterdir()) == sorted(Path(i).name for i in referenced)
    files = [f for _, p in journal.batch_files(run_dir) for e in journal.read(p) for f in e["hermes"]["files"]]
    assert sorted(files) == sorted(referenced)

    stats = json.loads((run_dir / "statistics.json").read_text())
    aux = stats["aux_usage"]
    assert aux["image_gen"]["calls"] == aux["image_gen"]["images"] == generated
    assert aux["image_gen"]["total_tokens"] > 0
    assert aux["vision"]["calls"] == analysed and aux["vision"]["prompt_tokens"] > 0
    assert stats["tool_statistics"]["image_generate"]["success"] == generated
    # the agent's own usage is counted apart: its calls are the trajectories' api_calls
    assert stats["api_calls"] == sum(e["api_calls"] for e in entries)
    assert stats["usage"]["total_tokens"] > 0


def test_sigkill_mid_prompt_then_resume_generates_each_image_once(tmp_path):
    rows = [{"prompt": f"Make me a poster ({i})"} for i in range(6)]
    dataset = write_dataset(tmp_path / "d.jsonl", rows)
    run_dir = tmp_path / "data" / "posters"
    images = run_dir / "images"

    def journal_keys() -> set[str]:
        return {e["hermes"]["key"] for _, p in journal.batch_files(run_dir) for e in journal.read(p)}

    def unfinished_image() -> bool:  # an image saved for a prompt that has no journal line yet
        done = journal_keys()
        saved = {re.match(r"(.+?-\d+)-call", p.name)[1] for p in images.glob("*.png")} if images.exists() else set()
        return bool(done) and bool(saved - done)

    with MockLLM(latency=0.3) as mock:
        proc = cli(tmp_path, dataset, "posters", mock.base_url, "--distribution=creative", "--num_workers=1",
                   popen=True)
        deadline = time.monotonic() + 300
        while not unfinished_image():
            assert proc.poll() is None, f"run ended first: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "never saw an image of an unfinished prompt"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = {e["hermes"]["key"]: e for _, p in journal.batch_files(run_dir) for e in journal.read(p)}
        before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in images.glob("*.png")
                  if re.match(r"(.+?-\d+)-call", p.name)[1] in finished}
        asked_before = len(mock.image_requests())
        cli(tmp_path, dataset, "posters", mock.base_url, "--distribution=creative", "--num_workers=1", "--resume")
        asked_after = mock.image_requests()[asked_before:]

    # prompts finished before the kill were not run again: no image asked for them, files untouched
    finished_tokens = {token(e["conversations"][1]["value"]) for e in finished.values()}
    assert before, "some finished prompt had made an image"
    assert not [r for r in asked_after if any(k in r["prompt"] for k in finished_tokens)]
    for name, (mtime, data) in before.items():
        assert (images / name).stat().st_mtime_ns == mtime and (images / name).read_bytes() == data
    entries = read_jsonl(run_dir / "trajectories.jsonl")
    assert sorted(e["conversations"][1]["value"] for e in entries) == sorted(r["prompt"] for r in rows)
    referenced = [r["content"]["image"] for e in entries for r in tool_responses(e) if r["name"] == "image_generate"]
    assert referenced and len(set(referenced)) == len(referenced)
    # the run folder holds each kept image exactly once, whole; nothing of the killed attempt is left over
    assert sorted(p.name for p in images.iterdir()) == sorted(Path(i).name for i in referenced)
    for image in referenced:
        png_size((run_dir / image).read_bytes())


def test_an_earlier_unfinished_attempts_images_are_removed_not_kept_beside_the_new_ones(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    (images / "aaaa-3-call_old.png").write_bytes(png(4, 4))      # an attempt killed after generating
    (images / ".aaaa-3-call_torn.tmp").write_bytes(b"\x89PNG")   # one killed mid-write
    (images / "aaaa-30-call_x.png").write_bytes(png(4, 4))       # another prompt's image
    with MockLLM() as mock:
        ctx = context(mock, run_dir=tmp_path, key="aaaa-3")
        first = call("image_generate", {"prompt": "a red square"}, ctx, "call_new")
        second = call("image_generate", {"prompt": "a blue one", "aspect_ratio": "portrait"}, ctx, "call_newer")
    assert first["image"] == "images/aaaa-3-call_new.png" and second["image"] == "images/aaaa-3-call_newer.png"
    assert sorted(p.name for p in images.iterdir()) == ["aaaa-3-call_new.png", "aaaa-3-call_newer.png",
                                                        "aaaa-30-call_x.png"]
    assert png_size((images / "aaaa-3-call_newer.png").read_bytes()) == (1024, 1536)
    assert ctx.files == ["images/aaaa-3-call_new.png", "images/aaaa-3-call_newer.png"]


# --------------------------------------------------------------------------- vision_analyze

def test_vision_analyze_on_a_file_the_prompt_wrote_in_its_own_container(tmp_path, sandbox_image):
    from hermes.agent.loop import run_agent
    from hermes.model.client import ModelClient
    from hermes.sandbox import open_sandbox
    from hermes.sandbox.base import SandboxSettings, SandboxSpec
    from hermes.settings import AgentSettings
    from hermes.tools import openai_schemas, tools_for

    chart, big = png(8, 6), png(40, 40, noise=True)
    assert len(chart) < 1000 < len(big)
    write = (f"mkdir -p out && echo {base64.b64encode(chart).decode()} | base64 -d > out/chart.png && "
             f"echo {base64.b64encode(big).decode()} | base64 -d > out/big.png && echo 'just text' > out/notes.txt")
    look = [{"name": "vision_analyze", "arguments": {"image_url": p, "question": "What is plotted?"}}
            for p in ("out/chart.png", "out/notes.txt", "out/big.png", "out/missing.png")]
    prompt = "plot and look " + script({"reasoning": "plot", "tool_calls": [{"name": "terminal", "arguments": {"command": write}}]},
                                       {"reasoning": "look", "tool_calls": look}, {"reasoning": "ok", "content": "Seen."})
    with MockLLM() as mock:
        box = open_sandbox(SandboxSpec(image=sandbox_image, labels={"hermes-batch.run": "vision-test", "hermes-batch.prompt": "0"}),
                           SandboxSettings())
        try:
            ctx = context(mock, sandbox=box, vision={"max_image_bytes": 1000})
            client = ModelClient(AgentSettings(base_url=mock.base_url, model="mock-model"), "k")
            run = run_agent(client, prompt, openai_schemas(tools_for(["terminal", "vision"])), ctx, max_turns=4)
            client.close()
        finally:
            box.close()
        sent = [m for body in mock.requests() for m in body["messages"] if isinstance(m.get("content"), list)]
    assert run.completed, run.error
    results = [json.loads(m["content"]) for m in run.messages if m["role"] == "tool"][1:]
    assert results[0] == {"success": True, "analysis": f"The image is a PNG, 8x6 pixels, {len(chart)} bytes, "
                                                       f"sha256 {sha12(chart)}. Asked: What is plotted?"}
    assert results[1]["success"] is False and "not an image" in results[1]["error"] and "out/notes.txt" in results[1]["error"]
    assert results[2]["success"] is False and f"too large ({len(big)} bytes; the limit is 1000 bytes)" in results[2]["error"]
    assert results[3]["success"] is False and "no such file" in results[3]["error"]
    # the bytes reached the vision endpoint: the request log holds the image part, decoded = the file
    [vision_request] = sent
    url = vision_request["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == chart
    assert ctx.aux_usage["vision"]["calls"] == 1


def test_vision_analyze_on_allowlisted_urls_and_data_urls_through_the_cli(tmp_path):
    chart, big = png(12, 10), png(300, 300, noise=True)
    routes = {"/chart.png": (200, {"Content-Type": "image/png"}, chart),
              "/moved": (302, {"Location": "/chart.png"}, b""),
              "/notes.txt": (200, {"Content-Type": "image/png"}, b"a text file, whatever its type says"),
              "/big.png": (200, {"Content-Type": "image/png"}, big)}
    with Files(routes) as files, MockLLM() as mock:
        inline = "data:image/png;base64," + base64.b64encode(png(3, 2)).decode()
        urls = [f"{files.url}/chart.png", f"{files.url}/moved", inline, f"{files.url}/notes.txt", f"{files.url}/big.png",
                "data:image/png;base64,@@@"]
        calls = [{"name": "vision_analyze", "arguments": {"image_url": u, "question": "Describe it."}} for u in urls]
        [prompt] = prompts_drawing(tmp_path, "creative", {"vision"}, 1, "look at these",
                                   script({"reasoning": "look", "tool_calls": calls}, {"reasoning": "ok", "content": "Seen."}))
        cli(tmp_path, write_dataset(tmp_path / "d.jsonl", [{"prompt": prompt}]), "urls", mock.base_url,
            "--distribution=creative", "--web_allow_hosts=127.0.0.1", "--vision_max_image_bytes=100000")
        seen = list(files.seen)
        refused = call("vision_analyze", {"image_url": f"{files.url}/chart.png", "question": "?"}, context(mock))
    [entry] = read_jsonl(tmp_path / "data" / "urls" / "trajectories.jsonl")
    chart_res, moved, data_url, notes, too_big, broken = [r["content"] for r in tool_responses(entry)]
    assert chart_res["success"] and f"PNG, 12x10 pixels, {len(chart)} bytes, sha256 {sha12(chart)}" in chart_res["analysis"]
    assert moved["success"] and f"sha256 {sha12(chart)}" in moved["analysis"]  # the redirect was followed (and checked)
    assert data_url.get("success") and "PNG, 3x2 pixels" in data_url["analysis"], data_url
    assert notes == {"success": False, "analysis": None, "error": notes["error"]} and "not an image" in notes["error"]
    assert too_big["success"] is False and "too large" in too_big["error"] and "100000" in too_big["error"]
    assert broken["success"] is False and "does not decode" in broken["error"]
    assert seen.count("/chart.png") == 2 and "/moved" in seen  # fetched by us, not by the vision endpoint
    # without the allowlist, loopback is refused before any request
    assert refused["success"] is False and "loopback" in refused["error"] and "--web_allow_hosts" in refused["error"]
    assert files.seen == seen


# --------------------------------------------------------------------------- image_generate backends

def test_openai_images_api_b64_and_url_answers_and_an_edit_of_the_generated_image(tmp_path):
    with MockLLM() as mock:
        b64 = call("image_generate", {"prompt": "a lighthouse", "aspect_ratio": "landscape"},
                   context(mock, run_dir=tmp_path, key="p-0"), "c1")
        ctx = context(mock, run_dir=tmp_path, key="p-1", image_gen={"response_format": "url", "model": "dall-e-3"})
        url = call("image_generate", {"prompt": "a harbour", "aspect_ratio": "portrait"}, ctx, "c2")
        edit = call("image_generate", {"prompt": "add a boat", "image_url": url["image"],
                                       "reference_image_urls": [url["image"]]}, ctx, "c3")
        foreign = call("image_generate", {"prompt": "edit", "image_url": b64["image"]}, ctx, "c4")  # p-0's, not p-1's
        refused = call("image_generate", {"prompt": "nope MOCK_IMAGE_ERROR: 400"}, ctx, "c5")
        asked = mock.image_requests()
    assert png_size((tmp_path / b64["image"]).read_bytes()) == (1536, 1024)
    assert png_size((tmp_path / url["image"]).read_bytes()) == (1024, 1536) and url["success"]
    assert edit["success"] and png_size((tmp_path / edit["image"]).read_bytes()) == (1536, 1024)
    sizes = [(r["endpoint"], r["size"], r["response_format"], r["model"]) for r in asked]
    assert sizes[:3] == [("generations", "1536x1024", None, "gpt-image-1"), ("generations", "1024x1536", "url", "dall-e-3"),
                         ("edits", "1536x1024", "url", "dall-e-3")]
    saved = (tmp_path / url["image"]).read_bytes()
    assert [i["sha256"] for i in asked[2]["images"]] == [hashlib.sha256(saved).hexdigest()] * 2  # the file itself
    # another prompt's image is not this prompt's to read: it is looked for in the (absent) sandbox
    assert foreign["success"] is False and foreign["error_type"] == "invalid_image"
    assert refused == {"success": False, "image": None, "modality": "text", "error": refused["error"],
                       "error_type": "backend_error"} and "HTTP 400" in refused["error"]
    assert {k: ctx.aux_usage["image_gen"][k] for k in ("calls", "images", "failed")} == {"calls": 3, "images": 2, "failed": 1}
    assert sorted(p.name for p in (tmp_path / "images").iterdir()) == ["p-0-c1.png", "p-1-c2.png", "p-1-c3.png"]


def test_fal_backend_request_and_answer_in_fals_documented_format(tmp_path):
    out = png(64, 36)
    answer = lambda url: json.dumps({"images": [{"url": url, "width": 64, "height": 36, "content_type": "image/png"}],
                                     "timings": {"inference": 0.05}, "seed": 1234, "has_nsfw_concepts": [False],
                                     "prompt": "a fox"}).encode()
    routes = {"/files/out.png": (200, {"Content-Type": "image/png"}, out)}
    with Files(routes) as fal, MockLLM() as mock:
        routes["POST /fal-ai/flux/schnell"] = (200, {}, answer(f"{fal.url}/files/out.png"))
        routes["POST /fal-ai/flux/dev/image-to-image"] = (200, {}, answer("data:image/png;base64," + base64.b64encode(out).decode()))
        routes["POST /fal-ai/bad"] = (401, {}, b'{"detail": "Invalid API key"}')
        secret = {"FAL_KEY": "fal-test-key"}.get
        ctx = context(mock, run_dir=tmp_path, key="f-0", secret=secret, image_gen={"fal_base_url": fal.url})
        made = call("image_generate", {"prompt": "a fox", "aspect_ratio": "portrait"}, ctx, "c1")
        edited = call("image_generate", {"prompt": "a fox at night", "image_url": made["image"]}, ctx, "c2")
        bad = call("image_generate", {"prompt": "x"}, context(mock, run_dir=tmp_path, key="f-1", secret=secret,
                                                              image_gen={"fal_base_url": fal.url, "model": "fal-ai/bad"}))
        posts = list(fal.posts)
    assert made["success"] and made["seed"] == 1234 and (tmp_path / made["image"]).read_bytes() == out
    assert edited["success"] and (tmp_path / edited["image"]).read_bytes() == out
    (path1, headers1, body1), (path2, _, body2), _ = posts
    assert path1 == "/fal-ai/flux/schnell" and headers1["Authorization"] == "Key fal-test-key"
    assert body1 == {"prompt": "a fox", "image_size": "portrait_16_9", "num_images": 1}
    assert path2 == "/fal-ai/flux/dev/image-to-image" and body2["image_size"] == "landscape_16_9"
    assert base64.b64decode(body2["image_url"].split(",", 1)[1]) == out  # the image to edit, inline
    assert bad["success"] is False and bad["error_type"] == "auth_error" and "401" in bad["error"]
    # auto picks FAL only with FAL_KEY; asking for FAL without a key leaves the toolset out, saying why
    assert "FAL_KEY" in availability(ToolsetSettings(image_gen={"backend": "fal"}), lambda name: None)["image_gen"]
    assert availability(ToolsetSettings(), lambda name: None)["image_gen"] is None


@pytest.mark.parametrize("distribution", ["image_gen"])
def test_image_gen_distribution_runs_end_to_end(tmp_path, sandbox_image, distribution):
    with MockLLM() as mock:
        rows = [{"prompt": f"Design a logo ({i})"} for i in range(4)]
        cli(tmp_path, write_dataset(tmp_path / "d.jsonl", rows), "logos", mock.base_url,
            f"--distribution={distribution}", "--num_workers=2")
    run_dir = tmp_path / "data" / "logos"
    entries = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(entries) == 4 and all(e["completed"] for e in entries)
    made = [r["content"]["image"] for e in entries for r in tool_responses(e) if r["name"] == "image_generate"]
    assert made and all(png_size((run_dir / m).read_bytes()) for m in made)


# --------------------------------------------------------------------------- whose key goes where

def test_the_runs_key_never_goes_to_a_separately_configured_vision_or_image_endpoint():
    """Over the real wire (a recording hop in front of each endpoint): a vision or image endpoint
    of its own gets its own key, or none, never the agent's; the run's own endpoint gets the run's."""
    from tests.helpers import HeaderRecorder

    image = "data:image/png;base64," + base64.b64encode(png(3, 2)).decode()
    with MockLLM() as mock, HeaderRecorder(mock.url) as own, HeaderRecorder(mock.url) as vision, \
            HeaderRecorder(mock.url) as images:
        def ctx(secrets: dict, **toolsets) -> ToolContext:
            return ToolContext(settings=ToolsetSettings(**toolsets),
                               endpoint=ModelEndpoint(own.base_url, "mock-model", "sk-run-secret"),
                               key="k-0", net=NetPolicy(), secret=secrets.get)

        look = {"image_url": image, "question": "What is it?"}
        assert call("vision_analyze", look, ctx({}))["success"]  # no endpoint of its own: the run's
        assert call("vision_analyze", look, ctx({}, vision={"base_url": vision.base_url, "model": "v"}))["success"]
        assert call("vision_analyze", look, ctx({"HERMES_VISION_API_KEY": "sk-vision"},
                                                vision={"base_url": vision.base_url, "model": "v"}))["success"]
        draw = {"prompt": "a lighthouse", "aspect_ratio": "square"}
        assert call("image_generate", draw, ctx({}, image_gen={"base_url": images.base_url}))["success"]
        assert call("image_generate", draw, ctx({"HERMES_IMAGE_API_KEY": "sk-images"},
                                                image_gen={"base_url": images.base_url}))["success"]
    assert own.authorizations == ["Bearer sk-run-secret"]
    assert vision.authorizations == ["Bearer not-needed", "Bearer sk-vision"]
    assert images.authorizations == ["Bearer not-needed", "Bearer sk-images"]
