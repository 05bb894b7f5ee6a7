"""The journal entry model and the byte-slicing contract the run index and merge rely on.

hermes.data.run_index cuts a runner's line at `, "hermes": {` (the trajectory merge copies) and decodes
only from `, "api_calls": ` on; these tests fail if JournalEntry's serialisation stops giving
lines that can be cut so, or stops giving the bytes the runner always wrote.
"""
from __future__ import annotations

import json

from hermes.data import journal
from hermes.data.entry import TAIL_KEYS, HermesBlock, JournalEntry, Reward, Status
from hermes.data.journal_lines import hermes_block, outcome_block, split_entry


def sample(status: Status = Status.COMPLETED, reward: Reward | None = None) -> JournalEntry:
    # Text that looks like the cut points, inside strings and nested objects, must not fool the cut.
    tricky = 'echo \', "hermes": {"status": "failed"}\' and , "api_calls": 9 — ünïcode'
    return JournalEntry(
        prompt_index=7,
        conversations=[{"from": "system", "value": "You are..."}, {"from": "human", "value": tricky},
                       {"from": "gpt", "value": "<think>ok</think>done"}],
        metadata={"source": "x", "hermes": {"status": "nested"}, "batch_num": 2,
                  "timestamp": "2025-01-01T00:00:00", "model": "m"},
        completed=status == Status.COMPLETED,
        partial=False,
        api_calls=3,
        toolsets_used=["terminal", "file"],
        tool_stats={"terminal": {"count": 2, "success": 2, "failure": 0}},
        tool_error_counts={"terminal": 0},
        reward=reward,
        hermes=HermesBlock(key="k" * 16, status=status, error=None if status != Status.FAILED else "boom",
                           usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                           elapsed=1.234, sandbox_wait=0.0123, hallucinated_tools=[],
                           reasoning={"total_assistant_turns": 1, "turns_with_reasoning": 1,
                                      "turns_without_reasoning": 0}),
    )


def the_runners_dict(e: JournalEntry) -> dict:
    """The entry as the runner built it by hand before the model (plus the toolsets' aux_usage and
    files, and the in-run requeue's attempt and requeued, added since): the bytes to keep."""
    h = e.hermes
    return {"prompt_index": e.prompt_index, "conversations": e.conversations, "metadata": e.metadata,
            "completed": e.completed, "partial": e.partial, "api_calls": e.api_calls,
            "toolsets_used": e.toolsets_used, "tool_stats": e.tool_stats, "tool_error_counts": e.tool_error_counts,
            "hermes": {"key": h.key, "status": h.status.value, "error": h.error, "usage": h.usage,
                       "elapsed": h.elapsed, "sandbox_wait": h.sandbox_wait,
                       "hallucinated_tools": h.hallucinated_tools, "reasoning": h.reasoning,
                       "aux_usage": h.aux_usage, "files": h.files, "attempt": h.attempt, "requeued": h.requeued,
                       "worker": h.worker}}


def test_the_line_is_the_bytes_the_runner_always_wrote():
    for status in Status:
        e = sample(status)
        assert journal.encode(e.record()) == journal.encode(the_runners_dict(e))
        assert json.loads(journal.encode(e.record()))["hermes"]["status"] == status.value


# a check's output can hold the cut points too
CHECKED = Reward(passed=False, exit_code=1, output='FAILED , "hermes": {"status": "x"}, "api_calls": 1\n',
                 truncated=False, timed_out=False, duration=0.25)


def test_an_entry_without_a_check_has_no_reward_key():
    assert "reward" not in sample().record()
    assert journal.encode(sample().record()) == journal.encode(the_runners_dict(sample()))


def test_the_index_cuts_a_line_without_decoding_it_whole():
    for e in (sample(), sample(reward=CHECKED)):
        record = e.record()
        line = journal.encode(record)
        parsed = split_entry(line)
        assert parsed is not None
        head, tail = parsed
        # The trajectory is the line cut before `hermes`, byte for byte what a re-encode would give...
        assert head is not None, "the line was decoded whole: the entry's key order no longer fits split_entry"
        assert head == journal.encode({k: v for k, v in record.items() if k != "hermes"})
        # ...and the tail is exactly the contract's keys, decoded (the reward, if any, in the trajectory too).
        assert list(tail) == [k for k in TAIL_KEYS if k in record]
        assert hermes_block(tail) == record["hermes"]
        assert outcome_block(line) == record["hermes"]
    assert json.loads(head)["reward"] == tail["reward"] == CHECKED.model_dump()


def test_the_models_last_fields_are_the_contracts():
    assert list(JournalEntry.model_fields)[-len(TAIL_KEYS):] == list(TAIL_KEYS)
    assert list(sample(reward=CHECKED).record())[-len(TAIL_KEYS):] == list(TAIL_KEYS)


def test_statuses_read_as_their_values():
    assert [str(s) for s in Status] == ["completed", "partial", "discarded", "failed", "stopped"]
    assert f"'{Status.FAILED}'" == "'failed'" and Status.FAILED == "failed"
