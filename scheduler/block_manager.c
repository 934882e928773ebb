/* block_manager.c - the block manager's public operations (include/block_manager.h):
 * admission checks with the watermark, allocation with prefix-cache reuse, registration of
 * computed blocks, append with copy-on-write, fork, swap out/in, free. The pools are in
 * block_pool.c, the hash table in prefix_cache.c, blk_check in block_check.c.
 *
 * Admission arithmetic (blk_can_allocate, blk_can_swap_in). "Required" is what the call
 * would take out of blk_num_free_gpu: new blocks, plus prefix hits on evictable blocks (they
 * leave the free count too); hits on blocks in use cost nothing. The answer is LATER when
 * free - required < watermark_blocks, and NEVER when the sequence's whole block count exceeds
 * num_gpu - watermark_blocks: that is exactly the case where the check could never pass,
 * even with every other sequence gone (its in-use hits would then be evictable), so NEVER
 * does not depend on what else is running.
 *
 * With a sliding window a new table holds the blocks of [lo, end): lo the first position its
 * first computed token reads (the hits before lo are claimed and released again at once), end
 * the first step's last slot; "required" counts the new ones and the evictable hits kept, and
 * NEVER compares the most a sequence of that length ever holds (blk_held_blocks). */
#include <stdlib.h>
#include <string.h>

#include "block_internal.h"

static int blocks_for(const BlockManager *bm, int tokens) {
    return (tokens + bm->cfg.block_size - 1) / bm->cfg.block_size;
}

int blk_held_blocks(const BlockManagerConfig *cfg, int num_tokens, int step_tokens) {
    const int bs = cfg->block_size, all = (num_tokens + bs - 1) / bs;
    if (cfg->sliding_window <= 0)
        return all;
    const long span = (long)cfg->sliding_window - 1 + (step_tokens > 0 ? step_tokens : 1);
    const long most = (span + bs - 1) / bs + 1;
    return most < all ? (int)most : all;
}

int blk_peak_blocks(const BlockManagerConfig *cfg, int num_tokens) {
    const int step = cfg->max_step_tokens;
    return blk_held_blocks(cfg, num_tokens, step > 0 ? step : num_tokens);
}

const BlockManagerConfig *blk_config(const BlockManager *bm) {
    return &bm->cfg;
}

/* The first block a token at position pos reads (0 without a window). */
static int first_read_block(const BlockManager *bm, int pos) {
    const int w = bm->cfg.sliding_window;
    return w > 0 && pos >= w ? (pos - w + 1) / bm->cfg.block_size : 0;
}

/* Slots a new table gets for a prompt of num_tokens whose first `cached` are cached: all of
 * them, or with a window up to the first step's tokens. */
static int first_slots(const BlockManager *bm, int num_tokens, int cached) {
    const int step = bm->cfg.max_step_tokens;
    return bm->cfg.sliding_window > 0 && step > 0 && cached + step < num_tokens ? cached + step
                                                                                : num_tokens;
}

/* Grow the table's arrays to hold n blocks (amortised doubling: the only allocation made
 * while serving). */
static void ensure_capacity(BlockTable *t, int n) {
    if (n <= t->capacity)
        return;
    int cap = t->capacity > 0 ? t->capacity : 8;
    while (cap < n)
        cap *= 2;
    t->blocks = pl_xrealloc(t->blocks, (size_t)cap * sizeof *t->blocks);
    t->on_cpu = pl_xrealloc(t->on_cpu, (size_t)cap * sizeof *t->on_cpu);
    t->capacity = cap;
}

