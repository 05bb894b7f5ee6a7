"""Whether a finished run counts as a success: the share of its prompts that failed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hermes.errors import HermesError


class TooManyFailedPrompts(HermesError, RuntimeError):
    """More than `max_failed_share` of a run's prompts failed. The outputs were still written."""

    def __init__(self, message: str, stats: dict[str, Any] | None = None):
        super().__init__(message)
        self.stats = stats or {}  # the run's statistics, as written to statistics.json


def failed_share(stats: dict[str, Any]) -> float:
    total = stats.get("total_prompts") or 0
    return stats.get("prompts_failed", 0) / total if total else 0.0


def check_failed_share(stats: dict[str, Any], max_share: float, run_path: Path) -> None:
    """Raise TooManyFailedPrompts when the run's failed share passes the threshold."""
    share = failed_share(stats)
    if share > max_share:
        reasons = stats.get("failure_reasons") or {}
        kind = next(iter(reasons), None)
        top = f"{kind} (e.g. {reasons[kind].get('example')})" if kind else "unknown"
        raise TooManyFailedPrompts(
            f"{stats['prompts_failed']} of {stats['total_prompts']} prompts failed ({share:.0%}), more than "
            f"max_failed_share={max_share:g} allows. Outputs were still written to {Path(run_path).resolve()}. "
            f"Most common reason: {top}. Fix the cause, then run again with resume=true (--resume on the command line) "
            f"to retry the failed prompts.", stats)
