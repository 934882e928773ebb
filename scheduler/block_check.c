/* block_check.c - blk_check: recount every reference from the caller's tables and verify
 * each invariant of the pools, free lists, LRU list and prefix-cache hash table. O(blocks +
 * table entries) with scratch memory of its own; for tests and debugging, not the step loop. */
#include <stdlib.h>

#include "block_internal.h"

#define FAIL(...) pl_fatal(__FILE__, __LINE__, "blk_check: " __VA_ARGS__)

enum { SEEN_NONE, SEEN_FREE, SEEN_LRU };

static void check_table(const BlockManager *bm, const BlockTable *t, int ti, int32_t *gref,
                        int32_t *cref, int32_t *gstamp, int32_t *cstamp) {
    int bs = bm->cfg.block_size;
    if (t->num_tokens < 0 || t->num_blocks != (t->num_tokens + bs - 1) / bs)
        FAIL("table %d: %d tokens in %d blocks of %d", ti, t->num_tokens, t->num_blocks, bs);
    if (t->num_blocks > t->capacity || (t->num_blocks > 0 && (!t->blocks || !t->on_cpu)))
        FAIL("table %d: %d blocks, capacity %d", ti, t->num_blocks, t->capacity);
    if (t->num_hashed < 0 || t->num_hashed > t->num_tokens / bs)
        FAIL("table %d: %d hashed blocks of %d tokens", ti, t->num_hashed, t->num_tokens);
    if (t->num_released < 0 || t->num_released > t->num_blocks ||
        (t->num_released > 0 && bm->cfg.sliding_window <= 0))
        FAIL("table %d: %d of %d blocks released (window %d)", ti, t->num_released, t->num_blocks,
             bm->cfg.sliding_window);
    for (int i = 0; i < t->num_blocks; i++) {
        int32_t id = t->blocks[i];
        if (t->on_cpu[i] > 1)
            FAIL("table %d block %d: on_cpu = %d", ti, i, t->on_cpu[i]);
        if (i < t->num_released) {
            if (id != BLK_RELEASED || t->on_cpu[i])
                FAIL("table %d block %d: released, yet id %d (on_cpu %d)", ti, i, id, t->on_cpu[i]);
            continue;
        }
        if (t->on_cpu[i]) {
            if (id < 0 || id >= bm->num_cpu)
                FAIL("table %d block %d: CPU id %d out of range", ti, i, id);
            if (cstamp[id] == ti)
                FAIL("table %d holds CPU block %d twice", ti, id);
            cstamp[id] = ti;
            cref[id]++;
            continue;
        }
        if (id < 0 || id >= bm->num_gpu)
            FAIL("table %d block %d: GPU id %d out of range", ti, i, id);
        if (gstamp[id] == ti)
            FAIL("table %d holds GPU block %d twice", ti, id);
        gstamp[id] = ti;
        gref[id]++;
        if (bm->gpu[id].registered && (i + 1) * bs > t->num_tokens)
            FAIL("table %d block %d: registered GPU block %d is not full", ti, i, id);
    }
}

static void check_gpu_lists(const BlockManager *bm, uint8_t *seen) {
    if (bm->num_gpu_free < 0 || bm->num_gpu_free > bm->num_gpu)
        FAIL("%d free GPU blocks of %d", bm->num_gpu_free, bm->num_gpu);
    for (int k = 0; k < bm->num_gpu_free; k++) {
        int32_t id = bm->gpu_free[k];
        if (id < 0 || id >= bm->num_gpu || seen[id] != SEEN_NONE)
            FAIL("free stack entry %d: GPU block %d out of range or listed twice", k, id);
        seen[id] = SEEN_FREE;
        if (bm->gpu[id].ref != 0 || bm->gpu[id].registered)
            FAIL("free GPU block %d: ref %d, registered %d", id, bm->gpu[id].ref,
                 bm->gpu[id].registered);
    }
    int count = 0;
    int32_t prev = BLK_NONE;
    for (int32_t id = bm->lru_head; id != BLK_NONE; prev = id, id = bm->gpu[id].next) {
        if (id < 0 || id >= bm->num_gpu || seen[id] != SEEN_NONE || count >= bm->num_gpu)
            FAIL("LRU list: GPU block %d out of range, listed twice or a cycle", id);
        seen[id] = SEEN_LRU;
        count++;
        const GpuBlock *b = &bm->gpu[id];
        if (b->prev != prev)
            FAIL("LRU list: GPU block %d has prev %d, expected %d", id, b->prev, prev);
        if (b->ref != 0 || !b->registered)
            FAIL("evictable GPU block %d: ref %d, registered %d", id, b->ref, b->registered);
    }
    if (prev != bm->lru_tail || count != bm->num_evictable)
        FAIL("LRU list: %d blocks ending at %d; counted %d ending at %d", count, prev,
             bm->num_evictable, bm->lru_tail);
}

