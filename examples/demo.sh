#!/usr/bin/env bash
# weft's demo: a "node" network namespace running weftd, two "pods" (namespaces)
# attached through the real weft plugin exactly as a runtime would, pings between
# them, `weftctl status`, then everything removed again. Run as root after
# `cargo build --release`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
for b in weft weftd weftctl; do [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: run cargo build --release" >&2; exit 1; }; done
NODE=weft-demo-node
DIR=$(mktemp -d /tmp/weft-demo.XXXXXX)
SOCK=$DIR/weftd.sock
PODS=(weft-demo-pod1 weft-demo-pod2)
cleanup() {
  for i in 0 1; do
    printf '%s' "$CONF" | env -i CNI_COMMAND=DEL CNI_CONTAINERID="demo-$i" CNI_NETNS="/run/netns/${PODS[$i]}" \
      CNI_IFNAME=eth0 CNI_PATH="$BIN" "$BIN/weft" >/dev/null 2>&1 || true
    ip netns del "${PODS[$i]}" 2>/dev/null || true
  done
  [ -n "${DAEMON:-}" ] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  ip netns del "$NODE" 2>/dev/null || true
  rm -rf "$DIR"
}
CONF=$(printf '{"cniVersion":"1.1.0","name":"weft","type":"weft","socket":"%s","ranges":["10.244.1.0/24","fd00:10:244:1::/64"],"mtu":1500}' "$SOCK")
trap cleanup EXIT

ip netns add "$NODE"; ip -n "$NODE" link set lo up
ip netns exec "$NODE" "$BIN/weftd" --socket "$SOCK" --state-dir "$DIR/state" --metrics-addr 127.0.0.1:9384 \
  --node-name demo-node --log-format text 2>"$DIR/weftd.log" &
DAEMON=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.05; done

declare -a IP4 IP6
for i in 0 1; do
  ip netns add "${PODS[$i]}"
  OUT=$(printf '%s' "$CONF" | env -i CNI_COMMAND=ADD CNI_CONTAINERID="demo-$i" CNI_NETNS="/run/netns/${PODS[$i]}" \
    CNI_IFNAME=eth0 CNI_PATH="$BIN" CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=demo-$i" "$BIN/weft")
  echo "ADD ${PODS[$i]}: $OUT"
  IP4[$i]=$(echo "$OUT" | grep -o '"address":"[0-9.]*' | head -1 | cut -d'"' -f4)
  IP6[$i]=$(echo "$OUT" | grep -o '"address":"[0-9a-f:]*/128' | head -1 | cut -d'"' -f4 | cut -d/ -f1)
done
echo
ip netns exec "${PODS[0]}" ping -c 2 -W 2 "${IP4[1]}"
ip netns exec "${PODS[1]}" ping -6 -c 2 -W 2 "${IP6[0]}"
echo
"$BIN/weftctl" --socket "$SOCK" status
echo
echo "demo OK: two pods attached through weft reached each other over IPv4 and IPv6"
