#!/usr/bin/env bash
# Builds the pod sandbox ("pause") image from Kubernetes' own C source, build/pause/linux/pause.c of
# the k8s.io/kubernetes module that tests/controlplane pins (its Go module cache copy), the way its
# Makefile does (static, -Os, VERSION from its TAG), into an image FROM scratch tagged as
# registry.k8s.io/pause:<TAG>: a node's containerd finds its sandbox image without a pull.
# Prints the image name on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=$(cd "$root/tests/controlplane" && go mod download -json k8s.io/kubernetes | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -f "$src/build/pause/linux/pause.c" ]] || { echo "pause: no build/pause/linux/pause.c under '$src'" >&2; exit 1; }
tag=$(sed -n 's/^TAG ?= *//p' "$src/build/pause/Makefile")
image=registry.k8s.io/pause:$tag
work=$(mktemp -d "${TMPDIR:-/var/tmp}/hypertopo-pause.XXXXXX")
trap 'rm -rf "$work"' EXIT
gcc -Os -Wall -Werror -static -DVERSION="v$tag-hypertopo" -o "$work/pause" "$src/build/pause/linux/pause.c"
strip "$work/pause"
printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' > "$work/Containerfile"
podman build --pull=never --isolation=chroot --network=host -q -t "$image" -f "$work/Containerfile" "$work" >/dev/null
echo "$image"
