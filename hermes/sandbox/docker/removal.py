"""Removing containers: this product's leftovers, cleanup of dead runs' ones, and the background
removal of closed sandboxes (Removals, the one owner of that state).

close(wait=False) leaves the removal to background threads (Removals); its drain() waits for
them, and exit removes whatever is left, open sandboxes included.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from hermes.sandbox import lifecycle
from hermes.sandbox.base import LABEL_OWNER, LABEL_RUN, EngineTimeout, Leftover, SandboxError, SandboxSettings
from hermes.sandbox.docker.engine import engine_call, gate, get_client, lifecycle_client

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- leftovers


def leftovers(run_id: str | None = None, *, label: str | None = None,
              client: docker.DockerClient | None = None) -> list[Leftover]:
    """This product's containers (every run's, or one run's; only those carrying `label` if
    given), each with whether its owner lives."""
    client = client or get_client()
    labels = [LABEL_RUN if run_id is None else f"{LABEL_RUN}={run_id}"] + ([label] if label else [])
    try:
        found = client.api.containers(all=True, filters={"label": labels})
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
        return sum(pool.map(lambda cid: remove_one(client, cid), ids))


def remove_one(client: docker.DockerClient, cid: str, settings: SandboxSettings | None = None) -> bool:
    """Force-remove one container. With `settings`, through the engine gate and its time limit
    (a prompt's own container); without, directly (cleanup of leftovers, signal handlers)."""
    try:
        if settings is None:
            client.api.remove_container(cid, force=True, v=True)
        else:
            with engine_call(f"remove of {cid[:12]}", settings):
                lifecycle_client(client, settings.engine_timeout).api.remove_container(cid, force=True, v=True)
        return True
    except NotFound:
        return False
    except APIError as e:
        if e.status_code == 409 and "in progress" in str(e.explanation or e):
            return False  # the engine is removing it already (AutoRemove: its main process ended)
        log.warning("could not remove sandbox container %s: %s", cid[:12], e)
        return False
    except EngineTimeout as e:
        if settings is not None:
            # The gate or its time limit gave up (an engine slow right now), not the engine: the
            # container, and a command a stop waits to see end in it, would live on. Once more,
            # outside the gate, with the client's own time limit.
            log.info("removal of %s: %s; asking once more outside the engine gate", cid[:12], e)
            return remove_one(client, cid)
        log.warning("could not remove sandbox container %s: %s", cid[:12], e)
        return False
    except (DockerException, SandboxError, requests.exceptions.RequestException) as e:
        log.warning("could not remove sandbox container %s: %s", cid[:12], e)
        return False


# --------------------------------------------------------------------------- background removal

#: threads removing closed prompts' containers, so that a prompt's slot never waits for the engine
REMOVER_THREADS = 3
#: removals queued beyond this are done by the closing thread itself: back-pressure, not a backlog
MAX_PENDING_REMOVALS = 64


class Removals:
    """This process's containers from their creation to their removal: the open ones (for exit
    to remove) and the closed ones its background removers are still removing.

    The only holder of that state: a sandbox says opened()/closed(), and hands its container to
    remove_later(); drain() waits for the backlog; close_all() is the exit hook.
    """

    def __init__(self) -> None:
        self._live_lock = threading.Lock()
        self._live: set[Any] = set()  # open DockerSandboxes
        self._queue: "queue.Queue[tuple[docker.DockerClient, str, SandboxSettings]]" = queue.Queue()
        self._cond = threading.Condition()
        self._pending: set[str] = set()
        self._removers: list[threading.Thread] = []

    def opened(self, sandbox: Any) -> None:
        with self._live_lock:
            self._live.add(sandbox)

    def closed(self, sandbox: Any) -> None:
        with self._live_lock:
            self._live.discard(sandbox)

    def remove_later(self, client: docker.DockerClient, cid: str, settings: SandboxSettings) -> None:
        """Hand a container to the background removers; it is removed either way."""
        with self._cond:
            if len(self._pending) >= MAX_PENDING_REMOVALS:
                queued = False
            else:
                queued = True
                self._pending.add(cid)
                if len(self._removers) < REMOVER_THREADS:
                    t = threading.Thread(target=self._remover_loop, name=f"sandbox-remover-{len(self._removers)}",
                                         daemon=True)
                    self._removers.append(t)
                    t.start()
        if queued:
            self._queue.put((client, cid, settings))
        else:
            remove_one(client, cid, settings)

    def _remover_loop(self, block: bool = True) -> None:
        while True:
            try:
                client, cid, settings = self._queue.get(block=block)
            except queue.Empty:
                return
            try:
                remove_one(client, cid, settings)
            finally:
                with self._cond:
                    self._pending.discard(cid)
                    self._cond.notify_all()

    def pending(self) -> int:
        """Containers closed but not yet removed."""
        with self._cond:
            return len(self._pending)

    def drain(self, timeout: float | None = 60.0) -> bool:
        """Wait until every container closed so far is removed (at most `timeout` s; None: no bound).
        True when none is pending. Call at the end of a run: closing a sandbox only queues it."""
        # At a run's end nothing else needs the engine: clear the backlog with the whole engine gate,
        # not only the few standing removers (64 containers left by 64 workers took ~4 s with 3).
        helpers = max(0, gate.limit - REMOVER_THREADS) if not self._queue.empty() else 0
        for i in range(helpers):
            threading.Thread(target=self._remover_loop, args=(False,), name=f"sandbox-drain-{i}", daemon=True).start()
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def close_all(self) -> None:
        """At exit, every container this process still has goes: those still open, those queued."""
        with self._live_lock:
            live = list(self._live)
        for sb in live:
            try:
                sb.close(wait=False)
            except Exception:  # noqa: BLE001
                pass
        if self.drain(60.0):
            return
        with self._cond:  # the removers are stuck: try each once more from here
            left = list(self._pending)
        for cid in left:
            try:
                remove_one(get_client(), cid)
            except SandboxError:  # no engine: the next run's start-up removes them
                return


#: the process's one Removals: containers are process-wide, as the engine client is
removals = Removals()
atexit.register(removals.close_all)


def remove_own(run_id: str) -> int:
    """Remove every container this process made for `run_id`, on a client of its own, so that a
    signal handler never waits for a lock the interrupted main thread may hold."""
    client = docker.from_env(timeout=30)
    try:
        me = lifecycle.owner_label()
        return remove([c for c in leftovers(run_id, client=client) if c.owner == me], client=client)
    finally:
        client.close()