BlockManager *blk_create(const BlockManagerConfig *cfg) {
    if (!cfg) {
        pl_error_set(PL_ERR_INVALID, "block manager: no config");
        return NULL;
    }
    if (cfg->num_gpu_blocks <= 0 || cfg->num_cpu_blocks < 0) {
        pl_error_set(PL_ERR_INVALID,
                     "block manager: %d GPU and %d CPU blocks (need > 0 GPU, >= 0 CPU)",
                     cfg->num_gpu_blocks, cfg->num_cpu_blocks);
        return NULL;
    }
    int bs = cfg->block_size;
    if (bs <= 0 || bs > 1024 || (bs & (bs - 1)) != 0) {
        pl_error_set(PL_ERR_INVALID, "block size %d: must be a power of two from 1 to 1024", bs);
        return NULL;
    }
    if (!(cfg->watermark >= 0.0f && cfg->watermark < 1.0f)) {
        pl_error_set(PL_ERR_INVALID, "block manager watermark %g: must be in [0, 1)",
                     (double)cfg->watermark);
        return NULL;
    }

    if (cfg->sliding_window < 0 || cfg->max_step_tokens < 0) {
        pl_error_set(PL_ERR_INVALID, "block manager: sliding window %d, step tokens %d",
                     cfg->sliding_window, cfg->max_step_tokens);
        return NULL;
    }

    BlockManager *bm = pl_xcalloc(1, sizeof *bm);
    bm->cfg = *cfg;
    bm->num_gpu = cfg->num_gpu_blocks;
    bm->num_cpu = cfg->num_cpu_blocks;
    bm->watermark_blocks = (int)(cfg->watermark * (float)cfg->num_gpu_blocks);

    bm->gpu = pl_xcalloc((size_t)bm->num_gpu, sizeof *bm->gpu);
    bm->gpu_free = pl_xmalloc((size_t)bm->num_gpu * sizeof *bm->gpu_free);
    bm->matched = pl_xmalloc((size_t)bm->num_gpu * sizeof *bm->matched);
    for (int i = 0; i < bm->num_gpu; i++) {
        bm->gpu[i].prev = bm->gpu[i].next = bm->gpu[i].hnext = BLK_NONE;
        bm->gpu_free[i] = bm->num_gpu - 1 - i; /* block 0 on top: taken first */
    }
    bm->num_gpu_free = bm->num_gpu;
    bm->lru_head = bm->lru_tail = BLK_NONE;

    bm->cpu_ref = pl_xcalloc((size_t)bm->num_cpu + 1, sizeof *bm->cpu_ref);
    bm->cpu_free = pl_xmalloc(((size_t)bm->num_cpu + 1) * sizeof *bm->cpu_free);
    for (int i = 0; i < bm->num_cpu; i++)
        bm->cpu_free[i] = bm->num_cpu - 1 - i;
    bm->num_cpu_free = bm->num_cpu;

    if (bm->cfg.enable_prefix_caching) {
        bm->tokens = pl_xmalloc((size_t)bm->num_gpu * (size_t)bs * sizeof *bm->tokens);
        uint64_t nb = 16;
        while (nb < 2 * (uint64_t)bm->num_gpu)
            nb *= 2;
        bm->buckets = pl_xmalloc(nb * sizeof *bm->buckets);
        for (uint64_t i = 0; i < nb; i++)
            bm->buckets[i] = BLK_NONE;
        bm->bucket_mask = nb - 1;
    }
    return bm;
}

void blk_destroy(BlockManager *bm) {
    if (!bm)
        return;
    free(bm->gpu);
    free(bm->gpu_free);
    free(bm->matched);
    free(bm->cpu_ref);
    free(bm->cpu_free);
    free(bm->tokens);
    free(bm->buckets);
    free(bm);
}

int blk_block_size(const BlockManager *bm) {
    return bm->cfg.block_size;
}

int blk_num_free_gpu(const BlockManager *bm) {
    return bm->num_gpu_free + bm->num_evictable;
}

int blk_num_free_cpu(const BlockManager *bm) {
    return bm->num_cpu_free;
}

int blk_num_gpu(const BlockManager *bm) {
    return bm->num_gpu;
}

int blk_num_cpu(const BlockManager *bm) {
    return bm->num_cpu;
}

BlockStats blk_stats(const BlockManager *bm) {
    return bm->stats;
}

/* Full prompt blocks eligible for reuse: all but the block holding the last token when the
 * prompt is block-aligned, so at least one token is always computed (it yields the logits). */
