"""Where the runc backend's sandboxes live on this host, who made them, and their removal.

    STATE/runc/           runc's own state (`runc --root`): ours apart from the Docker engine's
    STATE/boxes/NAME/     one sandbox: its config.json and owner.json (run, prompt, labels,
                          owner host:pid, when made); NAME names the owner's pid and the run too
    cgroups               /hermes-runc/NAME in each controller (cgroup v1) or the unified tree

A sandbox is removed by killing what its cgroup holds and removing the cgroup, runc's state
and its folder by hand (`runc delete --force` where that cannot be done: remove_box). A sandbox whose owner process
is dead (lifecycle.owner_alive) may be removed by anyone: the next run's start on this host,
whatever its run, and `hermes-batch sandbox cleanup`; a dead owner's reaper removes them at once
(reaper.py). Sandboxes still open at interpreter exit are removed then (Removals.close_all).
"""
from __future__ import annotations

import atexit
import concurrent.futures
import functools
import json
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from hermes.environment import read
from hermes.sandbox import lifecycle
from hermes.sandbox.runc import reaper
from hermes.sandbox.base import LABEL_OWNER, LABEL_PROMPT, LABEL_RUN, Leftover, SandboxSpec

log = logging.getLogger(__name__)

STATE = read("runc_state")  # HERMES_RUNC_STATE, once: the backend's modules share the paths
RUNC_ROOT = STATE / "runc"
BOXES = STATE / "boxes"
#: the cgroup parent of every sandbox (as Docker's are under /docker)
CGROUP_PARENT = "/hermes-runc"
CGROUP_FS = Path("/sys/fs/cgroup")


