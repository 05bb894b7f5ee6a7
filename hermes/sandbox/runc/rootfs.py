"""The runc backend's images: a Docker image unpacked once into a root folder every sandbox of
it shares read-only, and the seccomp section the Docker engine itself makes of its default
profile.

    image_root(image, settings) -> ImageRoot   the image's id, its unpacked root, its config
    docker_seccomp() -> dict                   the OCI seccomp section Docker applies to a
                                               container with every capability dropped

A root is kept under CACHE/<image id>/rootfs: unpacked from `docker export` of a container
made (never started) from the image, into a temporary folder renamed into place, under a file
lock, so concurrent runs unpack it once and a killed unpack leaves only a temporary folder,
which the next unpack of that image removes. The image comes from the local Docker image
store, pulled by the engine when missing (as the docker backend does).
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from hermes.environment import read
from hermes.sandbox.base import ImageUnavailable, SandboxError, SandboxSettings

#: where unpacked image roots (and the captured seccomp section) are kept
CACHE = read("runc_cache")  # HERMES_RUNC_CACHE, once: the backend's modules share the path
#: folders every sandbox mounts a tmpfs on: made in the root at unpack time (the root is read-only after)
MOUNT_POINTS = ("tmp", "workspace", "dev", "proc", "sys")


@dataclass(frozen=True)
class ImageRoot:
    image: str
    id: str              # the image's id, "sha256:..."
    rootfs: Path         # the unpacked root, shared read-only
    config: dict         # the image's Config (Env, WorkingDir, Volumes, ...)


_lock = threading.Lock()
_known: dict[str, ImageRoot] = {}
_key_locks: dict[str, threading.Lock] = {}


def known(image: str) -> bool:
    return image in _known


def image_root(image: str, settings: SandboxSettings) -> ImageRoot:
    """The image's unpacked root, unpacked now if this host has none yet. Raises ImageUnavailable."""
    found = _known.get(image)
    if found is not None:
        return found
    with _lock:
        key_lock = _key_locks.setdefault(image, threading.Lock())
    with key_lock:
        if image in _known:
            return _known[image]
        from docker.errors import DockerException

        from hermes.sandbox.docker.engine import get_client, image_config

        client = get_client()
        config = image_config(image, settings.pull_timeout, client)  # pulled here if missing
        try:
            image_id = client.api.inspect_image(image)["Id"]
        except DockerException as e:
            raise ImageUnavailable(image, str(e)) from e
        folder = CACHE / image_id.replace(":", "-")
        rootfs = folder / "rootfs"
        if not rootfs.is_dir():
            _unpack(client, image, folder)
        _known[image] = ImageRoot(image, image_id, rootfs, config)
        return _known[image]


