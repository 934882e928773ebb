/* prefix_cache.c - block hashing and the prefix-cache hash table.
 *
 * A full block is keyed by (parent, tokens): its predecessor's chained hash and its own
 * block_size token ids; its own chained hash mixes both and picks the bucket. Lookups
 * compare the stored parent hash and tokens exactly, so two different blocks whose hashes
 * collide are told apart; what remains is a collision of two whole 64-bit prefix chains
 * (parent hashes equal for different earlier tokens), the same assumption vLLM makes.
 *
 * The table is chained through GpuBlock.hnext with one head per bucket; there are at most
 * num_gpu entries and at least 2 * num_gpu buckets, allocated at create: no rehashing. */
#include <string.h>

#include "block_internal.h"

#define P1 0x9E3779B185EBCA87ULL /* xxHash64 primes */
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

/* splitmix64's finaliser: full avalanche of a 64-bit word. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

uint64_t blk_hash_block(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = mix64(parent + P5) ^ ((uint64_t)n * P1);
    int i = 0;
    for (; i + 1 < n; i += 2) { /* two token ids per 64-bit lane, xxHash64 round + merge */
        uint64_t lane = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;
        h ^= rotl64(lane * P2, 31) * P1;
        h = rotl64(h, 27) * P1 + P4;
    }
    if (i < n) {
        h ^= (uint64_t)(uint32_t)tokens[i] * P1;
        h = rotl64(h, 23) * P2 + P3;
    }
    return mix64(h);
}

int32_t blk_cache_lookup(const BlockManager *bm, uint64_t hash, uint64_t parent,
                         const int32_t *tokens) {
    size_t bytes = (size_t)bm->cfg.block_size * sizeof(int32_t);
    for (int32_t id = bm->buckets[hash & bm->bucket_mask]; id != BLK_NONE; id = bm->gpu[id].hnext) {
        const GpuBlock *b = &bm->gpu[id];
        if (b->hash == hash && b->parent == parent &&
            memcmp(blk_cache_tokens(bm, id), tokens, bytes) == 0)
            return id;
    }
    return BLK_NONE;
}

void blk_cache_insert(BlockManager *bm, int32_t id, uint64_t hash, uint64_t parent,
                      const int32_t *tokens) {
    GpuBlock *b = &bm->gpu[id];
    PL_CHECK(!b->registered && b->ref > 0);
    memcpy(blk_cache_tokens(bm, id), tokens, (size_t)bm->cfg.block_size * sizeof(int32_t));
    b->hash = hash;
    b->parent = parent;
    b->registered = 1;
    int32_t *head = &bm->buckets[hash & bm->bucket_mask];
    b->hnext = *head;
    *head = id;
    bm->num_registered++;
}

void blk_cache_remove(BlockManager *bm, int32_t id) {
    GpuBlock *b = &bm->gpu[id];
    PL_CHECK(b->registered);
    int32_t *link = &bm->buckets[b->hash & bm->bucket_mask];
    while (*link != id) {
        PL_CHECK(*link != BLK_NONE);
        link = &bm->gpu[*link].hnext;
    }
    *link = b->hnext;
    b->hnext = BLK_NONE;
    b->registered = 0;
    bm->num_registered--;
}
