#!/usr/bin/env bash
# Builds the project's image from the Dockerfile, unchanged, with podman from Debian, the way the
# README's `docker build` does, and tags it as the manifests and the chart name it
# (ghcr.io/hypertopo/hypertopo:<version>), so the README's install finds it on a node without a pull.
# The base comes from base.sh (a local stand-in for python:3.11-slim-bookworm when no registry can be
# reached). An image already built from the same sources (a label holds their hash) is kept; else
# podman's layer cache rebuilds only the stages that changed. The context
# is the checkout's files as git sees them (tracked and new, not ignored), like a fresh clone.
# Prints the image name on stdout.
#
# The podman flags this needs on a machine without cgroup v2 and a registry (the CI machine):
#   --isolation=chroot  crun refuses cgroups in hybrid (v1 + v2) mode
#   --network=host      the build's RUN steps reach Debian and PyPI without a CNI network
#   -v /etc/ssl/certs   the host's CA store: pip trusts what the host trusts (a TLS-inspecting proxy)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)
image=ghcr.io/hypertopo/hypertopo:$version
command -v podman >/dev/null || { echo "image: podman is not installed (tests/setup.sh installs it)" >&2; exit 1; }

bash "$root/tests/image/base.sh" >/dev/null
ctx=$(mktemp -d "${TMPDIR:-/var/tmp}/hypertopo-ctx.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
(cd "$root" && git ls-files -z -co --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) \
  | tar -x -C "$ctx"
# The same sources as the image already built: nothing to do (podman would take ~40 s to say so).
sources=$( (cd "$ctx" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; cat "$root/tests/image/base.sh") \
  | sha256sum | cut -c1-16)
if [[ $(podman image inspect --format '{{index .Labels "io.hypertopo.sources"}}' "$image" 2>/dev/null) == "$sources" ]]; then
  echo "image: $image is built from these sources" >&2
  echo "$image"
  exit 0
fi
start=$SECONDS
podman build --pull=never --isolation=chroot --network=host -v /etc/ssl/certs:/etc/ssl/certs:ro \
  --label "io.hypertopo.sources=$sources" -t "$image" -f "$ctx/Dockerfile" "$ctx" > "$ctx.log" 2>&1 \
  || { tail -30 "$ctx.log" >&2; rm -f "$ctx.log"; exit 1; }
rm -f "$ctx.log"
# Earlier builds' final images, dangling once the tag moved on (~100 MB of venv each); the stages'
# images stay, as the layer cache.
for id in $(podman images --filter dangling=true --filter label=io.hypertopo.sources --format '{{.ID}}'); do
  if [[ $(podman image inspect --format '{{.Config.User}}' "$id") == 65532 ]]; then
    podman rmi "$id" >/dev/null 2>&1 || true
  fi
done
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "image: built $image in $((SECONDS - start))s, $((size / 1000000)) MB" >&2
echo "$image"
