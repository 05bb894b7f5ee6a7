#!/usr/bin/env bash
# Set up a machine for hermes-batch: the Python package, a Docker engine that answers, and the
# sandbox images (built offline when no registry can be reached). Safe to run again.
#   HERMES_INSTALL_RUNSC=1  also install gVisor (runsc) and register it with the engine
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[bootstrap] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
apt_install() {  # others may hold apt's lock (unattended upgrades, a parallel install): wait for it
  if [ -z "${_APT_UPDATED:-}" ]; then as_root apt-get -o DPkg::Lock::Timeout=300 update -qq; _APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq -o DPkg::Lock::Timeout=300 "$@" >/dev/null
}

log "installing the hermes-batch package and its test, benchmark and publishing dependencies"
python3 -m pip install -q --disable-pip-version-check -e ".[test,bench,publish]"
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }
if ! engine_answers; then
  if ! command -v dockerd >/dev/null 2>&1; then
    log "no Docker engine: installing docker.io"
    apt_install docker.io || { log "cannot install Docker here; install it and start the engine, then run this again"; exit 1; }
  fi
  if pgrep -x dockerd >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    # An engine that runs but does not answer is hung: restart it rather than wait forever.
    log "dockerd runs but does not answer: restarting it"
    pkill -x dockerd || true
    for _ in $(seq 30); do pgrep -x dockerd >/dev/null || break; sleep 1; done
  fi
  if ! engine_answers; then
    log "starting dockerd"
    as_root sh -c 'nohup dockerd >/var/log/hermes-dockerd.log 2>&1 &'
    for _ in $(seq 60); do engine_answers && break; sleep 1; done
    engine_answers || { log "dockerd did not answer within 60 s; see /var/log/hermes-dockerd.log"; exit 1; }
  fi
fi
log "Docker engine $(docker version --format '{{.Server.Version}}') answers"

# The runc sandbox backend (--sandbox_backend runc) runs runc itself: it comes with docker.io,
# which depends on it; an engine installed otherwise may ship its own copy out of PATH.
if ! command -v runc >/dev/null 2>&1; then
  log "no runc on PATH: installing runc (for --sandbox_backend runc)"
  apt_install runc || log "could not install runc; --sandbox_backend runc will refuse to run"
fi

# The small image's shell is Debian's static busybox; the default image, where no registry
# answers, is made by debootstrap from this machine's own Debian mirror.
if command -v dpkg >/dev/null 2>&1; then
  for pkg in busybox-static debootstrap; do
    dpkg -s "$pkg" >/dev/null 2>&1 || apt_install "$pkg" || log "could not install $pkg; the image builds need it"
  done
fi

# gVisor (--sandbox_runtime runsc), when asked: Debian's runsc package, registered with the engine
# in daemon.json and loaded by SIGHUP (dockerd reloads its runtimes without a restart). runsc's own
# network stack is off (--network=none): a sandbox has no network by default, and gVisor cannot
# join the engine's "none" namespace here.
if [ "${HERMES_INSTALL_RUNSC:-0}" = 1 ]; then
  command -v runsc >/dev/null 2>&1 || apt_install runsc || { log "cannot install runsc"; exit 1; }
  if ! docker info --format '{{json .Runtimes}}' | grep -q '"runsc"'; then
    log "registering runsc with the Docker engine"
    as_root python3 - "$(command -v runsc)" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
cfg = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
cfg.setdefault("runtimes", {})["runsc"] = {"path": sys.argv[1], "runtimeArgs": ["--network=none"]}
os.makedirs("/etc/docker", exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(cfg, f, indent=2)
os.replace(path + ".tmp", path)
PY
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker 2>/dev/null; then
      as_root systemctl reload docker
    else
      as_root kill -HUP "$(pgrep -x dockerd | head -1)"
    fi
    for _ in $(seq 30); do docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' && break; sleep 1; done
    docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' || { log "the engine did not take the runsc runtime"; exit 1; }
  fi
  log "gVisor runtime runsc registered"
fi


# The browser toolset: Debian's Chromium (never a browser download at run time) and the unprivileged
# account it runs as, with Chromium's own sandbox, when hermes runs as root.
if ! command -v chromium >/dev/null 2>&1; then
  apt_install chromium || log "could not install chromium; the browser toolset stays unavailable"
fi
if [ "$(id -u)" = 0 ] && ! id hermes-browser >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin hermes-browser \
    || log "could not create the hermes-browser user; the browser runs as nobody"
fi

# The default image (Debian with python3: ~90 s once, offline) and the small busybox one; each
# is left alone when it exists with its recipe's label.
python3 -m hermes.sandbox.image ensure --tag hermes-sandbox:bookworm
python3 -m hermes.sandbox.image ensure --tag hermes-sandbox-mini:latest

# The API server's tests drive it with the official openai-node SDK too (4.x and 6.x).
if ! command -v npm >/dev/null 2>&1; then
  log "no npm: installing nodejs and npm"
  apt_install nodejs npm || log "could not install npm; the openai-node client tests need it"
fi
if command -v npm >/dev/null 2>&1; then
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error) || log "npm ci in tests/node failed"
fi
log "ready"