static int eligible_blocks(const BlockManager *bm, int num_tokens) {
    return bm->cfg.enable_prefix_caching && num_tokens > 0 ? (num_tokens - 1) / bm->cfg.block_size
                                                           : 0;
}

/* The prompt's longest cached run of leading blocks. Fills ids[] (NULL: the manager's scratch)
 * with the matched blocks, and returns the run's length; *last gets the chained hash of the last
 * matched block and *evictable_kept the hits on evictable blocks that the table keeps (with a
 * window, those its first computed token reads). Changes nothing. */
static int match_prefix(const BlockManager *bm, const int32_t *tokens, int num_tokens, int32_t *ids,
                        int *evictable_kept, uint64_t *last) {
    int n = eligible_blocks(bm, num_tokens), bs = bm->cfg.block_size, hits = 0;
    uint64_t parent = BLK_HASH_ROOT;
    int32_t *found = ids ? ids : bm->matched;
    for (; hits < n && hits < bm->num_gpu; hits++) {
        const int32_t *tok = tokens + (size_t)hits * bs;
        uint64_t h = blk_hash_block(parent, tok, bs);
        int32_t id = blk_cache_lookup(bm, h, parent, tok);
        if (id == BLK_NONE)
            break;
        found[hits] = id;
        parent = h;
    }
    *evictable_kept = 0;
    for (int i = first_read_block(bm, hits * bs); i < hits; i++)
        *evictable_kept += bm->gpu[found[i]].ref == 0;
    *last = parent;
    return hits;
}

AllocStatus blk_can_allocate(BlockManager *bm, const int32_t *tokens, int num_tokens) {
    PL_CHECK(num_tokens >= 0);
    if (blk_peak_blocks(&bm->cfg, num_tokens) > bm->num_gpu - bm->watermark_blocks)
        return BLK_ALLOC_NEVER;
    int evictable_kept = 0;
    uint64_t last;
    int hits = match_prefix(bm, tokens, num_tokens, NULL, &evictable_kept, &last);
    int required = blocks_for(bm, first_slots(bm, num_tokens, hits * bm->cfg.block_size)) - hits +
                   evictable_kept;
    if (blk_num_free_gpu(bm) - required < bm->watermark_blocks)
        return BLK_ALLOC_LATER;
    return BLK_ALLOC_OK;
}

int blk_allocate(BlockManager *bm, BlockTable *t, const int32_t *tokens, int num_tokens) {
    PL_CHECK(t->num_blocks == 0 && num_tokens >= 0);
    ensure_capacity(t, blocks_for(bm, num_tokens));
    int evictable_kept = 0;
    uint64_t last;
    int hits = match_prefix(bm, tokens, num_tokens, t->blocks, &evictable_kept, &last);
    const int cached = hits * bm->cfg.block_size, slots = first_slots(bm, num_tokens, cached);
    const int total = blocks_for(bm, slots);
    PL_CHECK(total - hits + evictable_kept <= blk_num_free_gpu(bm));
    bm->stats.prefix_queries += eligible_blocks(bm, num_tokens);
    bm->stats.prefix_hits += hits;
    /* Claim the hits first: taking new blocks may evict, and must not evict these. */
    for (int i = 0; i < hits; i++) {
        blk_pool_ref_gpu(bm, t->blocks[i]);
        t->on_cpu[i] = 0;
    }
    t->num_blocks = hits;
    t->num_released = 0;
    blk_release_behind(bm, t, cached); /* hits behind the window: cached again at once */
    for (int i = hits; i < total; i++) {
        t->blocks[i] = blk_pool_take_gpu(bm);
        t->on_cpu[i] = 0;
    }
    t->num_blocks = total;
    t->num_tokens = slots;
    t->num_hashed = hits;
    t->last_hash = hits > 0 ? last : 0;
    BLK_DEBUG_CHECK(bm);
    return cached;
}

