#!/usr/bin/env bash
# Installs what weft's build, tests and demo need on Debian 12 (run as root).
# Rust itself (rustup, cargo) is expected to be installed already.
set -euo pipefail
packages=(
  iproute2 iputils-ping          # namespaces, links, ping across pods
  containerd runc                # the real runtime for the CRI end-to-end test
  containernetworking-plugins    # loopback for containerd; ptp + host-local as the benchmark reference
  protobuf-compiler              # only for the k8s-cri test dependency (weft's own protos use protox)
  gcc libc6-dev                  # the static pause binary of the CRI test
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
