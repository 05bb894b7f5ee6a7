"""Errors with one root and a kind (hermes.errors): every error class of the product derives from
HermesError and says whether it passes; a failed entry records the kind beside its text, and the
failure's grouping uses it, falling back to the text's prefixes for journals written before."""
from __future__ import annotations

import importlib
import inspect
import json
import pickle
import socket
from pathlib import Path

import pytest

from hermes.data import journal
from hermes.data.entry import HermesBlock
from hermes.data.failures import classify, group, of_exception
from hermes.errors import HermesError
from hermes.model.client import ModelClient, ModelError
from hermes.settings import AgentSettings
from mockllm import MockLLM
from tests.helpers import script

ROOT = Path(__file__).resolve().parents[2]
#: control flow, not an error: a BaseException on purpose, so `except Exception` never swallows it
NOT_ERRORS = {"hermes.sandbox.lifecycle.RunInterrupted"}


def product_exceptions() -> list[type[BaseException]]:
    found = []
    for package in ("hermes", "flows", "tasks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            module = importlib.import_module(name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == name:
                    found.append(cls)
    return found


def test_every_error_class_of_the_product_derives_from_hermes_error_and_says_if_it_passes():
    classes = product_exceptions()
    assert len(classes) > 25  # the walk found them
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes
              if not issubclass(c, HermesError) and f"{c.__module__}.{c.__qualname__}" not in NOT_ERRORS]
    assert strays == []
    assert all(isinstance(c.transient, bool) for c in classes if issubclass(c, HermesError))
    # the builtin bases callers catch are kept
    from hermes.data.dataset import DatasetError
    from hermes.netpolicy import UrlRefused
    from hermes.sandbox.base import EngineTimeout, ImageUnavailable, SandboxError
    assert issubclass(DatasetError, ValueError) and issubclass(UrlRefused, ValueError)
    assert (EngineTimeout.kind, EngineTimeout.transient) == ("engine time-out", True)
    assert issubclass(EngineTimeout, SandboxError) and not ImageUnavailable.transient


def test_an_instance_keeps_what_it_said_across_a_pickle():
    e = ModelError("model endpoint answered 429: slow down", kind="model endpoint 429", transient=True)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.kind, back.transient) == (ModelError, str(e), "model endpoint 429", True)
    from hermes.sandbox.base import ImageUnavailable
    img = pickle.loads(pickle.dumps(ImageUnavailable("img:1", "not pulled")))
    assert str(img) == "image not available: img:1 (not pulled)" and img.kind == "image unavailable"


def _model_error(base_url: str) -> ModelError:
    c = ModelClient(AgentSettings(model="m", base_url=base_url), "k", max_retries=0)
    try:
        with pytest.raises(ModelError) as caught:
            c.complete([{"role": "user", "content": script({"error": 400}) + " hi"}], [])
        return caught.value
    finally:
        c.close()


def test_the_model_errors_kind_is_the_one_its_text_was_grouped_by():
    # the same groups and the same requeue decisions for new entries as for old ones
    with MockLLM(fail_first=1, error_status=429) as server:
        rate_limited = _model_error(server.base_url)
    with MockLLM() as server:
        refused = _model_error(server.base_url)
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    unreachable = _model_error(f"http://127.0.0.1:{port}/v1")
    for e, kind, transient in ((rate_limited, "model endpoint 429", True), (refused, "model endpoint 400", False),
                               (unreachable, "model endpoint connection failed", True)):
        assert of_exception(e) == classify(str(e)) == classify(None, kind, transient)
        assert (e.kind, e.transient) == (kind, transient)


OLD_LINE = {"prompt_index": 0, "conversations": [], "metadata": {}, "completed": False, "partial": False,
            "api_calls": 1, "toolsets_used": [], "tool_stats": {}, "tool_error_counts": {},
            "hermes": {"key": "k0", "status": "failed", "error": "Docker engine too slow: create waited 30s",
                       "usage": {}, "elapsed": 1.0, "sandbox_wait": None, "hallucinated_tools": [],
                       "reasoning": {}, "aux_usage": {}, "files": [], "attempt": 1, "requeued": False,
                       "worker": "h:1"}}


def test_an_old_line_without_a_kind_still_loads_and_is_grouped_by_its_text():
    block = HermesBlock.model_validate(OLD_LINE["hermes"])
    assert (block.error_kind, block.error_transient) == (None, None)
    assert "error_kind" not in block.model_dump() and "error_transient" not in block.model_dump()
    assert classify(block.error, block.error_kind, block.error_transient) == classify(block.error)
    assert classify(block.error).kind == "engine time-out" and classify(block.error).transient


def test_a_recorded_kind_wins_over_the_text_and_is_written_beside_it():
    new = {**OLD_LINE["hermes"], "key": "k1", "error": "sandbox container 0123456789ab is gone: no such container",
           "error_kind": "sandbox lost", "error_transient": False}
    block = HermesBlock.model_validate(new)
    assert block.model_dump(mode="json") == new  # written as read: kind and transience beside the text
    # the text alone says "sandbox lost" too; a kind of its own is grouped under its name
    assert group([(block.error, block.error_kind), (block.error, "my kind"), OLD_LINE["hermes"]["error"]]) == {
        "sandbox lost": {"count": 1, "example": block.error},
        "my kind": {"count": 1, "example": block.error},
        "engine time-out": {"count": 1, "example": OLD_LINE["hermes"]["error"]}}


def test_a_journal_of_old_and_new_lines_merges(tmp_path):
    from hermes.run.merge import merge

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_name": "run", "total_prompts": 2}))
    new = json.loads(json.dumps(OLD_LINE))
    new["prompt_index"], new["hermes"]["key"] = 1, "k1"
    new["hermes"].update(error="model endpoint answered 500: boom", error_kind="model endpoint 500",
                         error_transient=True)
    with open(run / "batch_0.jsonl", "wb") as f:
        f.write(journal.encode(OLD_LINE) + journal.encode(new))
    stats = merge(run)
    assert stats["prompts_failed"] == 2
    assert {k: g["count"] for k, g in stats["failure_reasons"].items()} == {"engine time-out": 1,
                                                                            "model endpoint 500": 1}
