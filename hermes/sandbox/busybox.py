"""The small sandbox image's recipe: ``FROM scratch`` plus the static busybox of the Debian package
``busybox-static`` (``/bin/busybox`` and its applets as symlinks), ``/etc/passwd`` and
``/etc/group`` with ``nobody`` (65534), ``/tmp`` and ``/workspace``. Built in memory with
``docker build`` in about a second, with no registry. No Python: tests and benchmarks that want a
sandbox and nothing more use it (hermes.sandbox.image.MINI_TAG).
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import struct
import subprocess
import tarfile
import time
from pathlib import Path

import docker
from docker.errors import BuildError, DockerException

from hermes.environment import read
from hermes.sandbox.base import SandboxError

log = logging.getLogger(__name__)

RECIPE = "offline-busybox"
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
      hermes-batch.image.recipe="{recipe}" \\
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
    own = read("busybox")  # HERMES_BUSYBOX
    candidates = [own and str(own), "/bin/busybox", "/usr/bin/busybox", shutil.which("busybox")]
    seen = []
    for c in candidates:
        if c and c not in seen and os.path.isfile(c):
            seen.append(c)
            if _is_static_elf(c):
                return c
    found = f" (found only dynamically linked: {', '.join(seen)})" if seen else ""
    raise SandboxError(f"cannot build the busybox sandbox image: {INSTALL_HINT}{found}")


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
        add_file(tf, "Dockerfile", OFFLINE_DOCKERFILE.format(version=version, recipe=RECIPE).encode())
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


def build(tag: str, client: docker.DockerClient) -> str:
    """Build the busybox image; returns the image id."""
    context = offline_context()
    try:
        image, _ = client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag,
                                       rm=True, forcerm=True, pull=False)
    except BuildError as e:
        raise SandboxError(f"busybox image build failed: {e.msg}") from e
    except DockerException as e:
        raise SandboxError(f"busybox image build failed: {e}") from e
    log.info("built %s (%s) from static busybox", tag, image.short_id)
    return image.id
