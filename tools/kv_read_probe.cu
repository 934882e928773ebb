/* kv_read_probe.cu - how fast the H200 reads a decode step's K/V from the paged cache when
 * nothing but the reads happens: the bound a decode-attention kernel can reach with this cache
 * layout. Not part of the build; on a GPU host:
 *
 *   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/kv_read_probe tools/kv_read_probe.cu
 *   /tmp/kv_read_probe
 *
 * One layer of a Llama-3-8B-shaped cache (block of 16 positions: K then V, each [position]
 * [8 KV heads][128] bf16, as KvLayout), 256 sequences of 1024 positions whose block tables are
 * a random permutation (4 sets in rotation: 2 GB, well past the 60 MB L2). Two read orders:
 * per head (a block per (KV head, sequence, partition) reads 256-byte head slices, as the
 * decode kernels do) and all heads (a block per (sequence, partition) reads whole 2-KB
 * position rows). Each thread XORs what it loads so that nothing is optimised away; the rate
 * is K/V bytes over the mean time of 40 launches. A plain copy of the same bytes is printed
 * for comparison. */
#include "probe_util.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

/* elements (2 bytes) */
constexpr int BS = 16, NKV = 8, D = 128, ROW = NKV * D, HALF = BS * ROW, BLOCK = 2 * HALF;

/* block (g, row, part): head g's slices, 16 lanes per 256-byte slice, UNR loads in flight */
template <int UNR>
__global__ void per_head(const uint4 *cache, const int *tab, int mb, int part_len, unsigned *sink) {
    const int g = blockIdx.x, row = blockIdx.y, start = blockIdx.z * part_len;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane & 15, r = lane >> 4;
    unsigned acc = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int p0 = start + warp * 2 * UNR; p0 < start + part_len; p0 += 4 * 2 * UNR) {
            uint4 v[UNR];
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int p = p0 + u * 2 + r, b = tab[row * mb + p / BS];
                v[u] = __ldg(
                    cache + ((size_t)b * BLOCK + kv * HALF + (p % BS) * ROW + g * D + sub * 8) / 8);
            }
#pragma unroll
            for (int u = 0; u < UNR; u++)
                acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    if (acc == 0x12345678u)
        *sink = acc;
}

/* block (row, part): whole position rows, 128 threads x 16 bytes each */
template <int UNR>
__global__ void all_heads(const uint4 *cache, const int *tab, int mb, int part_len,
                          unsigned *sink) {
    const int row = blockIdx.x, start = blockIdx.y * part_len, t = threadIdx.x;
    unsigned acc = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int p0 = start; p0 < start + part_len; p0 += UNR) {
            uint4 v[UNR];
#pragma unroll
            for (int u = 0; u < UNR; u++) {
                const int p = p0 + u, b = tab[row * mb + p / BS];
                v[u] = __ldg(cache + ((size_t)b * BLOCK + kv * HALF + (p % BS) * ROW + t * 8) / 8);
            }
#pragma unroll
            for (int u = 0; u < UNR; u++)
                acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
    if (acc == 0x12345678u)
        *sink = acc;
}

__global__ void copy_kernel(const uint4 *a, uint4 *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[i];
}

int main() {
    const int rows = 256, ctx = 1024, mb = ctx / BS, nsets = 4;
    const size_t nblocks = (size_t)rows * mb * nsets, bytes = nblocks * BLOCK * 2;
    uint4 *cache;
    CK(cudaMalloc(&cache, bytes));
    CK(cudaMemset(cache, 1, bytes));
    std::vector<int> perm(nblocks);
    for (size_t i = 0; i < nblocks; i++)
        perm[i] = (int)i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(1));
    int *tab;
    unsigned *sink;
    CK(cudaMalloc(&tab, nblocks * sizeof(int)));
    CK(cudaMemcpy(tab, perm.data(), nblocks * sizeof(int), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    const double set_bytes = (double)rows * ctx * NKV * D * 2 * 2; /* K and V, bf16 */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto timeit = [&](const char *name, auto launch) {
        for (int i = 0; i < 3; i++)
            launch(i % nsets);
        CK(cudaDeviceSynchronize());
        const int iters = 40;
        CK(cudaEventRecord(e0));
        for (int i = 0; i < iters; i++)
            launch(i % nsets);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= iters;
        printf("%-30s %8.1f us  %.2f TB/s\n", name, ms * 1e3, set_bytes / (ms * 1e-3) / 1e12);
    };
    for (int part : {128, 256, 512, 1024}) {
        char n[64];
        snprintf(n, sizeof n, "per head, part %d", part);
        timeit(n, [&](int s) {
            per_head<8>
                <<<dim3(NKV, rows, ctx / part), 128>>>(cache, tab + s * rows * mb, mb, part, sink);
        });
        snprintf(n, sizeof n, "all heads, part %d", part);
        timeit(n, [&](int s) {
            all_heads<4>
                <<<dim3(rows, ctx / part), 128>>>(cache, tab + s * rows * mb, mb, part, sink);
        });
    }
    uint4 *dst;
    CK(cudaMalloc(&dst, (size_t)set_bytes));
    const size_t n16 = (size_t)set_bytes / 16;
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; i++)
        copy_kernel<<<132 * 8, 512>>>(cache, dst, n16);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= 20;
    printf("copy of the same bytes          %8.1f us  %.2f TB/s (read + write)\n", ms * 1e3,
           2 * set_bytes / (ms * 1e-3) / 1e12);
    CK(cudaGetLastError());
    return 0;
}
