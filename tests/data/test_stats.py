"""Golden tests for hermes.data.stats: tool failure rule, per-entry stats, reasoning, aggregation."""

import pytest

from hermes.data.stats import (aggregate_reasoning, aggregate_tool_stats, entry_tool_stats,
                          format_table, hallucinated_tools, has_any_reasoning, is_tool_failure,
                          reasoning_counts, turn_has_reasoning)

ALL_TOOLS = ["write_file", "terminal", "read_file"]


def call(id_, name, arguments="{}"):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content=None, tool_calls=None, **extra):
    return {"role": "assistant", "content": content, "tool_calls": tool_calls, **extra}


def tool(id_, content):
    return {"role": "tool", "tool_call_id": id_, "content": content}


# --------------------------------------------------------------------------- failure rule

@pytest.mark.parametrize("content", [
    '{"error": "permission denied"}',                        # non-null error
    '{"error": ""}',                                         # empty string is still non-null
    '{"content": {"output": "", "error": "timeout"}}',       # terminal-style content.error
    '{"success": false, "message": "nope"}',                 # success false
    "",                                                      # empty
    "   \n\t",                                               # whitespace only
    None,                                                    # no content at all
    "Error: file not found",                                 # error: prefix
    "  ERROR: boom",                                         # any case, after lstrip
    "error:",                                                # the prefix alone
    {"error": "already parsed"},                             # a dict handed over as is
])
def test_failures(content):
    assert is_tool_failure(content) is True


@pytest.mark.parametrize("content", [
    '{"error": null, "output": "ok"}',                       # null error is no error
    '{"content": {"output": "x", "error": null, "exit_code": 1}}',  # non-zero exit is not a failure
    '{"success": true}',
    '{"content": "error: inside a string field"}',           # content.error only when content is an object
    '["a", "b"]',                                            # JSON array
    "[]",
    "Python 3.11.6",                                         # plain text
    "The error: was in line 3",                              # error: not at the start
    "errors: none",                                          # not the error: prefix
    '"Error: a JSON string"',                                # JSON, not an object: success
    "{not json",                                             # broken JSON is text, not an error
])
def test_successes(content):
    assert is_tool_failure(content) is False


# --------------------------------------------------------------------------- per entry

def test_entry_tool_stats_lists_every_tool_sorted_with_zeros():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "terminal"), call("c2", "terminal"), call("c3", "read_file")]),
        tool("c3", "Error: no such file"),   # out of order: matched by id, not position
        tool("c1", '{"output": "ok", "error": null}'),
        tool("c2", ""),
        assistant("Done."),
    ]
    tool_stats, error_counts = entry_tool_stats(messages, ALL_TOOLS)
    assert tool_stats == {
        "read_file": {"count": 1, "success": 0, "failure": 1},
        "terminal": {"count": 2, "success": 1, "failure": 1},
        "write_file": {"count": 0, "success": 0, "failure": 0},
    }
    assert list(tool_stats) == ["read_file", "terminal", "write_file"]
    assert error_counts == {"read_file": 1, "terminal": 1, "write_file": 0}
    assert list(error_counts) == ["read_file", "terminal", "write_file"]


def test_entry_tool_stats_ignores_tools_the_system_does_not_have():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "launch_rockets"), call("c2", "terminal")]),
        tool("c1", "Error: unknown tool launch_rockets"),
        tool("c2", "ok"),
    ]
    tool_stats, error_counts = entry_tool_stats(messages, ["terminal"])
    assert tool_stats == {"terminal": {"count": 1, "success": 1, "failure": 0}}
    assert error_counts == {"terminal": 0}


def test_entry_tool_stats_of_a_conversation_without_tools():
    messages = [{"role": "user", "content": "hi"}, assistant("hello")]
    assert entry_tool_stats(messages, ["terminal"]) == (
        {"terminal": {"count": 0, "success": 0, "failure": 0}}, {"terminal": 0})


def test_hallucinated_tools():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "teleport"), call("c2", "terminal"), call("c3", "fly")]),
        assistant(None, [call("c4", "teleport")]),
    ]
    assert hallucinated_tools(messages, ALL_TOOLS) == ["fly", "teleport"]
    assert hallucinated_tools(messages[:1], ALL_TOOLS) == []


