#!/usr/bin/env bash
# bench/h200.sh - the performance issue's workloads on one H200, in one command, as one table:
# workload, measured, floor, measured/floor, target, pass/fail.
#
#   bench/h200.sh [OUTDIR]        (from the repository root, after ./configure.py && ninja)
#   ROWS="1 2 3" bench/h200.sh    only those rows (numbered as in the comments below)
#   DTYPE=fp8 bench/h200.sh       the fp8 table (issue 36): the same model quantized online
#                                 (--quantization fp8) with an fp8 KV cache, fp8 floors and
#                                 targets, rows 1-5 and 11 (Llama-3-70B shape, batch 1)
#   PAGELLM_BIN=path bench/h200.sh   another build's binary (bench/ab.sh compares two)
#
# Model: Llama-3-8B shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, head_dim 128,
# intermediate 14336, vocab 128256), load-format dummy, bf16, block size 16, written to
# $OUTDIR/l3 with GPT-2's tokenizer.json (for the HTTP row; prompts are token ids elsewhere).
# Floors (../shared/DESIGN.md 6): copy 4.23 TB/s, bf16 GEMM 763 TFLOP/s, host<->device
# 55 GB/s; weights 16.06 GB, KV 128 KiB per token. Logs of every run stay in OUTDIR
# (default /tmp/pagellm-h200). Takes about 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/pagellm-h200}
mkdir -p "$out"
bin=${PAGELLM_BIN:-build/pagellm}
[ -x "$bin" ] || { echo "bench/h200.sh: $bin not built (./configure.py && ninja)" >&2; exit 1; }
. bench/llama_config.sh
write_llama_config "$out/l3" 4096 32 32 14336
cp tests/data/tokenizers/gpt2/tokenizer.json "$out/l3/"
model=(--model "$out/l3" --load-format dummy --block-size 16)
# Floors and targets per row (fp8: 7.0 GB of fp8 layers + 1.05 GB bf16 LM head, KV 64 KiB per
# token, fp8 GEMM ~2x the bf16 rate; issue 36's table)
fp8=0
if [ "${DTYPE:-bf16}" = fp8 ]; then
    fp8=1
    model+=(--quantization fp8 --kv-cache-dtype fp8)
    ROWS=${ROWS:-"1 2 3 4 5 11"} # the fp8 table's rows
    f1=1.90 t1=2.2 f2=5.96 t2=8 f3=22 t3=30 f4="" t4=30000 t5=20000
else
    f1=3.80 t1=4.2 f2=11.9 t2=14 f3=43 t3=55 f4=23700 t4=17000 t5=10000
fi
# bench latency repeats the same prompts: without this the measured prefills would be
# prefix-cache hits of the warm-up's blocks
cold=(--enable-prefix-caching false)

rows=()
want() { [ -z "${ROWS:-}" ] || [[ " $ROWS " == *" $1 "* ]]; }
# row NAME MEASURED FLOOR UNIT TARGET_TEXT PASS(0/1); ratio = measured/floor (or floor/measured
# for rates, flagged by UNIT ending in /s)
row() {
    local ratio
    if [[ $4 == */s ]]; then ratio=$(awk -v m="$2" -v f="$3" 'BEGIN{printf (m>0&&f>0)?"%.2fx":"-", f/m}')
    else ratio=$(awk -v m="$2" -v f="$3" 'BEGIN{printf (m>0&&f>0)?"%.2fx":"-", m/f}'); fi
    rows+=("| $1 | $2 $4 | ${3:--} | $ratio | $5 | $([ "$6" = 1 ] && echo pass || echo FAIL) |")
}
# the value is the last number of the match ("Decode step (batch 256): median 12.5" -> 12.5)
num() { grep -oE "$1" | head -1 | grep -oE '[0-9]+(\.[0-9]+)?' | tail -1; }
le() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a!="" && a<=b)}' && echo 1 || echo 0; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN{exit !(a!="" && a>=b)}' && echo 1 || echo 0; }

