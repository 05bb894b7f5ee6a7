"""The product's sandbox images, built here.

* ``hermes-sandbox:bookworm`` (DEFAULT_TAG, the default image): Debian bookworm with python3
  (pip, venv), git, curl, ca-certificates, procps and the usual command-line tools
  (hermes/sandbox/debian.py). From deployments/sandbox/Dockerfile where the engine can pull its
  base image, else by debootstrap from this machine's own Debian mirror (about 90 s, once).
* ``hermes-sandbox-mini:latest`` (MINI_TAG): FROM scratch + static busybox, about a second to
  build, no Python (hermes/sandbox/busybox.py): for tests and benchmarks that want it.

An image is built once: `ensure` leaves one alone that carries its recipe's label.

    python -m hermes.sandbox.image build [--tag T] [--recipe auto|registry|offline|busybox]
    python -m hermes.sandbox.image ensure [--tag T]      # build only when missing
    python -m hermes.sandbox.image cleanup [--run NAME] [--all] [--dry-run]
                                                        # containers of runs no longer alive
"""
from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

import docker
from docker.errors import DockerException, ImageNotFound

from hermes.sandbox import busybox, debian
from hermes.sandbox.base import DEFAULT_IMAGE, MINI_IMAGE, SandboxError

log = logging.getLogger(__name__)

DEFAULT_TAG = DEFAULT_IMAGE
MINI_TAG = MINI_IMAGE
RECIPE_LABEL = "hermes-batch.image.recipe"
#: the product's own images: what recipes may have made each (ensure builds the first that can)
PRODUCT_IMAGES = {DEFAULT_TAG: debian.RECIPES, MINI_TAG: (busybox.RECIPE,)}
RECIPES = ("auto", "registry", "offline", "busybox")


def _client(client: docker.DockerClient | None) -> docker.DockerClient:
    if client is not None:
        return client
    from hermes.sandbox.docker.engine import get_client

    return get_client()


def recipe_of(tag: str, client: docker.DockerClient | None = None) -> str | None:
    """The recipe label of image `tag` ("" for an image without one), None when it is absent."""
    try:
        cfg = _client(client).api.inspect_image(tag).get("Config") or {}
    except ImageNotFound:
        return None
    except DockerException as e:
        raise SandboxError(f"cannot check image {tag}: {e}") from e
    return (cfg.get("Labels") or {}).get(RECIPE_LABEL, "")


def _registry_answers(client: docker.DockerClient, timeout: float = 60.0) -> bool:
    from hermes.sandbox.docker.engine import _pull

    reason = _pull(client, debian.BASE_IMAGE, timeout)
    if reason:
        log.info("no registry answers (%s): building the Debian image offline", reason)
    return reason is None


def build(tag: str = DEFAULT_TAG, recipe: str = "auto", *, client: docker.DockerClient | None = None) -> str:
    """Build `tag` with `recipe` (auto: busybox for the mini tag, else the Dockerfile where a
    registry answers, else debootstrap); returns the image id."""
    client = _client(client)
    if recipe == "auto":
        recipe = "busybox" if tag == MINI_TAG else "registry" if _registry_answers(client) else "offline"
    started = time.monotonic()
    if recipe == "busybox":
        image_id = busybox.build(tag, client)
    elif recipe == "registry":
        image_id = debian.build_registry(tag, client)
    elif recipe == "offline":
        image_id = debian.build_offline(tag, client)
    else:
        raise SandboxError(f"unknown image recipe {recipe!r}: one of {', '.join(RECIPES)}")
    log.info("built %s (%s recipe) in %.1fs", tag, recipe, time.monotonic() - started)
    return image_id


_ensure_lock = threading.Lock()


def ensure_image_built(tag: str, *, client: docker.DockerClient | None = None) -> str:
    """Return `tag`, building it first when it is one of the product's images and the engine has
    none made by one of its recipes (another image of that name is rebuilt: e.g. the busybox
    image that was once the default)."""
    client = _client(client)
    wanted = PRODUCT_IMAGES.get(tag)
    if wanted is None:
        raise SandboxError(f"{tag} is not one of the images built here ({', '.join(PRODUCT_IMAGES)})")
    with _ensure_lock:
        found = recipe_of(tag, client)
        if found in wanted:
            return tag
        if found is not None:
            log.warning("image %s exists but was not made by one of its recipes (%s): rebuilding it", tag,
                        found or "no recipe label")
        build(tag, client=client)
        return tag


def ensure_default_image(tag: str = DEFAULT_TAG, *, client: docker.DockerClient | None = None) -> str:
    """The default image (or another product image `tag`), built when missing."""
    return ensure_image_built(tag, client=client)


def ensure_mini_image(*, client: docker.DockerClient | None = None) -> str:
    return ensure_image_built(MINI_TAG, client=client)


def _cleanup_command(run: str | None, everything: bool, dry_run: bool) -> int:
    from hermes.sandbox import SandboxSettings, backend_names, get_backend

    # every backend whose sandboxes can outlive a crash (docker's containers, runc's sandboxes)
    for name in backend_names():
        _cleanup_backend(get_backend(SandboxSettings(backend=name)), run, everything, dry_run)
    return 0


def _cleanup_backend(backend, run: str | None, everything: bool, dry_run: bool) -> None:
    found = backend.leftovers(run)
    gone = [c for c in found if everything or c.alive is False]
    kept = [c for c in found if c not in gone]
    for c in gone:
        state = {False: "owner dead", True: "owner alive", None: "owner unknown"}[c.alive]
        print(f"{'would remove' if dry_run else 'removing'} {c.name}  run={c.run}  owner={c.owner or '?'} ({state})")
    if dry_run:
        print(f"would remove {len(gone)} container(s)")
    else:
        print(f"removed {backend.remove(gone)} container(s)")
    if kept:
        print(f"kept {len(kept)} container(s) of live runs or of owners this host cannot check; --all removes them too")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hermes.sandbox.image", description="Build the hermes sandbox image.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build an image (again)")
    b.add_argument("--tag", default=DEFAULT_TAG)
    b.add_argument("--recipe", choices=RECIPES, default="auto",
                   help="auto (default): busybox for the mini tag; else the Dockerfile where a registry answers, "
                        "else debootstrap from this machine's Debian mirror")
    e = sub.add_parser("ensure", help="build only when the tag is missing (or not made by its recipe)")
    e.add_argument("--tag", default=DEFAULT_TAG)
    c = sub.add_parser("cleanup", help="remove containers left behind by hermes-batch runs that are no longer alive")
    c.add_argument("--run", default=None, help="only this run's containers")
    c.add_argument("--all", action="store_true",
                   help="also containers of live runs and of runs this host cannot check (another host)")
    c.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    started = time.monotonic()
    try:
        if args.cmd == "cleanup":
            return _cleanup_command(args.run, args.all, args.dry_run)
        elif args.cmd == "ensure":
            ensure_default_image(args.tag)
            print(f"{args.tag} ready ({time.monotonic() - started:.2f}s)")
        else:
            image_id = build(args.tag, args.recipe)
            print(f"{args.tag} {image_id} built in {time.monotonic() - started:.2f}s")
    except SandboxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