void blk_release_behind(BlockManager *bm, BlockTable *t, int next_pos) {
    const int upto = first_read_block(bm, next_pos);
    if (upto <= t->num_released) /* no window, or nothing new behind it */
        return;
    for (; t->num_released < upto && t->num_released < t->num_blocks; t->num_released++) {
        const int i = t->num_released;
        if (t->on_cpu[i]) /* swapped: it comes back whole */
            break;
        blk_pool_release_gpu(bm, t->blocks[i]);
        t->blocks[i] = BLK_RELEASED;
        bm->stats.released++;
    }
    BLK_DEBUG_CHECK(bm);
}

void blk_mark_computed(BlockManager *bm, BlockTable *t, const int32_t *tokens, int num_computed) {
    if (!bm->cfg.enable_prefix_caching)
        return;
    int bs = bm->cfg.block_size;
    int full = (num_computed < t->num_tokens ? num_computed : t->num_tokens) / bs;
    uint64_t parent = t->num_hashed > 0 ? t->last_hash : BLK_HASH_ROOT;
    for (int i = t->num_hashed; i < full && !t->on_cpu[i]; i++) {
        const int32_t *tok = tokens + (size_t)i * bs;
        uint64_t h = blk_hash_block(parent, tok, bs);
        int32_t id = t->blocks[i]; /* released (after a swap reset the chain): hashed only */
        if (id != BLK_RELEASED && bm->gpu[id].registered) /* a hit or a fork: same key */
            PL_CHECK(bm->gpu[id].hash == h && bm->gpu[id].parent == parent);
        else if (id != BLK_RELEASED && blk_cache_lookup(bm, h, parent, tok) == BLK_NONE)
            blk_cache_insert(bm, id, h, parent, tok);
        /* else: another block already holds this content; this one stays private. */
        parent = h;
        t->num_hashed = i + 1;
        t->last_hash = h;
    }
    BLK_DEBUG_CHECK(bm);
}

/* 1 when growing the table writes into its partially filled last block and that block is
 * shared, so it must be copied first. */
static int needs_cow(const BlockManager *bm, const BlockTable *t, int num_new) {
    if (num_new <= 0 || t->num_tokens % bm->cfg.block_size == 0)
        return 0;
    int last = t->num_blocks - 1;
    return !t->on_cpu[last] && bm->gpu[t->blocks[last]].ref > 1;
}

int blk_can_append(BlockManager *bm, const BlockTable *t, int num_new) {
    if (num_new <= 0)
        return 1;
    if (t->num_blocks > 0 && t->on_cpu[t->num_blocks - 1])
        return 0; /* swapped: swap it in first */
    int need = blocks_for(bm, t->num_tokens + num_new) - t->num_blocks + needs_cow(bm, t, num_new);
    return need <= blk_num_free_gpu(bm);
}

int blk_append(BlockManager *bm, BlockTable *t, int num_new, BlockCopy *cow) {
    PL_CHECK(num_new >= 0);
    if (num_new == 0)
        return 0;
    int total = blocks_for(bm, t->num_tokens + num_new);
    int copy = needs_cow(bm, t, num_new);
    PL_CHECK(t->num_blocks == 0 || !t->on_cpu[t->num_blocks - 1]);
    PL_CHECK(total - t->num_blocks + copy <= blk_num_free_gpu(bm));
    if (copy) {
        int last = t->num_blocks - 1;
        int32_t old = t->blocks[last], fresh = blk_pool_take_gpu(bm);
        *cow = (BlockCopy){old, fresh};
        blk_pool_release_gpu(bm, old); /* still held by the other sharers */
        t->blocks[last] = fresh;
        bm->stats.cow_copies++;
    }
    ensure_capacity(t, total);
    for (int i = t->num_blocks; i < total; i++) {
        t->blocks[i] = blk_pool_take_gpu(bm);
        t->on_cpu[i] = 0;
    }
    t->num_blocks = total;
    t->num_tokens += num_new;
    BLK_DEBUG_CHECK(bm);
    return copy;
}