def runc(*args: str, timeout: float = 30.0, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(["runc", "--root", str(RUNC_ROOT), *args], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=timeout, **kw)


def _slug(text: str, n: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")[:n] or "x"


@functools.lru_cache(maxsize=1)
def host_tag() -> str:
    return _slug(socket.gethostname(), 20)


def new_name(spec: SandboxSpec) -> str:
    """hermes-HOST-PID-RUN-PROMPT-RANDOM: a runc container id (letters, digits, _ . + -)."""
    return (f"hermes-{host_tag()}-{os.getpid()}-{_slug(spec.run_label(), 24)}-{_slug(spec.prompt_label(), 16)}-"
            f"{secrets.token_hex(3)}")


def cgroup_path(name: str) -> str:
    return f"{CGROUP_PARENT}/{name}"


def cgroup_dirs(name: str) -> list[Path]:
    """The sandbox's cgroup folders that exist (one per v1 controller, or the unified one)."""
    rel = cgroup_path(name).lstrip("/")
    if (CGROUP_FS / "cgroup.controllers").exists():  # cgroup v2 only
        candidates = [CGROUP_FS / rel]
    else:
        candidates = [d / rel for d in CGROUP_FS.iterdir() if d.is_dir()]
    return [c for c in candidates if c.is_dir()]


def write_owner(box: Path, spec: SandboxSpec) -> None:
    labels = {**{str(k): str(v) for k, v in spec.labels.items()}, LABEL_RUN: spec.run_label(),
              LABEL_PROMPT: spec.prompt_label(), LABEL_OWNER: lifecycle.owner_label()}
    (box / "owner.json").write_text(json.dumps({"labels": labels, "created": time.time()}))


def _read_owner(box: Path) -> tuple[dict, float | None]:
    try:
        data = json.loads((box / "owner.json").read_text())
        return dict(data.get("labels") or {}), float(data["created"])
    except (OSError, ValueError, KeyError, TypeError):
        pid = box.name.split("-")[2] if box.name.count("-") >= 2 else ""
        return {LABEL_OWNER: f"{socket.gethostname()}:{pid}"}, None  # made before its owner file was


def _has(labels: dict, label: str) -> bool:
    key, eq, value = label.partition("=")
    return key in labels and (not eq or labels[key] == value)


def leftovers(run_id: str | None = None, *, label: str | None = None) -> list[Leftover]:
    """Every sandbox folder of this host's processes (`run_id`: that run's, and any whose owner is
    dead, whatever its run: nothing uses those), each with whether its owner lives."""
    try:
        boxes = [p for p in BOXES.iterdir() if p.name.startswith(f"hermes-{host_tag()}-")]
    except OSError:
        return []
    found = []
    for box in boxes:
        labels, created = _read_owner(box)
        if created is None:
            try:
                created = box.stat().st_mtime
            except OSError:
                continue
        if label is not None and not _has(labels, label):
            continue
        owner = labels.get(LABEL_OWNER, "")
        alive = owner_alive(owner, created)
        run = labels.get(LABEL_RUN, "")
        if run_id is None or run == run_id or alive is False:
            found.append(Leftover(id=str(box), name=box.name, run=run, owner=owner, alive=alive))
    return found


def owner_alive(owner: str, created: float) -> bool | None:
    return lifecycle.owner_alive(owner, created)


def remove_box(name: str) -> bool:
    """Remove one sandbox: its processes, runc's state, its cgroups, its folder. True when gone.

    By hand where it can be: every process of the sandbox is in its cgroup (the init's death
    takes the rest of its PID namespace with it), so once the cgroup is empty only folders are
    left, runc's state among them. That takes about 12 ms where `runc delete --force` took 110
    (bench/RUNC_REPORT.md), in a removal thread a run of fast prompts keeps busy. `runc delete`
    stays the way when no cgroup is found or something in it would not die.
    """
    dirs = cgroup_dirs(name)
    emptied = bool(dirs) and all([_kill_cgroup(d) for d in dirs])
    if emptied:
        for d in dirs:
            try:
                d.rmdir()
            except OSError:
                emptied = False
    if emptied:
        shutil.rmtree(RUNC_ROOT / name, ignore_errors=True)
    elif (RUNC_ROOT / name).exists():
        try:
            runc("delete", "--force", name)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("runc delete of %s failed: %s", name, e)
        for d in cgroup_dirs(name):  # a `runc run` killed half way leaves its cgroup to us
            _kill_cgroup(d)
            try:
                d.rmdir()
            except OSError:
                pass
    shutil.rmtree(BOXES / name, ignore_errors=True)
    gone = not (BOXES / name).exists() and not (RUNC_ROOT / name).exists()
    if gone:
        reaper.forget(name)
    return gone


def _kill_cgroup(d: Path) -> bool:
    """SIGKILL every process in cgroup folder `d`; True once it is empty (within half a second)."""
    try:
        pids = (d / "cgroup.procs").read_text().split()
    except OSError:
        return not d.exists()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError, PermissionError):
            pass
    pause, until = 0.0005, time.monotonic() + 0.5
    while True:
        try:
            if not (d / "cgroup.procs").read_text().strip():
                return True
        except OSError:
            return not d.exists()
        if time.monotonic() > until:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def remove(found: list[Leftover]) -> int:
    return sum(remove_box(Path(f.id).name) for f in found)


class Removals:
    """Sandboxes this process opened and those it closed in the background. One thread removes
    closed ones in turn (a prompt's slot is free before its sandbox is gone); at interpreter exit
    every one still open or queued is removed."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="runc-removal")
        self._lock = threading.Lock()
        self._open: dict[str, str] = {}   # name -> run
        self._pending: set[concurrent.futures.Future] = set()
        atexit.register(self.close_all)

    def opened(self, name: str, run: str) -> None:
        with self._lock:
            self._open[name] = run

    def closed(self, name: str, wait: bool) -> None:
        if wait:
            remove_box(name)
            with self._lock:
                self._open.pop(name, None)
            return
        future = self._pool.submit(self._remove, name)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _remove(self, name: str) -> None:
        remove_box(name)
        with self._lock:
            self._open.pop(name, None)

    def _done(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._pending.discard(future)

    def of_run(self, run_id: str) -> list[str]:
        with self._lock:
            return [n for n, r in self._open.items() if r == run_id]

    def drain(self, timeout: float | None) -> bool:
        with self._lock:
            pending = list(self._pending)
        return not concurrent.futures.wait(pending, timeout).not_done

    def close_all(self) -> None:
        self.drain(30.0)
        with self._lock:
            names = list(self._open)
        for name in names:
            self._remove(name)


removals = Removals()


def remove_own(run_id: str) -> int:
    """Every sandbox of `run_id` this process made (the run's stop and end): how many went."""
    me = lifecycle.owner_label()
    mine = [f for f in leftovers(run_id) if f.run == run_id and f.owner == me]
    return remove(mine)
