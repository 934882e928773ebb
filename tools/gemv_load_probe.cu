/* gemv_load_probe.cu - how fast a batch-1 GEMV's weight reads stream when nothing but the reads
 * happens, for several shapes of a warp's load: the bound the fp8 GEMV (matmul_fp8.cu) can reach
 * with each layout. Not part of the build; on a GPU host:
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/gemv_load_probe tools/gemv_load_probe.cu
 *   /tmp/gemv_load_probe
 *
 * The grid is the fp8 GEMV's: a block of 8 warps owns 16 rows of a [N, K] byte matrix (the
 * Llama-3-8B fp8 projections), its units of 2 KB (4 loads of 16 bytes a lane) taken by the warps
 * in turn, DEPTH units in flight a warp, with the GEMV's non-allocating loads. SEG is the bytes
 * of one row a warp load covers: 64 (8 rows a load, the fp8 GEMV's layout for 5-8 rows of x),
 * 128 (4 rows, its layout for up to 4), 256 or 512. "rows" is the bf16 GEMV's shape for
 * comparison: a warp of a 4-warp block reads one whole row, 2 KB in flight. Blocks an SM are
 * capped at 3 by shared memory (the fp8 GEMV's occupancy: 80 registers) or left free. Each
 * launch reads another copy of the matrix (24 in rotation, past the L2); the rate is bytes over
 * the mean time of 60 launches back to back. */
#include "probe_util.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

__device__ __forceinline__ uint4 ld_stream(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ unsigned fold(uint4 v) {
    return v.x ^ v.y ^ v.z ^ v.w;
}

/* A unit: UR rows x UC columns (UR x UC = 2048); load i covers 32 / (SEG / 16) rows x SEG
 * bytes. Units ordered column-chunk fastest within the block's 16 rows. */
template <int SEG, int DEPTH>
__global__ void __launch_bounds__(256) units_kernel(const uint8_t *w, int K, unsigned *sink) {
    constexpr int LANES_A_ROW = SEG / 16, ROWS_A_LOAD = 32 / LANES_A_ROW;
    constexpr int UC = SEG >= 128 ? SEG : 128, UR = 2048 / UC, SEGS_A_ROW = UC / SEG;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r0 = blockIdx.x * 16;
    const int chunks = K / UC, units = chunks * (16 / UR);
    auto addr = [&](int u, int i) {
        const int row =
            r0 + (u / chunks) * UR + (i / SEGS_A_ROW) * ROWS_A_LOAD + lane / LANES_A_ROW;
        const size_t col =
            (size_t)(u % chunks) * UC + (i % SEGS_A_ROW) * SEG + (lane % LANES_A_ROW) * 16;
        return w + (size_t)row * K + col;
    };
    unsigned acc = 0;
    uint4 buf[DEPTH][4];
    int u = warp;
#pragma unroll
    for (int d = 0; d < DEPTH; d++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            buf[d][i] = u + 8 * d < units ? ld_stream(addr(u + 8 * d, i)) : make_uint4(0, 0, 0, 0);
    for (; u < units; u += 8 * DEPTH)
#pragma unroll
        for (int d = 0; d < DEPTH; d++) {
            const int next = u + 8 * (d + DEPTH);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                acc ^= fold(buf[d][i]);
                buf[d][i] = next < units ? ld_stream(addr(next, i)) : make_uint4(0, 0, 0, 0);
            }
        }
    if (acc == 0x12345678u)
        *sink = acc;
}

/* one warp a whole row, 4 loads of 512 bytes in flight */
__global__ void __launch_bounds__(128) rows_kernel(const uint8_t *w, int K, unsigned *sink) {
    const int lane = threadIdx.x & 31, row = blockIdx.x * 4 + (threadIdx.x >> 5);
    const uint8_t *p = w + (size_t)row * K;
    unsigned acc = 0;
    for (int c = lane * 16; c < K; c += 2048) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            v[j] = c + j * 512 < K ? ld_stream(p + c + j * 512) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc ^= fold(v[j]);
    }
    if (acc == 0x12345678u)
        *sink = acc;
}

typedef void (*Kernel)(const uint8_t *, int, unsigned *);

struct Variant {
    const char *name;
    Kernel fn;
    int threads, rows_a_block;
};

int main() {
    const size_t pool = (size_t)3 << 30;
    uint8_t *w;
    unsigned *sink;
    CK(cudaMalloc(&w, pool));
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    CK(cudaMemset(w, 1, pool));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    const int shapes[][2] = {{4096, 4096}, {6144, 4096}, {4096, 14336}, {28672, 4096}};
    const Variant variants[] = {
        {"seg64 depth1", units_kernel<64, 1>, 256, 16},
        {"seg128 depth1", units_kernel<128, 1>, 256, 16},
        {"seg256 depth1", units_kernel<256, 1>, 256, 16},
        {"seg512 depth1", units_kernel<512, 1>, 256, 16},
        {"seg64 depth2", units_kernel<64, 2>, 256, 16},
        {"seg128 depth2", units_kernel<128, 2>, 256, 16},
        {"seg512 depth2", units_kernel<512, 2>, 256, 16},
        {"seg64 depth4", units_kernel<64, 4>, 256, 16},
        {"seg512 depth4", units_kernel<512, 4>, 256, 16},
        {"rows", rows_kernel, 128, 4},
    };
    cudaEvent_t start, stop;
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
    for (int capped = 1; capped >= 0; capped--)
        for (const Variant &v : variants) {
            if (capped && v.threads != 256)
                continue;
            const int smem = capped ? 220 * 1024 / 3 : 0;
            if (smem)
                CK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            printf("%-14s %-8s", v.name, capped ? "3 a SM" : "free");
            for (const auto &s : shapes) {
                const int N = s[0], K = s[1];
                const size_t bytes = (size_t)N * K;
                const int copies = pool / bytes < 24 ? (int)(pool / bytes) : 24, iters = 60;
                for (int it = 0; it < 5; it++)
                    v.fn<<<N / v.rows_a_block, v.threads, smem>>>(w + it % copies * bytes, K, sink);
                CK(cudaEventRecord(start));
                for (int it = 0; it < iters; it++)
                    v.fn<<<N / v.rows_a_block, v.threads, smem>>>(w + it % copies * bytes, K, sink);
                CK(cudaEventRecord(stop));
                CK(cudaEventSynchronize(stop));
                CK(cudaGetLastError());
                float ms;
                CK(cudaEventElapsedTime(&ms, start, stop));
                const double us = ms * 1e3 / iters;
                printf("  %dx%d %6.1f us %5.0f GB/s", N, K, us, bytes / us / 1e3);
            }
            printf("\n");
        }
    return 0;
}
