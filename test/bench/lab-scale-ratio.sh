#!/usr/bin/env bash
# How `lab up` grows from one lab size to a bigger one, on a machine whose speed drifts
# (docs/BENCHMARKS.md, "Lab scale"): a small lab, then ROUNDS times a big lab and a
# small one, so every big lab's `up` is timed between two small ones; each big `up` is
# compared with the mean of the two around it, which cancels a drift slower than a
# round (on the 2-vCPU machine of these runs the same build's `up` moved by a fifth
# within the hour). Each `up` starts once the kernel has freed the last lab's
# namespaces and the machine was idle 3 s; every lab is taken down in full (`lab
# down`), not by killing its daemons, whose teardown would run into the next `up`.
# Prints every run, then each big lab's ratio, their median, the ratio of the means,
# and the links' own ratio (growth at most linear: a ratio at most that).
# Needs root and release binaries (cargo build --release -p weftd -p weft -p weftctl).
# Not in CI: a round at the default sizes takes about six minutes.
#
#   test/bench/lab-scale-ratio.sh [ROUNDS] [SMALL] [LARGE]    (defaults: 6 1500:510 5000:1700)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${WEFT_BIN:-target/release}
. test/bench/lib.sh
need_binaries_and_root
rounds=${1:-6}
small=${2:-1500:510}
large=${3:-5000:1700}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS: a positive number, not $rounds" >&2; exit 2; }
for s in "$small" "$large"; do
  [[ "$s" =~ ^[1-9][0-9]*:[1-9][0-9]*$ ]] || { echo "size LINKS:PODS, not $s" >&2; exit 2; }
done
lab_workdir
runs="$work/runs"

run() { # run LINKS:PODS: one timed `up` and a full `down`, appended to $runs
  local links=${1%%:*} pods=${1##*:} name file t up b cpu down
  name="sc$links"
  file="$work/$name.yaml"
  [ -e "$file" ] || "$B/weftctl" lab gen --pods "$pods" --links "$links" --nodes 3 --kind grpc --name "$name" -o "$file"
  quiet
  b=$(busy)
  t=$(date +%s.%N); "$B/weftctl" lab up "$file" > "$work/up.log"; up=$(secs "$t")
  cpu=$(echo "scale=1; ($(busy) - $b) / $hz" | bc)
  t=$(date +%s.%N); "$B/weftctl" lab down "$file" > /dev/null; down=$(secs "$t")
  printf '| %s | %s | %s | %.2f | %.1f | %.1f |\n' "$(date +%H:%M:%S)" "$links" "$pods" "$up" "$cpu" "$down"
  echo "$links $up" >> "$runs"
}

printf '| at | links | pods | lab up (s) | busy CPU during up (s) | lab down (s) |\n'
printf '|---|---:|---:|---:|---:|---:|\n'
run "$small"
for _ in $(seq 1 "$rounds"); do
  run "$large"
  run "$small"
done

echo
awk -v small="${small%%:*}" -v large="${large%%:*}" '
  { links[NR] = $1; up[NR] = $2 }
  END {
    n = 0
    for (i = 2; i < NR; i += 2) {
      s = (up[i - 1] + up[i + 1]) / 2
      n++; r[n] = up[i] / s; L += up[i]; S += s
      printf "round %d: %.2f s at %d links between %.2f and %.2f s at %d: %.2fx\n", n, up[i], large, up[i - 1], up[i + 1], small, r[n]
    }
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
    med = (n % 2) ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2
    printf "median %.2fx, ratio of the means %.2fx, rounds %.2fx to %.2fx; the links grow %.2fx\n", med, L / S, r[1], r[n], large / small
  }' "$runs"
