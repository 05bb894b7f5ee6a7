#!/usr/bin/env bash
# Set up a machine for hermes-batch: the Python package, a Docker engine that answers, and the
# default sandbox image (built offline when no registry can be reached). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[bootstrap] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
apt_install() {
  if [ -z "${_APT_UPDATED:-}" ]; then as_root apt-get update -qq; _APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

log "installing the hermes-batch package and its test dependencies"
python3 -m pip install -q --disable-pip-version-check -e ".[test]"
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

# The offline image builder takes its shell from Debian's static busybox.
if command -v dpkg >/dev/null 2>&1 && ! dpkg -s busybox-static >/dev/null 2>&1; then
  apt_install busybox-static || log "could not install busybox-static; the offline image build needs it"
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
python3 -m hermes.sandbox.image ensure

# The API server's tests drive it with the official openai-node SDK too (4.x and 6.x).
if ! command -v npm >/dev/null 2>&1; then
  log "no npm: installing nodejs and npm"
  apt_install nodejs npm || log "could not install npm; the openai-node client tests need it"
fi
if command -v npm >/dev/null 2>&1; then
  (cd tests/node && npm ci --no-audit --no-fund --loglevel=error) || log "npm ci in tests/node failed"
fi
log "ready"
