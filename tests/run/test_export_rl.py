"""--logprobs: the endpoint is asked for them (read off the bundled mock server's request log),
each assistant turn's tokens and logprobs land in the batch line (not in the ShareGPT line), and
`hermes-batch export --format rl` writes lines that `datasets` loads."""
from __future__ import annotations

import json

from hermes.data import journal
from hermes.run import direct
from hermes.run.export import main as export_main
from hermes.settings import RunSettings
from mockllm.server import MockLLM
from tests.helpers import read_jsonl, script, write_dataset

TOOL_TURN = {"reasoning": "look first", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}]}
ANSWER = {"reasoning": "seen it", "content": "The answer is hi."}


def run(tmp_path, server: MockLLM, name: str, *, logprobs: bool) -> None:
    rows = [{"prompt": f"row {i} " + script(TOOL_TURN, ANSWER)} for i in range(3)]
    direct.run(RunSettings(dataset_file=str(write_dataset(tmp_path / "d.jsonl", rows)), run_name=name,
                           output_dir=str(tmp_path / "data"), base_url=server.base_url, model="mock-model",
                           batch_size=2, num_workers=2, distribution="terminal_only", logprobs=logprobs,
                           sandbox={"backend": "local", "prefetch": False}))


def test_logprobs_are_kept_per_turn_and_export_for_rl_loads_in_datasets(tmp_path):
    import datasets

    with MockLLM() as server:
        run(tmp_path, server, "rl", logprobs=True)
        bodies = server.requests()
    assert len(bodies) == 6 and all(b["logprobs"] is True and b["return_tokens_as_token_ids"] for b in bodies)
    assert all("logprobs" not in m for b in bodies for m in b["messages"])  # never sent back

    run_dir = tmp_path / "data" / "rl"
    lines = [e for _, p in journal.batch_files(run_dir) for e in journal.read(p)]
    for e in lines:
        turns = e["hermes"]["logprobs"]
        assert len(turns) == 2 and all(len(t["tokens"]) == len(t["logprobs"]) > 0 for t in turns)
        assert all(t.startswith("token_id:") for turn in turns for t in turn["tokens"])
    assert "logprobs" not in (run_dir / "trajectories.jsonl").read_text()  # not in the ShareGPT lines

    assert export_main(["rl", f"--output_dir={tmp_path / 'data'}", "--format=rl"]) == 0
    out = run_dir / "export" / "rl.rl.jsonl"
    exported = read_jsonl(out)
    assert sorted(e["prompt_index"] for e in exported) == [0, 1, 2]
    ds = datasets.load_dataset("json", data_files=str(out), split="train")
    assert ds.num_rows == 3
    row = ds[0]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert len(row["turns"]) == 2
    first = row["turns"][0]
    assert len(first["token_ids"]) == len(first["tokens"]) == len(first["logprobs"])
    assert all(isinstance(i, int) for i in first["token_ids"])
    assert json.loads(row["tools"])[0]["function"]["name"]


def test_without_the_flag_no_logprobs_are_asked_nor_kept(tmp_path):
    with MockLLM() as server:
        run(tmp_path, server, "plain", logprobs=False)
        assert not any("logprobs" in b for b in server.requests())
    lines = [e for _, p in journal.batch_files(tmp_path / "data" / "plain") for e in journal.read(p)]
    assert lines and not any("logprobs" in e["hermes"] for e in lines)
