#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit tests, and the integration tests that
# run the real plugin and daemon in network namespaces (root required) and containerd.
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean clone gains nothing from incremental caches, and they double target/'s size.
if [ "${CI:-}" = "true" ]; then export CARGO_INCREMENTAL=0; fi
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo build --workspace --bins
cargo test --workspace
