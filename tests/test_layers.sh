#!/usr/bin/env bash
# test_layers.sh - the layering check (tools/check_layers.py) passes on the build and fails on
# each kind of forbidden edge. Run by `ninja test` (after the build) from the repository root:
#
#   tests/test_layers.sh
#
# Case 1 checks build/lib*.a as built. Each other case copies one archive into a scratch
# folder, adds an object that breaks one rule (it calls, or defines, a symbol taken from
# another archive with nm, so the case does not depend on what the code is named), and asserts
# that the check exits 1 naming the edge, the object and the symbol. Output ends with cmocka's
# summary lines, which tests/run_tests.sh counts.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. tests/support/script_test.sh

CC=${CC:-cc}
command -v "$CC" >/dev/null || CC=gcc
command -v "$CC" >/dev/null || CC=clang
NM=${NM:-nm}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/pagellm-layers.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

# A global function that lib$1.a defines, not matching the glob $2 (default: any).
some_function() {
    "$NM" -P -g --defined-only "build/lib$1.a" 2>/dev/null |
        awk -v skip="${2:-}" '$2 == "T" && $1 !~ /^_/ && (skip == "" || $1 !~ skip) {
            print $1
            exit
        }'
}

# violation NAME USER PROVIDER C-SOURCE EXPECTED...: put an object compiled from C-SOURCE into
# a copy of lib$USER.a (as layer_probe.o, or as $PROBE.o: a member of that name is replaced),
# check it with lib$PROVIDER.a and libcommon.a, expect exit 1 and each EXPECTED text in the
# output.
violation() {
    local name=$1 user=$2 provider=$3 src=$4 probe=${PROBE:-layer_probe}
    shift 4
    st_run "$name"
    local dir=$scratch/$name
    mkdir -p "$dir"
    if ! printf '%s\n' "$src" | "$CC" -x c -c - -o "$dir/$probe.o" 2>"$dir/cc.log"; then
        st_fail "$name" "cannot compile the probe object: $(head -3 "$dir/cc.log")"
        return
    fi
    cp "build/lib$user.a" "$dir/lib$user.a"
    ar rs "$dir/lib$user.a" "$dir/$probe.o" 2>/dev/null
    local libs=("$dir/lib$user.a")
    [[ $provider != "$user" ]] && libs+=("build/lib$provider.a")
    [[ $provider != common && $user != common ]] && libs+=("build/libcommon.a")
    local out status line
    out=$(python3 tools/check_layers.py --nm "$NM" "${libs[@]}" 2>&1)
    status=$?
    while IFS= read -r line; do echo "    $line"; done <<<"$out"
    if ((status != 1)); then
        st_fail "$name" "check_layers.py exited $status, expected 1"
        return
    fi
    local want
    for want in "$@"; do
        if ! grep -qF -- "$want" <<<"$out"; then
            st_fail "$name" "the output lacks: $want"
            return
        fi
    done
    st_ok "$name"
}

st_begin layers layers_clean_build layers_reversed_edge layers_sideways_edge layers_narrow_edge \
    layers_export_prefix layers_duplicate_definition layers_part_calls_up layers_part_unknown

st_run layers_clean_build
if ! ls build/lib*.a >/dev/null 2>&1; then
    st_fail layers_clean_build "no build/lib*.a (run ninja first)"
elif python3 tools/check_layers.py --nm "$NM"; then
    st_ok layers_clean_build
else
    st_fail layers_clean_build "tools/check_layers.py failed on the build (above)"
fi

eng=$(some_function engine)
model=$(some_function models)
kern=$(some_function kernels '^sampling_')
pl=$(some_function common)
if [[ -z $eng || -z $model || -z $kern || -z $pl ]]; then
    st_fail layers_probe_symbols \
        "no function found in libengine.a, libmodels.a, libkernels.a or libcommon.a"
else
    # Upward: the kernels calling into the engine.
    violation layers_reversed_edge kernels engine \
        "void $eng(void); void layer_probe(void) { $eng(); }" \
        "forbidden edge kernels -> engine is a reversed edge" "(layer_probe.o) calls $eng"
    # Sideways: the scheduler calling into models (neither is below the other).
    violation layers_sideways_edge scheduler models \
        "void $model(void); void layer_probe(void) { $model(); }" \
        "forbidden edge scheduler -> models is a sideways edge" "(layer_probe.o) calls $model"
    # A narrowed edge: the server may take only sampling_* from kernels.
    violation layers_narrow_edge server kernels \
        "void $kern(void); void layer_probe(void) { $kern(); }" \
        "server -> kernels is allowed only for sampling_*" "(layer_probe.o) calls $kern"
    # The tokenizer exporting a name without its tok_ prefix.
    violation layers_export_prefix tokenizer tokenizer \
        "int jstr(void) { return 0; }" \
        "(layer_probe.o) exports jstr: every symbol of libtokenizer.a must start with tok_"
    # One function defined in two libraries.
    violation layers_duplicate_definition engine engine \
        "void $pl(void) {}" \
        "$pl is defined in" "libcommon.a(" "(layer_probe.o)"
    # Inside the engine: a lower part (request.c) calling the step loop above it, and a source
    # file missing from PART_ORDER.
    PROBE=request violation layers_part_calls_up engine engine \
        "int eng_step(void *, const void **); void layer_probe(void) { eng_step(0, 0); }" \
        "(request.o) calls eng_step, defined in step.o: part request may call only the parts below"
    violation layers_part_unknown engine engine \
        "int eng_step(void *, const void **); void layer_probe(void) { eng_step(0, 0); }" \
        "part layer_probe of libengine.a is not in configure.py's PART_ORDER"
fi

st_end