static void check_hash_table(const BlockManager *bm) {
    if (!bm->cfg.enable_prefix_caching) {
        if (bm->num_registered != 0)
            FAIL("%d registered blocks with prefix caching off", bm->num_registered);
        for (int id = 0; id < bm->num_gpu; id++)
            if (bm->gpu[id].registered)
                FAIL("GPU block %d registered with prefix caching off", id);
        return;
    }
    int count = 0;
    for (uint64_t k = 0; k <= bm->bucket_mask; k++) {
        for (int32_t id = bm->buckets[k]; id != BLK_NONE; id = bm->gpu[id].hnext) {
            if (id < 0 || id >= bm->num_gpu || count >= bm->num_gpu)
                FAIL("hash bucket %llu: GPU block %d out of range or a cycle",
                     (unsigned long long)k, id);
            const GpuBlock *b = &bm->gpu[id];
            const int32_t *tok = blk_cache_tokens(bm, id);
            if (!b->registered || (b->hash & bm->bucket_mask) != k)
                FAIL("hash bucket %llu holds GPU block %d (registered %d, hash %016llx)",
                     (unsigned long long)k, id, b->registered, (unsigned long long)b->hash);
            if (blk_hash_block(b->parent, tok, bm->cfg.block_size) != b->hash)
                FAIL("GPU block %d: stored tokens do not hash to its key", id);
            /* The first entry with this key must be this block: no duplicate content. */
            if (blk_cache_lookup(bm, b->hash, b->parent, tok) != id)
                FAIL("GPU block %d: its content is registered twice", id);
            count++;
        }
    }
    int registered = 0;
    for (int id = 0; id < bm->num_gpu; id++)
        registered += bm->gpu[id].registered;
    if (count != bm->num_registered || registered != count)
        FAIL("hash table holds %d blocks; %d flagged registered; counted %d", count, registered,
             bm->num_registered);
}

static void check_cpu(const BlockManager *bm, const int32_t *cref) {
    uint8_t *seen = pl_xcalloc((size_t)bm->num_cpu + 1, 1);
    if (bm->num_cpu_free < 0 || bm->num_cpu_free > bm->num_cpu)
        FAIL("%d free CPU blocks of %d", bm->num_cpu_free, bm->num_cpu);
    for (int k = 0; k < bm->num_cpu_free; k++) {
        int32_t id = bm->cpu_free[k];
        if (id < 0 || id >= bm->num_cpu || seen[id])
            FAIL("CPU free stack entry %d: block %d out of range or listed twice", k, id);
        seen[id] = 1;
    }
    for (int id = 0; id < bm->num_cpu; id++) {
        if (bm->cpu_ref[id] != cref[id])
            FAIL("CPU block %d: ref %d, tables hold %d", id, bm->cpu_ref[id], cref[id]);
        if ((bm->cpu_ref[id] == 0) != seen[id])
            FAIL("CPU block %d: ref %d but %son the free stack", id, bm->cpu_ref[id],
                 seen[id] ? "" : "not ");
    }
    free(seen);
}

void blk_check(const BlockManager *bm, const BlockTable *const *tables, int num_tables) {
    int32_t *gref = pl_xcalloc((size_t)bm->num_gpu, sizeof *gref);
    int32_t *cref = pl_xcalloc((size_t)bm->num_cpu + 1, sizeof *cref);
    int32_t *gstamp = pl_xmalloc((size_t)bm->num_gpu * sizeof *gstamp);
    int32_t *cstamp = pl_xmalloc(((size_t)bm->num_cpu + 1) * sizeof *cstamp);
    uint8_t *seen = pl_xcalloc((size_t)bm->num_gpu, 1);
    for (int i = 0; i < bm->num_gpu; i++)
        gstamp[i] = -1;
    for (int i = 0; i <= bm->num_cpu; i++)
        cstamp[i] = -1;
    for (int ti = 0; ti < num_tables; ti++)
        if (tables[ti])
            check_table(bm, tables[ti], ti, gref, cref, gstamp, cstamp);

    check_gpu_lists(bm, seen);
    int used = 0;
    for (int id = 0; id < bm->num_gpu; id++) {
        const GpuBlock *b = &bm->gpu[id];
        if (b->ref != gref[id])
            FAIL("GPU block %d: ref %d, tables hold %d", id, b->ref, gref[id]);
        if ((b->ref == 0) != (seen[id] != SEEN_NONE))
            FAIL("GPU block %d: ref %d but %son a free list", id, b->ref,
                 seen[id] != SEEN_NONE ? "" : "not ");
        used += b->ref > 0;
    }
    if (used != bm->num_gpu_used)
        FAIL("%d GPU blocks in use, counted %d", used, bm->num_gpu_used);
    check_hash_table(bm);
    check_cpu(bm, cref);
    free(gref);
    free(cref);
    free(gstamp);
    free(cstamp);
    free(seen);
}
