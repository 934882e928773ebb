/* moe.cuh - (internal to kernels/cuda/) what the mixture-of-experts files share: the routing
 * that moe.cu leaves in the workspace (each row's picks, and the picks grouped by expert) and
 * the launchers of the two expert paths, the GEMV one of decode batches (moe_gemv.cu) and the
 * tensor-core grouped GEMMs (moe_mma.cu).
 *
 * Grouping: the n * top_k picks ("slots", slot = row * top_k + j) are laid out by expert in
 * "positions": the experts that got rows ("active", in increasing id) own consecutive position
 * ranges [offset[a], offset[a + 1]); within an expert the order is unspecified (atomics), which
 * changes no value (every position's result depends on its own row only). The tensor-core path
 * also gets a tile list: each active expert's range cut into tiles of at most `tile_rows`. */
#ifndef PAGELLM_KERNELS_CUDA_MOE_CUH
#define PAGELLM_KERNELS_CUDA_MOE_CUH

#include "cuda_internal.cuh"

enum { MOE_MAX_EXPERTS = 512, MOE_MAX_TOP_K = 32, MOE_GEMV_MAX_ROWS = 8, MOE_MIN_TILE_ROWS = 16 };

/* Device pointers into the workspace (sizes for n rows, E experts, k picks a row). */
struct MoeRouting {
    float *logits;       /* [n, E] router logits, fp32 */
    int32_t *ids;        /* [n, k] picked experts, increasing id within a row */
    float *weights;      /* [n, k] their weights (renormalized when asked) */
    int32_t *pos_of;     /* [n k] slot -> position */
    int32_t *slot_at;    /* [n k] position -> slot */
    int32_t *active;     /* [E] the experts with rows, increasing id; num_active of them, then
                            -1 up to min(E, n k) */
    int32_t *offset;     /* [E + 1] active expert a's positions start at offset[a] */
    int32_t *num_active; /* [1] */
    int32_t *num_tiles;  /* [1] */
    int32_t *tile_a;     /* [max_tiles] a tile's active expert */
    int32_t *tile_pos;   /* [max_tiles] its first position (rows: up to tile_rows, in range) */
    int max_tiles;
};

/* Tiles of at most tile_rows that cover n k slots spread over at most E experts. */
static inline int moe_max_tiles(int slots, int E, int tile_rows) {
    return (slots < E ? slots : E) + (slots + tile_rows - 1) / tile_rows;
}

/* logits[t, e] = x[t] . router[e] in fp32 for a routed batch on tensor cores (moe_logits.cu):
 * 16-bit x and router, H % 8 == 0, both 16-byte aligned. */
template <typename T>
void moe_logits_launch(float *logits, const T *x, const T *router, int n, int E, int H,
                       cudaStream_t s);

/* act[pos, j] = silu(g) * u, [g; u] = gate_up_e x[row of pos], for n <= MOE_GEMV_MAX_ROWS,
 * then out[t, h] = sum over t's picks in increasing expert id of weight * (down_e act[pos]),
 * each expert's dot rounded to T: two launches (moe_gemv.cu). Needs active[a] = -1 for the
 * active indices num_active <= a < min(E, n top_k). */
template <typename T>
void moe_gemv_launch(T *out, const T *x, T *act, const T *gate_up, const T *down,
                     const MoeRouting &r, int n, int E, int H, int I, int top_k, cudaStream_t s);

/* The grouped GEMMs over the tile list (tiles of tile_rows(n, top_k, E) rows): act[pos, :]
 * as above, y[pos, h] = down_e act[pos] rounded to T (moe_mma.cu). */
int moe_mma_tile_rows(int n, int top_k, int E);
template <typename T>
void moe_mma_launch(T *act, T *y, const T *x, const T *gate_up, const T *down, const MoeRouting &r,
                    int n, int E, int H, int I, int top_k, cudaStream_t s);

/* The same pair on Hopper's wgmma (moe_sm90a.cu) when this build and GPU have it and the shapes
 * suit it; false: nothing launched. Overwrites y before the down GEMM writes it. */
template <typename T>
bool moe_wgmma_try(T *act, T *y, const T *x, const T *gate_up, const T *down, const MoeRouting &r,
                   int n, int E, int H, int I, int top_k, int tile_rows, int tiles, cudaStream_t s);

#endif
