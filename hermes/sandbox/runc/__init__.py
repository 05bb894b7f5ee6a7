"""The runc backend (`--sandbox_backend runc`): each prompt's sandbox run by runc directly, as
the Docker engine would run it, without the engine's per-container work (create, start, exec,
remove through dockerd and containerd). Images still come from the engine's store, unpacked
once per image id (rootfs.py); the hardening is the docker backend's (spec.py).

Its lifecycle, as the registry's interface names it:
    open_run     dead owners' sandboxes on this host removed (whatever their run); the limits
                 this host would not apply found (the run refused unless it accepts them);
                 SIGINT/SIGTERM made to remove the run's sandboxes first (lifecycle.RunGuard)
    open         the image's root ensured, `runc run` of a bundle whose init is the channel
    close        `runc delete --force`, cgroup and folder gone (in the background with wait=False)
    end_run      those removals drained; any sandbox of the run this process made swept
    cleanup      sandboxes whose owner process is dead (state.py)

The modules: sandbox.py (RuncSandbox), pipes.py (the init's channel), spec.py (config.json),
rootfs.py (image roots, the engine's seccomp section), state.py (folders, leftovers, removal),
limits.py (which limits this host applies).
"""
from __future__ import annotations

import logging
import shutil
import sys

from hermes.sandbox.base import Leftover, Sandbox, SandboxError, SandboxSpec, WeakerSandbox
from hermes.sandbox.registry import SandboxBackend, register

log = logging.getLogger(__name__)


@register
class RuncBackend(SandboxBackend):
    name = "runc"
    slow_to_open = True  # a `runc run` is some 30 ms: worth starting while the model thinks

    def ensure_image(self, image: str) -> None:
        from hermes.sandbox.runc.rootfs import image_root

        image_root(image, self.settings)

    def image_known(self, image: str) -> bool:
        from hermes.sandbox.runc import rootfs

        return rootfs.known(image)

    def open(self, spec: SandboxSpec) -> Sandbox:
        from hermes.sandbox.runc.limits import seccomp_or_none
        from hermes.sandbox.runc.sandbox import RuncSandbox

        return RuncSandbox(spec, self.settings, seccomp_or_none(self.settings))

    def check_limits(self, run_id: str | None = None) -> list[str]:
        from hermes.sandbox.runc.limits import limit_problems

        problems = limit_problems(self.settings)
        if problems and not self.settings.allow_weaker_sandbox:
            listed = "".join(f"\n  - {p}" for p in problems)
            raise WeakerSandbox("runc on this host would not apply these sandbox limits, so model-written commands "
                                f"would run without them:{listed}\nFix the host (e.g. mount the missing cgroup "
                                "controller) or the settings, or accept weaker sandboxes with "
                                "--sandbox_allow_weaker_sandbox.")
        return problems

    def prepare_run(self, run_id: str) -> list[str]:
        if not self.available():
            raise SandboxError("the runc backend needs runc on PATH and root (bash deployments/bootstrap.sh installs runc)")
        return super().prepare_run(run_id)

    removes_own = True

    def remove_own(self, run_id: str) -> int:
        from hermes.sandbox.runc.state import remove_own

        return remove_own(run_id)

    def drain(self, timeout: float | None = 60.0) -> bool:
        state = sys.modules.get("hermes.sandbox.runc.state")
        return True if state is None else state.removals.drain(timeout)

    def leftovers(self, run_id: str | None = None, *, label: str | None = None) -> list[Leftover]:
        from hermes.sandbox.runc.state import leftovers

        return leftovers(run_id, label=label)

    def remove(self, found: list[Leftover]) -> int:
        from hermes.sandbox.runc.state import remove

        return remove(found)

    def available(self) -> bool:
        import os

        return shutil.which("runc") is not None and os.geteuid() == 0

    def ensure_default_image(self) -> str | None:
        from hermes.sandbox.image import PRODUCT_IMAGES, ensure_image_built

        if self.settings.image not in PRODUCT_IMAGES:
            return None
        return ensure_image_built(self.settings.image)
