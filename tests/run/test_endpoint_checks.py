"""A run against an endpoint that cannot serve: refused before the fan-out, or stopped by the
breaker mid-run, with the reason; nothing that is not done is marked failed, and a resume owes
exactly the prompts not done. Against the test's own loopback server (tests/wire_server.py)."""
from __future__ import annotations

import json
import threading

import pytest

from hermes.data import journal
from hermes.model.breaker import EndpointDown
from hermes.run import direct
from hermes.run.endpoint import EndpointRefused
from hermes.settings import RunSettings
from tests.helpers import closed_loopback_port, write_dataset
from tests.wire_server import WireServer, completion, error

MODEL = "served-model"


def settings(tmp_path, base_url: str, **kw) -> RunSettings:
    rows = [{"prompt": f"prompt {i}"} for i in range(6)]
    return RunSettings(**{"dataset_file": str(write_dataset(tmp_path / "d.jsonl", rows)), "run_name": "ep",
                          "output_dir": str(tmp_path / "data"), "base_url": base_url, "model": MODEL,
                          "batch_size": 2, "num_workers": 1, "distribution": "terminal_only",
                          "sandbox": {"backend": "local", "prefetch": False},
                          "max_no_tool_use_share": 1, **kw})  # prose answers: questions that merely offer tools


def listing(method, path, body):
    """An endpoint that serves MODEL only, as vLLM does: 404 for another model's completion."""
    if path.endswith("/models"):
        return 200, {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 4096}]}
    if "/models/" in path:
        return error(404, "Not Found")
    if body.get("model") != MODEL:
        return error(404, f"The model `{body.get('model')}` does not exist.", "model_not_found")
    return 200, completion()


def lines(tmp_path) -> list[dict]:
    return [e for _, p in journal.batch_files(tmp_path / "data" / "ep") for e in journal.read(p)]


def test_a_closed_port_refuses_the_run_before_anything_is_written(tmp_path):
    port = closed_loopback_port()
    with pytest.raises(EndpointRefused, match=rf"cannot reach http://127.0.0.1:{port}/v1 .*Connection refused"):
        direct.run(settings(tmp_path, f"http://127.0.0.1:{port}/v1"))
    assert not (tmp_path / "data" / "ep").exists()


def test_a_refused_key_refuses_the_run_with_the_endpoints_words(tmp_path):
    with WireServer(lambda m, p, b: error(401, "Incorrect API key provided: sk-wrong.", "invalid_api_key")) as server:
        with pytest.raises(EndpointRefused, match=r"refused the API key: .* answered 401: Incorrect API key provided"):
            direct.run(settings(tmp_path, server.base_url), api_key="sk-wrong")
        assert server.chat_bodies() == []  # /models said it all
    assert not (tmp_path / "data" / "ep").exists()


def test_an_unknown_model_refuses_the_run_naming_the_models_served(tmp_path):
    with WireServer(listing) as server:
        with pytest.raises(EndpointRefused, match=r"cannot serve model 'no-such-model' \(it lists: served-model\).*"
                                                  r"answered 404: The model `no-such-model` does not exist"):
            direct.run(settings(tmp_path, server.base_url, model="no-such-model"))
        assert [b["max_tokens"] for b in server.chat_bodies()] == [1]  # one tiny completion, no prompt
    assert not (tmp_path / "data" / "ep").exists()


def test_a_served_model_runs_and_its_context_length_is_read_off_the_listing(tmp_path):
    with WireServer(listing) as server:
        stats = direct.run(settings(tmp_path, server.base_url))
        assert len(server.chat_bodies()) == 6  # the listing named the model: no extra completion
    assert stats["prompts_completed"] == 6
    manifest = json.loads((tmp_path / "data" / "ep" / "run.json").read_text())
    assert manifest["settings"]["context_length"] == 4096


def test_the_check_can_be_skipped(tmp_path):
    with WireServer(listing) as server:
        direct.run(settings(tmp_path, server.base_url, check_endpoint=False))
        assert not any(p.endswith("/models") for _, p, _ in server.requests)


def test_an_endpoint_that_dies_mid_run_trips_the_breaker_and_resume_owes_the_rest(tmp_path):
    served = threading.Semaphore(2)  # two prompts are answered, then the endpoint answers 503 for good

    def dying(method, path, body):
        if method == "GET":
            return listing(method, path, body)
        return (200, completion()) if served.acquire(blocking=False) else error(503, "upstream connect error")

    with WireServer(dying) as server:
        with pytest.raises(EndpointDown, match=r"failed every request for 1 s .*answered 503: upstream connect error"
                                               r".*not marked failed.*--resume") as stopped:
            direct.run(settings(tmp_path, server.base_url, breaker_seconds=1, max_retries=2))
    assert stopped.value.stats["prompts_completed"] == 2 and stopped.value.stats["prompts_failed"] == 0
    done = lines(tmp_path)
    assert [e["hermes"]["status"] for e in done] == ["completed", "completed"]  # no failed line at all

    with WireServer(listing) as server:  # back again
        stats = direct.run(settings(tmp_path, server.base_url, resume=True))
        asked = sorted(b["messages"][-1]["content"] for b in server.chat_bodies())
    finished = {e["conversations"][1]["value"] for e in done}
    assert asked == sorted({f"prompt {i}" for i in range(6)} - finished)  # exactly the prompts not done
    assert stats["prompts_completed"] == 6 and stats["prompts_failed"] == 0


def test_passing_faults_of_a_working_endpoint_do_not_trip_it(tmp_path):
    calls = iter(range(1000))

    def flaky(method, path, body):  # every other completion answers 503: the client's retries absorb it
        if method == "GET":
            return listing(method, path, body)
        return error(503, "busy") if next(calls) % 2 == 0 else (200, completion())

    with WireServer(flaky) as server:
        stats = direct.run(settings(tmp_path, server.base_url, breaker_seconds=0.01, max_retries=3))
    assert stats["prompts_completed"] == 6 and stats["prompts_failed"] == 0
