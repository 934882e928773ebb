# script_test.sh - sourced by the shell tests (tests/test_*.sh): cmocka-shaped output, which
# tests/run_tests.sh counts. A test calls st_begin SUITE CASE..., then per case `st_run NAME`
# and st_ok NAME or st_fail NAME WHY, and ends with st_end (exit status 1 when a case
# failed); st_skip_all SUITE WHY skips every case of st_begin and exits 0.

st_begin() {
    st_suite=$1
    shift
    st_cases=("$@")
    st_passed=()
    st_failed=()
    echo "[==========] $st_suite: ${#st_cases[@]} test(s)"
}

st_skip_all() {
    for c in "${st_cases[@]}"; do echo "[  SKIPPED ] $c: $1"; done
    echo "[==========] $st_suite: ${#st_cases[@]} test(s) run."
    echo "[  PASSED  ] 0 test(s)."
    echo "[  SKIPPED ] ${#st_cases[@]} test(s), listed below:"
    printf '[  SKIPPED ] %s\n' "${st_cases[@]}"
    exit 0
}

st_run() {
    echo "[ RUN      ] $1"
}

st_ok() {
    echo "[       OK ] $1"
    st_passed+=("$1")
}

st_fail() {
    echo "[  FAILED  ] $1: $2"
    st_failed+=("$1")
}

st_end() {
    echo "[==========] $st_suite: $((${#st_passed[@]} + ${#st_failed[@]})) test(s) run."
    echo "[  PASSED  ] ${#st_passed[@]} test(s)."
    if ((${#st_failed[@]} > 0)); then
        echo "[  FAILED  ] ${#st_failed[@]} test(s), listed below:"
        printf '[  FAILED  ] %s\n' "${st_failed[@]}"
        exit 1
    fi
    exit 0
}