def _unpack(client, image: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process unpacking the same image: wait for it
        if (folder / "rootfs").is_dir():
            return
        for stale in folder.glob("unpack-*"):  # a killed unpack's half
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix="unpack-", dir=folder))
        cid = client.api.create_container(image, command=["true"], labels={"hermes-batch.runc-export": "1"})["Id"]
        try:
            tar = subprocess.Popen(["tar", "-x", "--numeric-owner", "-C", str(work)], stdin=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
            try:
                for chunk in client.api.export(cid):
                    tar.stdin.write(chunk)
            finally:
                tar.stdin.close()
            if tar.wait() != 0:
                raise SandboxError(f"cannot unpack image {image}: {tar.stderr.read().decode(errors='replace')[:300]}")
        finally:
            client.api.remove_container(cid, force=True)
        for point in MOUNT_POINTS:
            (work / point).mkdir(exist_ok=True)
        os.chmod(work, 0o755)
        work.rename(folder / "rootfs")


_prepared: set[tuple[Path, str]] = set()


def prepare_mount_points(root: ImageRoot, points: list[str]) -> None:
    """Make each tmpfs mount point a folder of mode 1777 in the shared root. runc gives a tmpfs
    the mode of the folder it covers, not the mount's mode= option, and would make a missing one
    0755 (root's: the sandbox user could not write there). A path through a symlink of the image
    is refused: followed on the host, it could lead out of the root."""
    for point in points:
        if (root.rootfs, point) in _prepared:
            continue
        at = root.rootfs
        for part in [p for p in point.split("/") if p]:
            at = at / part
            try:
                info = os.lstat(at)
            except FileNotFoundError:
                os.mkdir(at, 0o755)
                info = os.lstat(at)
            if not os.path.isdir(at) or os.path.islink(at):
                raise SandboxError(f"{point} in image {root.image} passes through a symlink or a file: "
                                   "it cannot be a writable work space there")
        if info.st_mode & 0o7777 != 0o1777:
            os.chmod(at, 0o1777)
        _prepared.add((root.rootfs, point))


# --------------------------------------------------------------------------- seccomp

_seccomp: dict | None = None
#: the one syscall ABI a sandbox may use, by host machine: the engine's section also allows the
#: 32-bit ones (i386 and x32 on x86_64, arm on aarch64). Compiling the filter for three ABIs was a
#: quarter of a sandbox's start, in runc's init (libseccomp; bench/RUNC_REPORT.md); a 32-bit
#: program is refused with SIGSYS instead, as gVisor, which runs none, refuses it. Other
#: machines keep the engine's list.
NATIVE_ARCH = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64", "arm64": "SCMP_ARCH_AARCH64",
               "ppc64le": "SCMP_ARCH_PPC64LE", "s390x": "SCMP_ARCH_S390X"}
#: where the Docker engine's containerd keeps a running container's OCI bundle
BUNDLES = ("/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/{id}/config.json",
           "/run/containerd/io.containerd.runtime.v2.task/moby/{id}/config.json")


def docker_seccomp() -> dict:
    """The seccomp section the Docker engine generates from its default profile for a container
    with every capability dropped, read from that container's OCI bundle (so it is the engine's
    own, for this kernel and architecture, fetched from nowhere), for the native ABI only
    (NATIVE_ARCH). Kept in CACHE per engine version, as the engine gave it."""
    global _seccomp
    if _seccomp is not None:
        return _seccomp
    with _lock:
        if _seccomp is not None:
            return _seccomp
        from hermes.sandbox.base import MINI_IMAGE
        from hermes.sandbox.docker.engine import get_client

        client = get_client()
        version = client.version().get("Version", "unknown")
        cached = CACHE / f"seccomp-docker-{version}-{platform.machine()}.json"
        if cached.is_file():
            section = json.loads(cached.read_text())
        else:
            section = _capture(client, MINI_IMAGE)
            CACHE.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(section))
            tmp.rename(cached)
        _seccomp = native_only(section)
        return _seccomp


def native_only(section: dict) -> dict:
    native = NATIVE_ARCH.get(platform.machine())
    if native is None or native not in section.get("architectures", [native]):
        return section
    return dict(section, architectures=[native])


def _capture(client, image: str) -> dict:
    from hermes.sandbox.docker.engine import ensure_image

    ensure_image(image, pull_timeout=120.0, client=client)
    hc = client.api.create_host_config(network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"])
    cid = client.api.create_container(image, command=["sleep", "30"], host_config=hc,
                                      labels={"hermes-batch.runc-seccomp": "1"})["Id"]
    try:
        client.api.start(cid)
        for _ in range(50):
            found = [p for pattern in BUNDLES for p in glob.glob(pattern.format(id=cid))]
            if found:
                seccomp = json.loads(Path(found[0]).read_text())["linux"].get("seccomp")
                if not seccomp or not seccomp.get("syscalls"):
                    raise SandboxError("the Docker engine applies no seccomp profile to its containers")
                return seccomp
            time.sleep(0.1)
        raise SandboxError("cannot read the Docker engine's seccomp profile: its container's bundle was not found under /run")
    finally:
        client.api.remove_container(cid, force=True)
