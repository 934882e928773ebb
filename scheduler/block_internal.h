/* block_internal.h - private state of the block manager, shared by its files:
 *   block_manager.c  the public operations (allocate, append, fork, swap, free, ...)
 *   block_pool.c     GPU and CPU pools: reference counts, free lists, the evictable LRU
 *   prefix_cache.c   the block hash and the prefix-cache hash table
 *   block_check.c    blk_check, the full invariant check
 * Tests include it for white-box checks; nothing outside scheduler/ should.
 *
 * Every GPU block is in exactly one state:
 *   in use      ref > 0 (registered or not); on no list
 *   free        ref == 0, not registered; on the free stack (taken first)
 *   evictable   ref == 0, registered; on the LRU list (oldest at head), still hit-able
 * A CPU block is in use (ref > 0) or on the CPU free stack. */
#ifndef PAGELLM_BLOCK_INTERNAL_H
#define PAGELLM_BLOCK_INTERNAL_H

#include <stdint.h>

#include "block_manager.h"

#define BLK_NONE (-1)
/* Chained hash "before" the first block of every sequence. */
#define BLK_HASH_ROOT 0x6a09e667f3bcc908ULL

typedef struct {
    uint64_t hash;      /* registered: chained hash of (parent, tokens), the table key */
    uint64_t parent;    /* registered: predecessor's chained hash, compared on lookup */
    int32_t ref;        /* references held by block tables */
    int32_t prev, next; /* evictable: LRU neighbours (BLK_NONE at the ends) */
    int32_t hnext;      /* registered: next block of the same hash bucket */
    uint8_t registered; /* 1 = in the prefix-cache hash table */
} GpuBlock;

struct BlockManager {
    BlockManagerConfig cfg; /* as created (blk_config): block size, prefix caching, window */
    int num_gpu, num_cpu;
    int watermark_blocks; /* (int)(watermark * num_gpu) */

    GpuBlock *gpu;     /* [num_gpu] */
    int32_t *gpu_free; /* [num_gpu] stack of free unregistered blocks, top at [num_gpu_free-1] */
    int32_t *matched; /* [num_gpu] scratch: the blocks a prompt matched (distinct, so <= num_gpu) */
    int num_gpu_free;
    int32_t lru_head, lru_tail; /* evictable blocks, least recently freed/hit at head */
    int num_evictable;
    int num_gpu_used; /* blocks with ref > 0 */

    int32_t *cpu_ref;  /* [num_cpu] */
    int32_t *cpu_free; /* [num_cpu] stack of free CPU blocks */
    int num_cpu_free;

    /* Prefix cache (NULL when caching is off). Chained hash table with intrusive links
     * (GpuBlock.hnext): at most num_gpu entries, so it is sized once and never rehashed. */
    int32_t *tokens;  /* [num_gpu * block_size] the tokens of each registered block */
    int32_t *buckets; /* [bucket_mask + 1] first block of each chain, BLK_NONE = empty */
    uint64_t bucket_mask;
    int num_registered;

    BlockStats stats;
};

/* --- block_pool.c --- */

/* A GPU block with ref 1: a free unregistered one if any, else the least recently used
 * evictable one (unregistered first, counted as an eviction). Aborts when none is left. */
int32_t blk_pool_take_gpu(BlockManager *bm);
/* One more reference to a GPU block (an evictable block leaves the LRU list). */
void blk_pool_ref_gpu(BlockManager *bm, int32_t id);
/* One reference less; at zero a registered block becomes evictable (most recent end of
 * the LRU list), an unregistered one free. */
void blk_pool_release_gpu(BlockManager *bm, int32_t id);
int32_t blk_pool_take_cpu(BlockManager *bm);
void blk_pool_ref_cpu(BlockManager *bm, int32_t id);
void blk_pool_release_cpu(BlockManager *bm, int32_t id);
/* Cheap counter consistency (PAGELLM_DEBUG builds call it after each mutating op). */
void blk_pool_debug_check(const BlockManager *bm);

/* --- prefix_cache.c --- */

/* Chained hash of one block: a 64-bit mix (xxHash64-style rounds, splitmix64 finish) of the
 * predecessor's hash and the block's n token ids. */
uint64_t blk_hash_block(uint64_t parent, const int32_t *tokens, int n);
/* The registered block whose key is (hash, parent, tokens), compared exactly, or BLK_NONE. */
int32_t blk_cache_lookup(const BlockManager *bm, uint64_t hash, uint64_t parent,
                         const int32_t *tokens);
/* Register block id (in use, not registered) under (hash, parent, tokens). */
void blk_cache_insert(BlockManager *bm, int32_t id, uint64_t hash, uint64_t parent,
                      const int32_t *tokens);
/* Remove a registered block from the hash table. */
void blk_cache_remove(BlockManager *bm, int32_t id);
/* The stored tokens of GPU block id ([block_size]). */
static inline int32_t *blk_cache_tokens(const BlockManager *bm, int32_t id) {
    return bm->tokens + (size_t)id * (size_t)bm->cfg.block_size;
}

#ifdef PAGELLM_DEBUG
#define BLK_DEBUG_CHECK(bm) blk_pool_debug_check(bm)
#else
#define BLK_DEBUG_CHECK(bm) ((void)0)
#endif

#endif
