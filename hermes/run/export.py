"""`hermes-batch export`: a run's trajectories in the formats trainers read.

    openai     JSONL, one {"messages", "tools"} a line, as OpenAI's fine-tuning format has them:
               assistant turns with `tool_calls` (arguments as JSON text), one `tool` message per
               result with its `tool_call_id`; the tools' JSON schemas beside the messages
               (TRL and axolotl read the same shape)
    sharegpt   JSONL, the lines of trajectories.jsonl as they are
    parquet    one Parquet file written by DuckDB: the trajectory's fields plus `messages` and
               `tools` (as JSON text: json.loads(row["tools"])); datasets.load_dataset("parquet", ...)
               and the Hub read it
    rl         JSONL for RL trainers: messages, tools, reward and per assistant turn its tokens and
               logprobs (runs made with --logprobs), read from the journal (hermes.run.export_rl)

The source is the run's trajectories.jsonl (the merge's output), read line by line, so memory does
not grow with the run. The ShareGPT turns are turned back into chat messages here: the generated
system turn carries the tools' schemas (hermes.data.trajectory.system_prompt), a gpt turn its think
block, content and <tool_call> blocks, a tool turn its <tool_response> blocks, each block's JSON
on one line. Reasoning stays in the content as its <think> block (lossless, and what a Hermes-style
chat template expects) unless reasoning="field" moves it to `reasoning_content`.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from hermes.errors import HermesError
from hermes.data.run_paths import RunPaths

FORMATS = ("openai", "sharegpt", "parquet", "rl")
ONLY = {
    "passed": lambda e: isinstance(e.get("reward"), dict) and e["reward"].get("passed") is True,
    "completed": lambda e: e.get("completed") is True,
}
_SUFFIX = {"openai": ".openai.jsonl", "sharegpt": ".sharegpt.jsonl", "parquet": ".parquet", "rl": ".rl.jsonl"}


class ExportError(HermesError, ValueError):
    """A run that cannot be exported as asked (no trajectories yet, an unreadable line)."""


# --------------------------------------------------------------------------- ShareGPT -> messages

def tagged_blocks(text: str, tag: str) -> tuple[str, list[dict]]:
    """(the text before the first block, each block's JSON): blocks are `<tag>\\n{json}\\n</tag>`."""
    lines = text.split("\n")
    head, blocks, i = [], [], 0
    while i < len(lines):
        if lines[i] == f"<{tag}>" and i + 2 < len(lines) and lines[i + 2] == f"</{tag}>":
            try:
                blocks.append(json.loads(lines[i + 1]))
                i += 3
                continue
            except ValueError:
                pass
        if blocks:  # text after a block: not ours to take apart, keep it as content
            return text, []
        head.append(lines[i])
        i += 1
    return "\n".join(head), blocks


def split_gpt(value: str) -> tuple[str, str, list[dict]]:
    """A gpt turn's (reasoning, content, tool calls {"name", "arguments"})."""
    reasoning, rest = "", value
    if value.startswith("<think>\n"):
        end = value.find("</think>")
        if end != -1:
            reasoning = value[len("<think>\n"):end].strip()
            rest = value[end + len("</think>"):].lstrip("\n")
    content, calls = tagged_blocks(rest, "tool_call")
    return reasoning, content.strip(), calls


def tool_schemas(system_value: str) -> list[dict]:
    """The tools of a generated system turn, as OpenAI's `tools` list."""
    start, end = system_value.find("<tools>\n"), system_value.find("\n</tools>")
    if start == -1 or end == -1:
        return []
    listed = json.loads(system_value[start + len("<tools>\n"):end])
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                              "parameters": t.get("parameters") or {}}} for t in listed]


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def openai_record(entry: dict, reasoning: str = "inline") -> dict:
    """One trajectory as {"messages", "tools"}. reasoning: "inline" keeps the gpt turn's think block
    at the start of its content; "field" puts its text in `reasoning_content`."""
    turns = entry.get("conversations") or []
    tools: list[dict] = []
    messages: list[dict] = []
    for n, turn in enumerate(turns):
        who, value = turn.get("from"), turn.get("value") or ""
        if who == "system":
            tools = tools or tool_schemas(value)
        elif who == "human":
            messages.append({"role": "user", "content": value})
        elif who == "gpt":
            thought, content, calls = split_gpt(value)
            following = turns[n + 1] if n + 1 < len(turns) and turns[n + 1].get("from") == "tool" else None
            results = tagged_blocks(following.get("value") or "", "tool_response")[1] if following else []
            msg: dict[str, Any] = {"role": "assistant"}
            if reasoning == "field":
                msg["content"] = content or None
                msg["reasoning_content"] = thought or None
            else:
                msg["content"] = ((f"<think>\n{thought}\n</think>\n" if thought else "<think>\n</think>\n") + content).rstrip()
            if calls:
                msg["tool_calls"] = [
                    {"id": (results[i].get("tool_call_id") if i < len(results) else None) or f"call_{n}_{i}",
                     "type": "function",
                     "function": {"name": c.get("name", ""), "arguments": json.dumps(c.get("arguments") or {},
                                                                                      ensure_ascii=False)}}
                    for i, c in enumerate(calls)]
            messages.append(msg)
        elif who == "tool":
            prev = messages[-1] if messages else {}
            ids = [c["id"] for c in prev.get("tool_calls") or []]
            for i, block in enumerate(tagged_blocks(value, "tool_response")[1]):
                messages.append({"role": "tool", "tool_call_id": block.get("tool_call_id") or
                                 (ids[i] if i < len(ids) else f"call_{n}_{i}"),
                                 "name": block.get("name", ""), "content": _text(block.get("content"))})
    return {"messages": messages, "tools": tools}


