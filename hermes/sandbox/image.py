"""The default sandbox image, `hermes-sandbox:latest`, built here.

Two recipes:

* offline (the default, for machines with no registry): ``FROM scratch`` plus the static
  busybox of the Debian package ``busybox-static`` (``/bin/busybox`` and its applets as
  symlinks), ``/etc/passwd`` and ``/etc/group`` with ``nobody`` (65534), ``/tmp`` and
  ``/workspace``. Built in memory with ``docker build`` in about a second. No Python.
* registry: ``deployments/sandbox/Dockerfile`` (``FROM debian:bookworm-slim`` with python3,
  coreutils, grep, findutils, ...), for users whose engine can pull.

    python -m hermes.sandbox.image build [--tag T] [--offline|--registry]
    python -m hermes.sandbox.image ensure [--tag T]      # build offline only when missing
    python -m hermes.sandbox.image cleanup [--run NAME] [--all] [--dry-run]
                                                        # containers of runs no longer alive
"""
from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import docker
from docker.errors import BuildError, DockerException, ImageNotFound

from hermes.sandbox.base import SandboxError

log = logging.getLogger(__name__)

DEFAULT_TAG = "hermes-sandbox:latest"
REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY_CONTEXT = REPO_ROOT / "deployments" / "sandbox"
INSTALL_HINT = ("a statically linked busybox is needed: apt-get install busybox-static "
                "(the plain 'busybox' package is dynamically linked and cannot run FROM scratch), "
                "or point HERMES_BUSYBOX at a static busybox binary")

OFFLINE_DOCKERFILE = """\
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
WORKDIR /workspace
USER 65534:65534
LABEL org.opencontainers.image.title="hermes-sandbox" \\
      hermes-batch.image.recipe="offline-busybox" \\
      hermes-batch.image.busybox="{version}"
CMD ["sleep", "2147483647"]
"""

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


# --------------------------------------------------------------------------- busybox

