"""Removing containers: this product's leftovers, cleanup of dead runs' ones, and the background
removal of closed sandboxes.

close(wait=False) leaves the removal to background threads; drain_removals() waits for them,
and exit removes whatever is left, open sandboxes included.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker
import requests
from docker.errors import DockerException, NotFound

from hermes.sandbox import lifecycle
from hermes.sandbox.base import LABEL_OWNER, LABEL_RUN, SandboxError, SandboxSettings
from hermes.sandbox.engine import _engine_call, _gate, _lifecycle_client, get_client

if TYPE_CHECKING:
    from hermes.sandbox.docker import DockerSandbox

log = logging.getLogger(__name__)

#: the open sandboxes (DockerSandbox adds and discards itself), for exit to remove
_live_lock = threading.Lock()
_live: set["DockerSandbox"] = set()


# --------------------------------------------------------------------------- leftovers


@dataclass(frozen=True)
class Leftover:
    id: str
    name: str
    run: str
    owner: str
    alive: bool | None  # is its owner process still running? None: cannot tell (another host, no label)


def leftovers(run_id: str | None = None, *, client: docker.DockerClient | None = None) -> list[Leftover]:
    """This product's containers (every run's, or one run's), each with whether its owner lives."""
    client = client or get_client()
    label = LABEL_RUN if run_id is None else f"{LABEL_RUN}={run_id}"
    try:
        found = client.api.containers(all=True, filters={"label": label})
    except DockerException as e:
        raise SandboxError(f"cannot list containers: {e}") from e
    out = []
    for c in found:
        labels = c.get("Labels") or {}
        owner = labels.get(LABEL_OWNER, "")
        out.append(Leftover(id=c["Id"], name=(c.get("Names") or ["/?"])[0].lstrip("/"), run=labels.get(LABEL_RUN, ""),
                            owner=owner, alive=lifecycle.owner_alive(owner, c.get("Created"))))
    return out


def remove(containers: list[Leftover] | list[str], *, client: docker.DockerClient | None = None) -> int:
    """Force-remove containers (and their anonymous volumes), a few at once. Returns how many went."""
    client = client or get_client()
    ids = [c.id if isinstance(c, Leftover) else c for c in containers]
    if not ids:
        return 0
    with ThreadPoolExecutor(max_workers=min(8, len(ids)), thread_name_prefix="sandbox-remove") as pool:
        return sum(pool.map(lambda cid: _remove(client, cid), ids))


def _remove(client: docker.DockerClient, cid: str, settings: SandboxSettings | None = None) -> bool:
    """Force-remove one container. With `settings`, through the engine gate and its time limit
    (a prompt's own container); without, directly (cleanup of leftovers, signal handlers)."""
    try:
        if settings is None:
            client.api.remove_container(cid, force=True, v=True)
        else:
            with _engine_call(f"remove of {cid[:12]}", settings):
                _lifecycle_client(client, settings.engine_timeout).api.remove_container(cid, force=True, v=True)
        return True
    except NotFound:
        return False
    except (DockerException, SandboxError, requests.exceptions.RequestException) as e:
        log.warning("could not remove sandbox container %s: %s", cid[:12], e)
        return False


# --------------------------------------------------------------------------- background removal

#: threads removing closed prompts' containers, so that a prompt's slot never waits for the engine
REMOVER_THREADS = 3
#: removals queued beyond this are done by the closing thread itself: back-pressure, not a backlog
MAX_PENDING_REMOVALS = 64

_removals: "queue.Queue[tuple[docker.DockerClient, str, SandboxSettings]]" = queue.Queue()
_pending_cond = threading.Condition()
_pending: set[str] = set()
_removers: list[threading.Thread] = []


def _remove_later(client: docker.DockerClient, cid: str, settings: SandboxSettings) -> None:
    """Hand a container to the background removers; False-free: it is removed either way."""
    with _pending_cond:
        if len(_pending) >= MAX_PENDING_REMOVALS:
            queued = False
        else:
            queued = True
            _pending.add(cid)
            if len(_removers) < REMOVER_THREADS:
                t = threading.Thread(target=_remover_loop, name=f"sandbox-remover-{len(_removers)}", daemon=True)
                _removers.append(t)
                t.start()
    if queued:
        _removals.put((client, cid, settings))
    else:
        _remove(client, cid, settings)


def _remover_loop(block: bool = True) -> None:
    while True:
        try:
            client, cid, settings = _removals.get(block=block)
        except queue.Empty:
            return
        try:
            _remove(client, cid, settings)
        finally:
            with _pending_cond:
                _pending.discard(cid)
                _pending_cond.notify_all()


def pending_removals() -> int:
    """Containers closed but not yet removed."""
    with _pending_cond:
        return len(_pending)


def drain_removals(timeout: float | None = 60.0) -> bool:
    """Wait until every container closed so far is removed (at most `timeout` s; None: no bound).
    True when none is pending. Call at the end of a run: closing a sandbox only queues it."""
    # At a run's end nothing else needs the engine: clear the backlog with the whole engine gate,
    # not only the few standing removers (64 containers left by 64 workers took ~4 s with 3).
    helpers = max(0, _gate.limit - REMOVER_THREADS) if not _removals.empty() else 0
    for i in range(helpers):
        threading.Thread(target=_remover_loop, args=(False,), name=f"sandbox-drain-{i}", daemon=True).start()
    with _pending_cond:
        return _pending_cond.wait_for(lambda: not _pending, timeout)


def cleanup(run_id: str | None = None, *, include_live: bool = False,
            client: docker.DockerClient | None = None) -> int:
    """Remove the containers of runs that are no longer alive (every run's, or `run_id`'s).

    `include_live` removes the others too: those of live runs, and those whose owner this
    host cannot see (another host, or no owner label). Returns how many were removed.
    """
    gone = [c for c in leftovers(run_id, client=client) if include_live or c.alive is False]
    removed = remove(gone, client=client)
    if removed:
        log.info("removed %d leftover sandbox container(s)%s", removed, f" of run {run_id}" if run_id else "")
    return removed


def remove_own(run_id: str) -> int:
    """Remove every container this process made for `run_id`, on a client of its own, so that a
    signal handler never waits for a lock the interrupted main thread may hold."""
    client = docker.from_env(timeout=30)
    try:
        me = lifecycle.owner_label()
        return remove([c for c in leftovers(run_id, client=client) if c.owner == me], client=client)
    finally:
        client.close()


@atexit.register
def _close_all() -> None:
    """At exit, every container this process still has goes: those still open, those queued."""
    with _live_lock:
        live = list(_live)
    for sb in live:
        try:
            sb.close(wait=False)
        except Exception:  # noqa: BLE001
            pass
    if drain_removals(60.0):
        return
    with _pending_cond:  # the removers are stuck: try each once more from here
        left = list(_pending)
    for cid in left:
        try:
            _remove(get_client(), cid)
        except SandboxError:  # no engine: the next run's start-up removes them
            return
