#!/usr/bin/env bash
# bench/tp.sh - decode steps of the Llama-3-70B-shaped dummy model (and the 8B one) at each
# tensor-parallel size the host's GPUs allow, as one table: model, TP, batch, measured step,
# the per-GPU shard's floor, measured/floor, and at batch 256 the output tokens/s.
#
#   bench/tp.sh [OUTDIR]                     (from the repository root, after ninja)
#   TP="2 4" MODELS="70b" BATCHES="1" bench/tp.sh
#
# Shapes: 70B hidden 8192, 80 layers, 64 heads, 8 KV heads, head_dim 128, intermediate 28672,
# vocab 128256 (70.55 B parameters, 141.1 GB in bf16); 8B as bench/h200.sh (16.06 GB). Load
# format dummy, bf16, block size 16, `bench latency` at input 128, output 64 (context
# 129-192). Floor per GPU (../shared/DESIGN.md 6): its shard's weights at 4.23 TB/s, or at
# batch 256 the shard's GEMM FLOPs (2 x parameters x 256 / N) at 763 TFLOP/s if larger.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pagellm-tp}
bin=build/pagellm
[ -x "$bin" ] || { echo "bench/tp.sh: $bin not built (./configure.py && ninja)" >&2; exit 1; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$gpus" -ge 2 ] || { echo "bench/tp.sh: needs 2 or more GPUs, found $gpus" >&2; exit 1; }
sizes=${TP:-"1 2 4 8"}
models=${MODELS:-"8b 70b"}
batches=${BATCHES:-"1 256"}

. bench/llama_config.sh
write_llama_config "$out/8b" 4096 32 32 14336
write_llama_config "$out/70b" 8192 80 64 28672

echo "pagellm $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $gpus GPUs, $(date -u +%F)"
echo "| model | TP | batch | decode step | floor per GPU | measured / floor | output tok/s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for m in $models; do
    case $m in
        8b) params=8.03e9 ;;
        70b) params=70.55e9 ;;
        *) echo "bench/tp.sh: unknown model $m (8b or 70b)" >&2; exit 1 ;;
    esac
    for n in $sizes; do
        [ "$n" -le "$gpus" ] || continue
        [ "$m" = 70b ] && [ "$n" -lt 2 ] && continue # 141 GB: more than one H200
        for b in $batches; do
            log="$out/$m-tp$n-b$b.log"
            $bin bench latency --model "$out/$m" --load-format dummy --block-size 16 \
                --input-len 128 --output-len 64 --num-iters-warmup 1 --num-iters 1 \
                --max-model-len 2048 --tensor-parallel-size "$n" --batch-size "$b" >"$log" 2>&1
            ms=$(grep -oE "Decode step \(batch $b\): median [0-9.]+" "$log" | grep -oE '[0-9.]+$')
            awk -v m="$m" -v n="$n" -v b="$b" -v ms="${ms:-}" -v p="$params" 'BEGIN {
                w = 2 * p / n / 4.23e12 * 1e3; f = 2 * p * b / n / 763e12 * 1e3
                floor = f > w ? f : w
                if (ms == "") {
                    printf "| %s | %d | %d | failed (see log) | %.2f ms | - | - |\n", m, n, b, floor
                    exit
                }
                printf "| %s | %d | %d | %.3f ms | %.2f ms | %.2fx | %.0f |\n", m, n, b, ms,
                    floor, ms / floor, b / ms * 1e3
            }'
        done
    done
done
echo "logs: $out"
