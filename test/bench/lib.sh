# Shared by the lab benchmarks in this directory (sourced, not run): timing, the
# machine's busy time, and the waits that keep one lab's teardown out of the next
# lab's timing.

secs() { # seconds since $1 (from date +%s.%N)
  echo "$(date +%s.%N) - $1" | bc
}
busy() { # the machine's busy CPU time so far, in clock ticks
  awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat
}
# The kernel frees a deleted network namespace later, in its cleanup work, and an
# earlier lab's thousand namespaces can wait there for minutes until another namespace
# is deleted (seen 2026-12-01: 708 of them, freed at once by a probe namespace made and
# deleted). Freed during the next lab's `up`, they would be timed with it.
netns_freed() { # waits (at most 120 s) until at most 100 namespaces are allocated
  local f=/sys/kernel/slab/net_namespace/objects
  [ -r "$f" ] || return 0
  for _ in $(seq 1 120); do
    [ "$(cut -d' ' -f1 "$f")" -le 100 ] && return 0
    ip netns add "lab-scale-probe-$$" && ip netns delete "lab-scale-probe-$$"
    sleep 1
  done
  echo "the kernel still holds $(cut -d' ' -f1 "$f") namespaces after 120 s" >&2
}
quiet() { # waits for netns_freed, then (at most 120 s) until the machine was 95 % idle 3 seconds in a row
  local n=0 b0 b1 t0 t1
  netns_freed
  for _ in $(seq 1 120); do
    b0=$(busy) t0=$(awk '/^cpu / {print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat)
    sleep 1
    b1=$(busy) t1=$(awk '/^cpu / {print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat)
    if [ $(((b1 - b0) * 100)) -le $(((t1 - t0) * 5)) ]; then n=$((n + 1)); else n=0; fi
    [ $n -ge 3 ] && return 0
  done
  echo "the machine did not become idle in 120 s" >&2
}
hz=$(getconf CLK_TCK)

# The labs' state (topology directory, statuses, stores) on a tmpfs of the bench's own,
# as under the default /run/weft-lab of a Debian machine (/run is a tmpfs there): on a
# disk file system, creating thousands of small files measures the file system.
# Sets `work` and WEFT_LAB_DIR; everything goes at exit, labs left up included.
lab_workdir() {
  work=$(mktemp -d /tmp/weft-lab-scale.XXXXXX)
  export WEFT_LAB_DIR="$work/labs"
  mkdir -p "$WEFT_LAB_DIR"
  mount -t tmpfs -o size=4g weft-lab-scale "$WEFT_LAB_DIR"
  trap 'for f in "$work"/*.yaml; do [ -e "$f" ] && "$B/weftctl" lab down "$f" >/dev/null 2>&1 || true; done; umount "$WEFT_LAB_DIR"; rm -rf "$work"' EXIT
}

# Fails unless the release binaries are in $B and this is root.
need_binaries_and_root() {
  for b in weftd weft weftctl; do
    [ -x "$B/$b" ] || { echo "no $B/$b: cargo build --release -p weftd -p weft -p weftctl" >&2; exit 1; }
  done
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
}
