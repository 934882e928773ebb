#!/usr/bin/env python3
"""fp8_accum_error.py - how far cuBLASLt's fp8 GEMM on Hopper lands from the exact sum, with
and without fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM, which kernels/cuda/matmul_fp8.cu
sets for per-tensor and per-channel weights). Draws x as tests/test_fp8_cuda.c does (uniform in
[-2, 2), every 7th element 20 times larger), quantizes it per row and an e4m3 w per output
channel, multiplies them with torch's _scaled_mm (fp32 out) and compares with the float64 sum
of the same codes and scales. Prints, per (K, rows, fast): the worst |err| / sum |products|
(test_fp8_cuda's measure), its 99.9th percentile and the median |err| / |exact|. Needs torch
with CUDA on an sm_89+ GPU:

    python3 tools/fp8_accum_error.py
"""
import torch


def draw(rows, K, N, dev):
    x = torch.rand(rows, K, device=dev) * 4 - 2
    x[:, ::7] *= 20
    xs = x.abs().amax(1, keepdim=True) / 448
    xq = (x / xs).to(torch.float8_e4m3fn)
    w = (torch.rand(N, K, device=dev) * 896 - 448).to(torch.float8_e4m3fn)
    ws = torch.rand(1, N, device=dev) * 3e-3 + 1e-4
    return xq, xs, w, ws


def main():
    torch.manual_seed(0)
    dev, N = "cuda", 4096
    for K in (1040, 4096, 14336):
        for rows in (256, 1024):
            xq, xs, w, ws = draw(rows, K, N, dev)
            scale = xs.double() * ws.double()
            exact = (xq.double() @ w.double().t()) * scale
            mag = (xq.double().abs() @ w.double().abs().t()) * scale
            for fast in (False, True):
                got = torch._scaled_mm(xq, w.t(), scale_a=xs.float(), scale_b=ws.float(),
                                       out_dtype=torch.float32, use_fast_accum=fast).double()
                err = (got - exact).abs()
                of_mag = (err / mag).flatten()
                p999 = of_mag.kthvalue(int(of_mag.numel() * 0.999)).values.item()
                rel = (err / exact.abs().clamp_min(1e-30)).median().item()
                print(f"K {K:5d} rows {rows:4d} fast {int(fast)}: worst err/mag "
                      f"{of_mag.max().item():.3e}  p99.9 {p999:.3e}  median rel {rel:.3e}")


if __name__ == "__main__":
    main()
