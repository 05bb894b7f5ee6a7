"""Golden tests for hermes.data.trajectory: API messages -> ShareGPT turns (SPEC section 2, seed 001).

Expected values are written out literally; nothing here is computed with the code under test.
"""

import logging


from hermes.data.trajectory import format_assistant, system_prompt, to_sharegpt

TERMINAL = {"name": "terminal", "description": "Execute shell commands",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}
TOOLS = [{"type": "function", "function": TERMINAL}]

# Seed 001, the example's system "value", character for character.
SEED_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools> </tools> XML tags. You may call one or more functions to assist with the user query. If available tools are not relevant in assisting with user query, just respond in natural conversational language. Don't make assumptions about what values to plug into functions. After calling & executing the functions, you will be provided with function results within <tool_response> </tool_response> XML tags. Here are the available tools:\n<tools>\n[{\"name\": \"terminal\", \"description\": \"Execute shell commands\", \"parameters\": {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"string\"}}}, \"required\": null}]\n</tools>\nFor each function call return a JSON object, with the following pydantic model json schema for each:\n{'title': 'FunctionCall', 'type': 'object', 'properties': {'name': {'title': 'Name', 'type': 'string'}, 'arguments': {'title': 'Arguments', 'type': 'object'}}, 'required': ['name', 'arguments']}\nEach function call should be enclosed within <tool_call> </tool_call> XML tags.\nExample:\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>"
)
SYSTEM_TURN = {"from": "system", "value": SEED_SYSTEM}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content=None, tool_calls=None, **extra):
    return {"role": "assistant", "content": content, "tool_calls": tool_calls, **extra}


def tool(id_, content, **extra):
    return {"role": "tool", "tool_call_id": id_, "content": content, **extra}


# --------------------------------------------------------------------------- system turn

def test_system_turn_is_the_seed_example_for_the_terminal_tool():
    assert system_prompt([TERMINAL]) == SEED_SYSTEM
    assert system_prompt(TOOLS) == SEED_SYSTEM  # OpenAI wrapper form gives the same


def test_system_turn_keeps_non_ascii_and_defaults_missing_fields():
    value = system_prompt([{"type": "function", "function": {"name": "tìm", "description": "Tìm kiếm"}}])
    assert '<tools>\n[{"name": "tìm", "description": "Tìm kiếm", "parameters": {}, "required": null}]\n</tools>\n' in value


def test_no_tools_gives_an_empty_list():
    assert "<tools>\n[]\n</tools>\n" in system_prompt([])


def test_a_system_turn_made_again_follows_every_change_of_its_tools():
    # Turns are kept by their tools (one made per tool set, not per prompt): a tool set that
    # differs in any field, or a list changed in place after its turn was made, gets its own turn.
    first = system_prompt([TERMINAL])
    assert system_prompt([dict(TERMINAL)]) == first == SEED_SYSTEM
    other = {**TERMINAL, "description": "Run shell commands"}
    assert '"description": "Run shell commands"' in system_prompt([other])
    tools = [dict(TERMINAL)]
    assert system_prompt(tools) == SEED_SYSTEM
    tools[0]["parameters"] = {"type": "object", "properties": {"cmd": {"type": "string"}}}
    assert '"properties": {"cmd": {"type": "string"}}' in system_prompt(tools)
    assert system_prompt([TERMINAL]) == SEED_SYSTEM


# --------------------------------------------------------------------------- the seed example

def test_seed_example_end_to_end():
    messages = [
        {"role": "system", "content": "ephemeral prompt, never saved"},
        {"role": "user", "content": "What Python version is installed?"},
        assistant(None, [call("call_abc123", "terminal", '{"command": "python3 --version"}')],
                  reasoning="The user wants to know the Python version. I should run python3 --version."),
        tool("call_abc123", "Python 3.11.6"),
        assistant("Python 3.11.6 is installed on this system.",
                  reasoning="Got the version. I can now answer the user."),
    ]
    assert to_sharegpt(messages, TOOLS) == [
        SYSTEM_TURN,
        {"from": "human", "value": "What Python version is installed?"},
        {"from": "gpt", "value": "<think>\nThe user wants to know the Python version. I should run python3 --version.\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"python3 --version\"}}\n</tool_call>"},
        {"from": "tool", "value": "<tool_response>\n{\"tool_call_id\": \"call_abc123\", \"name\": \"terminal\", \"content\": \"Python 3.11.6\"}\n</tool_response>"},
        {"from": "gpt", "value": "<think>\nGot the version. I can now answer the user.\n</think>\nPython 3.11.6 is installed on this system."},
    ]


# --------------------------------------------------------------------------- reasoning

