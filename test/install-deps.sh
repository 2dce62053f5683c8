#!/usr/bin/env bash
# Installs what weft's build, tests and demo need on Debian 12 (run as root from the
# repository). Rust itself (rustup, cargo) is expected to be installed already.
# Everything that is not a Debian package goes inside the repository: the Python venv
# with the rotel OpenTelemetry collector (.venv) and the npm packages that validate
# the Grafana dashboard (test/grafana/node_modules).
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  iproute2 iputils-ping curl     # namespaces, links, ping across pods, HTTP probes
  containerd runc                # the real runtime for the CRI end-to-end test
  containernetworking-plugins    # loopback for containerd; ptp + host-local as the benchmark reference
  protobuf-compiler              # only for the k8s-cri test dependency (weft's own protos use protox)
  gcc libc6-dev                  # the static pause binary of the CRI test
  prometheus                     # promtool and a real Prometheus for the metrics, dashboard and alert tests
  python3-venv                   # the venv for the rotel collector
  nftables conntrack             # host ports: weftd writes its table with nft and flushes UDP flows
  busybox-static                 # the httpd workload image of the CRI host-port test
  iperf3                         # weft-bench --compare wires: TCP throughput across wires
  ethtool                        # weft-bench --compare pod-network: offloads of both VXLAN devices compared
  buildah                        # the weft image, built offline from the Containerfile (test/tests/runtime/install.rs)
  graphviz                       # weftctl lab graph: dot draws the lab as SVG or PNG (test/tests/lab/graph.rs)
  tcpdump                        # reads the pcapng weftctl capture writes (test/tests/lab/capture.rs)
  bird2                          # BGP in the lab: pod ranges between nodes (test/tests/lab/bgp.rs, examples/lab-bgp.yaml)
  frr                            # vtysh --dryrun checks docs/routed-cluster.md's FRR configuration
  dnsmasq-base                   # the lab's DNS: names for domainNames policies (test/tests/cluster/fqdn.rs)
  chromium chromium-driver       # weftctl lab serve's page in a real headless browser (test/tests/lab/graph.rs)
)
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian starts the packaged Prometheus, BIRD and FRR as services; the tests run their own.
systemctl disable --now prometheus prometheus-node-exporter bird frr >/dev/null 2>&1 || true

# The host's musl target: `cargo plugin-static` links the plugin against musl, whose
# start costs less than glibc's (.cargo/config.toml). Best effort: without it the
# plugin is linked against glibc statically, and works the same.
if command -v rustup >/dev/null; then
  musl="$(uname -m)-unknown-linux-musl"
  rustup target list --installed 2>/dev/null | grep -qx "$musl" || rustup target add "$musl" ||
    echo "install-deps.sh: could not add the $musl target; cargo plugin-static will link glibc" >&2
fi

# rotel: a real OpenTelemetry collector (Rust), shipped as a PyPI wheel.
if ! ls .venv/lib/python3*/site-packages/rotel/rotel-agent >/dev/null 2>&1; then
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check rotel==0.0.1a15
fi
# kubernetes-validate: the rendered manifests checked offline against the Kubernetes
# schemas it ships (test/tests/runtime/install.rs).
if [ "$(.venv/bin/pip show kubernetes-validate 2>/dev/null | sed -n 's/^Version: //p')" != 1.37.0 ]; then
  .venv/bin/pip install -q --disable-pip-version-check kubernetes-validate==1.37.0
fi
# @grafana/schema and a JSON Schema validator, pinned by test/grafana/package-lock.json.
if [ ! -d test/grafana/node_modules/@grafana/schema ]; then
  (cd test/grafana && npm ci --silent --no-audit --no-fund)
fi
