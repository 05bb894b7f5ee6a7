#!/bin/sh
# Build the default sandbox image (Debian bookworm with python3, git, curl) with no registry:
# debootstrap from this machine's own Debian mirror, imported into the engine (needs root and
# the Debian package debootstrap).
#   deployments/sandbox/build_offline.sh [TAG]          (default hermes-sandbox:bookworm)
# The recipe is hermes/sandbox/debian.py; this is its shell front door.
set -eu
cd "$(dirname "$0")/../.."
exec python3 -m hermes.sandbox.image build --recipe offline --tag "${1:-hermes-sandbox:bookworm}"
