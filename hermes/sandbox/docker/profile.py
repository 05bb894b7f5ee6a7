"""A task image's profile (base.TaskProfile) as the settings its container is made and used with.

The default profile (read-only root, tmpfs work space, nobody in /workspace, no capabilities)
cannot run a published task: its Dockerfile put its files in its WORKDIR, owned by its USER
(often root), and its tests write where they please. So such a container gets the image's own
USER and WORKDIR and a writable root, copy-on-write in the container's own layer and gone with
it; the rest of the hardening is the run's (container.py applies the capabilities).
"""
from __future__ import annotations

import logging

from hermes.sandbox.base import SandboxSettings, TaskProfile, resolve_cwd

log = logging.getLogger(__name__)


def task_settings(s: SandboxSettings, profile: TaskProfile, image_cfg: dict) -> SandboxSettings:
    """The run's settings with the image's user and work dir, a writable root and the task's limits."""
    update = {"user": str(image_cfg.get("User") or "0:0"), "read_only": False,
              "workdir": resolve_cwd(image_cfg.get("WorkingDir") or "/", "/")}
    if profile.memory:
        update["memory"] = profile.memory
    if profile.cpus:
        update["cpus"] = profile.cpus
    return s.model_copy(update=update)