# --------------------------------------------------------------------------- reasoning

@pytest.mark.parametrize("message, expected", [
    (assistant("answer", reasoning="thought"), True),
    (assistant("answer", reasoning=None, reasoning_content="thought"), True),
    (assistant("answer", reasoning="   "), False),
    (assistant("<REASONING_SCRATCHPAD>plan</REASONING_SCRATCHPAD>answer"), True),
    (assistant("<REASONING_SCRATCHPAD> </REASONING_SCRATCHPAD>answer"), False),
    (assistant("<think>\nplan\n</think>\nanswer"), True),
    (assistant("<think>\n\n</think>\nanswer"), False),
    (assistant("just an answer"), False),
    (assistant(None, [call("c1", "terminal")]), False),
])
def test_turn_has_reasoning(message, expected):
    assert turn_has_reasoning(message) is expected


def test_reasoning_counts_and_any():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "terminal")], reasoning="look first"),
        tool("c1", "ok"),
        assistant("done"),
    ]
    assert reasoning_counts(messages) == {
        "total_assistant_turns": 2, "turns_with_reasoning": 1, "turns_without_reasoning": 1}
    assert has_any_reasoning(messages) is True
    assert has_any_reasoning([{"role": "user", "content": "go"}, assistant("done")]) is False


# --------------------------------------------------------------------------- run level

def test_aggregate_tool_stats_sums_and_rates():
    entries = [
        {"terminal": {"count": 2, "success": 2, "failure": 0},
         "read_file": {"count": 0, "success": 0, "failure": 0}},
        {"terminal": {"count": 1, "success": 0, "failure": 1},
         "read_file": {"count": 0, "success": 0, "failure": 0}},
        {},
    ]
    assert aggregate_tool_stats(entries) == {
        "read_file": {"count": 0, "success": 0, "failure": 0, "success_rate": 0.0, "failure_rate": 0.0},
        "terminal": {"count": 3, "success": 2, "failure": 1, "success_rate": 66.67, "failure_rate": 33.33},
    }


def test_aggregate_reasoning_sums():
    entries = [
        {"total_assistant_turns": 3, "turns_with_reasoning": 2, "turns_without_reasoning": 1},
        {"total_assistant_turns": 1, "turns_with_reasoning": 1, "turns_without_reasoning": 0,
         "has_any_reasoning": True},
    ]
    assert aggregate_reasoning(entries) == {
        "total_assistant_turns": 4, "turns_with_reasoning": 3, "turns_without_reasoning": 1}
    assert aggregate_reasoning([]) == {
        "total_assistant_turns": 0, "turns_with_reasoning": 0, "turns_without_reasoning": 0}


def test_format_table():
    statistics = {
        "run_name": "demo",
        "total_prompts": 3,
        "duration_seconds": 12.345,
        "discarded_no_reasoning": 1,
        "completed_at": None,
        "tool_statistics": {
            "read_file": {"count": 0, "success": 0, "failure": 0, "success_rate": 0.0, "failure_rate": 0.0},
            "terminal": {"count": 3, "success": 2, "failure": 1, "success_rate": 66.67, "failure_rate": 33.33},
        },
        "reasoning_statistics": {
            "total_assistant_turns": 4, "turns_with_reasoning": 3, "turns_without_reasoning": 1},
    }
    assert format_table(statistics) == (
        "run_name                demo\n"
        "total_prompts           3\n"
        "duration_seconds        12.35\n"
        "discarded_no_reasoning  1\n"
        "completed_at            -\n"
        "\n"
        "Tool statistics\n"
        "  tool       count  success  failure  success %  failure %\n"
        "  ---------  -----  -------  -------  ---------  ---------\n"
        "  terminal       3        2        1      66.67      33.33\n"
        "  read_file      0        0        0       0.00       0.00\n"
        "\n"
        "Reasoning statistics\n"
        "  total_assistant_turns: 4\n"
        "  turns_with_reasoning: 3\n"
        "  turns_without_reasoning: 1\n"
        "  share_with_reasoning: 75.00%"
    )


def test_format_table_of_an_empty_run():
    assert format_table({"run_name": "empty", "tool_statistics": {}}) == (
        "run_name  empty\n\nTool statistics\n  (no tools)")
