#!/usr/bin/env python3
"""kernel_trace_steps.py - where a decode step's GPU time goes, from tools/kernel_trace.c's CSV.

A step starts at an embedding kernel (the forward's first, one block per token of the step);
decode steps of --rows rows (an embedding grid of --rows blocks and a decode attention kernel)
are kept, the first --skip of them dropped. Prints the kept steps'
median wall time (embedding to the next embedding) and, per kernel (name and grid), the calls
and mean GPU time per step, summed by kind (a step's last GEMM is the LM head's). A kernel's
time is its own: from the later of its start and the end of every kernel before it, to its end
(with programmatic dependent launch a kernel starts early and waits for the one before; that
wait is the earlier kernel's time). The times add up to `busy`, the union of the spans.

    python3 tools/kernel_trace_steps.py TRACE.csv --rows 256 [--skip 5] [--gaps 8]

--gaps N also prints the N largest sources of idle GPU time in a step: the time between one
kernel's end and the next kernel's start (nothing running), summed per pair of kernel names,
the gap after a step's last kernel (up to the next step's first) included.
"""
import argparse
import csv
import re
import shutil
import statistics
import subprocess
import sys

KINDS = [
    ("attention", r"decode_kernel|decode_tc_kernel|decode_reduce"),
    ("gemm", r"nvjet|gemm|xmma|cutlass|splitK|gemv"),
    ("norm", r"norm"),
    ("rope", r"rope"),
    ("silu", r"silu"),
    ("sampler", r"sample_kernel|penalty|scatter_tokens"),
    ("logits", r"to_f32|vocab_logits|gather_rows"),
    ("embedding", r"embedding"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def demangler(names):
    """name -> readable name, through c++filt where it is installed (CUPTI gives mangled ones)."""
    names = sorted(set(names))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.split("\n")
    return {n: (lines[i] if i < len(lines) and lines[i] else n) for i, n in enumerate(names)}


def short(name):
    """The kernel's name without its template arguments and parameters."""
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            if depth == 0 and ch == "(":
                break
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)[:60]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--rows", type=int, required=True, help="decode rows of the steps to keep")
    ap.add_argument("--skip", type=int, default=3, help="kept steps to drop first (warm-up)")
    ap.add_argument("--gaps", type=int, default=0, help="print the N largest idle gaps' sources")
    a = ap.parse_args()
    kernels = []
    with open(a.trace, newline="") as f:
        for row in csv.reader(f):
            if len(row) == 5:
                kernels.append((int(row[0]), int(row[1]), row[2], row[4]))
    if not kernels:
        sys.exit(f"{a.trace}: no kernel records")
    names = demangler(k[3] for k in kernels)
    kernels = sorted((s, e, g, names[n]) for s, e, g, n in kernels)
    starts = [i for i, k in enumerate(kernels) if "embedding" in k[3]]
    steps = []
    for s, e in zip(starts, starts[1:]):
        ks = kernels[s:e]
        attn = any(re.search(r"decode_(tc_)?kernel", k[3]) for k in ks)
        if attn and int(ks[0][2].split("x")[0]) == a.rows:
            steps.append((ks + [kernels[e]], kernels[e][0] - kernels[s][0]))
    steps = steps[a.skip:]
    if not steps:
        sys.exit(f"{a.trace}: no decode steps of {a.rows} rows (after skipping {a.skip})")
    n = len(steps)
    per = {}
    busy = []
    gaps = {}
    for ks_next, _ in steps:
        ks = ks_next[:-1]
        t_end, b = 0, 0
        gemms = [i for i, k in enumerate(ks) if kind_of(k[3]) == "gemm"]
        for i, (start, end, grid, name) in enumerate(ks):
            kind = "lm_head" if gemms and i == gemms[-1] else kind_of(name)
            key = (kind, short(name), grid)
            calls, total = per.get(key, (0, 0))
            own = max(0, end - max(start, t_end))
            per[key] = (calls + 1, total + own)
            b += own
            t_end = max(t_end, end)
            nxt = ks_next[i + 1]  # nothing runs from t_end to the next kernel's start
            if nxt[0] > t_end:
                gap = (short(name), short(nxt[3]))
                gaps[gap] = gaps.get(gap, 0) + nxt[0] - t_end
        busy.append(b)
    wall = statistics.median(w for _, w in steps) / 1e6
    print(f"{n} steps of {a.rows} rows: wall median {wall:.3f} ms, GPU busy median "
          f"{statistics.median(busy) / 1e6:.3f} ms")
    print(f"{'kind':10} {'calls':>6} {'ms/step':>8} {'us/call':>8}  grid  kernel")
    kinds = {}
    for key in sorted(per, key=lambda k: -per[k][1]):
        calls, total = per[key]
        kinds[key[0]] = kinds.get(key[0], 0) + total
        print(f"{key[0]:10} {calls / n:6.0f} {total / n / 1e6:8.3f} {total / calls / 1e3:8.1f}  "
              f"{key[2]}  {key[1]}")
    print("by kind (ms/step): " + ", ".join(
        f"{k} {v / n / 1e6:.3f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])))
    if a.gaps:
        print(f"idle GPU time, us per step, by the kernels either side (largest {a.gaps}):")
        for (prev, nxt), t in sorted(gaps.items(), key=lambda kv: -kv[1])[:a.gaps]:
            print(f"{t / n / 1e3:8.1f}  {prev} -> {nxt}")


if __name__ == "__main__":
    main()
