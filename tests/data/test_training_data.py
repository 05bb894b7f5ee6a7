"""The output as a user feeds it to training: exact statistics, and loadable by `datasets`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.settings import RunSettings
from tests.helpers import BROWSER_TOOLS, read_jsonl, script, write_dataset

pytestmark = pytest.mark.usefixtures("prefect_harness")


def settings_for(tmp_path, mock_llm, dataset, run_name, **kw) -> RunSettings:
    return RunSettings(dataset_file=str(dataset), run_name=run_name, output_dir=str(tmp_path / "data"),
                       base_url=mock_llm.base_url, model="mock-model", max_retries=0,
                       **{"batch_size": 3, "num_workers": 4, **kw})


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def test_statistics_of_a_run_with_known_outcomes(tmp_path, mock_llm, sandbox_image):
    from flows.batch import batch_run

    rows = [
        # completed: write_file succeeds, read_file of a missing file fails
        {"prompt": "p1 " + script({"reasoning": "r1", "tool_calls": [call("write_file", path="a.txt", content="x"),
                                                                     call("read_file", path="missing.txt")]},
                                  {"reasoning": "r2", "content": "ok"})},
        # completed: a non-zero exit code is not a tool failure
        {"prompt": "p2 " + script({"reasoning": "r1", "tool_calls": [call("terminal", command="exit 3"),
                                                                     call("terminal", command="echo hi > f.txt")]},
                                  {"reasoning": "r2", "tool_calls": [call("read_file", path="f.txt")]},
                                  {"reasoning": "r3", "content": "done"})},
        # partial: still calling tools when max_turns (3) runs out
        {"prompt": "p3 " + script(*[{"reasoning": f"r{i}", "tool_calls": [call("terminal", command=f"echo {i}")]}
                                    for i in range(4)])},
        # discarded: no reasoning anywhere
        {"prompt": "p4 " + script({"content": "plain answer"})},
        # dropped at merge: calls a tool the system does not have
        {"prompt": "p5 " + script({"reasoning": "r", "tool_calls": [call("web_fetch_imaginary")]},
                                  {"reasoning": "r", "content": "done"})},
        # failed: the model endpoint keeps answering 500
        {"prompt": "p6 " + script({"error": 500})},
    ]
    settings = settings_for(tmp_path, mock_llm, write_dataset(tmp_path / "d.jsonl", rows), "known", max_turns=3,
                            prompt_retries=1)
    stats = batch_run(settings=settings)
    on_disk = json.loads((Path(settings.output_dir) / "known" / "statistics.json").read_text())
    assert on_disk == stats

    zero = {"count": 0, "success": 0, "failure": 0, "success_rate": 0.0, "failure_rate": 0.0}
    assert stats["tool_statistics"] == {
        "patch": zero, "process": zero, "search_files": zero, "web_search": zero, "web_extract": zero,
        "vision_analyze": zero, "image_generate": zero, **{name: zero for name in BROWSER_TOOLS},
        "read_file": {"count": 2, "success": 1, "failure": 1, "success_rate": 50.0, "failure_rate": 50.0},
        "terminal": {"count": 5, "success": 5, "failure": 0, "success_rate": 100.0, "failure_rate": 0.0},
        "write_file": {"count": 1, "success": 1, "failure": 0, "success_rate": 100.0, "failure_rate": 0.0},
    }
    assert stats["reasoning_statistics"] == {"total_assistant_turns": 8, "turns_with_reasoning": 8,
                                             "turns_without_reasoning": 0}
    assert (stats["trajectories_written"], stats["prompts_completed"], stats["prompts_partial"]) == (3, 2, 1)
    assert (stats["prompts_failed"], stats["discarded_no_reasoning"], stats["dropped_hallucinated_tools"]) == (1, 1, 1)
    [(kind, reasons)] = stats["failure_reasons"].items()
    assert kind == "model endpoint 500" and reasons["count"] == 1
    assert reasons["example"].startswith("model endpoint answered 500")
    # a 500 is transient: p6 was tried again within the run (--prompt_retries 1 here), then its failure stood
    assert stats["retries"]["prompts_retried"] == 1 and stats["retries"]["prompts_recovered"] == 0
    assert stats["api_calls"] == 2 + 3 + 3 + 1 + 2
    assert stats["total_prompts"] == 6 and stats["total_batches"] == 2
    assert stats["usage"]["total_tokens"] > 0

    entries = {e["conversations"][1]["value"][:2]: e for e in
               read_jsonl(Path(settings.output_dir) / "known" / "trajectories.jsonl")}
    assert sorted(entries) == ["p1", "p2", "p3"]
    assert entries["p1"]["tool_error_counts"]["read_file"] == 1
    assert entries["p3"]["partial"] is True and entries["p3"]["completed"] is False


def test_datasets_loads_trajectories_of_different_toolsets(tmp_path, mock_llm, sandbox_image):
    datasets = pytest.importorskip("datasets")
    from flows.batch import batch_run

    rows = [{"prompt": f"task {i}", **({"source": "gsm8k", "difficulty": "hard"} if i % 2 else {})} for i in range(12)]
    # 'development' draws terminal and file independently (80% each): entries differ in tools used
    settings = settings_for(tmp_path, mock_llm, write_dataset(tmp_path / "d.jsonl", rows), "mixed-tools",
                            distribution="development", seed=3)
    batch_run(settings=settings)
    path = Path(settings.output_dir) / "mixed-tools" / "trajectories.jsonl"
    entries = read_jsonl(path)
    assert len({tuple(sorted(e["toolsets_used"])) for e in entries}) > 1, "the seed should give varied toolsets"
    used = {json.dumps({t: s["count"] > 0 for t, s in e["tool_stats"].items()}, sort_keys=True) for e in entries}
    assert len(used) > 1

    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf-cache"))
    assert ds.num_rows == 12
    assert set(ds.features["tool_stats"]) == {"terminal", "process", "read_file", "write_file", "patch", "search_files",
                                                "web_search", "web_extract", "vision_analyze", "image_generate",
                                                *BROWSER_TOOLS}
    assert set(ds.features["tool_error_counts"]) == set(ds.features["tool_stats"])
    assert sorted(ds["prompt_index"]) == list(range(12))
    assert sorted(str(r.get("source")) for r in ds["metadata"]) == ["None"] * 6 + ["gsm8k"] * 6
