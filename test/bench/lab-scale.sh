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
. test/bench/lib.sh
need_binaries_and_root
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1500:510 5000:1700)
lab_workdir

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
