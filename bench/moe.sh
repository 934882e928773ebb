#!/usr/bin/env bash
# bench/moe.sh - the mixture-of-experts decode workloads of issue 37 on one H200, as one table:
# workload, measured decode step, floor, measured/floor, target, pass/fail.
#
#   bench/moe.sh [OUTDIR]         (from the repository root, after ./configure.py && ninja)
#   ROWS="1 3" bench/moe.sh       only those rows (numbered as in the comments below)
#   PAGELLM_BIN=path bench/moe.sh another build's binary (bench/ab.sh compares two)
#   MIXTRAL_LAYERS=16 bench/moe.sh  the Mixtral shape with 16 layers (46 GB: fits an 80 GB
#                                 GPU; rows 3 and 4 get that model's floor)
#
# Models (load-format dummy, bf16, block size 16, GPT-2's tokenizer.json for the config):
#   Qwen3-30B-A3B shape: 48 layers, hidden 2048, 32 heads / 4 KV heads of 128, 128 experts,
#     top 8, moe_intermediate 768, vocab 151936, untied LM head;
#   Mixtral-8x7B shape: 32 layers, hidden 4096, 32 heads / 8 KV heads of 128, 8 experts,
#     top 2, intermediate 14336, vocab 32000.
# Floor of a decode step (../shared/DESIGN.md 6: copy at 4.23 TB/s): every byte it must read
# once, in bf16: attention weights and router of each layer, the experts the batch touches
# (E (1 - (1 - k/E)^batch) of them a layer, the expected count when every row's k picks are
# spread evenly; top 8 of 128 at batch 256: all), the LM head, and every sequence's KV at the
# median decode step's context (prompt + half the output). Targets: batch 1 <= 1.3x the floor,
# batch 256 <= 1.4x. Logs stay in OUTDIR (default /tmp/pagellm-moe). One measured iteration a
# row (decode graphs are captured at start, so no warm-up iteration is needed).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-/tmp/pagellm-moe}
mkdir -p "$out/q3m" "$out/mx"
mx_layers=${MIXTRAL_LAYERS:-32}
[[ $mx_layers =~ ^[1-9][0-9]*$ ]] ||
    { echo "bench/moe.sh: MIXTRAL_LAYERS must be a positive integer, not '$mx_layers'" >&2; exit 2; }
bin=${PAGELLM_BIN:-build/pagellm}
[ -x "$bin" ] || { echo "bench/moe.sh: $bin not built (./configure.py && ninja)" >&2; exit 1; }
cat >"$out/q3m/config.json" <<J
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144,
 "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
 "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
 "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
 "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 151643,
 "eos_token_id": 151645}
J
cat >"$out/mx/config.json" <<J
{"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
 "num_hidden_layers": $mx_layers, "num_attention_heads": 32, "num_key_value_heads": 8,
 "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
 "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
J
cp tests/data/tokenizers/gpt2/tokenizer.json "$out/q3m/"
cp tests/data/tokenizers/gpt2/tokenizer.json "$out/mx/"

# floor_ms LAYERS HIDDEN HEADS KV_HEADS HEAD_DIM EXPERTS TOP_K INTER VOCAB BATCH CONTEXT
floor_ms() {
    awk -v L="$1" -v H="$2" -v nh="$3" -v nkv="$4" -v D="$5" -v E="$6" -v k="$7" -v I="$8" \
        -v V="$9" -v b="${10}" -v ctx="${11}" 'BEGIN {
        attn = H * nh * D + 2 * H * nkv * D + nh * D * H
        touched = E * (1 - (1 - k / E) ^ b)
        params = L * (attn + E * H + touched * 3 * H * I) + V * H
        kv = b * ctx * L * 2 * nkv * D * 2
        printf "%.3f", (2 * params + kv) / 4.23e12 * 1e3 }'
}
rows=()
want() { [ -z "${ROWS:-}" ] || [[ " $ROWS " == *" $1 "* ]]; }
num() { grep -oE "$1" | head -1 | grep -oE '[0-9]+(\.[0-9]+)?' | tail -1; }
# run ROW NAME MODEL_DIR SHAPE(9 numbers) BATCH IN OUT TARGET_RATIO: one bench latency, one row
run() {
    local row=$1 name=$2 dir=$3 b=${13} in=${14} outlen=${15} target=${16} log d f ratio pass
    want "$row" || return 0
    log="$out/$(basename "$dir")-b$b.log"
    $bin bench latency --model "$dir" --load-format dummy --block-size 16 \
        --enable-prefix-caching false --batch-size "$b" --input-len "$in" --output-len "$outlen" \
        --num-iters-warmup 0 --num-iters 1 --max-model-len 1024 --max-num-seqs "$b" \
        --max-num-batched-tokens 8192 --swap-space 0 >"$log" 2>&1
    d=$(num "Decode step \\(batch $b\\): median [0-9.]+" <"$log")
    f=$(floor_ms "${@:4:9}" "$b" $((in + outlen / 2)))
    ratio=$(awk -v m="$d" -v f="$f" 'BEGIN{printf (m>0)?"%.2fx":"-", m/f}')
    pass=$(awk -v m="$d" -v f="$f" -v t="$target" 'BEGIN{print (m!="" && m<=t*f)?"pass":"FAIL"}')
    rows+=("| $name, decode step, batch $b ($in in, $outlen out) | ${d:-?} ms | $f ms | $ratio | <= ${target}x | $pass |")
}
q3m=(48 2048 32 4 128 128 8 768 151936)
mx=("$mx_layers" 4096 32 8 128 8 2 14336 32000)
mxname="Mixtral-8x7B shape"
[ "$mx_layers" = 32 ] || mxname="Mixtral-8x7B shape with $mx_layers layers"
# 1. Qwen3-30B-A3B shape, batch 1; 2. batch 256
run 1 "Qwen3-30B-A3B shape" "$out/q3m" "${q3m[@]}" 1 128 64 1.3
run 2 "Qwen3-30B-A3B shape" "$out/q3m" "${q3m[@]}" 256 64 32 1.4
# 3. Mixtral-8x7B shape, batch 1; 4. batch 256
run 3 "$mxname" "$out/mx" "${mx[@]}" 1 128 64 1.3
run 4 "$mxname" "$out/mx" "${mx[@]}" 256 64 32 1.4

echo "pagellm $(git rev-parse --short HEAD 2>/dev/null), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d)"
echo "| workload | measured | floor | measured / floor | target | result |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
