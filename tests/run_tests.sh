#!/usr/bin/env bash
# run_tests.sh - run cmocka test binaries and add up their results in one line.
#
#   tests/run_tests.sh build/tests/test_a build/tests/test_b ...     (what `ninja test` runs)
#
# Each binary runs from the current folder (the repository root), with its output streamed.
# The counts come from cmocka's summary lines ("[  PASSED  ] 3 test(s).", "[  FAILED  ] 1
# test(s), listed below:", "[  SKIPPED ] 1 test(s), listed below:"). A binary that exits
# non-zero without a FAILED summary - a crash, an abort, a sanitizer report at exit, a
# timeout - counts as one failed test and is named at the end.
# The last line is always "tests: N passed, M failed, K skipped"; the exit status is 1 when
# M > 0 or when no test ran at all.
#
# PAGELLM_TEST_TIMEOUT: seconds one binary may run (default 600; 0 = no limit).
set -uo pipefail

export CMOCKA_MESSAGE_OUTPUT=STDOUT # the standard format, parsed below
timeout_s=${PAGELLM_TEST_TIMEOUT:-600}
passed=0
failed=0
skipped=0
problems=() # "binary: what went wrong", for the end

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# Sum of the counts in cmocka summary lines of $log: prints "passed failed skipped".
count_summaries() {
    awk '
        function count(line, tag) { sub(".*\\[  " tag " *\\] ", "", line); return line + 0 }
        /\[  PASSED  \] [0-9]+ test\(s\)\.$/               { p += count($0, "PASSED") }
        /\[  FAILED  \] [0-9]+ test\(s\), listed below:$/  { f += count($0, "FAILED") }
        /\[  SKIPPED \] [0-9]+ test\(s\), listed below:$/  { s += count($0, "SKIPPED") }
        END { print p + 0, f + 0, s + 0 }' "$log"
}

# Run $1 with its output both shown and kept in $log; returns the binary's exit status.
run_one() {
    local bin=$1 status
    local limit=()
    if [[ $timeout_s != 0 ]] && command -v timeout >/dev/null; then
        limit=(timeout --foreground -k 10 "$timeout_s")
    fi
    # The outer 2>/dev/null only hides bash's own "Aborted ..." job notice: the binary's
    # stderr goes into the pipe, and the death is reported below with the signal's name.
    { "${limit[@]}" "$bin" </dev/null 2>&1 | tee "$log"; } 2>/dev/null
    status=${PIPESTATUS[0]}
    return "$status"
}

for bin in "$@"; do
    echo "=== $bin"
    if [[ ! -x $bin || -d $bin ]]; then
        echo "run_tests.sh: $bin: not an executable file"
        failed=$((failed + 1))
        problems+=("$bin: not an executable file")
        continue
    fi
    run_one "$bin"
    status=$?
    read -r p f s < <(count_summaries)
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
    if ((f > 0)); then
        problems+=("$bin: $f failed")
    elif ((status != 0)); then
        if ((status == 124)); then
            why="timed out after ${timeout_s}s"
        elif ((status > 128)) && sig=$(kill -l $((status - 128)) 2>/dev/null); then
            why="killed by SIG$sig"
        else
            why="exit status $status without a cmocka FAILED summary"
        fi
        echo "run_tests.sh: $bin: $why"
        failed=$((failed + 1))
        problems+=("$bin: $why")
    fi
done

if ((${#problems[@]} > 0)); then
    echo
    echo "problems:"
    printf '  %s\n' "${problems[@]}"
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
((failed == 0 && passed + failed + skipped > 0))
