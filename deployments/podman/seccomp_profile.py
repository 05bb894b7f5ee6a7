"""Podman's default seccomp profile made as strict as Docker's about namespaces (issue #49).

    python3 deployments/podman/seccomp_profile.py [SOURCE] > /etc/containers/hermes-seccomp.json

Podman's profile (/usr/share/containers/seccomp.json) allows clone, clone3, mount, setns and
unshare to every process, so that containers can nest; a sandboxed command can then make a user
namespace (`unshare -r id -u` prints 0), which the abuse suite refuses. Docker's profile allows
them only with CAP_SYS_ADMIN (which no sandbox has), and clone only without the CLONE_NEW* flags.
This writes Podman's profile with those rules taken from Docker's instead.
"""
from __future__ import annotations

import json
import sys

NAMESPACED = {"clone", "clone3", "mount", "setns", "unshare"}
#: CLONE_NEWNS|CLONE_NEWCGROUP|CLONE_NEWUTS|CLONE_NEWIPC|CLONE_NEWUSER|CLONE_NEWPID|CLONE_NEWNET
CLONE_NEW_FLAGS = 2114060288
ENOSYS = 38


def strict(profile: dict) -> dict:
    rules = []
    for rule in profile["syscalls"]:
        names = rule.get("names") or [rule.get("name")]
        if rule.get("action") == "SCMP_ACT_ALLOW" and not rule.get("includes") and NAMESPACED & set(names):
            rest = [n for n in names if n not in NAMESPACED]
            if rest:
                rules.append({**rule, "names": rest})
            continue
        rules.append(rule)
    rules += [
        # a thread or a process, never a new namespace (Docker's rule; s390's argument order aside)
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 0, "value": CLONE_NEW_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
         "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
        # clone3's flags are in memory seccomp cannot read: ENOSYS makes libc fall back to clone
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS, "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
        {"names": sorted(NAMESPACED), "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
    ]
    return {**profile, "syscalls": rules}


if __name__ == "__main__":
    source = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
    with open(source) as f:
        json.dump(strict(json.load(f)), sys.stdout, indent=1)
    sys.stdout.write("\n")
