#!/usr/bin/env bash
# Prepares a fresh Debian machine for the test suite, idempotently:
#   1. Debian packages for the real parts (lldpd, prometheus/promtool, iproute2, openssl, ...)
#   2. a virtualenv in .venv with hypertopo and its test extras, pinned with hashes by
#      requirements/test.lock (requirements/update.sh regenerates the lock files)
#   3. Kubernetes, the suite's release (kube-apiserver, kubectl, kube-scheduler, etcd, and the real
#      node's kubelet and kube-controller-manager, in one go build) and the oldest supported minor
#      (kube-apiserver, kubectl: tests/controlplane/compat), kwok, and Volcano (vc-scheduler,
#      vc-controller-manager and its CRDs), built from the pinned Go modules in tests/controlplane
#      and cached in ~/.cache/hypertopo (first run only); helm, built the same way; Kueue's, KAI's and
#      prometheus-operator's CRDs from their Go modules
#   4. the real node's images: the project's image built by podman from the Dockerfile over a local
#      Debian base (tests/image, the base's root filesystem cached) and the pause image from its C
#      source
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(lldpd prometheus tcpdump ethtool iproute2 openssl procps graphviz
          podman debootstrap containerd runc containernetworking-plugins iptables gcc libc6-dev
          perftest)  # perftest: the measured fabric's RDMA tools, whose real parser checks our command lines
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv" >&2
  python3 -m venv .venv
fi
echo "setup: installing hypertopo[test] into .venv (pinned, hash-checked: requirements/*.lock)" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check --require-hashes --no-deps \
  -r requirements/build.lock -r requirements/test.lock >&2
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . >&2

echo "setup: Kubernetes, the suite's release (control plane and the real node's binaries)" >&2
bash tests/controlplane/build.sh >/dev/null
echo "setup: Kubernetes, the oldest supported minor (kube-apiserver, kubectl)" >&2
bash tests/controlplane/build.sh compat >/dev/null
if [[ -f tests/controlplane/kwok/build_kwok.sh ]]; then
  echo "setup: kwok" >&2
  bash tests/controlplane/kwok/build_kwok.sh >/dev/null
fi
echo "setup: volcano" >&2
bash tests/controlplane/volcano/build_volcano.sh >/dev/null
echo "setup: prometheus-operator CRDs" >&2
bash tests/controlplane/prometheus_operator_crds.sh >/dev/null
echo "setup: Kueue CRDs" >&2
bash tests/controlplane/kueue_crds.sh >/dev/null
echo "setup: KAI Scheduler CRDs" >&2
bash tests/controlplane/kai_crds.sh >/dev/null
echo "setup: helm" >&2
bash tests/controlplane/helm/build_helm.sh >/dev/null
echo "setup: images (the Dockerfile's, with podman; pause)" >&2
if ! { bash tests/image/build.sh >/dev/null && bash tests/image/pause.sh >/dev/null; }; then
  # CI requires it (the real-node tests run the image); elsewhere those tests skip with the reason
  [[ "${HYPERTOPO_REQUIRE_REAL:-}" != 1 ]] || { echo "setup: the image build failed" >&2; exit 1; }
  echo "setup: the image build failed; the real-node tests will skip" >&2
fi
echo "setup: done" >&2
