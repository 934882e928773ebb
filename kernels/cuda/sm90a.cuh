/* sm90a.cuh - (internal to kernels/cuda/) what the Hopper-only kernels (*_sm90a.cu) share:
 * mbarriers, the tensor copy engine (TMA) with 128-byte swizzle, shared-memory matrix
 * descriptors and wgmma. Included only by files configure.py compiles for sm_90a
 * (PAGELLM_SM90A); the kc_tensor_map_* functions live in gemm_sm90a.cu beside
 * k_cuda_wgmma_available, which finds the driver's encoder. */
#ifndef PAGELLM_KERNELS_CUDA_SM90A_CUH
#define PAGELLM_KERNELS_CUDA_SM90A_CUH

#include <cuda.h>

#include "cuda_internal.cuh"

#if PAGELLM_SM90A

/* A 2-D row-major [rows, cols] 16-bit (8-bit) tensor of row pitch `ld` elements, read in boxes
 * of box_rows x 64 (128) elements, one 128-byte swizzled row each, zero fill beyond the edges. */
CUtensorMap kc_tensor_map_16bit(const void *base, DType dt, int64_t rows, int64_t cols, int64_t ld,
                                int box_rows);
CUtensorMap kc_tensor_map_8bit(const void *base, int64_t rows, int64_t cols, int64_t ld,
                               int box_rows);

namespace {

constexpr int BK = 64;                 /* K elements per stage: one 128-byte swizzled row */
constexpr int ROW_BYTES = BK * 2;      /* 16-bit elements */
constexpr int SMEM_LIMIT = 227 * 1024; /* a block's dynamic shared memory on sm_90 */
constexpr int WS_THREADS = 384;        /* producer warpgroup + two consumer warpgroups */
constexpr int WS_CONSUMER_WARPS = 8;   /* the arrivals that give a ring stage back */

/* Ring stages of stage_bytes that fit beside the alignment slack and the barriers, at most 8;
 * and a block's dynamic shared memory for them (1024-byte alignment slack, the barriers). */
__host__ __device__ constexpr int ring_stages(int stage_bytes) {
    return (SMEM_LIMIT - 1024 - 128) / stage_bytes < 8 ? (SMEM_LIMIT - 1024 - 128) / stage_bytes
                                                       : 8;
}
constexpr size_t ring_smem_bytes(int stage_bytes) {
    return 1024 + (size_t)ring_stages(stage_bytes) * stage_bytes + 128;
}

/* ---- shared memory, mbarriers and the tensor copy engine ---- */

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
    const uint32_t a = smem_addr(bar);
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
}

/* The dynamic shared memory rounded up to its first 1024-byte boundary, where 128-byte swizzled
 * tiles must start (ring_smem_bytes counts the slack). */
__device__ __forceinline__ uint8_t *ring_base(uint8_t *dynamic_smem) {
    return (uint8_t *)(((uintptr_t)dynamic_smem + 1023) & ~(uintptr_t)1023);
}

/* Thread 0's set-up of a ring's barriers: full[s] completes on the producer's one arrival (with
 * the copies' bytes), empty[s] on `consumers` arrivals. The caller then synchronizes the block
 * (or the cluster) before any thread uses them. */
__device__ __forceinline__ void ring_init(uint64_t *full, uint64_t *empty, int stages,
                                          unsigned consumers) {
    if (threadIdx.x != 0)
        return;
    for (int s = 0; s < stages; s++) {
        mbar_init(&full[s], 1);
        mbar_init(&empty[s], consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* One arrival on the barrier at the same offset in CTA `cta` of the cluster (itself included).
 * Default semantics (release at CTA scope): a .release.cluster arrive costs a memory barrier
 * per call, which ncu showed as 37 % of the warps' stalls. What it orders is the consumers'
 * MMAs' reads of the stage, complete once wgmma.wait_group has returned. */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, unsigned cta) {
    asm volatile("{\n.reg .b32 remote;\n"
                 "mapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
                 "r"(cta)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/* The box at (k, row) of `map` into dst, completing on bar, with an L2 eviction policy. */
__device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, int k, int row,
                                         uint64_t *bar, uint64_t policy) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(k), "r"(row), "l"(policy)
                 : "memory");
}

/* The same into dst of every CTA of the cluster in `mask`, each completing on its own bar. */
__device__ __forceinline__ void tma_load_multicast(void *dst, const CUtensorMap *map, int k,
                                                   int row, uint64_t *bar, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(smem_addr(bar)), "r"(k), "r"(row), "h"(mask)
                 : "memory");
}

