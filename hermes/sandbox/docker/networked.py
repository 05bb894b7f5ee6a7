"""A prompt's container as it is now, in a new container with the network: a task's verifier's.

--verifier_network gives a task's tests (tests/test.sh) the network while the agent had none.
Connecting the agent's own container would hand the network to whatever the agent left running
there too, so the verifier gets a container of its own instead: the agent's one committed (its
files, as the agent left them; none of its processes), started with the run's hardening and
labels and only the network added. The committed image is removed with that container.
"""
from __future__ import annotations

import secrets
from dataclasses import replace
from typing import TYPE_CHECKING

from docker.errors import APIError, DockerException, NotFound

from hermes.sandbox.base import SandboxError

if TYPE_CHECKING:
    from hermes.sandbox.docker.sandbox import DockerSandbox

#: repository of the committed images (one per verifier, removed after it)
REPOSITORY = "hermes-verifier"


def networked_copy(box: "DockerSandbox", sandbox_class: type) -> "DockerSandbox":
    """A sandbox from `box`'s container as it is now, with the network; close it to remove both."""
    if not box.container_id:
        raise SandboxError("the prompt's sandbox has no container to give its verifier")
    try:
        image = box.lifecycle_api().commit(box.container_id, repository=REPOSITORY, tag=secrets.token_hex(6),
                                           pause=True)["Id"]
    except (APIError, DockerException) as e:
        raise SandboxError(f"cannot copy the sandbox for its verifier: {getattr(e, 'explanation', None) or e}") from e
    try:
        copy = sandbox_class(replace(box.spec, image=image), box.settings.model_copy(update={"network": True}),
                             client=box.client)
    except BaseException:
        _remove_image(box, image)
        raise
    close = copy.close

    def close_and_remove(wait: bool = True) -> None:
        close(wait=True)  # the image goes only once no container uses it
        _remove_image(box, image)

    copy.close = close_and_remove  # type: ignore[method-assign]
    return copy


def _remove_image(box: "DockerSandbox", image: str) -> None:
    try:
        box.client.api.remove_image(image, force=True, noprune=False)
    except NotFound:
        pass
    except (APIError, DockerException) as e:
        raise SandboxError(f"cannot remove the verifier's image {image[:19]}: {e}") from e