void blk_fork(BlockManager *bm, const BlockTable *parent, BlockTable *child) {
    PL_CHECK(child->num_blocks == 0);
    ensure_capacity(child, parent->num_blocks);
    for (int i = 0; i < parent->num_blocks; i++) {
        child->blocks[i] = parent->blocks[i];
        child->on_cpu[i] = parent->on_cpu[i];
        if (i < parent->num_released)
            continue;
        if (parent->on_cpu[i])
            blk_pool_ref_cpu(bm, parent->blocks[i]);
        else
            blk_pool_ref_gpu(bm, parent->blocks[i]);
    }
    child->num_blocks = parent->num_blocks;
    child->num_released = parent->num_released;
    child->num_tokens = parent->num_tokens;
    child->num_hashed = parent->num_hashed;
    child->last_hash = parent->last_hash;
    BLK_DEBUG_CHECK(bm);
}

/* A swapped-out block is released like a freed one: if registered it stays cached
 * (evictable) on the GPU, because its content there stays valid until the block is taken
 * again, and other requests may still hit it. The table itself re-registers its blocks
 * after swap-in (num_hashed restarts at 0), where no cached copy exists by then. */
int blk_swap_out(BlockManager *bm, BlockTable *t, BlockCopy *map) {
    int need = 0;
    for (int i = t->num_released; i < t->num_blocks; i++)
        need += !t->on_cpu[i] && bm->gpu[t->blocks[i]].ref == 1;
    if (need > bm->num_cpu_free)
        return -1;
    int n = 0, first = -1;
    for (int i = t->num_released; i < t->num_blocks; i++) {
        int32_t g = t->blocks[i];
        if (t->on_cpu[i] || bm->gpu[g].ref != 1)
            continue; /* already on the CPU, or shared: stays on the GPU */
        int32_t c = blk_pool_take_cpu(bm);
        map[n++] = (BlockCopy){g, c};
        blk_pool_release_gpu(bm, g);
        t->blocks[i] = c;
        t->on_cpu[i] = 1;
        if (first < 0)
            first = i;
    }
    if (first >= 0 && first < t->num_hashed) {
        t->num_hashed = 0;
        t->last_hash = 0;
    }
    bm->stats.swapped_out += n;
    BLK_DEBUG_CHECK(bm);
    return n;
}

AllocStatus blk_can_swap_in(BlockManager *bm, const BlockTable *t, int num_new) {
    if (num_new < 0)
        num_new = 0;
    int total = blocks_for(bm, t->num_tokens + num_new);
    if (total - t->num_released > bm->num_gpu - bm->watermark_blocks)
        return BLK_ALLOC_NEVER;
    int need = total - t->num_blocks + needs_cow(bm, t, num_new);
    for (int i = t->num_released; i < t->num_blocks; i++)
        need += t->on_cpu[i];
    if (blk_num_free_gpu(bm) - need < bm->watermark_blocks)
        return BLK_ALLOC_LATER;
    return BLK_ALLOC_OK;
}

int blk_swap_in(BlockManager *bm, BlockTable *t, BlockCopy *map) {
    int need = 0;
    for (int i = t->num_released; i < t->num_blocks; i++)
        need += t->on_cpu[i];
    PL_CHECK(need <= blk_num_free_gpu(bm));
    int n = 0;
    for (int i = t->num_released; i < t->num_blocks; i++) {
        if (!t->on_cpu[i])
            continue;
        int32_t c = t->blocks[i], g = blk_pool_take_gpu(bm);
        map[n++] = (BlockCopy){c, g};
        blk_pool_release_cpu(bm, c);
        t->blocks[i] = g;
        t->on_cpu[i] = 0;
    }
    bm->stats.swapped_in += n;
    BLK_DEBUG_CHECK(bm);
    return n;
}

/* Released last block first: within one sequence the LRU then evicts the tail of a prefix
 * before its head, which other requests are likelier to share. */
void blk_free(BlockManager *bm, BlockTable *t) {
    for (int i = t->num_blocks - 1; i >= t->num_released; i--) {
        if (t->on_cpu[i])
            blk_pool_release_cpu(bm, t->blocks[i]);
        else
            blk_pool_release_gpu(bm, t->blocks[i]);
    }
    free(t->blocks);
    free(t->on_cpu);
    memset(t, 0, sizeof *t);
    BLK_DEBUG_CHECK(bm);
}
