#!/usr/bin/env bash
# run.sh - the end-to-end suite: real `build/pagellm serve` processes on the bundled model
# (CPU, 127.0.0.1 only), driven by curl and the official openai npm package through Node's
# built-in test runner.
#
#   tests/e2e/run.sh                         every tests/e2e/*.test.mjs
#   tests/e2e/run.sh tests/e2e/chat.test.mjs one file (or several)
#
# It builds nothing: run `ninja` first (`ninja test` runs this after the cmocka binaries).
# It runs `npm ci` in tests/e2e when node_modules is missing or older than the lockfile.
# Each test file starts the servers it needs (tests/e2e/server.mjs) on free ports and kills
# them when it exits; this script also kills, on any exit, every server still listed in
# its pid folder.
#
# Output: node's spec reporter, then the counts twice - as cmocka summary lines, which
# tests/run_tests.sh adds into the one "tests: N passed, M failed, K skipped" line of
# `ninja test`, and as the last line "e2e: N passed, M failed, K skipped". Without node,
# npm or curl the suite is skipped (counted as one skipped test) and the reason printed.
# Exit status: node's (0 when every test passed or the suite was skipped).
#
# PAGELLM_E2E_TIMEOUT: seconds the whole suite may run (default 420 x PAGELLM_E2E_SLOW).
# PAGELLM_E2E_SLOW: a factor >= 1 that stretches every time limit of the suite (for slow
# builds: .ci/run sets 4 for its ASan + UBSan run); see tests/e2e/server.mjs.
# PAGELLM_E2E_ARGS: extra flags for every server (e.g. "--log-level debug").
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
e2e=tests/e2e

summary() { # passed failed skipped what-was-skipped [failed test names...]
    local p=$1 f=$2 s=$3 skipped_what=$4
    shift 4
    echo "[==========] e2e: $((p + f + s)) test(s) run."
    echo "[  PASSED  ] $p test(s)."
    if ((f > 0)); then
        echo "[  FAILED  ] $f test(s), listed below:"
        for name in "$@"; do echo "[  FAILED  ] $name"; done
    fi
    if ((s > 0)); then
        echo "[  SKIPPED ] $s test(s), listed below:"
        echo "[  SKIPPED ] e2e: $skipped_what"
    fi
    echo "e2e: $p passed, $f failed, $s skipped"
}

skip() {
    echo "e2e: skipped: $1"
    summary 0 0 1 "$1"
    exit 0
}

fail() {
    echo "e2e: error: $1"
    summary 0 1 0 "" "e2e: $1"
    exit 1
}

command -v node >/dev/null || skip "node not found (Debian package nodejs; ./configure.py --install-deps installs it)"
command -v npm >/dev/null || skip "npm not found (Debian package npm; ./configure.py --install-deps installs it)"
command -v curl >/dev/null || skip "curl not found (Debian package curl; ./configure.py --install-deps installs it)"
node_help=$(node --help 2>/dev/null)
for opt in --test-concurrency --test-reporter-destination; do
    [[ $node_help == *"$opt"* ]] || skip "node $(node --version 2>/dev/null) has no $opt (need 18.19 or later)"
done

pagellm=${PAGELLM_BIN:-build/pagellm}
[[ -x $pagellm ]] || fail "$pagellm is not built (run ninja)"
"$pagellm" serve --help >/dev/null 2>&1 || fail "\`$pagellm serve --help\` fails: no serve command"

# npm ci when node_modules is missing or older than package.json / package-lock.json.
stamp=$e2e/node_modules/.package-lock.json
if [[ ! -f $stamp || $e2e/package-lock.json -nt $stamp || $e2e/package.json -nt $stamp ]]; then
    echo "e2e: npm ci (tests/e2e)"
    (cd "$e2e" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || fail "npm ci failed in $e2e"
fi

if (($# > 0)); then
    files=("$@")
else
    files=("$e2e"/*.test.mjs)
fi

work=$(mktemp -d)
export PAGELLM_E2E_PIDDIR=$work/pids
mkdir -p "$PAGELLM_E2E_PIDDIR"
node_pid=

cleanup() {
    # Servers the test files did not get to stop (a killed or timed-out test process):
    # each pid file is named by a server's pid and holds its command line, which must
    # still match before the kill.
    local f pid
    for f in "$PAGELLM_E2E_PIDDIR"/*; do
        [[ -e $f ]] || continue
        pid=${f##*/}
        if [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == "$(<"$f") " ]]; then
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap '[[ -n $node_pid ]] && kill -TERM "$node_pid" 2>/dev/null; exit 130' INT TERM

e2e_limit=${PAGELLM_E2E_TIMEOUT:-$(awk -v s="${PAGELLM_E2E_SLOW:-1}" 'BEGIN { s += 0; if (s < 1) s = 1; printf "%d", 420 * s }')}
limit=()
if command -v timeout >/dev/null; then
    limit=(timeout -k 10 "$e2e_limit")
fi
tap=$work/report.tap
# Test files run one at a time (the default on small machines anyway): the timing-sensitive
# tests (256 concurrent clients, disconnects) then see a quiet machine.
"${limit[@]}" node --test --test-concurrency=1 \
    --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tap" \
    "${files[@]}" </dev/null &
node_pid=$!
wait "$node_pid"
status=$?
node_pid=

# The runner's totals are the last "# pass N" ... lines of the TAP report.
total() { awk -v k="$1" '$1 == "#" && $2 == k { n = $3 } END { print n + 0 }' "$tap" 2>/dev/null || echo 0; }
passed=$(total pass)
failed=$(($(total fail) + $(total cancelled)))
skipped=$(($(total skipped) + $(total todo)))
# Names of the failed tests, not of the suites (describe) that hold them.
mapfile -t failures < <(awk '
    function flush() { if (pending && !suite) print name; pending = 0 }
    /^ *not ok [0-9]+ - / { flush(); name = $0; sub(/^ *not ok [0-9]+ - /, "", name)
                            sub(/ # .*/, "", name); pending = 1; suite = 0; next }
    /^ *ok [0-9]+ - / { flush(); next }
    pending && /^ *(type: .suite.|failureType: .subtestsFailed.)/ { suite = 1 }
    END { flush() }' "$tap" 2>/dev/null)

# Without the runner's totals (it was killed, or crashed), count what the report has.
if ! grep -q '^# pass ' "$tap" 2>/dev/null; then
    passed=$(grep -cE "^ *ok [0-9]+ - " "$tap" 2>/dev/null); passed=${passed:-0}
    failed=${#failures[@]}
fi
if ((status != 0 && (failed == 0 || status == 124))); then
    if ((status == 124)); then
        why="timed out after ${e2e_limit}s"
    else
        why="node exited with status $status"
    fi
    echo "e2e: $why"
    failed=$((failed + 1))
    failures+=("e2e: $why")
fi
echo
summary "$passed" "$failed" "$skipped" "tests marked skip or todo (see above)" "${failures[@]}"
exit "$status"