# --------------------------------------------------------------------------- the run's trajectories

def trajectories(run_path: Path, only: str | None = None) -> Iterator[tuple[bytes, dict]]:
    """(raw line, entry) of each trajectory of the run, those `only` chooses."""
    source = RunPaths(run_path).trajectories
    if not source.exists():
        raise ExportError(f"{source} does not exist yet: run `hermes-batch merge {run_path.name}` first")
    keep: Callable[[dict], bool] = ONLY[only] if only else (lambda e: True)
    with open(source, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except ValueError as e:
                raise ExportError(f"{source}, line {n}: not JSON ({e})") from None
            if keep(entry):
                yield raw if raw.endswith(b"\n") else raw + b"\n", entry


def default_output(run_path: Path, fmt: str, only: str | None) -> Path:
    return run_path / "export" / f"{run_path.name}{'-' + only if only else ''}{_SUFFIX[fmt]}"


def export(run_path: Path, fmt: str, output: Path | None = None, only: str | None = None,
           reasoning: str = "inline") -> tuple[Path, int]:
    """Write the export; returns (its path, how many trajectories it holds)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    if only is not None and only not in ONLY:
        raise ExportError(f"--only {only!r}: one of {', '.join(ONLY)}")
    output = Path(output) if output else default_output(run_path, fmt, only)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    if fmt == "rl":  # from the journal: the tokens and logprobs are not in trajectories.jsonl (hermes.run.export_rl)
        # imported here: it loads the journal's pydantic models, a tenth of a second that the
        # publishing worker (which imports this module for openai_record) would pay at every start
        from hermes.run import export_rl

        with open(tmp, "wb") as out:
            try:
                count = export_rl.write(run_path, out, lambda e: openai_record(e, reasoning),
                                        ONLY[only] if only else (lambda e: True))
            except FileNotFoundError as e:
                raise ExportError(str(e)) from None
        tmp.replace(output)
        return output, count
    rows = trajectories(run_path, only)
    if fmt == "parquet":
        count = _parquet(rows, tmp, reasoning)
    else:
        with open(tmp, "wb") as out:
            count = _jsonl(rows, out, fmt, reasoning)
    tmp.replace(output)
    return output, count


def _jsonl(rows: Iterable[tuple[bytes, dict]], out, fmt: str, reasoning: str) -> int:
    count = 0
    for raw, entry in rows:
        out.write(raw if fmt == "sharegpt" else
                  (json.dumps(openai_record(entry, reasoning), ensure_ascii=False) + "\n").encode())
        count += 1
    return count


def _parquet(rows: Iterable[tuple[bytes, dict]], out: Path, reasoning: str) -> int:
    import duckdb

    with tempfile.NamedTemporaryFile("wb", suffix=".jsonl", dir=out.parent, delete=False) as staged:
        count = 0
        for _, entry in rows:
            record = openai_record(entry, reasoning)
            # tools as JSON text: as columns, the tools' parameter schemas would merge into one struct
            # whose every tool shows every other tool's parameters as nulls
            record["tools"] = json.dumps(record["tools"], ensure_ascii=False)
            staged.write((json.dumps({**entry, **record}, ensure_ascii=False) + "\n").encode())
            count += 1
    try:
        con = duckdb.connect(":memory:")
        try:
            if count:
                # sample_size=-1: every line decides the columns' types (rows differ: a reward, metadata)
                con.execute(f"""COPY (SELECT * FROM read_json(?, format='newline_delimited', sample_size=-1,
                                                         maximum_object_size=1073741824))
                                TO '{_sql_path(out)}' (FORMAT parquet)""", [staged.name])
            else:
                con.execute(f"COPY (SELECT NULL::VARCHAR AS conversations LIMIT 0) TO '{_sql_path(out)}' (FORMAT parquet)")
        finally:
            con.close()
    finally:
        Path(staged.name).unlink(missing_ok=True)
    return count


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")


# --------------------------------------------------------------------------- the command

def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hermes-batch export", description="A run's trajectories for training.")
    p.add_argument("run_name")
    p.add_argument("--output_dir", default="data")
    p.add_argument("--format", choices=FORMATS, default="openai")
    p.add_argument("--output", default=None, help="default: data/<run>/export/<run>[-<only>].<format>")
    p.add_argument("--only", choices=tuple(ONLY), default=None,
                   help="passed: entries whose row check passed; completed: not stopped at max_turns")
    p.add_argument("--reasoning", choices=("inline", "field"), default="inline",
                   help="openai/parquet: the think block in the content (inline) or in reasoning_content")
    a = p.parse_args(argv)
    run_path = Path(a.output_dir) / a.run_name
    try:
        path, count = export(run_path, a.format, Path(a.output) if a.output else None, a.only, a.reasoning)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{count} trajectories -> {path}")
    return 0
