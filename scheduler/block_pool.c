/* block_pool.c - the block manager's GPU and CPU pools: reference counts, the free stacks
 * and the O(1) LRU list of evictable (registered, unreferenced) GPU blocks. Taking a GPU
 * block prefers never-registered free blocks, so cached content is evicted only when the
 * pool has nothing else. */
#include "block_internal.h"

static void lru_unlink(BlockManager *bm, int32_t id) {
    GpuBlock *b = &bm->gpu[id];
    if (b->prev != BLK_NONE)
        bm->gpu[b->prev].next = b->next;
    else
        bm->lru_head = b->next;
    if (b->next != BLK_NONE)
        bm->gpu[b->next].prev = b->prev;
    else
        bm->lru_tail = b->prev;
    b->prev = b->next = BLK_NONE;
    bm->num_evictable--;
}

static void lru_push_tail(BlockManager *bm, int32_t id) {
    GpuBlock *b = &bm->gpu[id];
    b->prev = bm->lru_tail;
    b->next = BLK_NONE;
    if (bm->lru_tail != BLK_NONE)
        bm->gpu[bm->lru_tail].next = id;
    else
        bm->lru_head = id;
    bm->lru_tail = id;
    bm->num_evictable++;
}

int32_t blk_pool_take_gpu(BlockManager *bm) {
    int32_t id;
    if (bm->num_gpu_free > 0) {
        id = bm->gpu_free[--bm->num_gpu_free];
    } else {
        PL_CHECK(bm->lru_head != BLK_NONE); /* callers check the free count first */
        id = bm->lru_head;
        lru_unlink(bm, id);
        blk_cache_remove(bm, id);
        bm->stats.evictions++;
    }
    PL_CHECK(bm->gpu[id].ref == 0 && !bm->gpu[id].registered);
    bm->gpu[id].ref = 1;
    bm->num_gpu_used++;
    return id;
}

void blk_pool_ref_gpu(BlockManager *bm, int32_t id) {
    GpuBlock *b = &bm->gpu[id];
    if (b->ref == 0) {
        /* Only a registered block can be referenced again after reaching zero (a hit). */
        PL_CHECK(b->registered);
        lru_unlink(bm, id);
        bm->num_gpu_used++;
    }
    b->ref++;
}

void blk_pool_release_gpu(BlockManager *bm, int32_t id) {
    GpuBlock *b = &bm->gpu[id];
    PL_CHECK(b->ref > 0);
    if (--b->ref > 0)
        return;
    bm->num_gpu_used--;
    if (b->registered)
        lru_push_tail(bm, id);
    else
        bm->gpu_free[bm->num_gpu_free++] = id;
}

int32_t blk_pool_take_cpu(BlockManager *bm) {
    PL_CHECK(bm->num_cpu_free > 0);
    int32_t id = bm->cpu_free[--bm->num_cpu_free];
    PL_CHECK(bm->cpu_ref[id] == 0);
    bm->cpu_ref[id] = 1;
    return id;
}

void blk_pool_ref_cpu(BlockManager *bm, int32_t id) {
    PL_CHECK(bm->cpu_ref[id] > 0);
    bm->cpu_ref[id]++;
}

void blk_pool_release_cpu(BlockManager *bm, int32_t id) {
    PL_CHECK(bm->cpu_ref[id] > 0);
    if (--bm->cpu_ref[id] == 0)
        bm->cpu_free[bm->num_cpu_free++] = id;
}

void blk_pool_debug_check(const BlockManager *bm) {
    PL_CHECK(bm->num_gpu_free >= 0 && bm->num_evictable >= 0 && bm->num_gpu_used >= 0);
    PL_CHECK(bm->num_gpu_free + bm->num_evictable + bm->num_gpu_used == bm->num_gpu);
    PL_CHECK(bm->num_cpu_free >= 0 && bm->num_cpu_free <= bm->num_cpu);
    PL_CHECK(bm->num_registered >= bm->num_evictable && bm->num_registered <= bm->num_gpu);
    PL_CHECK((bm->lru_head == BLK_NONE) == (bm->num_evictable == 0));
}
