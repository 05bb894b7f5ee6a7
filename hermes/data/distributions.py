"""Toolset distributions of the reference system and the seeded Bernoulli sampler.

Each toolset is drawn independently with its own probability; if none is drawn, the single
most probable one is used. Draws are seeded by (seed, prompt content key), so a prompt gets the
same toolsets whatever its position in the dataset and however often the run resumes.
"""
from __future__ import annotations

import hashlib
import logging

from hermes.errors import HermesError

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


class DistributionError(HermesError, ValueError):
    pass


def register(name: str, dist: dict[str, int]) -> None:
    """Add a distribution (a toolset module of the user's own may add one that draws it)."""
    if name in DISTRIBUTIONS:
        raise DistributionError(f"distribution '{name}' already exists")
    bad = {t: p for t, p in dist.items() if not (isinstance(p, int) and 0 <= p <= 100)}
    if not dist or bad:
        raise DistributionError(f"distribution '{name}': probabilities must be integer percents 0-100, got {bad or dist}")
    DISTRIBUTIONS[name] = dict(dist)


def usable(name: str, available: set[str] | dict[str, str | None]) -> dict[str, int]:
    """The distribution restricted to toolsets that can run here; says what it leaves out and why.

    `available`: the toolsets that can run, or toolset -> None (can run) / the reason it cannot."""
    if name not in DISTRIBUTIONS:
        raise DistributionError(f"unknown distribution '{name}'; choose one of: {', '.join(DISTRIBUTIONS)}")
    reasons = available if isinstance(available, dict) else {t: None for t in available}
    ok = {t for t, why in reasons.items() if why is None}
    dist = DISTRIBUTIONS[name]
    missing = [t for t in dist if t not in ok]
    kept = {t: p for t, p in dist.items() if t in ok}

    def why(t: str) -> str:
        return f"{t} ({reasons.get(t) or 'no such toolset in this installation'})"

    if not kept:
        raise DistributionError(
            f"distribution '{name}' draws only toolsets that cannot run here: {'; '.join(map(why, missing))}. "
            f"Available toolsets: {', '.join(sorted(ok)) or 'none'}"
        )
    if missing:
        log.warning("distribution '%s': toolsets %s are not available here and are left out of sampling: %s",
                    name, ", ".join(sorted(missing)), "; ".join(map(why, missing)))
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


def toolset_columns(registered: list[str] | None = None) -> list[str]:
    """Every toolset a distribution names, in first-seen order, then registered ones no distribution names."""
    names: list[str] = []
    for dist in DISTRIBUTIONS.values():
        names += [t for t in dist if t not in names]
    return names + [t for t in registered or [] if t not in names]


def describe(available: dict[str, str | None] | None = None) -> str:
    """The distributions as a table, for --list_distributions; with `available` (toolset -> None
    or the reason it cannot run here, from hermes.tools.registry.availability) it says which
    toolsets this machine can run, and why not the others."""
    toolsets = toolset_columns(list(available or {}))
    width = max(map(len, DISTRIBUTIONS)) + 2
    col = max(10, *(len(t) + 2 for t in toolsets))
    lines = ["distribution".ljust(width) + "".join(t.rjust(col) for t in toolsets)]
    for name, dist in DISTRIBUTIONS.items():
        lines.append(name.ljust(width) + "".join((f"{dist[t]}%" if t in dist else "-").rjust(col) for t in toolsets))
    if available is not None:
        here = [t for t in toolsets if t in available and available[t] is None]
        lines += ["", "available here: " + (", ".join(here) or "none")]
        for t in toolsets:
            reason = available.get(t, "no such toolset in this installation")
            if reason:
                lines.append(f"not available: {t}: {reason}")
    return "\n".join(lines)
