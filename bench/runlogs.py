"""What a measured run of ours left behind, read back: its log's phases, its journal's per-prompt times."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def ours_phases(log_path: Path, started: float, ended: float, times: dict[str, Any]) -> dict[str, float]:
    """Where our wall time went, from Prefect's log timestamps (HH:MM:SS.mmm, local time) and the
    model server's: launch -> (an ephemeral or first background server starting) -> flow run begins -> first model call ->
    last model call -> flow run finished -> process exit."""
    import datetime as dt

    marks: dict[str, float] = {}
    day = dt.datetime.fromtimestamp(started).date()
    pats = {"server_starting": "Starting temporary server", "flow_begins": "Beginning flow run",
            "flow_finished": "Finished in state"}
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    for line in lines:
        for key, pat in pats.items():
            if pat in line and (key != "flow_finished" or "Flow run" in line):
                try:
                    t = dt.datetime.combine(day, dt.time.fromisoformat(line[:12])).timestamp()
                except ValueError:
                    continue
                if key == "flow_finished" or key not in marks:
                    marks[key] = t
    out: dict[str, float] = {}
    first, last = times.get("first"), times.get("last")
    fb = marks.get("flow_begins")
    if "server_starting" in marks:
        out["launch_to_server_starting"] = marks["server_starting"] - started
        if fb:
            out["server_start"] = fb - marks["server_starting"]
    elif fb:
        out["launch_to_flow_begins"] = fb - started
    if fb and first:
        out["flow_begins_to_first_call"] = first - fb
    if first and last:
        out["first_to_last_call"] = last - first
    if last and "flow_finished" in marks:
        out["last_call_to_flow_finished"] = marks["flow_finished"] - last
        out["flow_finished_to_exit"] = ended - marks["flow_finished"]
    if first and last:  # every variant: what a user waits for before and after the model's work
        out["launch_to_first_call"] = first - started
        out["last_call_to_exit"] = ended - last
    return {k: round(v, 3) for k, v in out.items()}


def prompt_stats(run_dir: Path) -> dict[str, float]:
    """Per-prompt figures our journal records: seconds from start to entry (`elapsed`, container removal
    included) and seconds the first tool call waited for its container (`sandbox_wait`)."""
    out: dict[str, list[float]] = {"elapsed": [], "sandbox_wait": []}
    for f in run_dir.glob("batch_*.jsonl"):
        for line in open(f, "rb"):
            try:
                h = json.loads(line).get("hermes") or {}
            except ValueError:
                continue
            for k in out:
                if isinstance(h.get(k), (int, float)):
                    out[k].append(float(h[k]))
    res: dict[str, float] = {}
    for k, v in out.items():
        if v:
            v.sort()
            res[f"{k}_median"] = v[len(v) // 2]
            res[f"{k}_p90"] = v[min(len(v) - 1, int(len(v) * 0.9))]
    return res
