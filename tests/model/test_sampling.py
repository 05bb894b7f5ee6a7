"""Sampling flags as a user types them reach the request body, read by the test's own loopback
server; --sampling_seed gives each attempt of each row its own seed, the same on a rerun."""
from __future__ import annotations

import logging
from collections import defaultdict

from flows.run_command import run_parser, settings_from_args
from hermes.model.sampling import call_seed
from hermes.run import direct
from tests.helpers import write_dataset
from tests.wire_server import WireServer, completion


def serve(method, path, body):
    if path.endswith("/models"):
        return 200, {"object": "list", "data": [{"id": "open-model", "object": "model"}]}
    return 200, completion()


def settings(tmp_path, base_url: str, run_name: str, *flags: str):
    rows = [{"prompt": "first row"}, {"prompt": "second row"}]
    args = run_parser("hermes-batch run").parse_args([
        f"--dataset_file={write_dataset(tmp_path / 'd.jsonl', rows)}", "--batch_size=2", f"--run_name={run_name}",
        f"--output_dir={tmp_path / 'data'}", f"--base_url={base_url}", "--model=open-model", "--num_workers=2",
        "--distribution=terminal_only", "--sandbox_backend=local", "--sandbox_prefetch=false",
        "--max_no_tool_use_share=1", *flags])  # prose answers: questions that merely offer tools
    return settings_from_args(args)


FLAGS = ("--temperature=0.7", "--top_p", "0.9", "--top_k=20", "--min_p=0.05", "--stop=</done>,STOP",
         '--extra_body={"repetition_penalty": 1.1, "chat_template_kwargs": {"enable_thinking": false}, "top_k": 40}',
         "--sampling_seed=7", "--attempts=3")


def seeds_by_row(bodies: list[dict]) -> dict[str, list[int]]:
    seeds = defaultdict(list)
    for b in bodies:
        seeds[b["messages"][-1]["content"]].append(b["seed"])
    return {k: sorted(v) for k, v in seeds.items()}


def test_sampling_flags_reach_the_body_and_each_attempt_sends_its_own_seed(tmp_path):
    with WireServer(serve) as server:
        stats = direct.run(settings(tmp_path, server.base_url, "sampled", *FLAGS))
        bodies = server.chat_bodies()
    assert stats["prompts_completed"] == 6 and len(bodies) == 6  # 2 rows x 3 attempts, one turn each
    for b in bodies:
        assert (b["temperature"], b["top_p"], b["min_p"], b["stop"]) == (0.7, 0.9, 0.05, ["</done>", "STOP"])
        assert b["repetition_penalty"] == 1.1 and b["chat_template_kwargs"] == {"enable_thinking": False}
        assert b["top_k"] == 40  # --extra_body wins over --top_k
        assert "logprobs" not in b
    first = seeds_by_row(bodies)
    assert all(len(set(s)) == 3 for s in first.values())  # the K attempts of a row differ
    assert set(first["first row"]).isdisjoint(first["second row"])

    with WireServer(serve) as server:  # the same run again under another name: the same seeds
        direct.run(settings(tmp_path, server.base_url, "again", *FLAGS))
        assert seeds_by_row(server.chat_bodies()) == first


def test_without_sampling_flags_the_body_has_none_of_them(tmp_path):
    with WireServer(serve) as server:
        direct.run(settings(tmp_path, server.base_url, "plain"))
        bodies = server.chat_bodies()
    for field in ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "logprobs"):
        assert not any(field in b for b in bodies), field


def test_a_turn_has_its_own_seed():
    assert len({call_seed(7, "key", turn) for turn in range(50)}) == 50
    assert call_seed(7, "key", 0) == call_seed(7, "key", 0) != call_seed(8, "key", 0)
    assert all(0 <= call_seed(s, "k", 0) < 2 ** 31 for s in range(100))


def test_a_resume_with_other_sampling_settings_says_so(tmp_path, caplog):
    with WireServer(serve) as server:
        direct.run(settings(tmp_path, server.base_url, "mixed", "--temperature=0.2", "--max_samples=1"))
        with caplog.at_level(logging.WARNING, logger="hermes"):
            direct.run(settings(tmp_path, server.base_url, "mixed", "--temperature=1.0", "--resume"))
    assert "different sampling settings: temperature 0.2 -> 1.0" in caplog.text


def test_a_bad_extra_body_names_its_flag(tmp_path):
    import pytest
    from pydantic import ValidationError

    from flows.run_command import validation_text

    with pytest.raises(ValidationError) as e:
        settings(tmp_path, "http://127.0.0.1:9/v1", "bad", "--extra_body={not json")
    assert validation_text(e.value).startswith("--extra_body: Value error, not a JSON object")
