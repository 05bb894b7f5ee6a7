"""Harbor task folders as rows: real builds on the Docker engine, real containers, the bundled model
server on loopback, whole runs without Prefect (hermes.run.direct, as `--engine direct`)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from hermes.data.harbor import describe_tasks, read_tasks
from hermes.run import direct
from flows.task_commands import verify_main
from hermes.run.verify import OracleResult, format_results
from hermes.sandbox.base import DEFAULT_IMAGE, SandboxSettings
from hermes.sandbox.docker import build
from hermes.settings import RunSettings
from tests.conftest import containers_of
from tests.helpers import unique_run, read_jsonl, script, tool_responses

ORACLE = unique_run("oracle")  # its containers' label (verify-<run>): unique on a shared engine
VNET = unique_run("vnet")  # its containers' label: unique on a shared engine
NOVNET = unique_run("novnet")  # its containers' label: unique on a shared engine

TOML = """version = "1.0"
[metadata]
difficulty = "easy"
[verifier]
timeout_sec = 60.0
[agent]
timeout_sec = 120.0
[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 512
"""


def task(root: Path, name: str, prompt: str, test: str, solve: str = "true", docker: str = "", toml: str = TOML) -> Path:
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "instruction.md").write_text(prompt + "\n")
    (folder / "task.toml").write_text(toml)
    (folder / "environment" / "Dockerfile").write_text(f"FROM {DEFAULT_IMAGE}\nUSER root\nWORKDIR /app\n{docker}")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    (folder / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve)
    return folder


def shell(*commands: str) -> list[dict]:
    return [{"reasoning": "Shell.", "tool_calls": [{"name": "terminal", "arguments": {"command": c}}]} for c in commands]


DONE = {"reasoning": "Report.", "content": "Done."}
TXT_TEST = ("python3 -c \"import pathlib; p = pathlib.Path('/app/out.txt'); "
            "open('/logs/verifier/reward.txt', 'w').write('1' if p.is_file() and p.read_text().strip() == 'ok' else '0')\"\n")
JSON_TEST = ("python3 -c \"import json, pathlib; n = pathlib.Path('/app/n.txt').read_text().strip(); "
             "json.dump({'reward': 1.0 if n == '42' else 0.0, 'answer': n}, open('/logs/verifier/reward.json', 'w'))\"\n")


def settings(tmp_path: Path, dataset: Path, name: str, base_url: str, **kw) -> RunSettings:
    return RunSettings(dataset_file=str(dataset), run_name=name, output_dir=str(tmp_path / "data"), base_url=base_url,
                       model="mock-model", batch_size=2, num_workers=2, distribution="terminal_only",
                       sandbox=SandboxSettings(image=DEFAULT_IMAGE), **kw)


def entries(tmp_path: Path, name: str) -> list[dict]:
    return [e for p in sorted((tmp_path / "data" / name).glob("batch_*.jsonl")) for e in read_jsonl(p)]


def test_task_folders_run_with_images_built_once_tests_hidden_and_rewards_read_back(
        tmp_path, mock_llm, default_image, docker_engine, caplog):
    caplog.set_level(logging.INFO, logger="hermes.run.session")
    root = tmp_path / "tasks"
    look = "ls /tests; find / -name test.sh -not -path '/proc/*' 2>/dev/null; ls /solution; echo END; pwd; id -u"
    task(root, "write-ok", "Write ok to /app/out.txt. " + script(*shell(look, "echo ok > out.txt"), DONE), TXT_TEST)
    task(root, "answer", "Put 42 in n.txt. " + script(*shell("echo 42 > n.txt"), DONE), JSON_TEST,
         docker="RUN echo built > /app/marker\n")
    task(root, "broken-toml", "x", TXT_TEST, toml="[agent]\ntimeout_sec = 'soon'\n")

    lines, bad = describe_tasks(root)
    assert bad == 1 and any(f"{root / 'broken-toml'}" in line and "agent.timeout_sec" in line for line in lines)

    built_before = len(build.built)
    s = settings(tmp_path, root, "tasks1", mock_llm.base_url, skip_bad_lines=True)
    stats = direct.run(s)
    got = {e["metadata"]["task"]: e for e in entries(tmp_path, "tasks1")}
    assert set(got) == {"write-ok", "answer"}
    # one line for all tasks on what they ask and get (hermes.run.task_limits)
    said = [r.getMessage() for r in caplog.records if "task(s): memory" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("2 task(s): memory 2 ask 512 MB; CPUs 2 ask 1;"), said
    assert all(e["hermes"]["status"] == "completed" for e in got.values()), [e["hermes"]["error"] for e in got.values()]

    # the agent saw neither the tests nor the solution; it ran as the image's user, in its WORKDIR
    seen = tool_responses(got["write-ok"])[0]["content"]["output"]
    before_end, after_end = seen.split("END", 1)
    assert "test.sh" not in before_end and "solve.sh" not in before_end
    assert after_end.split() == ["/app", "0"]
    # rewards: reward.txt's number, reward.json's reward with its other metrics kept
    assert got["write-ok"]["reward"]["passed"] is True and got["write-ok"]["reward"]["value"] == 1.0
    assert got["answer"]["reward"]["value"] == 1.0 and got["answer"]["reward"]["metrics"] == {"answer": "42"}
    assert stats["task_statistics"]["pass_at_k"] == {"1": 1.0}
    assert len(build.built) - built_before <= 2  # built now, unless an earlier test of this process did
    tags = {build.image_tag(root / n / "environment", n) for n in ("write-ok", "answer")}
    assert all(docker_engine.images.get(t) for t in tags)

    # a second run builds nothing: the images are found by their content hash
    built = len(build.built)
    direct.run(settings(tmp_path, root, "tasks2", mock_llm.base_url, skip_bad_lines=True))
    assert len(build.built) == built
    assert containers_of(docker_engine, "tasks1") == [] and containers_of(docker_engine, "tasks2") == []


def test_a_missing_reward_file_and_a_failed_build_fail_only_their_task(tmp_path, mock_llm, default_image, docker_engine):
    root = tmp_path / "tasks"
    task(root, "no-reward", "Nothing. " + script(DONE), "echo the verifier forgot its reward\n")
    task(root, "unbuildable", "Never runs. " + script(DONE), TXT_TEST, docker="RUN echo the-build-broke >&2; exit 7\n")
    task(root, "fine", "Write ok. " + script(*shell("echo ok > /app/out.txt"), DONE), TXT_TEST)
    direct.run(settings(tmp_path, root, "broken", mock_llm.base_url))
    got = {e["metadata"]["task"]: e for e in entries(tmp_path, "broken")}
    assert got["fine"]["reward"]["passed"] is True
    missing = got["no-reward"]["reward"]
    assert missing["passed"] is False and "wrote no /logs/verifier/reward.txt or /logs/verifier/reward.json" in missing["reason"]
    assert "the verifier forgot its reward" in missing["output"]  # what test.sh printed, kept in the entry
    failed = got["unbuildable"]["hermes"]
    assert failed["status"] == "failed" and "image build failed" in failed["error"] and "the-build-broke" in failed["error"]


def test_verify_runs_the_solutions_and_shows_what_a_failing_one_printed(tmp_path, default_image, docker_engine, capsys):
    root = tmp_path / "tasks"
    task(root, "good", "Write ok.", TXT_TEST, solve="echo ok > /app/out.txt\n")
    noisy = "".join(f"echo solve-line-{n}\n" for n in range(40))
    task(root, "bad", "Write ok.", "echo test-says-expected-ok-got-$(cat /app/out.txt)\n" + TXT_TEST,
         solve=noisy + "echo not-ok > /app/out.txt\n")
    code = verify_main([str(root), "--json", "--sandbox_image", DEFAULT_IMAGE, "--run_name", ORACLE])
    got = json.loads(capsys.readouterr().out)
    assert code == 1 and got["problems"] == []
    by = {r["task"]: r for r in got["results"]}
    assert {t: r["passed"] for t, r in by.items()} == {"good": True, "bad": False}
    bad = by["bad"]
    assert bad["reason"] == "the verifier's reward is 0"
    assert bad["solve"]["exit_code"] == 0 and "solve-line-39" in bad["solve"]["tail"]
    assert bad["tests"]["exit_code"] == 0 and "test-says-expected-ok-got-not-ok" in bad["tests"]["tail"]
    assert "2 task(s): memory 2 ask 512 MB" in got["limits"]

    # the text a user reads: under the failing task, the end of each script's output
    text = format_results([OracleResult.model_validate(r) for r in got["results"]], [])
    shown = text.split("FAIL  bad", 1)[1]
    assert "solution/solve.sh exited 0 (last 15 of 40 lines):" in shown and "| solve-line-39" in shown
    assert "| solve-line-24" not in shown  # only the tail
    assert "tests/test.sh exited 0:" in shown and "| test-says-expected-ok-got-not-ok" in shown
    assert "1 of 2 oracle(s) pass; failing: bad" in text
    assert containers_of(docker_engine, f"verify-{ORACLE}") == []


def test_a_task_is_keyed_by_its_content_not_its_name(tmp_path):
    root = tmp_path / "tasks"
    task(root, "one", "Write ok.", TXT_TEST)
    key = read_tasks(root).keys()
    (root / "one").rename(root / "renamed")
    assert read_tasks(root).keys() == key
    (root / "renamed" / "tests" / "test.sh").write_text("#!/bin/bash\nexit 1\n")
    assert read_tasks(root).keys() != key
    assert read_tasks(root, attempts=3).keys() == [read_tasks(root).keys()[0] + s for s in ("", "#a2", "#a3")]


def test_verifier_network_reaches_the_verifier_and_never_the_agents_commands(tmp_path, mock_llm, default_image,
                                                                             docker_engine):
    import http.server
    import secrets
    import threading

    # the listener: a server on this host at the gateway address of a network this test made
    net = docker_engine.networks.create(f"hermes-test-vn-{secrets.token_hex(3)}", driver="bridge")
    hits: list[str] = []

    class Pong(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"pong")

        def log_message(self, *a):
            pass

    try:
        net.reload()
        gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        server = http.server.ThreadingHTTPServer((gateway, 0), Pong)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://{gateway}:{server.server_address[1]}"
        fetch = "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
        root = tmp_path / "tasks"
        # the agent tries the listener itself and leaves a process behind that keeps trying
        agent = (f"python3 -c '{fetch}' {url}/agent; echo agent-exit=$?; "
                 f"(while sleep 0.2; do python3 -c '{fetch}' {url}/leftover; done) >/dev/null 2>&1 &")
        test = (f"python3 -c '{fetch}' {url}/verifier > /tmp/got.txt; cat /tmp/got.txt; "
                "grep -qx pong /tmp/got.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n")
        task(root, "needs-net", "Fetch. " + script(*shell(agent), DONE), test)

        direct.run(settings(tmp_path, root, VNET, mock_llm.base_url, verifier_network=True))
        (on,) = entries(tmp_path, VNET)
        said = tool_responses(on)[0]["content"]["output"]
        assert "Network is unreachable" in said and "agent-exit=1" in said, said
        assert on["reward"]["passed"] is True, on["reward"]
        assert hits == ["/verifier"]  # the verifier reached it; neither the agent nor what it left behind did

        direct.run(settings(tmp_path, root, NOVNET, mock_llm.base_url))
        (off,) = entries(tmp_path, NOVNET)
        assert off["reward"]["passed"] is False
        assert "needs the network" in off["reward"]["reason"] and "--verifier_network" in off["reward"]["reason"]
        assert hits == ["/verifier"]
        server.shutdown()
        server.server_close()
    finally:
        net.remove()
    assert containers_of(docker_engine, VNET) == [] and containers_of(docker_engine, NOVNET) == []
    assert docker_engine.images.list(name="hermes-verifier") == []
