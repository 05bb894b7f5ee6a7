"""`hermes-batch view` in real Chromium: the summary, filters that narrow the list, an entry's page.

A real run (the direct engine, the local sandbox backend, the bundled model server on loopback
scripting tool calls, an image the image tool made, checks that pass and fail, a row whose setup
fails), the real command serving it on loopback, and Chromium driven by Playwright.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hermes.run import direct
from hermes.sandbox.base import SandboxSettings
from hermes.settings import RunSettings
from tests.helpers import script, until, write_dataset

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
DONE = {"reasoning": "Report.", "content": "Done."}


def call(name: str, arguments: dict) -> dict:
    return {"reasoning": f"Now {name}.", "tool_calls": [{"name": name, "arguments": arguments}]}


ROWS = [
    {"prompt": "Paint a lighthouse. " + script(call("image_generate", {"prompt": "a lighthouse"}), DONE), "case": "image"},
    {"prompt": "Echo the word. " + script(call("terminal", {"command": "echo viewer-marker"}), DONE),
     "case": "passes", "check": "true"},
    {"prompt": "Echo another word. " + script(call("terminal", {"command": "echo other"}), DONE),
     "case": "fails-check", "check": "false"},
    {"prompt": "Broken from the start. <b>not bold</b>", "case": "broken", "setup": "echo the-setup-broke; exit 3"},
    {"prompt": "Say hello. " + script({"reasoning": "Easy.", "content": "Hello."}), "case": "plain"},
]


def make_run(tmp: Path, rows: list[dict], resume: bool = False) -> dict:
    from mockllm import MockLLM

    with MockLLM() as server:
        return direct.run(RunSettings(
            dataset_file=str(write_dataset(tmp / "rows.jsonl", rows)), run_name="seen", output_dir=str(tmp / "data"),
            base_url=server.base_url, model="mock-model", batch_size=2, num_workers=2, distribution="default",
            sandbox=SandboxSettings(backend="local"), resume=resume, max_attempts=1 if resume else None))


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("view")
    make_run(tmp, ROWS)
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", "seen", "--output_dir", str(tmp / "data"),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
        yield line.split(" at ")[1].split()[0].rstrip("/"), tmp
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: bash deployments/bootstrap.sh installs Debian's chromium")
    with sync_playwright() as p:
        # as root Chromium refuses its own sandbox; the page is this test's own loopback server
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox"] if os.geteuid() == 0 else [])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context()
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield pg
    context.close()
    assert errors == []  # no script error, nothing the page's CSP refused


def shown(pg) -> None:
    """Wait until the page shows what its address asks (its script marks the body when it has)."""
    pg.wait_for_selector(f'body[data-shown="{pg.url}"]', state="attached")  # (wait_for_function: the CSP bars eval)


def rows_shown(pg) -> list[str]:
    shown(pg)
    return [r.inner_text() for r in pg.query_selector_all("[data-testid=entry-row]")]


def filter_by(pg, **choices: str) -> list[str]:
    form = pg.locator("[data-testid=filters]")
    for name, value in choices.items():
        field = form.locator(f"[name={name}]")
        field.fill(value) if name == "q" else field.select_option(value)
    before = pg.url
    form.locator("button[type=submit]").click()
    pg.wait_for_url(lambda url: url != before)
    return rows_shown(pg)


def test_the_summary_shows_the_run_and_only_the_tools_it_used(viewer, page):
    url, _ = viewer
    page.goto(url + "/")
    rows_shown(page)
    assert page.inner_text("[data-testid=done]").startswith("4 / 5")
    assert page.inner_text("[data-testid=failed]").startswith("1")
    assert page.inner_text("[data-testid=pass-rate]").startswith("50%")
    tools = page.inner_text("[data-testid=tools-chart]")
    assert "terminal" in tools and "image_generate" in tools and "vision_analyze" not in tools  # offered, never called
    assert "row setup failed" in page.inner_text("[data-testid=reasons-chart]")


def test_filters_narrow_the_list(viewer, page):
    url, tmp = viewer
    page.goto(url + "/")
    assert len(rows_shown(page)) == 5
    failed = filter_by(page, status="failed")
    assert len(failed) == 1 and "Broken from the start" in failed[0] and "row setup failed" in failed[0]
    assert "<b>not bold</b>" in failed[0]  # model-side text is shown as text, never as markup
    assert page.query_selector("td.prompt b") is None
    page.goto(url + "/")
    passed = filter_by(page, reward="passed")
    assert len(passed) == 1 and "Echo the word." in passed[0]
    page.goto(url + "/")
    painted = filter_by(page, tool="image_generate")
    assert len(painted) == 1 and "Paint a lighthouse." in painted[0]
    page.goto(url + "/")
    lines = [json.loads(line) for p in sorted((tmp / "data" / "seen").glob("batch_*.jsonl")) for line in p.read_text().splitlines()]
    offered = [e["metadata"]["case"] for e in lines if "terminal" in e["toolsets_used"]]
    assert 0 < len(filter_by(page, toolset="terminal")) == len(offered)
    page.goto(url + "/?reward=failed")
    assert len(rows_shown(page)) == 1 and "Echo another word." in rows_shown(page)[0]
    page.goto(url + "/")
    found = filter_by(page, q="HELLO")
    assert len(found) == 1 and "Say hello." in found[0]
    page.goto(url + "/")
    assert filter_by(page, reason="row setup failed", status="completed") == []  # filters combine


def test_an_entry_page_shows_its_tool_calls_and_the_image(viewer, page):
    url, tmp = viewer
    page.goto(url + "/?tool=image_generate")
    rows_shown(page)
    page.click("[data-testid=entry-row] a")
    page.wait_for_url(lambda u: "/entry/" in u)
    shown(page)
    assert "/entry/0" in page.url  # the shareable link of this entry
    assert page.inner_text("[data-testid=tool-call]").startswith("→ image_generate")
    assert "a lighthouse" in page.inner_text("[data-testid=tool-call]")
    result = page.inner_text("[data-testid=tool-result]")
    assert result.startswith("← image_generate") and '"success": true' in result
    img = page.locator("[data-testid=tool-result] img[data-testid=image]")
    img.wait_for()
    src = img.get_attribute("src")
    lines = [json.loads(line) for p in sorted((tmp / "data" / "seen").glob("batch_*.jsonl")) for line in p.read_text().splitlines()]
    saved = next(e for e in lines if e["metadata"]["case"] == "image")["hermes"]["files"]
    assert len(saved) == 1 and src == f"/files/{saved[0]}"
    until(lambda: img.evaluate("i => i.complete && i.naturalWidth > 0"), "the image to load", timeout=30)  # it loaded
    reasoning = page.locator("[data-testid=reasoning]").first
    assert reasoning.get_attribute("open") is None and not reasoning.locator("pre").is_visible()  # folded
    reasoning.locator("summary").click()
    assert reasoning.locator("pre").inner_text() == "Now image_generate."
    assert "mock-model" in page.inner_text("[data-testid=metadata]")


def test_a_shared_link_opens_the_entry_with_its_reward(viewer, page):
    url, _ = viewer
    page.goto(url + "/entry/2")
    shown(page)
    reward = page.inner_text("[data-testid=reward]")
    assert "failed" in reward and '"exit_code": 1' in reward
    assert page.inner_text("[data-testid=tool-call]").startswith("→ terminal")
    assert "other" in page.inner_text("[data-testid=tool-result]")
    page.goto(url + "/entry/3")
    shown(page)
    assert "the-setup-broke" in page.inner_text("[data-testid=entry-error]")


def status_of(url: str) -> int:
    try:
        return urllib.request.urlopen(url, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_run_folder_serves_only_its_images(viewer):
    url, tmp = viewer
    image = next((tmp / "data" / "seen" / "images").iterdir()).name
    assert status_of(f"{url}/files/images/{image}") == 200
    for path in ("/files/batch_0.jsonl", "/files/run.json", "/files/../../etc/passwd", "/files/%2e%2e/%2e%2e/etc/hostname",
                 "/api/entry/99"):
        assert status_of(url + path) == 404, path


def test_a_run_in_progress_shows_new_entries_on_reload(viewer, page):
    url, tmp = viewer
    page.goto(url + "/")
    assert len(rows_shown(page)) == 5
    more = ROWS + [{"prompt": f"Late prompt {i}. " + script(DONE), "case": f"late-{i}"} for i in range(3)]
    # the same run folder gets more journal lines while the viewer serves it (in a thread of its own:
    # Playwright's sync API holds this one's event loop)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(make_run, tmp, more, True).result()
    page.reload()
    shown = rows_shown(page)
    assert len(shown) == 8 and sum("Late prompt" in r for r in shown) == 3
    assert page.inner_text("[data-testid=done]").startswith("7 / 8")


def test_with_two_runs_an_entry_of_the_second_shows_its_own_images(viewer, page, tmp_path):
    # `view first second`: the second run's entry page (?run=second) loads its images from its own
    # folder, not from the first run's (the same run here, its image files removed)
    url, tmp = viewer
    data = tmp_path / "data"
    shutil.copytree(tmp / "data" / "seen", data / "second")
    shutil.copytree(tmp / "data" / "seen", data / "first")
    for name in ("index.duckdb", "view.duckdb"):
        for folder in ("first", "second"):
            (data / folder / name).unlink(missing_ok=True)  # derived: rebuilt for the folder they are in
    images = [p for p in (data / "first").rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp")]
    assert images
    for p in images:
        p.unlink()
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "view", "first", "second", "--output_dir", str(data),
                             "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, proc.stderr.read() if proc.poll() is not None else line
        base = line.split("http://", 1)[1].split("/", 1)[0]
        page.goto(f"http://{base}/entry/0?run=second")
        shown(page)
        img = page.locator("[data-testid=tool-result] img[data-testid=image]")
        img.wait_for()
        assert "run=second" in img.get_attribute("src")
        until(lambda: img.evaluate("i => i.complete && i.naturalWidth > 0"), "the second run's image to load", timeout=30)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