# 1. batch-1 decode
if want 1; then
    $bin bench latency "${model[@]}" --batch-size 1 --input-len 128 --output-len 256 \
        --num-iters-warmup 1 --num-iters 3 --max-model-len 4096 >"$out/latency-b1.log" 2>&1
    d1=$(num 'Decode step \(batch 1\): median [0-9.]+' <"$out/latency-b1.log")
    row "decode step, batch 1 (128 in, 256 out)" "$d1" $f1 ms "<= $t1 ms" "$(le "$d1" $t1)"
fi

# 2. batch-256 decode at context 1024; 8. host share of its steps. The figure is the median of
# the pure decode steps (every prompt has its first token); with 976-token prompts their mean
# context runs from ~993 to ~1057, ~1024 at the median step, the context the floor is taken at
# (with 1024-token prompts the median step is at ~1072: 4.7 % more KV bytes than the floor's)
if want 2; then
    $bin bench latency "${model[@]}" "${cold[@]}" --batch-size 256 --input-len 976 --output-len 96 \
        --num-iters-warmup 1 --num-iters 2 --max-model-len 2048 --max-num-batched-tokens 8192 \
        >"$out/latency-b256.log" 2>&1
    d256=$(num 'Decode step \(batch 256\): median [0-9.]+' <"$out/latency-b256.log")
    row "decode step, batch 256, context 1024" "$d256" $f2 ms "<= $t2 ms" "$(le "$d256" $t2)"
    host=$(num 'host share \(schedule \+ prepare \+ emit\) [0-9.]+' <"$out/latency-b256.log")
    rows+=("| engine host time per decode step, batch 256 | $host % | 0 | - | <= 5 % | $([ "$(le "$host" 5)" = 1 ] && echo pass || echo FAIL) |")
fi

# 3. TTFT of one 2048-token prompt
if want 3; then
    $bin bench latency "${model[@]}" "${cold[@]}" --batch-size 1 --input-len 2048 --output-len 2 \
        --num-iters-warmup 1 --num-iters 5 --max-model-len 4096 >"$out/ttft-2048.log" 2>&1
    ttft=$(num 'Prefill \(batch 1 x 2048 tokens, to every first token\): median [0-9.]+' <"$out/ttft-2048.log")
    row "TTFT, one 2048-token prompt, idle" "$ttft" $f3 ms "<= $t3 ms" "$(le "$ttft" $t3)"
fi

# 4. offline throughput 128/128 x 4096
if want 4; then
    $bin bench throughput "${model[@]}" --input-len 128 --output-len 128 --num-prompts 4096 \
        --max-model-len 2048 >"$out/throughput-128.log" 2>&1
    tp=$(num '[0-9.]+ output tokens/s' <"$out/throughput-128.log")
    row "bench throughput 128/128 x 4096" "$tp" "$f4" tok/s ">= $t4 tok/s" "$(ge "$tp" $t4)"
fi

# 5. offline throughput 1000/1000 x 2000
if want 5; then
    $bin bench throughput "${model[@]}" --input-len 1000 --output-len 1000 --num-prompts 2000 \
        --max-model-len 4096 >"$out/throughput-1000.log" 2>&1
    tpl=$(num '[0-9.]+ output tokens/s' <"$out/throughput-1000.log")
    row "bench throughput 1000/1000 x 2000" "$tpl" "" tok/s ">= $t5 tok/s" "$(ge "$tpl" $t5)"
fi

# 11. fp8 only: Llama-3-70B shape on this one GPU, batch-1 decode (floor: 70.6 GB / 4.23 TB/s)
if [ $fp8 = 1 ] && want 11; then
    write_llama_config "$out/l70" 8192 80 64 28672
    $bin bench latency --model "$out/l70" --load-format dummy --block-size 16 --quantization fp8 \
        --kv-cache-dtype fp8 --batch-size 1 --input-len 128 --output-len 128 \
        --num-iters-warmup 1 --num-iters 3 --max-model-len 4096 >"$out/latency-70b-b1.log" 2>&1
    d70=$(num 'Decode step \(batch 1\): median [0-9.]+' <"$out/latency-70b-b1.log")
    row "Llama-3-70B shape, decode step, batch 1" "$d70" 16.7 ms "<= 19 ms" "$(le "$d70" 19)"
fi

