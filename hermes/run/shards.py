"""Row shapes of published Parquet shards: a registry, so a shape of another module plugs in.

    openai    the columns of `hermes-batch export --format parquet`: the trajectory's fields plus
              `messages` (OpenAI chat messages with tool_calls) and `tools` (JSON text)
    sharegpt  the trajectory's fields only (the lines of trajectories.jsonl)

Each shape has ONE fixed Arrow schema, declared here, not inferred per shard: a shard holds a few
entries and would infer other types than its neighbours (a row with a reward, a message with
`reasoning_content`), and `datasets.load_dataset("parquet", data_files=...)` refuses shards whose
schemas differ. Fields whose shape varies from row to row or run to run (metadata: the dataset's
own fields; reward; tool_stats and tool_error_counts: one key per tool of the system) are JSON
text, as export's `tools` already is: json.loads(row["metadata"]).

    rl        the lines of `hermes-batch export --format rl`: messages, tools (JSON text), reward, and
              per assistant turn its tokens, token ids and logprobs (kept with --logprobs)

A shape of your own: register_shape(Shape(name, schema, row)) before publishing; a shape whose row
needs the entry's `hermes` block (its key, its logprobs) says so with needs_meta.

pyarrow is imported by the functions that need it: this module is loaded by the publishing worker
process, never on the path of a run's prompts.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from hermes.errors import HermesError
from hermes.run.export import openai_record


class PublishError(HermesError, ValueError):
    """A publication that cannot go as asked (unknown shape, a URL carrying credentials, ...)."""


@dataclass(frozen=True)
class Shape:
    name: str
    #: () -> pyarrow.Schema: the shape's columns and types, the same in every shard
    schema: Callable[[], Any]
    #: (trajectory entry without its hermes block) -> one row as a dict of the schema's columns
    row: Callable[[dict], dict]
    #: the row is made from the entry WITH its hermes block (under "hermes")
    needs_meta: bool = False


_SHAPES: dict[str, Shape] = {}


def register_shape(shape: Shape) -> None:
    _SHAPES[shape.name] = shape


def shape(name: str) -> Shape:
    if name in _SHAPES:
        return _SHAPES[name]
    raise PublishError(f"unknown --publish_format {name!r}: one of {', '.join(_SHAPES)}")


def shape_names() -> list[str]:
    return list(_SHAPES)


# --------------------------------------------------------------------------- the trajectory's columns

_JSON_TEXT = ("metadata", "tool_stats", "tool_error_counts", "reward")


def _text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _trajectory_fields():
    import pyarrow as pa

    return [
        pa.field("prompt_index", pa.int64()),
        pa.field("conversations", pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))),
        pa.field("metadata", pa.string()),
        pa.field("completed", pa.bool_()),
        pa.field("partial", pa.bool_()),
        pa.field("api_calls", pa.int64()),
        pa.field("toolsets_used", pa.list_(pa.string())),
        pa.field("tool_stats", pa.string()),
        pa.field("tool_error_counts", pa.string()),
        pa.field("reward", pa.string()),
    ]


def _trajectory_row(entry: dict) -> dict:
    row = {k: entry.get(k) for k in ("prompt_index", "completed", "partial", "api_calls", "toolsets_used")}
    row["conversations"] = [{"from": t.get("from"), "value": t.get("value")} for t in entry.get("conversations") or []]
    row.update({k: _text(entry.get(k)) for k in _JSON_TEXT})
    return row


def _messages_type():
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string()),
                               ("tool_calls", pa.list_(call)), ("tool_call_id", pa.string()), ("name", pa.string())]))


def _sharegpt_schema():
    import pyarrow as pa

    return pa.schema(_trajectory_fields())


def _openai_schema():
    import pyarrow as pa

    return pa.schema(_trajectory_fields() + [pa.field("messages", _messages_type()), pa.field("tools", pa.string())])


def _openai_row(entry: dict) -> dict:
    record = openai_record(entry)
    return {**_trajectory_row(entry), "messages": record["messages"],
            "tools": json.dumps(record["tools"], ensure_ascii=False)}


register_shape(Shape("openai", _openai_schema, _openai_row))
register_shape(Shape("sharegpt", _sharegpt_schema, _trajectory_row))


def _rl_schema():
    import pyarrow as pa

    turn = pa.struct([("tokens", pa.list_(pa.string())), ("token_ids", pa.list_(pa.int64())),
                      ("logprobs", pa.list_(pa.float64()))])
    return pa.schema([pa.field("prompt_index", pa.int64()), pa.field("key", pa.string()),
                      pa.field("messages", _messages_type()), pa.field("tools", pa.string()),
                      pa.field("reward", pa.float64()), pa.field("completed", pa.bool_()),
                      pa.field("partial", pa.bool_()), pa.field("turns", pa.list_(turn))])


def _rl_row(entry: dict) -> dict:
    from hermes.run.export_rl import rl_record  # only a worker publishing rl loads the journal's models

    plain = {k: v for k, v in entry.items() if k != "hermes"}
    return rl_record(entry, openai_record(plain))


register_shape(Shape("rl", _rl_schema, _rl_row, needs_meta=True))
