"""Whether a run's agents acted: tool calls by how they arrived, prompts that never called a tool.

A model served without a tool parser (or one that does not call tools) answers every prompt with
prose: each prompt "completes", and a run of agents that never acted looked like a success. Each
entry says how its calls arrived and whether it never acted (hermes.data.entry.HermesBlock);
statistics.json's `tool_use` block sums them, and when more than half of the prompts offered
tools never acted, the summary, the Prefect report and the log say so with the likely cause. Past
--max_no_tool_use_share the run ends Failed (its outputs written), as past --max_failed_share.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hermes.data.outcome import TooManyFailedPrompts
from hermes.model.textcalls import arrivals

log = logging.getLogger(__name__)

#: past this share of tool-offered prompts that never acted the run's reports warn
WARN_SHARE = 0.5


class AgentsNeverActed(TooManyFailedPrompts):
    """More than --max_no_tool_use_share of the prompts offered tools never called one. The outputs
    were still written; the run ends Failed like one with too many failed prompts."""


def tool_use(messages: list[dict[str, Any]], tools: list[dict[str, Any]], ran: bool) -> dict[str, Any]:
    """An entry's tool-use fields (HermesBlock): its calls by arrival format, and whether it never acted
    though offered tools (only said of a prompt that ran: a failed one says why it failed)."""
    by_format = arrivals(messages)
    return {"tool_calls_by_format": by_format, "no_tool_use": bool(ran and tools and not by_format)}


def add_tool_use(totals: dict[str, Any], toolsets_used: Any, meta: dict[str, Any]) -> None:
    """Count one entry that ran (not failed) into running `totals`."""
    offered = bool(toolsets_used)
    by_format = meta.get("tool_calls_by_format") or {}
    if offered:
        totals["offered"] = totals.get("offered", 0) + 1
        totals["never"] = totals.get("never", 0) + bool(meta.get("no_tool_use"))
    calls = totals.setdefault("calls", {})
    for fmt, n in by_format.items() if isinstance(by_format, dict) else ():
        if isinstance(n, int):
            calls[fmt] = calls.get(fmt, 0) + n


def aggregate_tool_use(totals: dict[str, Any]) -> dict[str, Any]:
    """statistics.json's `tool_use`: prompts offered tools, how many acted, calls by arrival format,
    and a warning when most never acted."""
    offered, never = totals.get("offered", 0), totals.get("never", 0)
    share = round(never / offered, 4) if offered else 0.0
    block = {"prompts_offered_tools": offered, "prompts_acted": offered - never, "prompts_no_tool_use": never,
             "no_tool_use_share": share, "calls_by_format": dict(sorted((totals.get("calls") or {}).items()))}
    block["warning"] = warning(block) if offered and share > WARN_SHARE else None
    return block


def warning(block: dict[str, Any]) -> str:
    never, offered = block["prompts_no_tool_use"], block["prompts_offered_tools"]
    return (f"{never} of {offered} prompts offered tools never called one ({block['no_tool_use_share']:.0%}): "
            "the agents did not act, and their trajectories show no tool use. Likely cause: the server returns "
            "tool calls as text it has no parser for, or the model does not call tools. Try: start the server "
            "with its tool parser (vLLM/SGLang: --enable-auto-tool-choice --tool-call-parser "
            "hermes|qwen3_coder|llama3_json|mistral; llama.cpp: --jinja or a function-calling chat format); "
            "or pick the format the model writes with --tool_call_parser hermes|json|llama|mistral|qwen3_coder "
            "(auto reads unmarked JSON only when it names an offered tool); or use a model trained to call tools.")


def report(stats: dict[str, Any]) -> str | None:
    """The run's tool-use warning, logged once at its end (None: the agents acted)."""
    text = (stats.get("tool_use") or {}).get("warning")
    if text:
        log.warning("%s", text)
    return text


def check_no_tool_use_share(stats: dict[str, Any], max_share: float, run_path: Path) -> None:
    """Raise AgentsNeverActed when the share of tool-offered prompts that never acted passes max_share."""
    block = stats.get("tool_use") or {}
    if block.get("prompts_offered_tools") and block.get("no_tool_use_share", 0.0) > max_share:
        raise AgentsNeverActed(
            f"{block['prompts_no_tool_use']} of {block['prompts_offered_tools']} prompts offered tools never called "
            f"one, more than max_no_tool_use_share={max_share:g} allows. Outputs were still written to "
            f"{Path(run_path).resolve()}. {block.get('warning') or warning(block)}", stats)
