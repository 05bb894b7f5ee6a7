"""One runc sandbox's OCI runtime spec (config.json): the docker backend's hardening, written
out for runc.

Starting from what `runc spec` gives (its mounts, masked and read-only /proc paths, the
namespaces), every sandbox gets: its own pid, net (empty: loopback only), ipc, uts, mount and
cgroup namespaces; every capability dropped; no-new-privileges; the settings' non-root user;
memory (swap not beyond it), CPU and pids limits in a cgroup of its own; the shared image root
read-only; size-capped tmpfs at /tmp, the work dir, the row's cwd and the image's VOLUMEs (the
docker backend's plan), /dev/shm capped the same; the seccomp section the Docker engine makes of
its default profile (rootfs.docker_seccomp); the device list Docker allows; the resource
limits and HOSTNAME a Docker container's process gets (rlimits.py).
"""
from __future__ import annotations

from typing import Any

from docker.utils import parse_bytes

from hermes.sandbox.base import SandboxError, SandboxSettings
from hermes.sandbox.docker.container import _tmpfs_plan
from hermes.sandbox.runc.rlimits import docker_rlimits
from hermes.sandbox.runc.rootfs import ImageRoot, prepare_mount_points

#: runc's default spec's masked and read-only paths (`runc spec`), as Docker has them too
MASKED = ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
          "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"]
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
#: null, zero, full, random, urandom, tty: what Docker allows a container without --device
DEVICES = [{"allow": False, "access": "rwm"}] + [
    {"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"}
    for major, minor in ((1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0))]
#: CFS period the CPU limit is a share of (Docker's)
CPU_PERIOD = 100_000


def parse_user(user: str) -> tuple[int, int]:
    """'uid:gid' (numbers: the root is shared, no passwd lookup is made for a name)."""
    uid, _, gid = user.partition(":")
    if not uid.strip().isdigit() or not (gid or uid).strip().isdigit():
        raise SandboxError(f"settings.user {user!r}: the runc backend takes a numeric uid:gid, like 65534:65534")
    return int(uid), int(gid or uid)


def build_spec(root: ImageRoot, settings: SandboxSettings, cwd: str, args: list[str], *, hostname: str,
               cgroup: str, seccomp: dict | None, etc_files: dict[str, str] | None = None) -> dict[str, Any]:
    """etc_files: /etc/hostname, /etc/hosts and the like -> host files bound over them read-only
    (the engine gives every container its own)."""
    if not settings.read_only:
        raise SandboxError("the runc backend shares one read-only image root between sandboxes: "
                           "sandbox.read_only=false is not supported by it (use the docker backend)")
    if settings.network:
        raise SandboxError("the runc backend gives sandboxes no network: sandbox.network=true needs the docker backend")
    uid, gid = parse_user(settings.user)
    mounts_at, _why_not = _tmpfs_plan(cwd, settings, root.config.get("WorkingDir") or "",
                                      sorted(root.config.get("Volumes") or {}))
    prepare_mount_points(root, mounts_at)
    size = parse_bytes(settings.tmpfs_size)
    memory = parse_bytes(settings.memory)
    tmpfs = ["nosuid", "nodev", "exec", f"size={size}", "mode=1777"]
    env = [e for e in root.config.get("Env") or [] if not e.startswith(("HOME=", "TMPDIR="))]
    if not any(e.startswith("PATH=") for e in env):
        env.insert(0, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    if not any(e.startswith("HOSTNAME=") for e in env):  # the engine sets it in every container
        env.insert(1, f"HOSTNAME={hostname}")
    spec: dict[str, Any] = {
        "ociVersion": "1.0.2-dev",
        "root": {"path": str(root.rootfs), "readonly": True},
        "hostname": hostname,
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid, "additionalGids": [gid]},
            "args": args,
            "env": env + ["HOME=/tmp", "TMPDIR=/tmp"],
            "cwd": "/tmp",
            "capabilities": {"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []},
            "rlimits": [dict(r) for r in docker_rlimits()],  # a Docker container's, not runc spec's 1024 files
            "noNewPrivileges": True,
            "oomScoreAdj": 500,  # the host's OOM killer takes a sandbox before the run
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", f"size={size}"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
             "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]},
        ] + [{"destination": m, "type": "tmpfs", "source": "tmpfs", "options": tmpfs} for m in mounts_at]
          + [{"destination": dest, "type": "bind", "source": src, "options": ["rbind", "rprivate", "ro", "nosuid", "nodev"]}
             for dest, src in (etc_files or {}).items()],
        "linux": {
            "cgroupsPath": cgroup,
            "resources": {
                "devices": DEVICES,
                "memory": {"limit": memory, "swap": memory, "disableOOMKiller": False},
                "cpu": {"quota": max(1000, int(settings.cpus * CPU_PERIOD)), "period": CPU_PERIOD},
                "pids": {"limit": settings.pids_limit},
            },
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "cgroup")],
            "maskedPaths": MASKED,
            "readonlyPaths": READ_ONLY,
        },
    }
    if seccomp is not None:
        spec["linux"]["seccomp"] = seccomp
    return spec
