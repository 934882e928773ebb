#!/usr/bin/env bash
# test_fuzz_replay.sh - every libFuzzer target (tests/fuzz/, built by tools/fuzz.sh with clang,
# ASan and UBSan) run once over its seed corpus and saved crash inputs: a target that no longer
# builds against the product's headers, or an input that crashes, leaks, trips a sanitizer or
# fails a FUZZ_CHECK, fails its case. Run by `ninja test` from the repository root; skipped
# (cmocka's SKIPPED summary) where clang or its libFuzzer runtime is missing. Output ends with
# cmocka's summary lines, which tests/run_tests.sh counts.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. tests/support/script_test.sh

mapfile -t targets < <(tools/fuzz.sh --list)
st_begin fuzz_replay "${targets[@]/#/fuzz_replay_}"
if ! out=$(tools/fuzz.sh --build all 2>&1); then
    # fuzz.sh exits 2 naming what is missing (clang, its libFuzzer runtime); a compile or
    # link error of a target is a failure of every case
    why=$(grep -m1 '^fuzz.sh: .*\(install\|not clang\|runtime is missing\)' <<<"$out") &&
        st_skip_all "$why"
    tail -20 <<<"$out"
    for t in "${targets[@]}"; do
        st_run "fuzz_replay_$t"
        st_fail "fuzz_replay_$t" "tools/fuzz.sh --build all failed (above)"
    done
    st_end
fi
for t in "${targets[@]}"; do
    st_run "fuzz_replay_$t"
    if out=$(tools/fuzz.sh --replay "$t" 2>&1); then
        st_ok "fuzz_replay_$t"
    else
        grep -E -m5 'ERROR|runtime error|FUZZ_CHECK|SUMMARY' <<<"$out"
        st_fail "fuzz_replay_$t" "tools/fuzz.sh --replay $t failed"
    fi
done
st_end
