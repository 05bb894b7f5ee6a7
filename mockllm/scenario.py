"""The default scenario: what the mock does with the tools it is offered when no script says.

Each toolset has its part of the scenario (a function from the conversation to tool-call turns,
run only when its tools are offered); the parts run one after another, then a final answer
quotes what the tool results said. A toolset teaches the mock its part by adding to PARTS
(and, for its final-answer facts, to FACTS).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from mockllm.conversation import HALLUCINATED_TOOL, RESULT_PREVIEW, Conversation, MockConfig, Reply, ToolCall, text_of
from mockllm.conversation import parse_conversation
from mockllm.script import _call_id, find_script, scripted_reply
from mockllm import browser as browser_part
from mockllm.vision import vision_and_images, vision_fact, vision_reply

Turn = list[tuple[str, dict]]


def build_reply(body: Any, config: MockConfig) -> Reply:
    """Decide the answer to one chat request (pure: depends on the body and config only)."""
    return reply_for(parse_conversation(body), config)


def reply_for(conv: Conversation, config: MockConfig) -> Reply:
    script = find_script(conv.first_user)  # a script says exactly what to answer, images or not
    if script is not None:
        return scripted_reply(script, conv)
    seen = vision_reply(conv)  # a vision request (image parts) is described
    if seen is not None:
        return seen
    return default_reply(conv, config)


def default_reply(conv: Conversation, config: MockConfig) -> Reply:
    steps = default_plan(conv, config)
    n = conv.assistant_turns
    if n >= len(steps):
        return final_reply(conv)
    calls = [ToolCall(_call_id(conv.token, n, i), name, json.dumps(args)) for i, (name, args) in enumerate(steps[n])]
    return Reply(reasoning=_step_reasoning(conv, n, calls), tool_calls=calls)


def default_plan(conv: Conversation, config: MockConfig) -> list[Turn]:
    """The tool-call turns of the default scenario: every part's turns, in PARTS order."""
    if not conv.offered_tools:
        return []
    return [turn for part in PARTS for turn in part(conv, config) if turn]


def files_and_terminal(conv: Conversation, config: MockConfig) -> list[Turn]:
    """write_file + terminal in parallel, ``--turns``-3 terminal steps, then read_file back."""
    offered, k = conv.offered_tools, conv.token
    first: list[tuple[str, dict]] = []
    if "write_file" in offered:
        first.append(("write_file", {"path": f"notes/{k}.txt", "content": f"token {k}\n"}))
    if "terminal" in offered:
        first.append(("terminal", {"command": "cat /etc/hostname"}))
    if _hallucinates(conv.first_user, config):
        first.append((HALLUCINATED_TOOL, {"url": f"https://example.invalid/{k}"}))
    middle = []
    if "terminal" in offered:
        middle = [[("terminal", {"command": f"echo step {i}"})] for i in range(1, config.turns - 2)]
    last = [("read_file", {"path": f"notes/{k}.txt"})] if "read_file" in offered else []
    steps = [step for step in (first, *middle, last) if step]
    return steps[: config.turns - 1]


PYTHON_SCRIPT = """def add(a, b):
    return a + b


assert add(2, 3) == 5
print("add(2, 3) =", add(2, 3))
"""


def python_in_sandbox(conv: Conversation, config: MockConfig) -> list[Turn]:
    """A prompt that mentions Python: write a small script with a test, then run it with python3."""
    offered = conv.offered_tools
    if "python" not in conv.first_user.lower() or not {"write_file", "terminal"} <= set(offered):
        return []
    path = f"scripts/add_{conv.token}.py"
    return [[("write_file", {"path": path, "content": PYTHON_SCRIPT})],
            [("terminal", {"command": f"python3 {path} && python3 --version"})]]


#: the parts of the default scenario, in order; each returns its turns (none when its tools are not offered)
PARTS: list[Callable[[Conversation, MockConfig], list[Turn]]] = [files_and_terminal, python_in_sandbox]
PARTS.append(browser_part.browse)


def vision_part(conv: Conversation, config: MockConfig) -> list[Turn]:
    """The vision and image turns, after the parts before them have spent the turn budget."""
    before = PARTS[:PARTS.index(vision_part)]
    return vision_and_images(conv, config, config.turns - 1 - sum(len(part(conv, config)) for part in before))


PARTS.append(vision_part)


def file_terminal_fact(name: str, args: dict, output: str) -> str | None:
    if name == "terminal" and args.get("command") == "cat /etc/hostname":
        return f"hostname={output}"
    if name == "terminal" and str(args.get("command", "")).startswith("python3 "):
        return f"python: {output}"
    if name == "read_file":
        return f"{args.get('path', 'file')}={output}"
    return None


#: what the final answer quotes of a tool result: the first part that says something about it
FACTS: list[Callable[[str, dict, str], str | None]] = [file_terminal_fact]
FACTS.append(browser_part.browser_fact)
FACTS.append(vision_fact)


def _hallucinates(first_user: str, config: MockConfig) -> bool:
    if config.hallucinate_rate <= 0:
        return False
    digest = hashlib.sha256(f"{config.seed}:{first_user}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < config.hallucinate_rate


def _step_reasoning(conv: Conversation, n: int, calls: list[ToolCall]) -> str:
    names = ", ".join(c.name for c in calls)
    if n == 0:
        task = " ".join(conv.first_user.split())[:80]
        return f"The task is: {task!r}. I will start with {names}, in parallel where I can."
    return f"Step {n}: the previous results are in; next I call {names}."


def final_reply(conv: Conversation) -> Reply:
    """The closing answer, quoting the tool results found in the conversation."""
    results = tool_results(conv.messages)
    facts = []
    for name, args, output in results:
        fact = next((f for f in (fact_of(name, args, output) for fact_of in FACTS) if f), None)
        if fact:
            facts.append(fact)
    content = "Done." + (" " + "; ".join(facts) if facts else "")
    if results:
        seen = ", ".join(name for name, _, _ in results)
        reasoning = f"I saw {len(results)} tool result(s) ({seen}); time to summarise."
    else:
        reasoning = "No tools are needed for this; I can answer directly."
    return Reply(content=content, reasoning=reasoning)


def tool_results(messages: list[dict]) -> list[tuple[str, dict, str]]:
    """(tool name, parsed arguments, short output) for each tool message, in order."""
    calls: dict[str, tuple[str, dict]] = {}
    for message in messages:
        if message["role"] == "assistant":
            for call in message.get("tool_calls") or []:
                if isinstance(call, dict) and isinstance(call.get("function"), dict):
                    function = call["function"]
                    calls[str(call.get("id"))] = (str(function.get("name")), _loads_object(function.get("arguments")))
    results = []
    for message in messages:
        if message["role"] == "tool":
            name, args = calls.get(str(message.get("tool_call_id")), ("unknown", {}))
            results.append((name, args, _preview(text_of(message.get("content")))))
    return results


def _loads_object(text: Any) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _preview(output: str) -> str:
    """A tool result's gist: the ``output``/``content`` of a JSON result, first line, trimmed."""
    parsed = _loads_object(output)
    for key in ("output", "content", "stdout", "result"):
        if isinstance(parsed.get(key), str):
            output = parsed[key]
            break
    lines = output.strip().splitlines()
    return (lines[0] if lines else "")[:RESULT_PREVIEW]


from mockllm.web import web_fact, web_search_then_extract  # noqa: E402 - the web toolset's part

PARTS.append(web_search_then_extract)
FACTS.append(web_fact)