def test_native_reasoning():
    msg = assistant("Done.", reasoning="  Checked the files.  ")
    assert format_assistant(msg) == "<think>\nChecked the files.\n</think>\nDone."


def test_reasoning_content_when_reasoning_empty():
    msg = assistant("Done.", reasoning="", reasoning_content="From the other field.")
    assert format_assistant(msg) == "<think>\nFrom the other field.\n</think>\nDone."


def test_reasoning_wins_over_reasoning_content():
    msg = assistant("Done.", reasoning="Native.", reasoning_content="Other.")
    assert format_assistant(msg) == "<think>\nNative.\n</think>\nDone."


def test_scratchpad_becomes_think():
    msg = assistant("<REASONING_SCRATCHPAD>\nList the dir first.\n</REASONING_SCRATCHPAD>\nHere it is.")
    assert format_assistant(msg) == "<think>\nList the dir first.\n</think>\nHere it is."


def test_inline_think_is_kept_once():
    msg = assistant("<think>\nAlready thought.\n</think>\nAnswer.")
    assert format_assistant(msg) == "<think>\nAlready thought.\n</think>\nAnswer."


def test_native_and_identical_inline_think_give_one_block():
    msg = assistant("<think>Same words.</think>Answer.", reasoning="Same words.")
    assert format_assistant(msg) == "<think>\nSame words.\n</think>\nAnswer."


def test_native_and_different_inline_think_are_merged_native_first():
    msg = assistant("<think>Inline part.</think>\nAnswer.", reasoning="Native part.")
    assert format_assistant(msg) == "<think>\nNative part.\nInline part.\n</think>\nAnswer."


def test_inline_think_later_in_content_moves_to_the_front():
    msg = assistant("Intro.\n<think>Hidden step.</think>\nAnswer.")
    assert format_assistant(msg) == "<think>\nHidden step.\n</think>\nIntro.\n\nAnswer."


def test_unclosed_think_is_all_reasoning():
    msg = assistant("<think>I was cut off mid-")
    assert format_assistant(msg) == "<think>\nI was cut off mid-\n</think>"


def test_prefilled_template_orphan_close_tag():
    msg = assistant("Thinking without an opening tag.\n</think>\n\nAnswer.")
    assert format_assistant(msg) == "<think>\nThinking without an opening tag.\n</think>\nAnswer."


def test_no_reasoning_gives_empty_think():
    assert format_assistant(assistant("Hello.")) == "<think>\n</think>\nHello."


def test_empty_think_block_counts_as_no_reasoning():
    assert format_assistant(assistant("<think>\n  \n</think>\nHello.")) == "<think>\n</think>\nHello."


def test_no_reasoning_no_content_no_calls():
    assert format_assistant(assistant(None)) == "<think>\n</think>"


# --------------------------------------------------------------------------- tool calls

def test_tool_call_without_reasoning_gets_empty_think():
    msg = assistant(None, [call("c1", "terminal", '{"command": "ls"}')])
    assert format_assistant(msg) == (
        "<think>\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>")


def test_parallel_calls_after_content_in_one_gpt_turn():
    msg = assistant("Let me look.", [
        call("c1", "terminal", '{"command": "ls"}'),
        call("c2", "read_file", '{"path": "/etc/hostname", "limit": 5}'),
    ], reasoning="Two things at once.")
    assert format_assistant(msg) == (
        "<think>\nTwo things at once.\n</think>\n"
        "Let me look.\n"
        "<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"/etc/hostname\", \"limit\": 5}}\n</tool_call>")


def test_arguments_keep_non_ascii_and_are_not_double_encoded():
    msg = assistant(None, [call("c1", "terminal", '{"command": "echo \\"xin chào\\""}')])
    assert format_assistant(msg) == (
        "<think>\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"echo \\\"xin chào\\\"\"}}\n</tool_call>")


def test_bad_arguments_give_empty_object_and_a_warning(caplog):
    msg = assistant(None, [call("c1", "terminal", '{"command": "ls"')])
    with caplog.at_level(logging.WARNING, logger="hermes.data.trajectory"):
        value = format_assistant(msg)
    assert value == "<think>\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {}}\n</tool_call>"
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "terminal" in caplog.records[0].getMessage()


def test_non_object_arguments_give_empty_object_and_a_warning(caplog):
    msg = assistant(None, [call("c1", "terminal", '["ls"]')])
    with caplog.at_level(logging.WARNING, logger="hermes.data.trajectory"):
        value = format_assistant(msg)
    assert value == "<think>\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {}}\n</tool_call>"
    assert len(caplog.records) == 1