# 9. server ready (graphs captured), then 6. the 128/128 workload over HTTP
if want 9 || want 6; then
    port=18123
    t0=$(date +%s.%N)
    $bin serve "${model[@]}" --port $port --max-model-len 2048 --served-model-name l3 \
        --max-queue-len 8192 \
        >"$out/serve.log" 2>&1 &
    spid=$!
    ready=""
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
            ready=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'); break
        fi
        kill -0 $spid 2>/dev/null || break
        sleep 0.1
    done
    rows+=("| server ready, 8B dummy, graphs captured | ${ready:-never} s | - | - | <= 20 s | $([ "$(le "$ready" 20)" = 1 ] && echo pass || echo FAIL) |")
    if [ -n "$ready" ]; then
        $bin bench serve --port $port --model l3 --tokenizer "$out/l3" --random-input-len 128 \
            --random-output-len 128 --ignore-eos --num-prompts 4096 --request-rate inf \
            >"$out/serve-bench.log" 2>&1
    fi
    kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
    http=$(num 'Output token throughput \(tok/s\): +[0-9.]+' <"$out/serve-bench.log" 2>/dev/null)
    pct=$(awk -v h="$http" -v t="${tp:-}" 'BEGIN{if (h>0 && t>0) printf "%.1f", 100*h/t}')
    # a rejected (503) or failed request makes the figure meaningless: the row fails
    failed=$(num 'Failed requests: +[0-9]+' <"$out/serve-bench.log" 2>/dev/null)
    okhttp=$(ge "$pct" 95); [ "${failed:-0}" = 0 ] || okhttp=0
    rows+=("| bench serve, rate inf, 128/128 x 4096 over HTTP | $http tok/s ($pct % of in-process, ${failed:-?} failed) | ${tp:-} tok/s | - | >= 95 % | $([ "$okhttp" = 1 ] && echo pass || echo FAIL) |")
fi

# 7. swap of 1000 blocks out and back in
if want 7; then
    $bin bench latency "${model[@]}" --batch-size 1 --input-len 16 --output-len 4 \
        --num-iters-warmup 0 --num-iters 1 --swap-blocks 1000 --swap-space 4 --max-model-len 2048 \
        >"$out/swap.log" 2>&1
    sw=$(num 'round trip [0-9.]+ GB/s' <"$out/swap.log")
    ov=$(num 'overlapped [0-9]+ %|both [0-9.]+ ms: -?[0-9]+ %' <"$out/swap.log")
    row "swap 1000 blocks out and in; swap-in beside decode graphs: ${ov:-?} % overlapped" \
        "$sw" 55 GB/s ">= 45 GB/s, overlapped" "$(ge "$sw" 45)"
fi

# 10. the cost of structured output: decode step at batch 64 with every request following a
# JSON schema (bench/json_schema_items.json: an array of at least 100 objects, so no sample
# completes within the run) against the same batch unconstrained; the floor is the
# unconstrained step (the constraint's masks, built on the host, and their upload are the cost)
if want 10; then
    lat64=(bench latency "${model[@]}" --batch-size 64 --input-len 128 --output-len 128
           --num-iters-warmup 1 --num-iters 3 --max-model-len 2048)
    $bin "${lat64[@]}" >"$out/latency-b64.log" 2>&1
    $bin "${lat64[@]}" --json-schema bench/json_schema_items.json >"$out/latency-b64-schema.log" 2>&1
    d64=$(num 'Decode step \(batch 64\): median [0-9.]+' <"$out/latency-b64.log")
    s64=$(num 'Decode step \(batch 64\): median [0-9.]+' <"$out/latency-b64-schema.log")
    lim=$(awk -v d="$d64" 'BEGIN{printf "%.3f", d * 1.1}')
    row "decode step, batch 64, JSON schema (unconstrained: $d64 ms)" "$s64" "$d64" ms \
        "<= 1.1x unconstrained" "$(le "$s64" "$lim")"
fi

echo "pagellm $(git rev-parse --short HEAD 2>/dev/null) (${DTYPE:-bf16}), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), $(date -u +%Y-%m-%d)"
echo "| workload | measured | floor | measured / floor | target | result |"
echo "| --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
