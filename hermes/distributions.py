"""Toolset distributions of the reference system and the seeded Bernoulli sampler.

Each toolset is drawn independently with its own probability; if none is drawn, the single
most probable one is used. Draws are seeded by (seed, prompt content key), so a prompt gets the
same toolsets whatever its position in the dataset and however often the run resumes.
"""
from __future__ import annotations

import hashlib
import logging

log = logging.getLogger(__name__)

# Percent, as in the reference system (SPEC §1).
DISTRIBUTIONS: dict[str, dict[str, int]] = {
    "default": {"web": 100, "vision": 100, "image_gen": 100, "terminal": 100, "file": 100, "browser": 100},
    "image_gen": {"web": 55, "vision": 90, "image_gen": 90, "terminal": 45},
    "research": {"web": 90, "vision": 50, "terminal": 10, "browser": 70},
    "science": {"web": 94, "vision": 65, "image_gen": 15, "terminal": 94, "file": 94, "browser": 50},
    "development": {"web": 30, "vision": 10, "terminal": 80, "file": 80},
    "safe": {"web": 80, "vision": 60, "image_gen": 60, "browser": 70},
    "balanced": {"web": 50, "vision": 50, "image_gen": 50, "terminal": 50, "file": 50, "browser": 50},
    "minimal": {"web": 100},
    "terminal_only": {"terminal": 100, "file": 100},
    "terminal_web": {"web": 100, "terminal": 100, "file": 100},
    "creative": {"web": 30, "vision": 90, "image_gen": 90},
    "reasoning": {"web": 90, "terminal": 20, "file": 60},
    "browser_use": {"web": 80, "vision": 70, "browser": 100},
    "browser_only": {"browser": 100},
    "browser_tasks": {"vision": 12, "terminal": 15, "browser": 97},
    "terminal_tasks": {"web": 97, "vision": 50, "image_gen": 10, "terminal": 97, "file": 97, "browser": 75},
    "mixed_tasks": {"web": 35, "vision": 15, "image_gen": 15, "terminal": 92, "file": 92, "browser": 92},
}


class DistributionError(ValueError):
    pass


def usable(name: str, available: set[str]) -> dict[str, int]:
    """The distribution restricted to toolsets that have a backend here; says what it leaves out."""
    if name not in DISTRIBUTIONS:
        raise DistributionError(f"unknown distribution '{name}'; choose one of: {', '.join(DISTRIBUTIONS)}")
    dist = DISTRIBUTIONS[name]
    missing = sorted(t for t in dist if t not in available)
    kept = {t: p for t, p in dist.items() if t in available}
    if not kept:
        raise DistributionError(
            f"distribution '{name}' draws only toolsets with no configured backend here ({', '.join(missing)}); "
            f"available toolsets: {', '.join(sorted(available))}"
        )
    if missing:
        log.warning("distribution '%s': toolsets %s have no configured backend and are left out of sampling",
                    name, ", ".join(missing))
    return kept


def sample(dist: dict[str, int], seed: int, key: str) -> list[str]:
    """Independent Bernoulli draw per toolset; the most probable toolset when none is drawn."""
    chosen = [t for t, p in dist.items() if _uniform(seed, key, t) * 100 < p]
    if not chosen:
        chosen = [max(dist, key=lambda t: dist[t])]
    return chosen


def _uniform(seed: int, key: str, toolset: str) -> float:
    """A uniform draw in [0, 1) fixed by (seed, prompt, toolset): each toolset's draw is its own."""
    digest = hashlib.sha256(f"{seed}:{key}:{toolset}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def describe() -> str:
    """The distributions as a table, for --list_distributions."""
    toolsets = ["web", "vision", "image_gen", "terminal", "file", "browser"]
    width = max(map(len, DISTRIBUTIONS)) + 2
    lines = ["distribution".ljust(width) + "".join(t.rjust(10) for t in toolsets)]
    for name, dist in DISTRIBUTIONS.items():
        lines.append(name.ljust(width) + "".join((f"{dist[t]}%" if t in dist else "-").rjust(10) for t in toolsets))
    return "\n".join(lines)