__device__ __forceinline__ uint64_t l2_policy_evict_normal(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}

__device__ __forceinline__ uint64_t l2_policy_evict_last(void) {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

/* ---- wgmma ---- */

/* Shared-memory matrix descriptor of a K-major tile written by the copy engine with 128-byte
 * swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart (stride byte offset), layout type 1
 * (128B swizzle) in bits 62-63. The tile must start on a 1024-byte boundary; a k16 step within
 * the row adds 32 bytes to the start address (field units of 16 bytes). */
__device__ __forceinline__ uint64_t smem_desc(const void *tile) {
    return (uint64_t)((smem_addr(tile) & 0x3ffff) >> 4) | (uint64_t)1 << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ void wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accumulator reads or writes across the asynchronous MMAs. */
template <int R> __device__ __forceinline__ void acc_fence(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++)
        asm volatile("" : "+f"(d[i])::"memory");
}

#define WG_D8(i)                                                                                   \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),    \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32  WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
#define WG_D48  WG_D32, WG_D8(32), WG_D8(40)
#define WG_D56  WG_D32, WG_D8(32), WG_D8(40), WG_D8(48)
#define WG_D64  WG_D56, WG_D8(56)
#define WG_D112 WG_D56, WG_D8(56), WG_D8(64), WG_D8(72), WG_D8(80), WG_D8(88), WG_D8(96), WG_D8(104)
#define WG_REGS_32                                                                                 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                       \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS_48                                                                                 \
    WG_REGS_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_REGS_64                                                                                 \
    WG_REGS_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "                    \
               "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "            \
               "%58, %59, %60, %61, %62, %63"
#define WG_REGS_112                                                                                \
    WG_REGS_64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "          \
               "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, "       \
               "%93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, "           \
               "%106, %107, %108, %109, %110, %111"

/* wgmma_nN<T>(d, da, db, scale_d): d[64 x N] (+)= a[64 x 16] b[N x 16]^T for T bf16 or f16,
 * both operands K-major in shared memory (descriptors da, db), d this warpgroup's fragment
 * (N / 2 per thread); scale_d 0 overwrites d. REGS, DOPS: the accumulators' operand list and
 * constraints; IA, IB, IS: the operand numbers after them. */
#define WGMMA_ASM(N, AB, REGS, IA, IB, IS)                                                         \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" #IS ", 0;\n"                                              \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #AB "." #AB " {" REGS "}, %" #IA ", %" #IB   \
    ", p, 1, 1, 0, 0;\n}\n"
#define WGMMA_DEFINE(N, REGS, DOPS, IA, IB, IS)                                                    \
    template <typename T>                                                                          \
    __device__ __forceinline__ void wgmma_n##N(float(&d)[N / 2], uint64_t da, uint64_t db,         \
                                               int scale_d) {                                      \
        if constexpr (std::is_same<T, bf16>::value)                                                \
            asm volatile(WGMMA_ASM(N, bf16, REGS, IA, IB, IS)                                      \
                         : DOPS                                                                    \
                         : "l"(da), "l"(db), "r"(scale_d));                                        \
        else                                                                                       \
            asm volatile(WGMMA_ASM(N, f16, REGS, IA, IB, IS)                                       \
                         : DOPS                                                                    \
                         : "l"(da), "l"(db), "r"(scale_d));                                        \
    }
WGMMA_DEFINE(64, WG_REGS_32, WG_D32, 32, 33, 34) /* wgmma_n64<T>: more kernels than one use it */
} // namespace

#endif
#endif
