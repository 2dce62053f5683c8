#!/usr/bin/env bash
# Runs weft's cargo-fuzz targets one after another, each for SECONDS (default 600),
# starting from the committed seeds. Only the stable toolchain is needed:
# RUSTC_BOOTSTRAP=1 lets it take the nightly-only flags cargo-fuzz passes
# (-Zsanitizer=address, sancov). See docs/fuzzing.md.
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#   FUZZ_SANITIZER=none fuzz/run.sh 60 cni_args   # if ASan will not link
#
# New inputs go to fuzz/corpus/<target>/, crashes to fuzz/artifacts/<target>/, the
# libFuzzer output to fuzz/logs/<target>.log (all ignored by git). Exits non-zero if
# any target found a crash, after running the rest.
set -uo pipefail
cd "$(dirname "$0")"

secs=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(cni_config cni_args cni_result wire_batch wire_tls topology)
fi
sanitizer=${FUZZ_SANITIZER:-address}

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked || exit 1
fi
export RUSTC_BOOTSTRAP=1

# Build all targets first so a build failure stops before any fuzzing time is spent.
nice -n 19 cargo fuzz build --sanitizer "$sanitizer" || exit 1

mkdir -p logs
failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== $t: ${secs}s"
    # The first directory receives new inputs; seeds/ is only read.
    if ! nice -n 19 cargo fuzz run --sanitizer "$sanitizer" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=10 -print_final_stats=1 2>&1 | tee "logs/$t.log"; then
        failed+=("$t")
    fi
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -1)
    echo "== $t: ${runs:-?} executions, corpus $(find "corpus/$t" -type f | wc -l) files"
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "crashes in: ${failed[*]} (see fuzz/artifacts/)" >&2
    exit 1
fi
