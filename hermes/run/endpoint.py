"""A run's side of its model endpoint: the check before the fan-out, a resume's sampling compared
with the run's, the breaker's verdict after it (hermes.model.preflight, .sampling, .breaker)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hermes.model.breaker import Breaker, EndpointDown
from hermes.model.client import resolve_api_key
from hermes.model.preflight import EndpointUnusable, check_endpoint
from hermes.model.sampling import changed
from hermes.run import rundir
from hermes.run.rundir import RunRefused
from hermes.settings import RunSettings

log = logging.getLogger(__name__)


class EndpointRefused(RunRefused, EndpointUnusable):
    """The endpoint check refused the run before anything ran."""


def checked(settings: RunSettings, api_key: str | None) -> RunSettings:
    """The settings to run with, once the endpoint was seen able to serve them (--check_endpoint);
    the model's context length filled in from /models where the endpoint says it and no flag did."""
    if not settings.check_endpoint or settings.dask_address:
        # On a Dask cluster the workers reach the endpoint from their machines with their own
        # keys (hermes.run.remote): what this process sees says nothing of it; their breakers watch.
        return settings
    try:
        info = check_endpoint(settings.base_url, settings.model, resolve_api_key(api_key))
    except EndpointUnusable as e:
        raise EndpointRefused(f"run '{settings.run_name}' refused: {e}") from None
    log.info("endpoint check: %s serves '%s'%s", settings.base_url, settings.model,
             f" (context {info.context_length} tokens)" if info.context_length else "")
    if settings.context_length is None and info.context_length:
        return settings.model_copy(update={"context_length": info.context_length})
    return settings


def warn_if_sampling_changed(settings: RunSettings) -> None:
    """A resume that samples differently from the run so far says so: its entries will mix two
    samplings (run.json keeps the latest). A warning, not a refusal: raising the temperature to
    get past prompts that failed is a fair thing to do, as long as it is known."""
    if not settings.resume:
        return
    before = (rundir.read_manifest(rundir.run_dir(settings)) or {}).get("settings") or {}
    diff = changed(before, settings)
    if diff:
        log.warning("resume of '%s' with different sampling settings: %s; the run's entries will mix both "
                    "(run.json keeps the latest settings)",
                    settings.run_name, ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items()))


def raise_if_down(breaker: Breaker, stats: dict[str, Any], run_path: Path, down: list[str]) -> None:
    """The breaker opened during the run, here or in a process that ran batches (`down`: what
    those said): end it with the reason (outputs were written)."""
    if not breaker.open and not down:
        return
    raise EndpointDown(
        f"the run stopped: the model endpoint failed every request for {breaker.seconds:g} s with no success "
        f"({breaker.reason or down[0]}). The prompts not done are not marked failed; outputs were written to "
        f"{Path(run_path).resolve()}. Fix the endpoint, then run again with --resume (resume=true).", stats)
