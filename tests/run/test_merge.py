"""Merge: what it writes from a journal of every kind of line, compared with the merge as it was.

The merge no longer decodes and re-encodes whole lines nor keeps every key in memory (it asks
the run's DuckDB index which line wins and copies lines up to their `hermes` block); its output
must be exactly what the old one wrote. The old merge is kept below as the oracle.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hermes.data import journal
from hermes.run import rundir
from hermes.data.dataset import load_rows
from hermes.data.failures import group
from hermes.run.merge import merge, retry_stats
from hermes.run.tool_use import aggregate_tool_use
from mockllm import MockLLM
from hermes.run.runner import RunContext, run_batch
from hermes.settings import RunSettings
from hermes.data.stats import add_reasoning, add_tool_stats, aggregate_reasoning, aggregate_tool_stats
from tests.helpers import read_jsonl, script, write_dataset

TERMINAL = {"name": "terminal", "arguments": {"command": "echo hello"}}
PROMPTS = {
    "done": script({"reasoning": "look first", "tool_calls": [TERMINAL]}, {"reasoning": "seen", "content": "Said hello."}),
    "partial": script(*[{"reasoning": f"step {i}", "tool_calls": [TERMINAL]} for i in range(3)]),
    "plain": script({"content": "An answer without any reasoning."}),
    "dreamer": script({"reasoning": "use my magic", "tool_calls": [{"name": "crystal_ball", "arguments": {}}]},
                      {"reasoning": "no luck", "content": "Nothing."}),
    "flaky": "flaky prompt",  # fails on the first server, succeeds on the second
    "never": script({"error": 500}),
    "never-again": script({"error": 429}),
}


def old_merge(run_path: Path) -> tuple[str, dict]:
    """The merge before it used the index: every line decoded, a Python set of keys (the oracle)."""
    done, last_failure, counts, usage = set(), {}, Counter(), Counter()
    tools, reasoning, api_calls, out, aux, attempts = {}, {}, 0, [], {}, []
    acted: dict = {}
    for _, path in journal.batch_files(run_path):
        for entry in journal.read(path):
            meta = entry.get("hermes") or {}
            key, status = meta.get("key"), meta.get("status")
            if key is not None:
                attempts.append((key, status, meta.get("error")))
            api_calls += entry.get("api_calls", 0)
            usage.update({k: v for k, v in (meta.get("usage") or {}).items() if isinstance(v, int)})
            for kind, counted in (meta.get("aux_usage") or {}).items():
                aux.setdefault(kind, Counter()).update(counted)
            if status == "failed":
                last_failure[key] = meta.get("error") or "unknown error"
                continue
            if key in done:
                continue
            done.add(key)
            if entry.get("toolsets_used"):  # every prompt that ran counts towards tool use, kept or not
                acted["offered"] = acted.get("offered", 0) + 1
                acted["never"] = acted.get("never", 0) + bool(meta.get("no_tool_use"))
            for fmt, n in (meta.get("tool_calls_by_format") or {}).items():
                acted.setdefault("calls", {})[fmt] = acted.get("calls", {}).get(fmt, 0) + n
            if status not in ("completed", "partial"):
                counts["discarded_no_reasoning"] += 1
                continue
            if meta.get("hallucinated_tools"):
                counts["dropped_hallucinated_tools"] += 1
                continue
            counts[status] += 1
            add_tool_stats(tools, entry["tool_stats"])
            add_reasoning(reasoning, meta.get("reasoning"))
            out.append(json.dumps({k: v for k, v in entry.items() if k != "hermes"}, ensure_ascii=False) + "\n")
    failed = {k: e for k, e in last_failure.items() if k not in done}
    # failed attempts followed by another attempt of the same prompt, in journal order
    retried = [(k, e, k in done) for i, (k, s, e) in enumerate(attempts)
               if s == "failed" and any(k2 == k for k2, _, _ in attempts[i + 1:])]
    manifest = rundir.read_manifest(run_path)
    stats = {
        "run_name": manifest.get("run_name", run_path.name), "distribution": manifest.get("distribution"),
        "total_prompts": manifest.get("total_prompts", len(done) + len(failed)),
        "total_batches": len(journal.batch_files(run_path)), "batch_size": manifest.get("batch_size"),
        "model": manifest.get("model"), "duration_seconds": rundir.total_seconds(run_path),
        "tool_statistics": aggregate_tool_stats([tools]), "reasoning_statistics": aggregate_reasoning([reasoning]),
        "trajectories_written": counts["completed"] + counts["partial"], "prompts_completed": counts["completed"],
        "prompts_partial": counts["partial"], "prompts_failed": len(failed),
        "failure_reasons": group(failed.values()), "retries": retry_stats(retried),
        "discarded_no_reasoning": counts["discarded_no_reasoning"],
        "dropped_hallucinated_tools": counts["dropped_hallucinated_tools"],
        # since: row checks (none in this journal; tests/run/test_row_setup_checks.py has them)
        "require_check_pass": False, "dropped_check_failed": 0, "dropped_unchecked": 0,
        "check_statistics": {"checked": 0, "passed": 0, "failed": 0, "pass_rate": 0.0, "timed_out": 0,
                             "exit_codes": {}},
        "api_calls": api_calls,
        "usage": {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
        "aux_usage": {kind: dict(sorted(c.items())) for kind, c in sorted(aux.items())},
        "tool_use": aggregate_tool_use(acted),  # since: tool calls by how they arrived (hermes.run.tool_use)
    }
    return "".join(out), stats


def new_merge(run_path: Path) -> tuple[str, dict]:
    stats = merge(run_path)
    assert json.loads((run_path / "statistics.json").read_text()) == stats
    return (run_path / "trajectories.jsonl").read_text(encoding="utf-8"), {k: v for k, v in stats.items()
                                                                            if k != "completed_at"}


@pytest.fixture(scope="module")
def mixed_journal(tmp_path_factory) -> Path:
    """A run folder whose batch files hold every kind of line the merge must handle.

    batch_0: completed, partial, discarded (no reasoning), hallucinated tool, two identical
    prompts (two keys), a Vietnamese prompt with an extra field, three failures.
    batch_1 (a resume): the flaky prompt now succeeds, `done` once more (a duplicate), one
    failure again, a line whose `hermes` is not the last key, a line that is not JSON, a torn end.
    """
    tmp = tmp_path_factory.mktemp("mixed")
    rows = [{"prompt": p} for p in PROMPTS.values()]
    rows += [{"prompt": "twice " + PROMPTS["done"]}] * 2
    rows.append({"prompt": "Xin chào — viết một bài thơ " + PROMPTS["done"], "lang": "vi", "note": "“quoted”"})
    dataset = write_dataset(tmp / "d.jsonl", rows)
    loaded = load_rows(dataset)[0]
    all_rows = {r.row.prompt: r for r in loaded}
    settings = RunSettings(dataset_file=str(dataset), batch_size=20, run_name="mixed", output_dir=str(tmp / "data"),
                           model="m", max_turns=2, max_retries=0, distribution="terminal_only",
                           prompt_retries=0,  # failures stand, to be tried again by the "resume" below
                           sandbox={"backend": "local"})
    run_dir = tmp / "data" / "mixed"
    run_dir.mkdir(parents=True)
    rundir.write_manifest(run_dir, settings, total_prompts=len(rows))
    by_name = {name: all_rows[p] for name, p in PROMPTS.items()}

    def run(server: MockLLM, batch: int, names: list[str], extra: list = ()) -> None:
        ctx = RunContext.create(settings.model_copy(update={"base_url": server.base_url}), run_id="mixed")
        run_batch(batch, [by_name[n] for n in names] + list(extra), ctx)
        ctx.client.close()

    with MockLLM() as ok, MockLLM(fail_first=1, error_status=503) as failing:
        twice = [r for r in loaded if r.row.prompt.startswith(("twice", "Xin"))]
        run(ok, 0, ["done", "partial", "plain", "dreamer", "never", "never-again"], twice)
        run(failing, 0, ["flaky"])
        run(ok, 1, ["flaky", "done", "never"])

    batch_1 = run_dir / "batch_1.jsonl"
    first = next(e for e in map(json.loads, (run_dir / "batch_0.jsonl").read_text().splitlines())
                 if e["hermes"]["status"] == "completed" and not e["hermes"]["hallucinated_tools"])
    moved = {"hermes": {**first["hermes"], "key": "hand-made-0"}, **{k: v for k, v in first.items() if k != "hermes"}}
    with open(batch_1, "a", encoding="utf-8") as f:
        f.write(json.dumps(moved, ensure_ascii=False) + "\n")  # hermes first: decoded and encoded again
        f.write("this line is not JSON\n")
        f.write('{"prompt_index": 99, "conversations": [{"from": "hu')  # a crash mid-write
    return run_dir


def test_merge_writes_exactly_what_the_old_merge_wrote(mixed_journal):
    expected_lines, expected_stats = old_merge(mixed_journal)
    lines, stats = new_merge(mixed_journal)
    assert lines == expected_lines
    assert stats == expected_stats
    # and what a user checks: each prompt once, the right ones left out, the reasons named
    entries = read_jsonl(mixed_journal / "trajectories.jsonl")
    humans = [e["conversations"][1]["value"] for e in entries]
    # the two identical prompts are two trajectories; the hand-made line repeats a prompt under another key
    assert len(humans) == len(set(humans)) + 2 == 7
    assert PROMPTS["flaky"] in humans and PROMPTS["dreamer"] not in humans and PROMPTS["plain"] not in humans
    assert all("hermes" not in e for e in entries)
    assert stats["prompts_partial"] == 2 and stats["dropped_hallucinated_tools"] == 1  # flaky: 3 turns, max 2
    assert stats["discarded_no_reasoning"] == 1 and stats["prompts_failed"] == 2
    # grouped by kind, each with an example message
    assert {k: g["count"] for k, g in stats["failure_reasons"].items()} == {"model endpoint 500": 1,
                                                                            "model endpoint 429": 1}
    assert stats["failure_reasons"]["model endpoint 429"]["example"].startswith("model endpoint answered 429")
    # tried again on the resume: flaky (503, then fine) and never (500 twice)
    assert stats["retries"] == {"prompts_retried": 2, "prompts_recovered": 1, "attempts_retried": 2, "reasons": {
        "model endpoint 503": {"count": 1, "example": "model endpoint answered 503: injected failure (mock-llm "
                                                      "--fail-first / --error-rate)"},
        "model endpoint 500": {"count": 1, "example": "model endpoint answered 500: scripted failure of turn "
                                                      "(MOCK_SCRIPT error 500)"}}}


def test_merge_again_gives_the_same_output(mixed_journal):
    first = new_merge(mixed_journal)
    (mixed_journal / "index.duckdb").unlink()  # derived: rebuilt from the batch files
    assert new_merge(mixed_journal) == first


def test_merge_of_a_run_whose_index_another_process_holds(mixed_journal):
    expected = new_merge(mixed_journal)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)"),
        str(mixed_journal / "index.duckdb")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert new_merge(mixed_journal) == expected  # read privately, the held index left alone
        assert not list(mixed_journal.glob("*.damaged"))
    finally:
        holder.kill()
        holder.wait()
    assert new_merge(mixed_journal) == expected
