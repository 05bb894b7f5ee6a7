"""A journal entry: one finished prompt, as hermes.run.runner builds it and hermes.data.journal appends it.

The reference's trajectory fields, then the `hermes` block (what this system adds: the prompt's
key, its status, its error, usage, timings). trajectories.jsonl is the entry without that block.

The byte-slicing contract with the run index (hermes.data.journal_lines.split_entry / outcome_block): the
fields are serialised in declaration order, and the last ones are, in this order,
`api_calls`, `toolsets_used`, `tool_stats`, `tool_error_counts`, `reward` (only when the row
has a check: written only then), `hermes`. The index finds a line's outcome by cutting it at
`, "hermes": {` and decodes only from `, "api_calls": ` on; merge copies a trajectory as the
line cut at `, "hermes": {`, never re-encoded: so `reward` is in the trajectory and in the
tail merge decodes. Reordering these fields, or adding one after `api_calls` without listing
it in TAIL_KEYS, silently turns every line into a whole decode and re-encode:
tests/test_entry.py fails first. A field in the tail must stay small (the index decodes it).
"""
from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer


class Status(str, Enum):
    """How a prompt ended. Only `failed` is owed again (on --resume); merge keeps completed and
    partial ones and counts discarded ones (no reasoning) and stopped ones (attempt policy)."""

    COMPLETED = "completed"  # the model answered on its own
    PARTIAL = "partial"      # stopped at max_turns while still calling tools
    DISCARDED = "discarded"  # ran, but no turn had reasoning (and keep_unreasoned is off)
    FAILED = "failed"        # an error: the sandbox, the model endpoint, the system
    #: an attempt the attempt policy (--attempt_policy) stopped in flight once a sibling passed:
    #: final (never owed again), not a failure, never written to trajectories.jsonl
    STOPPED = "stopped"

    def __str__(self) -> str:  # the value in f-strings and SQL text, on every Python version
        return self.value

    __format__ = str.__format__


#: what merge writes to trajectories.jsonl
KEPT = (Status.COMPLETED, Status.PARTIAL)


class HermesBlock(BaseModel):
    """What this system adds to a trajectory; the entry's last field (see the contract above)."""

    model_config = ConfigDict(extra="forbid")

    key: str
    status: Status
    error: str | None
    #: the failure's kind and whether it passes, as its exception said (hermes.errors); absent where it
    #: did not say, and in journals written before (hermes.data.failures then reads `error`'s text)
    error_kind: str | None = Field(None, exclude_if=lambda v: v is None)
    error_transient: bool | None = Field(None, exclude_if=lambda v: v is None)
    usage: dict[str, Any]
    elapsed: float
    #: seconds the first tool call waited for the sandbox to be ready (None: no tool call)
    sandbox_wait: float | None
    hallucinated_tools: list[str]
    reasoning: dict[str, Any]
    #: auxiliary model calls of tools (vision, image generation) by kind, counted apart from the agent's
    aux_usage: dict[str, Any] = {}
    #: files the prompt's tools produced (relative to the run folder)
    files: list[str] = []
    #: which try of the prompt in this invocation (1: the first; hermes.run.requeue puts transient failures back)
    attempt: int = 1
    #: this failed attempt was put back in the queue: the prompt's outcome is a later line
    requeued: bool = False
    #: which process ran it, host:pid (a Dask worker's process, or the flow's own)
    worker: str | None = None
    #: which of the run's --attempts this entry is (1..K; `attempt` above counts retries of one of them)
    trial: int = 1
    #: the task folder's name, for rows read from one (statistics.json's per-task pass rates)
    task: str | None = None
    # -- tool use (hermes.model.textcalls): absent where there were no calls / tools were not offered --
    #: the conversation's tool calls by how they arrived: native, or the text format they were recovered from
    tool_calls_by_format: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)
    #: tools were offered and no answer held a native or recoverable call: the agent never acted
    no_tool_use: bool = Field(False, exclude_if=lambda v: not v)
    # open models (issue 44): why a partial stopped before its answer ("context_length": the endpoint
    # said the conversation outgrew the model), and per assistant turn the tokens it sent with their
    # logprobs (--logprobs; hermes.model.logprobs). Absent when unset: older lines keep their bytes.
    stop_reason: str | None = Field(None, exclude_if=lambda v: v is None)
    logprobs: list[dict[str, Any]] | None = Field(None, exclude_if=lambda v: v is None)

    @model_serializer(mode="wrap")
    def _plain_rows_unchanged(self, handler):
        # a row run once, not from a task folder, keeps the line it always had
        data = handler(self)
        if data.get("trial") == 1:
            del data["trial"]
        if data.get("task") is None:
            data.pop("task", None)
        return data


class Reward(BaseModel):
    """The row's check, run in the prompt's sandbox after the agent finished (hermes.data.task)."""

    model_config = ConfigDict(extra="forbid")

    passed: bool          # exit code 0, within the check's time limit
    exit_code: int        # -1: killed (time limit) or the check could not run
    output: str           # its stdout and stderr, the last hermes.data.task.CHECK_OUTPUT characters
    truncated: bool
    timed_out: bool
    duration: float       # seconds
    #: a task folder's verifier (hermes.data.verifier): the number it wrote to /logs/verifier/reward.txt,
    #: or reward.json's `reward`; passed means 1 or more. Absent for a plain row check.
    value: float | None = None
    #: reward.json's other metrics, as the verifier wrote them
    metrics: dict[str, Any] | None = None
    #: why the check failed, where its exit code does not say (no reward file, no network)
    reason: str | None = None

    @model_serializer(mode="wrap")
    def _without_unset(self, handler):
        # a plain row check's reward keeps its shape: the verifier's fields only where a verifier set them
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in _VERIFIER_FIELDS}


_VERIFIER_FIELDS = ("value", "metrics", "reason")


class JournalEntry(BaseModel):
    """One line of a batch file. Field order is the line's key order (the contract above)."""

    model_config = ConfigDict(extra="forbid")

    prompt_index: int
    conversations: list[dict[str, Any]]
    metadata: dict[str, Any]
    completed: bool
    partial: bool
    # -- from here on: the tail the index decodes (split_entry), `hermes` last --
    api_calls: int
    toolsets_used: list[str]
    tool_stats: dict[str, Any]
    tool_error_counts: dict[str, Any]
    #: the row's check (None: the row has none, and the line has no `reward` key)
    reward: Reward | None = None
    hermes: HermesBlock

    def record(self) -> dict[str, Any]:
        """The entry as the journal writes it: plain JSON values, in the contract's key order."""
        data = self.model_dump(exclude={"reward"} if self.reward is None else None)
        data["hermes"]["status"] = self.hermes.status.value
        return data


#: the entry's last keys, in order, as hermes.data.journal_lines.split_entry relies on them (`reward` only
#: when there is one)
TAIL_KEYS = ("api_calls", "toolsets_used", "tool_stats", "tool_error_counts", "reward", "hermes")
