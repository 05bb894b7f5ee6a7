"""The default sandbox image's recipes: Debian bookworm with python3 (pip, venv), git, curl and
the usual command-line tools, running as nobody (65534) in /workspace.

* registry: deployments/sandbox/Dockerfile (FROM debian:bookworm-slim), where the engine can pull.
* offline: where it cannot, the same system made by debootstrap from this machine's own Debian
  mirror (the one apt uses, read from its sources, never hard-coded), trimmed of package caches
  and documentation, and imported into the engine as one layer (about 90 s and 250 MB here).

Both label the image with their recipe (hermes-batch.image.recipe), which hermes.sandbox.image
reads to tell a built default image from another image of the same name.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker
from docker.errors import BuildError, DockerException

from hermes.sandbox.base import SandboxError

log = logging.getLogger(__name__)

REGISTRY_RECIPE = "registry-debian"
OFFLINE_RECIPE = "offline-debian"
RECIPES = (REGISTRY_RECIPE, OFFLINE_RECIPE)
REGISTRY_CONTEXT = Path(__file__).resolve().parents[2] / "deployments" / "sandbox"
BASE_IMAGE = "debian:bookworm-slim"
SUITE = "bookworm"
#: what the Dockerfile installs, for debootstrap (minbase has the shell, coreutils, grep, sed, ...)
PACKAGES = ("python3", "python3-pip", "python3-venv", "git", "curl", "ca-certificates", "procps", "less", "file",
            "jq", "bc", "patch", "diffutils", "xz-utils", "unzip", "zip", "make", "tree", "wget", "gawk")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the image's settings, as the Dockerfile's ENV/WORKDIR/USER/CMD/LABEL say them
CHANGES = ("USER 65534:65534", "WORKDIR /workspace",
           f"ENV HOME=/tmp PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 PATH={PATH}",
           'CMD ["sleep", "infinity"]',
           f"LABEL org.opencontainers.image.title=hermes-sandbox hermes-batch.image.recipe={OFFLINE_RECIPE}")
#: trimmed after debootstrap: nothing in a sandbox reads them (448 MB -> 254 MB)
TRIM = ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/share/doc/*", "usr/share/man/*",
        "usr/share/locale/*", "usr/share/info/*")
DEBOOTSTRAP_TIMEOUT = 1800.0


def build_registry(tag: str, client: docker.DockerClient, context_dir: Path = REGISTRY_CONTEXT) -> str:
    """Build deployments/sandbox/Dockerfile (its base image pulled); returns the image id."""
    if not (context_dir / "Dockerfile").is_file():
        raise SandboxError(f"no Dockerfile at {context_dir}: the registry build needs the source checkout")
    try:
        image, _ = client.images.build(path=str(context_dir), tag=tag, rm=True, forcerm=True, pull=True)
    except BuildError as e:
        raise SandboxError(f"registry image build failed (is a registry reachable?): {e.msg}") from e
    except DockerException as e:
        raise SandboxError(f"registry image build failed: {e}") from e
    return image.id


# --------------------------------------------------------------------------- offline


def apt_mirror(suite: str = SUITE, sources: str = "/etc/apt") -> str:
    """The Debian archive this machine's apt installs `suite` from (deb822 .sources files first,
    then one-line sources.list entries). SandboxError when none is configured."""
    files = sorted(glob.glob(f"{sources}/sources.list.d/*.sources"))
    for path in files:
        for stanza in re.split(r"\n\s*\n", _read(path)):
            fields = _deb822(stanza)
            if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                uris = fields.get("uris", "").split()
                if uris:
                    return uris[0]
    for path in [f"{sources}/sources.list", *sorted(glob.glob(f"{sources}/sources.list.d/*.list"))]:
        for line in _read(path).splitlines():
            words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()  # drop [options]
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1]
    raise SandboxError(f"no Debian mirror for {suite} in {sources}/sources.list(.d): the offline image build "
                       "takes its packages from the mirror apt uses")


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _deb822(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, value = line.split(":", 1)
        fields[key.strip().lower()] = value.strip()
    return fields


def build_offline(tag: str, client: docker.DockerClient) -> str:
    """debootstrap the system from apt's own mirror, trim it, import it as `tag`; the image id."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise SandboxError("the offline Debian image needs debootstrap: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise SandboxError("the offline Debian image is made by debootstrap, which needs root: run "
                           "deployments/bootstrap.sh as root (or with sudo)")
    mirror = apt_mirror()
    root = Path(tempfile.mkdtemp(prefix="hermes-sandbox-rootfs-", dir="/var/tmp"))
    try:
        log.info("debootstrap %s from %s into %s (about a minute and a half)", SUITE, mirror, root)
        cmd = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), mirror]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            raise SandboxError(f"debootstrap did not finish within {DEBOOTSTRAP_TIMEOUT:g}s") from e
        if done.returncode != 0:
            said = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise SandboxError(f"debootstrap failed (exit {done.returncode}):\n{said}")
        for pattern in TRIM:
            for p in glob.glob(str(root / pattern)):
                shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
        (root / "workspace").mkdir(exist_ok=True)
        os.chmod(root / "workspace", 0o1777)
        return _import(root, tag, client)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _import(root: Path, tag: str, client: docker.DockerClient) -> str:
    repo, _, version = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, "", "latest")
    tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    try:
        answer = client.api.import_image(src=tar.stdout, repository=repo, tag=version, changes=list(CHANGES),
                                         stream_src=True)
    except DockerException as e:
        raise SandboxError(f"importing the Debian root filesystem failed: {e}") from e
    finally:
        tar.stdout.close()
        tar.wait()
    if tar.returncode != 0:
        raise SandboxError(f"tar of the Debian root filesystem failed (exit {tar.returncode})")
    if "error" in str(answer).lower():
        raise SandboxError(f"the engine refused the Debian root filesystem: {answer}")
    return client.api.inspect_image(tag)["Id"]
