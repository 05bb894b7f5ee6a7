#!/bin/sh
# Build the hermes-batch sandbox image with no registry: FROM scratch + static busybox.
#   deployments/sandbox/build_offline.sh [TAG]          (default hermes-sandbox:latest)
# One recipe, kept in hermes/sandbox/image.py; this is its shell front door. Needs the Debian
# package busybox-static (apt-get install busybox-static).
set -eu
cd "$(dirname "$0")/../.."
exec python3 -m hermes.sandbox.image build --offline --tag "${1:-hermes-sandbox:latest}"
