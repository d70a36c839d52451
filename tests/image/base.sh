#!/usr/bin/env bash
# Makes a local stand-in for the Dockerfile's base image, python:3.11-slim-bookworm, where the
# registry cannot be reached: Debian bookworm's minbase with python3 (python3-venv for `python3 -m
# venv`, ca-certificates for pip), built by debootstrap from Debian's packages and trimmed the way
# Debian's slim images are (no docs but copyright files, no man pages, no translations; a dpkg
# config keeps later `apt-get install`s in the build the same). The root filesystem is cached as a
# tarball in ~/.cache/hypertopo/image-base/<name>-<hash of this script> (first run only, ~5 min), and
# imported into podman under the Dockerfile's base name, so the Dockerfile builds unchanged with
# --pull=never. Prints the image name on stdout.
#
#   HYPERTOPO_CACHE   cache root (default ~/.cache/hypertopo)
#   HYPERTOPO_MIRROR  Debian mirror for debootstrap (default http://deb.debian.org/debian)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
image=docker.io/library/python:3.11-slim-bookworm
key=$(sha256sum "$here/base.sh" | cut -c1-12)
cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
tarball="$cache_root/image-base/python-3.11-slim-bookworm-$key.tar"
mirror=${HYPERTOPO_MIRROR:-http://deb.debian.org/debian}

slim_excludes='path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*'

make_rootfs() {
  local rootfs=$1
  local start=$SECONDS
  echo "image base: debootstrap bookworm minbase from $mirror ..." >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$mirror" > "$rootfs.log" 2>&1 || { tail -20 "$rootfs.log" >&2; return 1; }
  mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d"
  printf '%s\n' "$slim_excludes" > "$rootfs/etc/dpkg/dpkg.cfg.d/slim"
  # What the excludes would have kept out, had dpkg known them when debootstrap unpacked.
  find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{groff,info,linda,locale,man}/* "$rootfs"/usr/share/lintian/overrides/*
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  rm -rf "$rootfs"/var/log/* "$rootfs"/debootstrap
  echo "image base: root filesystem made in $((SECONDS - start))s" >&2
}

if [[ ! -s "$tarball" ]]; then
  command -v debootstrap >/dev/null || { echo "image base: debootstrap is not installed (tests/setup.sh installs it)" >&2; exit 1; }
  mkdir -p "$(dirname "$tarball")"
  rootfs=$(mktemp -d "${TMPDIR:-/var/tmp}/hypertopo-base.XXXXXX")
  trap 'rm -rf "$rootfs" "$rootfs.log" "$tarball.tmp"' EXIT
  make_rootfs "$rootfs"
  tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi

have=$(podman image inspect --format '{{index .Labels "io.hypertopo.base-key"}}' "$image" 2>/dev/null || true)
if [[ "$have" != "$key" ]]; then
  echo "image base: importing $tarball as $image" >&2
  podman import --quiet --change "LABEL io.hypertopo.base-key=$key" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$tarball" "$image" >/dev/null
fi
echo "$image"
