#!/bin/sh
# Build the hermes-batch sandbox image with no registry: FROM scratch + static busybox.
#   deployments/sandbox/build_offline.sh [TAG]          (default hermes-sandbox:latest)
# Same recipe as `python -m hermes.sandbox.image build --offline`. Needs the Debian package
# busybox-static (apt-get install busybox-static) or HERMES_BUSYBOX=/path/to/static/busybox.
set -eu
tag=${1:-hermes-sandbox:latest}

bb=${HERMES_BUSYBOX:-/bin/busybox}
if [ ! -x "$bb" ]; then
    echo "error: no busybox at $bb: apt-get install busybox-static" >&2
    exit 1
fi
# A dynamically linked busybox (the plain 'busybox' package) cannot run FROM scratch.
if command -v file >/dev/null 2>&1 && ! file -L "$bb" | grep -q 'statically linked\|static-pie'; then
    echo "error: $bb is not statically linked: apt-get install busybox-static" >&2
    exit 1
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT INT TERM
root=$ctx/rootfs
mkdir -p "$root/bin" "$root/etc" "$root/root" "$root/tmp" "$root/workspace" "$root/home" "$root/var" \
         "$root/usr/bin" "$root/usr/sbin" "$root/usr/local/bin" "$root/sbin"
chmod 1777 "$root/tmp" "$root/workspace"
chmod 700 "$root/root"
cp "$bb" "$root/bin/busybox"
chmod 755 "$root/bin/busybox"
for applet in $("$bb" --list-full); do
    [ "$applet" = bin/busybox ] && continue
    mkdir -p "$root/$(dirname "$applet")"
    ln -sf /bin/busybox "$root/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
version=$("$bb" | head -n 1 | tr -d '"')
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
WORKDIR /workspace
USER 65534:65534
LABEL org.opencontainers.image.title="hermes-sandbox" \\
      hermes-batch.image.recipe="offline-busybox" \\
      hermes-batch.image.busybox="$version"
CMD ["sleep", "2147483647"]
DOCKERFILE
docker build -q -t "$tag" "$ctx" >/dev/null
echo "$tag built"
