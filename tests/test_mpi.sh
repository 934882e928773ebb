#!/usr/bin/env bash
# test_mpi.sh - tensor-parallel ranks as MPI processes on the CPU backend: `mpirun -np N
# build/pagellm generate --tensor-parallel-size N` (rank 0 schedules and samples, the others
# follow its broadcast jobs) must print exactly the greedy completions of one process, and a
# follower killed mid-generation must end the whole job, non-zero, with a clear message, in
# bounded time. Run by `ninja test` from the repository root:
#
#   tests/test_mpi.sh
#
# Cases: bundled stories260K (8 heads, 4 KV heads, 172 MLP columns: all divide by 2 and 4)
# with 2 and 4 ranks; the same with a KV pool of 24 blocks, so sequences are preempted and
# swapped out and in; and a follower (rank 1) killed with SIGKILL while a larger dummy-weight
# model generates. Skipped (cmocka's SKIPPED summary) when mpirun is missing or the build has
# no MPI (configure.py found none). Open MPI runs as root here only with the variables below;
# --oversubscribe lets 4 ranks share CI's 2 cores. Output ends with cmocka's summary lines,
# which tests/run_tests.sh counts.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. tests/support/script_test.sh

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# Open MPI's own allocations are not ours to leak-check (an --asan build)
export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0
bin=build/pagellm
scratch=$(mktemp -d "${TMPDIR:-/tmp}/pagellm-mpi.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cases=(mpi_np2_equals_one_process mpi_np4_equals_one_process mpi_np2_swap_equals_one_process
       mpi_np4_swap_equals_one_process mpi_follower_killed_ends_the_job)

st_begin mpi "${cases[@]}"
why=""
if ! command -v mpirun >/dev/null; then
    why="mpirun not found (apt-get install openmpi-bin libopenmpi-dev, re-run ./configure.py)"
elif [[ ! -x $bin ]]; then
    why="no $bin (run ninja first)"
elif ! grep -q PAGELLM_HAVE_MPI build.ninja 2>/dev/null; then
    why="pagellm built without MPI (configure.py found no libopenmpi-dev)"
fi
[[ -n $why ]] && st_skip_all "$why"

prompts=$scratch/prompts.txt
cat >"$prompts" <<'EOF'
Lily and Tom
Once upon a time
The cat sat on
One day, a little girl named Sue
Tim had a red ball
The sun was
Mom said
A big dog
EOF
common=(generate --prompt-file "$prompts" --temperature 0 --max-tokens 96 --device cpu
        --cpu-threads 1 --seed 1)
# The KV cache of 24 blocks of 16 tokens cannot hold 8 sequences of 100 tokens, all admitted
# at once (conservativeness 0).
swap=(--num-gpu-blocks-override 24 --block-size 16 --ignore-eos --schedule-conservativeness 0)

# run_case NAME NP EXTRA...: one process and NP processes print the same completions.
run_case() {
    local name=$1 np=$2
    shift 2
    st_run "$name"
    local one=$scratch/$name.one many=$scratch/$name.many
    if ! timeout 120 "$bin" "${common[@]}" "$@" </dev/null >"$one" 2>"$one.err"; then
        st_fail "$name" "one process failed: $(tail -3 "$one.err")"
        return
    fi
    local status=0
    timeout 300 mpirun -np "$np" "$bin" "${common[@]}" --tensor-parallel-size "$np" "$@" \
        </dev/null >"$many" 2>"$many.err" || status=$?
    if ((status != 0)); then
        st_fail "$name" "mpirun -np $np exited $status: $(tail -5 "$many.err")"
        return
    fi
    if ! cmp -s "$one" "$many"; then
        st_fail "$name" "completions differ: $(diff "$one" "$many" | head -6)"
        return
    fi
    if [[ $* == *num-gpu-blocks-override* ]] &&
        ! grep -Eq "preemptions: [1-9][0-9]* by swap|blocks swapped out [1-9]" "$many.err"; then
        st_fail "$name" "no sequence was swapped out: $(grep -h preemptions "$many.err")"
        return
    fi
    echo "    $(wc -l <"$many") completions equal; $(grep -ho 'preemptions:.*' "$many.err")"
    st_ok "$name"
}

run_case mpi_np2_equals_one_process 2
run_case mpi_np4_equals_one_process 4
run_case mpi_np2_swap_equals_one_process 2 "${swap[@]}"
run_case mpi_np4_swap_equals_one_process 4 "${swap[@]}"

# A follower dies mid-generation: every process must end, mpirun non-zero, with a message
# that names the dead rank, well before the generation would have finished.
name=mpi_follower_killed_ends_the_job
st_run "$name"
big=$scratch/big
mkdir -p "$big"
cp models/stories260K/tokenizer.json models/stories260K/tokenizer_config.json "$big/"
cat >"$big/config.json" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
 "intermediate_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 16,
 "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 512,
 "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
 "torch_dtype": "float32"}
EOF
out=$scratch/killed
start=$(date +%s)
timeout 120 mpirun -np 2 "$bin" generate --model "$big" --load-format dummy --prompt "Lily" \
    --temperature 0 --max-tokens 1500 --ignore-eos --device cpu --cpu-threads 1 \
    --tensor-parallel-size 2 </dev/null >"$out" 2>"$out.err" &
job=$!
victim=""
for _ in $(seq 600); do # until rank 0 has printed tokens (or 60 s)
    if [[ -s $out ]]; then
        for p in $(pgrep -f "generate --model $big"); do
            if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then
                victim=$p
            fi
        done
        [[ -n $victim ]] && break
    fi
    sleep 0.1
done
if [[ -z $victim ]]; then
    echo "    out: $(wc -c <"$out") bytes; $(pgrep -af "generate --model $big" | wc -l) processes"
    kill "$job" 2>/dev/null
    wait "$job"
    st_fail "$name" "no output or no rank 1 process: $(tail -3 "$out.err")"
else
    kill -9 "$victim"
    status=0
    wait "$job" || status=$?
    took=$(($(date +%s) - start))
    echo "    killed rank 1 (pid $victim); mpirun exited $status after ${took}s:"
    grep -v '^ *$' "$out.err" | grep -iv "^pagellm: \(device\|kv cache\)" | head -12 |
        sed "s/^/    | /"
    if ((status == 0 || status == 124)); then
        st_fail "$name" "mpirun exited $status (0: not an error; 124: hung until the timeout)"
    elif ! grep -Eqi "rank 1|process rank 1" "$out.err"; then
        st_fail "$name" "the message does not name rank 1"
    elif pgrep -f "generate --model $big" >/dev/null; then
        st_fail "$name" "processes are left: $(pgrep -af "generate --model $big")"
    else
        st_ok "$name"
    fi
fi

st_end
