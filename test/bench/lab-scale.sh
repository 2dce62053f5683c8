#!/usr/bin/env bash
# Lab scale benchmark (docs/BENCHMARKS.md, "Lab scale"): for each LINKS:PODS size, a
# generated lab on 3 nodes (`weftctl lab gen`, gRPC between nodes, veth on a node) is
# brought up, checked twice and taken down, each timed; after the checks it reads each
# node's weftd RSS and open descriptors and counts the kernel objects the lab made per
# link: the link ends in the pods, the interfaces on the nodes beyond one per pod, and
# (in the weftd fds) the packet sockets of gRPC ends.
# Each `up` starts once the machine has been idle (95 %) for 3 seconds in a row, so it
# does not share the CPUs with the kernel's teardown of the last lab; after it, the
# CPU seconds the whole machine spent from its start until idle again (what the pods'
# kernels do for seconds after their interfaces come up included) are read too.
# Needs root and release binaries (cargo build --release -p weftd -p weft -p weftctl).
# Not in CI: the 5,000-link size takes minutes and most of the machine.
#
#   test/bench/lab-scale.sh 1500:510 5000:1700    (one shape: 2.94 links a pod)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${WEFT_BIN:-target/release}
for b in weftd weft weftctl; do
  [ -x "$B/$b" ] || { echo "no $B/$b: cargo build --release -p weftd -p weft -p weftctl" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1500:510 5000:1700)
work=$(mktemp -d /tmp/weft-lab-scale.XXXXXX)
export WEFT_LAB_DIR="$work/labs"
# The labs' state (topology directory, statuses, stores) on a tmpfs of the bench's own,
# as under the default /run/weft-lab of a Debian machine (/run is a tmpfs there): on a
# disk file system, creating thousands of small files measures the file system.
mkdir -p "$WEFT_LAB_DIR"
mount -t tmpfs -o size=4g weft-lab-scale "$WEFT_LAB_DIR"
trap 'for f in "$work"/*.yaml; do [ -e "$f" ] && "$B/weftctl" lab down "$f" >/dev/null 2>&1 || true; done; umount "$WEFT_LAB_DIR"; rm -rf "$work"' EXIT

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

printf '| links | pods | nodes | lab up (s) | CPU s from up until idle | lab check (s, 2 runs) | lab down (s) | weftd RSS n1/n2/n3 (MiB) | weftd fds n1/n2/n3 | link interfaces per link: in pods / on nodes | load at start |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|\n'
for size in "${sizes[@]}"; do
  links=${size%%:*}
  pods=${size##*:}
  name="sc$links"
  file="$work/$name.yaml"
  "$B/weftctl" lab gen --pods "$pods" --links "$links" --nodes 3 --kind grpc --name "$name" -o "$file"
  quiet
  load=$(cut -d' ' -f1 /proc/loadavg)
  b=$(busy)
  t=$(date +%s.%N); "$B/weftctl" lab up "$file" > "$work/up.log"; up=$(secs "$t")
  quiet
  cpu=$(echo "scale=1; ($(busy) - $b) / $hz" | bc)
  checks=()
  for _ in 1 2; do
    t=$(date +%s.%N); "$B/weftctl" lab check "$file" --within 30 > "$work/check.log"; checks+=("$(secs "$t")")
  done
  rss=() fds=()
  for n in n1 n2 n3; do
    pid=$(cut -d' ' -f1 "$WEFT_LAB_DIR/$name/nodes/$n/weftd.pid")
    rss+=("$(awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$pid/status")")
    fds+=("$(ls "/proc/$pid/fd" | wc -l)")
  done
  # Link ends in the pods (every interface but lo and eth0) and on the nodes (every
  # interface but lo, the uplink and the host end of each pod's eth0; the node ends of
  # gRPC wires are in the nodes' shard namespaces, <lab>-<node>-e0 to -e15, which the
  # pattern below counts with their node).
  in_pods=0 on_nodes=0
  for ns in $(ip netns list | awk -v p="$name-" 'index($1, p) == 1 {print $1}'); do
    devs=$(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -vx lo || true)
    case "$ns" in
      "$name-p-"*) in_pods=$((in_pods + $(echo "$devs" | grep -cvx eth0 || true))) ;;
      "$name-n"[0-9]*) on_nodes=$((on_nodes + $(echo "$devs" | grep -c . || true))) ;;
    esac
  done
  on_nodes=$((on_nodes - pods - 3))
  t=$(date +%s.%N); "$B/weftctl" lab down "$file" > /dev/null; down=$(secs "$t")
  printf '| %s | %s | 3 | %.2f | %.1f | %.1f, %.1f | %.1f | %s | %s | %.2f / %.2f | %s |\n' \
    "$links" "$pods" "$up" "$cpu" "${checks[0]}" "${checks[1]}" "$down" \
    "$(IFS=/; echo "${rss[*]}")" "$(IFS=/; echo "${fds[*]}")" \
    "$(echo "$in_pods / $links" | bc -l)" "$(echo "$on_nodes / $links" | bc -l)" "$load"
done
