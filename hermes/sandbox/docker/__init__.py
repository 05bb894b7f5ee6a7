"""The docker backend: one hardened container per prompt (the default, and the only backend
that isolates anything).

Its lifecycle, as the registry's interface names it:
    open_run     containers of dead invocations of the run removed; the limits this engine would
                 not apply found by a probe container (the run refused unless it accepts them);
                 SIGINT/SIGTERM made to remove the run's containers first (lifecycle.RunGuard)
    open         the image ensured (pulled within pull_timeout), a container created and started
    close        (the sandbox's) removal handed to background removers (removal.Removals)
    end_run      those removals drained; containers of the run this process made that no prompt
                 held (creates the engine finished after their time-out) swept
    cleanup      after a crash: containers whose owner process is dead (the next run's start,
                 `hermes-batch sandbox cleanup`, the API server's reaper)
and at interpreter exit, every container still open or queued goes (Removals.close_all).

The modules: sandbox.py (DockerSandbox), engine.py (client, gate, capabilities, images),
container.py (create arguments, limit probe), channel.py / link.py / output.py (the command
channel and reading a command's output), removal.py (leftovers, background removal). They are
imported when first needed, so choosing another backend costs no docker SDK import.
"""
from __future__ import annotations

import logging
import sys

from hermes.sandbox.base import Leftover, Sandbox, SandboxSpec, WeakerSandbox
from hermes.sandbox.registry import SandboxBackend, register

log = logging.getLogger(__name__)


@register
class DockerBackend(SandboxBackend):
    name = "docker"

    def ensure_image(self, image: str) -> None:
        from hermes.sandbox.docker.engine import ensure_image

        ensure_image(image, pull_timeout=self.settings.pull_timeout)

    def image_known(self, image: str) -> bool:
        from hermes.sandbox.docker.engine import image_known

        return image_known(image)

    def build_image(self, context: str, name: str, *, timeout: float, concurrency: int = 2) -> str:
        from hermes.sandbox.docker.build import build_image

        return build_image(context, name, timeout=timeout, concurrency=concurrency)

    def build_problems(self, context: str) -> list[str]:
        from hermes.sandbox.docker.build import build_problems

        return build_problems(context)

    def capacity(self):
        from hermes.sandbox.docker.engine import engine_capacity

        return engine_capacity()

    def open(self, spec: SandboxSpec) -> Sandbox:
        from hermes.sandbox.docker.sandbox import DockerSandbox

        return DockerSandbox(spec, self.settings)

    def check_limits(self, run_id: str | None = None) -> list[str]:
        from hermes.sandbox.docker.container import limit_problems

        problems = limit_problems(self.settings, run_id=run_id)
        if problems and not self.settings.allow_weaker_sandbox:
            raise WeakerSandbox(weaker_sandbox_message(problems))
        return problems

    def prepare_run(self, run_id: str) -> list[str]:
        accepted = super().prepare_run(run_id)
        if not self.settings.read_only:
            log.warning("sandbox.read_only is off: commands can write anywhere in their container, on the host's "
                        "disk, with no size limit")
        return accepted

    removes_own = True

    def remove_own(self, run_id: str) -> int:
        from hermes.sandbox.docker.removal import remove_own

        return remove_own(run_id)

    def drain(self, timeout: float | None = 60.0) -> bool:
        removal = sys.modules.get("hermes.sandbox.docker.removal")
        if removal is None:  # no docker sandbox was ever made here: nothing can be pending
            return True
        return removal.removals.drain(timeout)

    def leftovers(self, run_id: str | None = None, *, label: str | None = None) -> list[Leftover]:
        from hermes.sandbox.docker.removal import leftovers

        return leftovers(run_id, label=label)

    def remove(self, found: list[Leftover]) -> int:
        from hermes.sandbox.docker.removal import remove

        return remove(found)

    def available(self) -> bool:
        from hermes.sandbox.docker.engine import engine_available

        return engine_available()

    def ensure_default_image(self) -> str | None:
        from hermes.sandbox.image import PRODUCT_IMAGES, ensure_image_built

        if self.settings.image not in PRODUCT_IMAGES:
            return None  # a user's own image: pulled, never built here
        return ensure_image_built(self.settings.image)


def weaker_sandbox_message(problems: list[str]) -> str:
    listed = "".join(f"\n  - {p}" for p in problems)
    return ("the Docker engine would not apply these sandbox limits, so model-written commands would run "
            f"without them:{listed}\nFix the engine (e.g. enable the missing cgroup controller) or the settings, "
            "or accept weaker sandboxes with --sandbox_allow_weaker_sandbox (settings.sandbox.allow_weaker_sandbox = true).")
