#!/usr/bin/env bash
# Podman as the sandbox engine (issue #49): Debian's podman, its Docker-compatible API served on a
# socket, and the sandbox images loaded from the Docker store. The docker backend then runs against
# it with DOCKER_HOST=unix://$HERMES_PODMAN_SOCKET (README: "Many machines" > "Podman").
#
#   bash deployments/podman/setup.sh          # as root; idempotent; .ci/run calls it
#
# Why each step:
# - default_ulimits: podman run as root copies this host's hard limits (nofile 20000 here, higher on
#   most hosts) into every container, which the OCI runtime then fails to set inside this machine's
#   own container; 1024 is Docker's default for containers anyway.
# - read_only_tmpfs = false (Podman 4.4+; 4.3.1 ignores it on its Docker API): with a read-only root
#   Podman mounts writable tmpfs on /run, /tmp and
#   /var/tmp of its own, unsized (charged to the memory limit); with it, only those the backend asks for.
# - seccomp_profile: Podman's own lets any process make user namespaces (unshare -r); ours takes
#   Docker's rules for clone/clone3/mount/setns/unshare (seccomp_profile.py says how).
# - catatonit: podman's --init (the docker backend asks for an init process in every sandbox).
# - `podman system service --time=0`: the API server, never timing out on idle.
set -euo pipefail
SOCK=${HERMES_PODMAN_SOCKET:-/run/podman/podman.sock}
LOG=${HERMES_PODMAN_LOG:-/tmp/podman-service.log}
say() { echo "[podman-setup] $*"; }

if ! command -v podman >/dev/null || [ ! -x /usr/libexec/podman/catatonit ] && ! command -v catatonit >/dev/null; then
    say "installing podman and catatonit (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends podman catatonit >/dev/null
fi

conf=/etc/containers/containers.conf
mkdir -p /etc/containers
grep -qs '^\[containers\]' "$conf" || printf '[containers]\n' >> "$conf"
profile=/etc/containers/hermes-seccomp.json
python3 "$(dirname "$0")/seccomp_profile.py" > "$profile.new" && mv "$profile.new" "$profile"
for line in 'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]' 'read_only_tmpfs = false' \
            "seccomp_profile = \"$profile\""; do
    key=${line%% *}
    if ! grep -qs "^$key" "$conf"; then
        say "setting $key in $conf"
        sed -i "/^\[containers\]/a $line" "$conf"
    fi
done

if ! curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; then
    say "starting podman system service on $SOCK (log $LOG)"
    mkdir -p "$(dirname "$SOCK")"
    rm -f "$SOCK"
    # from /: the service outlives this checkout, and conmon fails every container start ("write child:
    # broken pipe", "Failed to get working directory") once the folder it was started in is removed
    (cd / && nohup podman system service --time=0 "unix://$SOCK" >"$LOG" 2>&1 &)
    for _ in $(seq 1 60); do
        curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1 && break
        sleep 0.5
    done
    curl -sf --unix-socket "$SOCK" http://d/_ping >/dev/null || { say "the service did not answer; see $LOG"; exit 1; }
fi

# The sandbox images: Podman has a store of its own, and no registry is reachable here.
for image in ${HERMES_PODMAN_IMAGES:-hermes-sandbox-mini:latest hermes-sandbox:bookworm}; do
    if podman image exists "$image"; then continue; fi
    if docker image inspect "$image" >/dev/null 2>&1; then
        say "loading $image from the Docker store"
        docker save "$image" | podman load >/dev/null
    else
        say "no $image in the Docker store to load (build it first: deployments/bootstrap.sh)"
    fi
done
say "ready: DOCKER_HOST=unix://$SOCK"