def _is_static_elf(path: str) -> bool:
    """True for an ELF executable without a program interpreter (PT_INTERP)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF":
                return False
            end = "<" if head[5] == 1 else ">"
            if head[4] == 2:
                phoff, = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                phoff, = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    for i in range(phnum):
        p_type, = struct.unpack_from(end + "I", table, i * phentsize)
        if p_type == 3:  # PT_INTERP: needs a dynamic loader
            return False
    return True


def find_static_busybox() -> str:
    """Path of a static busybox on this host, else SandboxError saying how to install one."""
    candidates = [os.environ.get("HERMES_BUSYBOX"), "/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")]
    seen = []
    for c in candidates:
        if c and c not in seen and os.path.isfile(c):
            seen.append(c)
            if _is_static_elf(c):
                return c
    found = f" (found only dynamically linked: {', '.join(seen)})" if seen else ""
    raise SandboxError(f"cannot build the offline sandbox image: {INSTALL_HINT}{found}")


def _applets(busybox: str) -> tuple[list[str], str]:
    """(applet paths relative to /, version string) as the binary itself reports them."""
    try:
        listing = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, timeout=30, check=True).stdout
        banner = subprocess.run([busybox], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"cannot run {busybox}: {e}") from e
    paths = sorted({p.strip().lstrip("/") for p in listing.splitlines() if p.strip()} - {"bin/busybox"})
    version = banner.splitlines()[0].strip() if banner else "busybox"
    return paths, version.replace('"', "'")


def offline_context(busybox: str | None = None) -> bytes:
    """The build context (a tar) of the offline image: Dockerfile + rootfs/."""
    busybox = busybox or find_static_busybox()
    applets, version = _applets(busybox)
    buf = io.BytesIO()
    now = int(time.time())

    def add_dir(tf: tarfile.TarFile, name: str, mode: int) -> None:
        ti = tarfile.TarInfo(name)
        ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, mode, now
        tf.addfile(ti)

    def add_file(tf: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode, ti.mtime = len(data), mode, now
        tf.addfile(ti, io.BytesIO(data))

    with tarfile.open(fileobj=buf, mode="w") as tf:
        add_file(tf, "Dockerfile", OFFLINE_DOCKERFILE.format(version=version).encode())
        dirs = {"rootfs", "rootfs/bin", "rootfs/etc", "rootfs/root", "rootfs/tmp", "rootfs/workspace",
                "rootfs/usr", "rootfs/usr/bin", "rootfs/usr/sbin", "rootfs/sbin", "rootfs/usr/local",
                "rootfs/usr/local/bin", "rootfs/var", "rootfs/home"}
        for a in applets:
            parts = ("rootfs/" + a).split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add("/".join(parts[:i]))
        modes = {"rootfs/tmp": 0o1777, "rootfs/workspace": 0o1777, "rootfs/root": 0o700}
        for d in sorted(dirs):
            add_dir(tf, d, modes.get(d, 0o755))
        add_file(tf, "rootfs/bin/busybox", Path(busybox).read_bytes(), 0o755)
        for a in applets:
            ti = tarfile.TarInfo("rootfs/" + a)
            ti.type, ti.linkname, ti.mode, ti.mtime = tarfile.SYMTYPE, "/bin/busybox", 0o777, now
            tf.addfile(ti)
        add_file(tf, "rootfs/etc/passwd", PASSWD.encode())
        add_file(tf, "rootfs/etc/group", GROUP.encode())
    return buf.getvalue()


# --------------------------------------------------------------------------- building

def _client(client: docker.DockerClient | None) -> docker.DockerClient:
    if client is not None:
        return client
    from hermes.sandbox.docker.engine import get_client

    return get_client()


def build_offline(tag: str = DEFAULT_TAG, *, client: docker.DockerClient | None = None) -> str:
    """Build the busybox image offline; returns the image id."""
    client = _client(client)
    context = offline_context()
    try:
        image, _ = client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag,
                                       rm=True, forcerm=True, pull=False)
    except BuildError as e:
        raise SandboxError(f"offline image build failed: {e.msg}") from e
    except DockerException as e:
        raise SandboxError(f"offline image build failed: {e}") from e
    log.info("built %s (%s) offline from static busybox", tag, image.short_id)
    return image.id


def build_registry(tag: str = DEFAULT_TAG, *, client: docker.DockerClient | None = None,
                   context_dir: Path = REGISTRY_CONTEXT) -> str:
    """Build deployments/sandbox/Dockerfile (needs a registry for its base image)."""
    client = _client(client)
    if not (context_dir / "Dockerfile").is_file():
        raise SandboxError(f"no Dockerfile at {context_dir}: the registry build needs the source checkout")
    try:
        image, _ = client.images.build(path=str(context_dir), tag=tag, rm=True, forcerm=True, pull=True)
    except BuildError as e:
        raise SandboxError(f"registry image build failed (is a registry reachable?): {e.msg}") from e
    except DockerException as e:
        raise SandboxError(f"registry image build failed: {e}") from e
    return image.id


_ensure_lock = threading.Lock()


def ensure_default_image(tag: str = DEFAULT_TAG, *, client: docker.DockerClient | None = None) -> str:
    """Return `tag`, building it offline first when the engine does not have it."""
    client = _client(client)
    with _ensure_lock:
        try:
            client.api.inspect_image(tag)
            return tag
        except ImageNotFound:
            pass
        except DockerException as e:
            raise SandboxError(f"cannot check image {tag}: {e}") from e
        started = time.monotonic()
        build_offline(tag, client=client)
        log.info("sandbox image %s was missing: built offline in %.2fs", tag, time.monotonic() - started)
        return tag


def _cleanup_command(run: str | None, everything: bool, dry_run: bool) -> int:
    from hermes.sandbox import get_backend

    backend = get_backend()  # the default settings' backend: the one whose sandboxes outlive a crash
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
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hermes.sandbox.image", description="Build the hermes sandbox image.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the image (offline by default)")
    b.add_argument("--tag", default=DEFAULT_TAG)
    how = b.add_mutually_exclusive_group()
    how.add_argument("--offline", dest="recipe", action="store_const", const="offline",
                     help="FROM scratch + static busybox; no registry needed (default)")
    how.add_argument("--registry", dest="recipe", action="store_const", const="registry",
                     help="deployments/sandbox/Dockerfile: Debian with python3; needs a registry")
    e = sub.add_parser("ensure", help="build offline only when the tag is missing")
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
            build = build_registry if args.recipe == "registry" else build_offline
            image_id = build(args.tag)
            print(f"{args.tag} {image_id} built in {time.monotonic() - started:.2f}s")
    except SandboxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
