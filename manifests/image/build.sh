#!/usr/bin/env bash
# Builds the weft image from the Containerfile at the top of the repository, offline:
# `FROM scratch` plus a root filesystem assembled here from BIN_DIR's `weft` (which must
# be statically linked: it is copied onto the node), `weftd` and `weftctl`, this
# machine's `nft` and `conntrack`, and every shared library those load (ldd closure).
#
#   manifests/image/build.sh [-t IMAGE] [-o FILE] [--push DEST]... BIN_DIR
#
# BIN_DIR: a release build (`cargo build --release && cargo plugin-static`, then
#   BIN_DIR=target/release), or any directory holding the three binaries (the tests use
#   debug builds of weftd and weftctl beside a static plugin).
# -t IMAGE: the image's name (default localhost/weft:<workspace version>, what
#   manifests/kustomization.yaml names).
# -o FILE: the OCI archive written (default ./weft-image.tar), for
#   `ctr -n k8s.io images import FILE` on a node or `skopeo copy oci-archive:FILE ...`.
# --push DEST: also push there, e.g. docker://registry.example/weft:0.1.0 (repeatable).
#
# buildah (Debian package `buildah`) runs with the vfs storage driver in a private,
# temporary storage directory, with no network and its CNI directories in there too,
# all removed afterwards: nothing is left in /var/lib/containers or /etc/cni. Needs root.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
image="localhost/weft:$version"
out="$PWD/weft-image.tar"
push=()
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    -t) image=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    --push) push+=("$2"); shift 2 ;;
    -h|--help) usage ;;
    -*) echo "build.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || usage
bin_dir=$(cd "$1" && pwd)
case $out in /*) ;; *) out="$PWD/$out" ;; esac
command -v buildah >/dev/null || { echo "build.sh: buildah is missing (apt-get install buildah)" >&2; exit 1; }

for b in weft weftd weftctl; do
  [ -x "$bin_dir/$b" ] || { echo "build.sh: $bin_dir/$b is missing" >&2; exit 1; }
done
if readelf -lW "$bin_dir/weft" | grep -q 'program interpreter'; then
  echo "build.sh: $bin_dir/weft is dynamically linked; it is copied onto nodes whose" >&2
  echo "  libc may differ. Build it statically: cargo build --release && cargo plugin-static" >&2
  exit 1
fi
nft=$(command -v nft || true)
conntrack=$(command -v conntrack || true)
[ -n "$nft" ] && [ -n "$conntrack" ] || {
  echo "build.sh: nft and conntrack are needed (apt-get install nftables conntrack)" >&2
  exit 1
}

work=$(mktemp -d /tmp/weft-image.XXXXXX)
# buildah keeps a blob-info cache under /var/lib/containers whatever its storage root;
# if this build is what creates it, it goes afterwards with the rest.
made=""
for d in /var/lib/containers /var/lib/containers/cache; do
  [ -e "$d" ] || { made=$d; break; }
done
trap 'rm -rf "$work" ${made:+"$made"}' EXIT
root="$work/context/rootfs"
mkdir -p "$root"

# The host's top-level directory links (Debian's merged /usr: /lib -> usr/lib, ...), so a
# path such as the ELF interpreter /lib64/ld-linux-x86-64.so.2 resolves in the image
# as it does here.
for l in /bin /sbin /lib /lib32 /lib64 /libx32; do
  if [ -L "$l" ]; then
    t=$(readlink "$l")
    mkdir -p "$root/${t#/}"
    ln -s "$t" "$root$l"
  fi
done

# Copies absolute path $1 into the root, keeping every symbolic link on the way to the
# file it names (libfoo.so.1 -> libfoo.so.1.2.3).
copy_path() {
  local p=$1 dir name target
  while :; do
    dir=$(cd "$(dirname "$p")" && pwd -P)
    name=$(basename "$p")
    mkdir -p "$root$dir"
    if [ -L "$p" ]; then
      target=$(readlink "$p")
      ln -sfn "$target" "$root$dir/$name"
      case $target in /*) p=$target ;; *) p="$dir/$target" ;; esac
    else
      cp -p "$p" "$root$dir/$name"
      return
    fi
  done
}

# The shared libraries (and the loader) an executable needs: ldd prints the closure.
libs_of() {
  ldd "$1" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (0x.*/\1/p' || true
}

mkdir -p "$root/usr/local/bin" "$root/usr/sbin"
for b in weft weftd weftctl; do
  install -m 0755 "$bin_dir/$b" "$root/usr/local/bin/$b"
done
install -m 0755 "$(readlink -f "$nft")" "$root/usr/sbin/nft"
install -m 0755 "$(readlink -f "$conntrack")" "$root/usr/sbin/conntrack"
for f in "$bin_dir/weftd" "$bin_dir/weftctl" "$nft" "$conntrack"; do
  for l in $(libs_of "$f"); do
    [ -e "$root$l" ] || copy_path "$l"
  done
done
# What a container expects to find: /tmp, /run (and /var/run linking to it, so the
# runtime's /var/run/netns/... paths are the DaemonSet's /run/netns mount), /etc for
# the runtime's resolv.conf and hosts, weftd's state directory.
mkdir -p "$root/etc" "$root/run" "$root/var/lib/weft" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
chmod 1777 "$root/tmp"
ln -s ../run "$root/var/run"

# Every file owned by root, whatever the builder's umask and user.
chown -R 0:0 "$root"

store=(--root "$work/storage" --runroot "$work/runroot" --storage-driver vfs)
export TMPDIR="$work"
buildah "${store[@]}" bud --quiet --layers=false --timestamp 0 --network none \
  --cni-config-dir "$work/cni" --cni-plugin-path "$work/cni" \
  --build-arg "VERSION=$version" \
  -f "$repo/Containerfile" -t "$image" "$work/context" >/dev/null
rm -f "$out"
buildah "${store[@]}" push --quiet "$image" "oci-archive:$out:$image"
for dest in "${push[@]}"; do
  buildah "${store[@]}" push --quiet "$image" "$dest"
done
echo "$image -> $out"
