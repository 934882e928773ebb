#!/usr/bin/env bash
# bench/ab.sh - two builds compared on one machine, as docs/PERFORMANCE.md's Method asks (hosts
# of one kind differ by a few percent, so figures from different calls or machines do not
# compare): a table script (bench/h200.sh, bench/moe.sh) run with binary A, then B, alternating,
# RUNS times each (default 2); every run's table rows printed under its build's label.
#
#   bench/ab.sh A_BIN B_BIN SCRIPT [ARGS...]      (from the repository root)
#   DTYPE=fp8 ROWS=2 bench/ab.sh /tmp/main/pagellm build/pagellm bench/h200.sh /tmp/ab
#   RUNS=3 ROWS="1 2" bench/ab.sh /tmp/main/pagellm build/pagellm bench/moe.sh /tmp/ab
#
# The script sees each binary as PAGELLM_BIN; environment variables (ROWS, DTYPE) pass through.
# Each run's whole output is kept in ${AB_LOGS:-/tmp/pagellm-ab}/run-N-LABEL.log.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
a=$1 b=$2
shift 2
for bin in "$a" "$b"; do
    [ -x "$bin" ] || { echo "bench/ab.sh: $bin is not an executable" >&2; exit 2; }
done
[ -f "$1" ] || { echo "bench/ab.sh: no script $1" >&2; exit 2; }
logs=${AB_LOGS:-/tmp/pagellm-ab}
mkdir -p "$logs"
status=0
for ((run = 1; run <= ${RUNS:-2}; run++)); do
    for label in A B; do
        bin=$a
        [ $label = B ] && bin=$b
        log="$logs/run-$run-$label.log"
        PAGELLM_BIN=$bin "$@" >"$log" 2>&1 || status=1
        echo "== run $run, $label ($bin)"
        # the table's rows, without its header and separator
        grep -E '^\| ' "$log" | grep -vE '^\| (workload|row|ROWS) \||^\| ---' ||
            echo "   (no table rows: see $log)"
    done
done
exit $status