def test_empty_arguments_mean_no_arguments_without_warning(caplog):
    msg = assistant(None, [call("c1", "browser_back", "")])
    with caplog.at_level(logging.WARNING, logger="hermes.data.trajectory"):
        value = format_assistant(msg)
    assert value == "<think>\n</think>\n<tool_call>\n{\"name\": \"browser_back\", \"arguments\": {}}\n</tool_call>"
    assert caplog.records == []


# --------------------------------------------------------------------------- tool results

def test_results_out_of_order_are_matched_by_id_and_ordered_like_the_calls():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "terminal", '{"command": "ls"}'),
                         call("c2", "read_file", '{"path": "a"}')]),
        tool("c2", "contents of a"),
        tool("c1", "a\nb"),
    ]
    assert to_sharegpt(messages, TOOLS)[3] == {"from": "tool", "value": (
        "<tool_response>\n{\"tool_call_id\": \"c1\", \"name\": \"terminal\", \"content\": \"a\\nb\"}\n</tool_response>\n"
        "<tool_response>\n{\"tool_call_id\": \"c2\", \"name\": \"read_file\", \"content\": \"contents of a\"}\n</tool_response>")}


def test_result_content_json_object_and_list_parsed_text_kept():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "terminal", "{}"), call("c2", "search_files", "{}"),
                         call("c3", "terminal", "{}"), call("c4", "terminal", "{}")]),
        tool("c1", '  {"output": "ok", "exit_code": 0}'),
        tool("c2", '["a.py", "b.py"]'),
        tool("c3", "plain text"),
        tool("c4", "{not json"),
    ]
    assert to_sharegpt(messages, TOOLS)[3] == {"from": "tool", "value": (
        "<tool_response>\n{\"tool_call_id\": \"c1\", \"name\": \"terminal\", \"content\": {\"output\": \"ok\", \"exit_code\": 0}}\n</tool_response>\n"
        "<tool_response>\n{\"tool_call_id\": \"c2\", \"name\": \"search_files\", \"content\": [\"a.py\", \"b.py\"]}\n</tool_response>\n"
        "<tool_response>\n{\"tool_call_id\": \"c3\", \"name\": \"terminal\", \"content\": \"plain text\"}\n</tool_response>\n"
        "<tool_response>\n{\"tool_call_id\": \"c4\", \"name\": \"terminal\", \"content\": \"{not json\"}\n</tool_response>")}


def test_result_name_falls_back_to_message_name_then_position():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "terminal", "{}"), call("c2", "read_file", "{}")]),
        tool("zz", "first", name="web_search"),
        tool("yy", "second"),
    ]
    assert to_sharegpt(messages, TOOLS)[3]["value"] == (
        "<tool_response>\n{\"tool_call_id\": \"zz\", \"name\": \"web_search\", \"content\": \"first\"}\n</tool_response>\n"
        "<tool_response>\n{\"tool_call_id\": \"yy\", \"name\": \"read_file\", \"content\": \"second\"}\n</tool_response>")


# --------------------------------------------------------------------------- humans

def test_later_user_message_is_a_further_human_turn():
    messages = [
        {"role": "user", "content": "Hi"},
        assistant("Hello.", reasoning="Greet back."),
        {"role": "user", "content": "Bye"},
        assistant("Bye."),
    ]
    assert to_sharegpt(messages, TOOLS) == [
        SYSTEM_TURN,
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "<think>\nGreet back.\n</think>\nHello."},
        {"from": "human", "value": "Bye"},
        {"from": "gpt", "value": "<think>\n</think>\nBye."},
    ]


def test_image_part_becomes_placeholder():
    messages = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "Be brief."},
    ]}]
    assert to_sharegpt(messages, TOOLS) == [
        SYSTEM_TURN,
        {"from": "human", "value": "What is in this picture?\n[image]\nBe brief."},
    ]


def test_system_messages_are_skipped_wherever_they_are():
    messages = [
        {"role": "system", "content": "secret ephemeral prompt"},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "mid-run note"},
        assistant("Hello."),
    ]
    assert to_sharegpt(messages, TOOLS) == [
        SYSTEM_TURN,
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "<think>\n</think>\nHello."},
    ]


def test_interrupted_call_without_results_has_no_tool_turn():
    messages = [
        {"role": "user", "content": "go"},
        assistant(None, [call("c1", "terminal", '{"command": "ls"}')]),
    ]
    assert to_sharegpt(messages, TOOLS)[1:] == [
        {"from": "human", "value": "go"},
        {"from": "gpt", "value": "<think>\n</think>\n<tool_call>\n{\"name\": \"terminal\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>"},
    ]
