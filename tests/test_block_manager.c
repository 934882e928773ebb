/* test_block_manager.c - the block manager (scheduler/block_*.c, prefix_cache.c): config
 * validation, allocate/append/free for every block size, the watermark, fork and
 * copy-on-write, swap out/in with shared blocks, the prefix cache (hits, partial matches,
 * reuse after free, LRU eviction, the last-token rule, token comparison on lookup,
 * duplicates, admission arithmetic with evictable hits) and a randomized run of thousands
 * of operations checked with blk_check and a shadow model of the KV content of every slot.
 * White-box: reads the private state in block_internal.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "block_internal.h"
#include "block_manager.h"

/* window > 0: every layer reads only the last `window` positions; step: the most tokens a
 * sequence computes in a step. */
static BlockManager *make_windowed(int gpu, int cpu, int bs, float watermark, int caching,
                                   int window, int step) {
    BlockManagerConfig cfg = {.num_gpu_blocks = gpu,
                              .num_cpu_blocks = cpu,
                              .block_size = bs,
                              .watermark = watermark,
                              .enable_prefix_caching = caching,
                              .sliding_window = window,
                              .max_step_tokens = step};
    BlockManager *bm = blk_create(&cfg);
    assert_non_null(bm);
    return bm;
}

static BlockManager *make(int gpu, int cpu, int bs, float watermark, int caching) {
    return make_windowed(gpu, cpu, bs, watermark, caching, 0, 0);
}

static void check4(const BlockManager *bm, const BlockTable *a, const BlockTable *b,
                   const BlockTable *c, const BlockTable *d) {
    const BlockTable *t[4] = {a, b, c, d};
    blk_check(bm, t, 4);
}

static void check(const BlockManager *bm, const BlockTable *a, const BlockTable *b,
                  const BlockTable *c) {
    check4(bm, a, b, c, NULL);
}

static int ref(const BlockManager *bm, int32_t id) {
    return bm->gpu[id].ref;
}

/* tokens[i] = base + i: distinct content per base. */
static int32_t *seq_tokens(int n, int base) {
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++)
        t[i] = base + i;
    return t;
}

static void test_create_invalid(void **state) {
    (void)state;
    BlockManagerConfig bad[] = {
        {0, 4, 16, 0.01f, 1, 0, 0},   {-1, 4, 16, 0.01f, 1, 0, 0}, {8, -1, 16, 0.01f, 1, 0, 0},
        {8, 4, 0, 0.01f, 1, 0, 0},    {8, 4, 24, 0.01f, 1, 0, 0},  {8, 4, 2048, 0.01f, 1, 0, 0},
        {8, 4, 16, -0.1f, 1, 0, 0},   {8, 4, 16, 1.0f, 1, 0, 0},   {8, 4, 16, 0.01f, 1, -1, 0},
        {8, 4, 16, 0.01f, 1, 16, -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_null(blk_create(&bad[i]));
        assert_true(strlen(pl_error()) > 0);
    }
    assert_null(blk_create(NULL));
    blk_destroy(NULL);
    /* No swap space is a valid configuration (recompute only). */
    BlockManager *bm = make(8, 0, 16, 0.0f, 1);
    assert_int_equal(blk_num_cpu(bm), 0);
    assert_int_equal(blk_num_free_cpu(bm), 0);
    blk_destroy(bm);
}

static void test_basics_block_sizes(void **state) {
    (void)state;
    const int sizes[] = {8, 16, 32, 64, 128};
    for (int s = 0; s < 5; s++) {
        for (int caching = 0; caching <= 1; caching++) {
            int bs = sizes[s];
            BlockManager *bm = make(64, 16, bs, 0.0f, caching);
            assert_int_equal(blk_block_size(bm), bs);
            assert_int_equal(blk_num_gpu(bm), 64);
            assert_int_equal(blk_num_free_gpu(bm), 64);
            int n = 3 * bs + 1;
            int32_t *tok = seq_tokens(n, 1000 * bs);
            BlockTable t = {0};
            assert_int_equal(blk_can_allocate(bm, tok, n), BLK_ALLOC_OK);
            assert_int_equal(blk_allocate(bm, &t, tok, n), 0);
            assert_int_equal(t.num_blocks, 4);
            assert_int_equal(t.num_tokens, n);
            assert_int_equal(blk_num_free_gpu(bm), 60);
            for (int i = 0; i < 4; i++) {
                assert_int_equal(t.on_cpu[i], 0);
                assert_int_equal(ref(bm, t.blocks[i]), 1);
                for (int j = 0; j < i; j++)
                    assert_int_not_equal(t.blocks[i], t.blocks[j]);
            }
            check(bm, &t, NULL, NULL);
            blk_mark_computed(bm, &t, tok, n);
            assert_int_equal(bm->num_registered, caching ? 3 : 0);

            /* Filling the partial last block takes no new block; the next token does. */
            BlockCopy cow = {-1, -1};
            assert_true(blk_can_append(bm, &t, bs - 1));
            assert_int_equal(blk_append(bm, &t, bs - 1, &cow), 0);
            assert_int_equal(t.num_blocks, 4);
            assert_int_equal(t.num_tokens, 4 * bs);
            assert_int_equal(blk_append(bm, &t, 1, &cow), 0);
            assert_int_equal(t.num_blocks, 5);
            assert_int_equal(blk_num_free_gpu(bm), 59);
            /* Many blocks at once (the arrays grow); more than the pool is refused. */
            assert_true(blk_can_append(bm, &t, (bs - 1) + 59 * bs));
            assert_false(blk_can_append(bm, &t, (bs - 1) + 59 * bs + 1));
            assert_int_equal(blk_append(bm, &t, 40 * bs, &cow), 0);
            assert_int_equal(t.num_blocks, 45);
            assert_int_equal(t.num_tokens, 44 * bs + 1);
            assert_int_equal(blk_num_free_gpu(bm), 19);
            assert_true(blk_can_append(bm, &t, 0));
            assert_int_equal(blk_append(bm, &t, 0, &cow), 0);
            check(bm, &t, NULL, NULL);

            blk_free(bm, &t);
            assert_null(t.blocks);
            assert_int_equal(t.num_blocks, 0);
            assert_int_equal(t.num_tokens, 0);
            assert_int_equal(blk_num_free_gpu(bm), 64);
            check(bm, NULL, NULL, NULL);
            BlockStats st = blk_stats(bm);
            assert_int_equal(st.cow_copies, 0);
            assert_int_equal(st.evictions, 0);
            free(tok);
            blk_destroy(bm);
        }
    }
}

static void test_watermark(void **state) {
    (void)state;
    int bs = 16;
    BlockManager *bm = make(100, 10, bs, 0.1f, 1); /* 10 watermark blocks */
    int32_t *tok = seq_tokens(100 * bs, 0);
    assert_int_equal(blk_can_allocate(bm, tok, 91 * bs), BLK_ALLOC_NEVER);
    assert_int_equal(blk_can_allocate(bm, tok, 90 * bs + 1), BLK_ALLOC_NEVER);
    assert_int_equal(blk_can_allocate(bm, tok, 90 * bs), BLK_ALLOC_OK);
    assert_int_equal(blk_can_allocate(bm, tok, 1), BLK_ALLOC_OK);

    BlockTable a = {0}, b = {0};
    blk_allocate(bm, &a, tok, 50 * bs); /* 50 free */
    int32_t *other = seq_tokens(100 * bs, 1 << 20);
    assert_int_equal(blk_can_allocate(bm, other, 40 * bs), BLK_ALLOC_OK);        /* 10 left */
    assert_int_equal(blk_can_allocate(bm, other, 40 * bs + 1), BLK_ALLOC_LATER); /* 9 left */
    assert_int_equal(blk_can_allocate(bm, other, 90 * bs), BLK_ALLOC_LATER);
    assert_int_equal(blk_can_allocate(bm, other, 91 * bs), BLK_ALLOC_NEVER);
    blk_allocate(bm, &b, other, 40 * bs);
    assert_int_equal(blk_num_free_gpu(bm), 10);
    assert_int_equal(blk_can_allocate(bm, other, 1), BLK_ALLOC_LATER);
    /* Appends are not held back by the watermark: running sequences may use it. */
    assert_true(blk_can_append(bm, &b, 10 * bs));
    assert_false(blk_can_append(bm, &b, 10 * bs + 1));
    check(bm, &a, &b, NULL);
    blk_free(bm, &a);
    assert_int_equal(blk_can_allocate(bm, other, 50 * bs), BLK_ALLOC_OK);
    blk_free(bm, &b);
    check(bm, NULL, NULL, NULL);
    free(tok);
    free(other);
    blk_destroy(bm);
}

static void test_fork_cow(void **state) {
    (void)state;
    int bs = 16;
    BlockManager *bm = make(8, 4, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(20, 7);
    BlockTable p = {0}, c = {0};
    blk_allocate(bm, &p, tok, 20); /* 2 blocks, the last one partial */
    blk_mark_computed(bm, &p, tok, 20);
    blk_fork(bm, &p, &c);
    assert_int_equal(c.num_blocks, 2);
    assert_int_equal(c.num_tokens, 20);
    assert_int_equal(c.num_hashed, p.num_hashed);
    assert_memory_equal(c.blocks, p.blocks, 2 * sizeof(int32_t));
    assert_int_equal(ref(bm, p.blocks[0]), 2);
    assert_int_equal(ref(bm, p.blocks[1]), 2);
    assert_int_equal(blk_num_free_gpu(bm), 6);
    check(bm, &p, &c, NULL);

    /* The first append of the child copies the shared partial block: with no free block the
     * copy cannot be made, so can_append says no even though the block has room. */
    BlockTable fill = {0};
    int32_t *ftok = seq_tokens(6 * bs, 5000);
    blk_allocate(bm, &fill, ftok, 6 * bs);
    assert_int_equal(blk_num_free_gpu(bm), 0);
    assert_false(blk_can_append(bm, &c, 1));
    blk_free(bm, &fill);

    int32_t shared_last = p.blocks[1];
    BlockCopy cow = {-1, -1};
    assert_true(blk_can_append(bm, &c, 1));
    assert_int_equal(blk_append(bm, &c, 1, &cow), 1);
    assert_int_equal(cow.src, shared_last);
    assert_int_equal(cow.dst, c.blocks[1]);
    assert_int_not_equal(cow.dst, shared_last);
    assert_int_equal(p.blocks[1], shared_last);
    assert_int_equal(c.blocks[0], p.blocks[0]);
    assert_int_equal(ref(bm, shared_last), 1);
    assert_int_equal(ref(bm, cow.dst), 1);
    assert_int_equal(ref(bm, p.blocks[0]), 2);
    assert_int_equal(c.num_tokens, 21);
    assert_int_equal(blk_stats(bm).cow_copies, 1);
    check(bm, &p, &c, NULL);
    /* The parent now owns its last block alone: no copy. */
    assert_int_equal(blk_append(bm, &p, 1, &cow), 0);
    assert_int_equal(p.blocks[1], shared_last);
    assert_int_equal(blk_stats(bm).cow_copies, 1);
    /* An append that crosses into new blocks copies the partial one and adds the rest. */
    BlockTable c2 = {0};
    blk_fork(bm, &c, &c2);
    int32_t c_last = c.blocks[1];
    assert_int_equal(blk_append(bm, &c2, 2 * bs, &cow), 1);
    assert_int_equal(cow.src, c_last);
    assert_int_equal(cow.dst, c2.blocks[1]);
    assert_int_equal(c2.num_blocks, 4);
    assert_int_equal(ref(bm, c_last), 1);
    check(bm, &p, &c, &c2);
    blk_free(bm, &c2);

    /* Fork of a block-aligned table: appends take new blocks, nothing is copied. */
    BlockTable q = {0}, r = {0};
    blk_free(bm, &c);
    blk_free(bm, &p);
    int32_t *tok2 = seq_tokens(2 * bs, 900);
    blk_allocate(bm, &q, tok2, 2 * bs);
    blk_fork(bm, &q, &r);
    assert_int_equal(blk_append(bm, &r, 1, &cow), 0);
    assert_int_equal(r.num_blocks, 3);
    assert_int_equal(ref(bm, r.blocks[1]), 2);
    assert_int_equal(ref(bm, r.blocks[2]), 1);
    assert_int_equal(blk_stats(bm).cow_copies, 2);
    check(bm, &q, &r, NULL);
    blk_free(bm, &q);
    blk_free(bm, &r);
    check(bm, NULL, NULL, NULL);
    assert_int_equal(blk_num_free_gpu(bm), 8);
    free(tok);
    free(tok2);
    free(ftok);
    blk_destroy(bm);
}

static void test_swap(void **state) {
    (void)state;
    int bs = 8;
    BlockManager *bm = make(16, 8, bs, 0.0f, 0);
    int32_t *tok = seq_tokens(20, 1);
    BlockTable a = {0}, b = {0};
    blk_allocate(bm, &a, tok, 20); /* blocks 0 1 2 */
    blk_fork(bm, &a, &b);
    BlockCopy cow;
    assert_int_equal(blk_append(bm, &a, 1, &cow), 1); /* a's last block is private now */
    int32_t a_old[3];
    memcpy(a_old, a.blocks, sizeof a_old);

    BlockCopy map[3];
    assert_int_equal(blk_swap_out(bm, &a, map), 1);
    assert_int_equal(map[0].src, a_old[2]);
    assert_int_equal(a.blocks[2], map[0].dst);
    assert_true(map[0].dst >= 0 && map[0].dst < 8);
    assert_int_equal(a.on_cpu[0], 0); /* shared with b: stays on the GPU, still a's */
    assert_int_equal(a.on_cpu[1], 0);
    assert_int_equal(a.on_cpu[2], 1);
    assert_int_equal(a.blocks[0], a_old[0]);
    assert_int_equal(ref(bm, a_old[0]), 2);
    assert_int_equal(ref(bm, a_old[2]), 0);
    assert_int_equal(blk_num_free_cpu(bm), 7);
    assert_int_equal(blk_num_free_gpu(bm), 16 - 3);
    assert_false(blk_can_append(bm, &a, 1));
    check(bm, &a, &b, NULL);

    /* b owns its last block alone; its first two are still shared with swapped-out a. */
    assert_int_equal(blk_swap_out(bm, &b, map), 1);
    assert_int_equal(b.on_cpu[2], 1);
    assert_int_equal(b.on_cpu[0] + b.on_cpu[1], 0);
    assert_int_equal(blk_num_free_cpu(bm), 6);
    assert_int_equal(blk_num_free_gpu(bm), 14);
    check(bm, &a, &b, NULL);
    /* Swapping out again moves nothing. */
    assert_int_equal(blk_swap_out(bm, &b, map), 0);

    /* Swap a back in (room for 4 more tokens: one new block). */
    assert_int_equal(blk_can_swap_in(bm, &a, 4), BLK_ALLOC_OK);
    int32_t a_cpu = a.blocks[2];
    assert_int_equal(blk_swap_in(bm, &a, map), 1);
    assert_int_equal(map[0].src, a_cpu);
    assert_int_equal(map[0].dst, a.blocks[2]);
    assert_int_equal(a.on_cpu[2], 0);
    assert_int_equal(ref(bm, a.blocks[2]), 1);
    assert_int_equal(blk_num_free_cpu(bm), 7);
    assert_true(blk_can_append(bm, &a, 4));
    check(bm, &a, &b, NULL);

    /* Freeing a while b is swapped: b's shared blocks are now owned by b alone, so a second
     * swap-out of b moves them too. */
    blk_free(bm, &a);
    assert_int_equal(blk_swap_out(bm, &b, map), 2);
    for (int i = 0; i < 3; i++)
        assert_int_equal(b.on_cpu[i], 1);
    assert_int_equal(blk_num_free_gpu(bm), 16);
    assert_int_equal(blk_num_free_cpu(bm), 5);
    check(bm, &b, NULL, NULL);
    assert_int_equal(blk_swap_in(bm, &b, map), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(b.on_cpu[i], 0);
        assert_int_equal(map[i].dst, b.blocks[i]);
    }
    BlockStats st = blk_stats(bm);
    assert_int_equal(st.swapped_out, 4);
    assert_int_equal(st.swapped_in, 4);
    blk_free(bm, &b);
    check(bm, NULL, NULL, NULL);
    assert_int_equal(blk_num_free_gpu(bm), 16);
    assert_int_equal(blk_num_free_cpu(bm), 8);
    free(tok);
    blk_destroy(bm);
}

static void test_free_mixed_pools(void **state) {
    (void)state;
    BlockManager *bm = make(8, 8, 4, 0.0f, 1);
    int32_t *tok = seq_tokens(10, 3);
    BlockTable a = {0}, b = {0};
    blk_allocate(bm, &a, tok, 10);
    blk_fork(bm, &a, &b);
    BlockCopy cow, map[3];
    blk_append(bm, &b, 1, &cow);
    assert_int_equal(blk_swap_out(bm, &b, map), 1); /* blocks 0,1 GPU, 2 CPU */
    BlockTable c = {0};
    blk_fork(bm, &b, &c); /* a fork of a swapped table shares its CPU block too */
    assert_int_equal(bm->cpu_ref[b.blocks[2]], 2);
    check(bm, &a, &b, &c);
    blk_free(bm, &b);
    check(bm, &a, &c, NULL);
    assert_int_equal(blk_swap_in(bm, &c, map), 1);
    blk_free(bm, &c);
    blk_free(bm, &a);
    check(bm, NULL, NULL, NULL);
    assert_int_equal(blk_num_free_gpu(bm), 8);
    assert_int_equal(blk_num_free_cpu(bm), 8);
    free(tok);
    blk_destroy(bm);
}

static void test_swap_out_cpu_full(void **state) {
    (void)state;
    BlockManager *bm = make(8, 2, 4, 0.0f, 1);
    int32_t *tok = seq_tokens(12, 0);
    BlockTable t = {0};
    blk_allocate(bm, &t, tok, 12);
    blk_mark_computed(bm, &t, tok, 12);
    int32_t before[3];
    memcpy(before, t.blocks, sizeof before);
    int hashed = t.num_hashed;
    BlockCopy map[3];
    assert_int_equal(blk_swap_out(bm, &t, map), -1);
    assert_memory_equal(t.blocks, before, sizeof before);
    for (int i = 0; i < 3; i++)
        assert_int_equal(t.on_cpu[i], 0);
    assert_int_equal(t.num_hashed, hashed);
    assert_int_equal(blk_num_free_cpu(bm), 2);
    assert_int_equal(blk_num_free_gpu(bm), 5);
    assert_int_equal(blk_stats(bm).swapped_out, 0);
    check(bm, &t, NULL, NULL);
    blk_free(bm, &t);
    free(tok);
    blk_destroy(bm);
}

static void test_swap_in_watermark(void **state) {
    (void)state;
    int bs = 4;
    BlockManager *bm = make(10, 20, bs, 0.2f, 0); /* 2 watermark blocks */
    int32_t *tok = seq_tokens(40, 0);
    BlockTable big = {0}, t = {0}, other = {0};
    BlockCopy cow, map[16];
    /* A running sequence may grow into the watermark; once swapped it can never return. */
    blk_allocate(bm, &big, tok, 8 * bs);
    blk_append(bm, &big, bs, &cow);
    assert_int_equal(blk_swap_out(bm, &big, map), 9);
    assert_int_equal(blk_can_swap_in(bm, &big, 0), BLK_ALLOC_NEVER);
    blk_free(bm, &big);

    blk_allocate(bm, &t, tok, 5 * bs);
    assert_int_equal(blk_swap_out(bm, &t, map), 5);
    assert_int_equal(blk_can_swap_in(bm, &t, 0), BLK_ALLOC_OK);
    assert_int_equal(blk_can_swap_in(bm, &t, 3 * bs), BLK_ALLOC_OK);        /* 8 + 2 */
    assert_int_equal(blk_can_swap_in(bm, &t, 3 * bs + 1), BLK_ALLOC_NEVER); /* 9 > 8 */
    blk_allocate(bm, &other, tok, 3 * bs + 1);                              /* 6 free */
    assert_int_equal(blk_can_swap_in(bm, &t, 0), BLK_ALLOC_LATER);          /* 6 - 5 < 2 */
    blk_free(bm, &other);
    blk_allocate(bm, &other, tok, 3 * bs); /* 7 free */
    assert_int_equal(blk_can_swap_in(bm, &t, 0), BLK_ALLOC_OK);
    assert_int_equal(blk_can_swap_in(bm, &t, 1), BLK_ALLOC_LATER);
    assert_int_equal(blk_swap_in(bm, &t, map), 5);
    check(bm, &t, &other, NULL);
    blk_free(bm, &t);
    blk_free(bm, &other);
    free(tok);
    blk_destroy(bm);
}

/* --- prefix cache --- */

static void test_prefix_identical_prompt(void **state) {
    (void)state;
    int bs = 16;
    BlockManager *bm = make(16, 4, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(3 * bs + 2, 42);
    int n = 3 * bs + 2;
    BlockTable a = {0}, b = {0};
    assert_int_equal(blk_allocate(bm, &a, tok, n), 0);
    /* Not computed yet: nothing to reuse. */
    BlockTable early = {0};
    assert_int_equal(blk_allocate(bm, &early, tok, n), 0);
    blk_free(bm, &early);
    blk_mark_computed(bm, &a, tok, 2 * bs + 5); /* two full blocks computed */
    assert_int_equal(a.num_hashed, 2);
    blk_mark_computed(bm, &a, tok, n);
    assert_int_equal(a.num_hashed, 3);
    assert_int_equal(bm->num_registered, 3);
    BlockStats st0 = blk_stats(bm);

    assert_int_equal(blk_can_allocate(bm, tok, n), BLK_ALLOC_OK);
    assert_int_equal(blk_allocate(bm, &b, tok, n), 3 * bs);
    assert_int_equal(b.num_blocks, 4);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(b.blocks[i], a.blocks[i]);
        assert_int_equal(ref(bm, a.blocks[i]), 2);
    }
    assert_int_not_equal(b.blocks[3], a.blocks[3]);
    assert_int_equal(b.num_hashed, 3);
    assert_true(b.last_hash == a.last_hash);
    BlockStats st = blk_stats(bm);
    assert_int_equal(st.prefix_queries - st0.prefix_queries, 3);
    assert_int_equal(st.prefix_hits - st0.prefix_hits, 3);
    assert_int_equal(blk_num_free_gpu(bm), 16 - 5);
    check(bm, &a, &b, NULL);
    /* b computes its last block and marks: nothing new to register. */
    blk_mark_computed(bm, &b, tok, n);
    assert_int_equal(bm->num_registered, 3);
    blk_free(bm, &a);
    blk_free(bm, &b);
    check(bm, NULL, NULL, NULL);
    free(tok);
    blk_destroy(bm);
}

static void test_prefix_different_suffix(void **state) {
    (void)state;
    int bs = 8;
    BlockManager *bm = make(16, 0, bs, 0.0f, 1);
    int n = 4 * bs + 3;
    int32_t *ta = seq_tokens(n, 0), *tb = seq_tokens(n, 0);
    tb[2 * bs + 1] = -5; /* differs in block 2 */
    BlockTable a = {0}, b = {0};
    blk_allocate(bm, &a, ta, n);
    blk_mark_computed(bm, &a, ta, n);
    assert_int_equal(blk_allocate(bm, &b, tb, n), 2 * bs);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    for (int i = 2; i < 5; i++)
        assert_int_not_equal(b.blocks[i], a.blocks[i]);
    /* Block 3 is identical in both, but its prefix is not: no hit after the first miss,
     * and once b computes it, it registers under its own chain. */
    blk_mark_computed(bm, &b, tb, n);
    assert_int_equal(bm->num_registered, 4 + 2);
    BlockStats st = blk_stats(bm);
    assert_int_equal(st.prefix_queries, 8);
    assert_int_equal(st.prefix_hits, 2);
    check(bm, &a, &b, NULL);
    blk_free(bm, &a);
    blk_free(bm, &b);
    free(ta);
    free(tb);
    blk_destroy(bm);
}

static void test_prefix_reuse_after_free(void **state) {
    (void)state;
    int bs = 4;
    BlockManager *bm = make(8, 0, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(3 * bs + 1, 10);
    int n = 3 * bs + 1;
    BlockTable a = {0}, b = {0};
    blk_allocate(bm, &a, tok, n);
    blk_mark_computed(bm, &a, tok, n);
    int32_t ids[3];
    memcpy(ids, a.blocks, sizeof ids);
    blk_free(bm, &a);
    /* Cached blocks count as free. */
    assert_int_equal(blk_num_free_gpu(bm), 8);
    assert_int_equal(bm->num_evictable, 3);
    check(bm, NULL, NULL, NULL);
    assert_int_equal(blk_allocate(bm, &b, tok, n), 3 * bs);
    assert_memory_equal(b.blocks, ids, sizeof ids);
    assert_int_equal(bm->num_evictable, 0);
    assert_int_equal(blk_num_free_gpu(bm), 4);
    assert_int_equal(blk_stats(bm).evictions, 0);
    check(bm, &b, NULL, NULL);
    blk_free(bm, &b);
    free(tok);
    blk_destroy(bm);
}

/* Register a 2-full-block prompt starting at `base` and free it (blocks become evictable). */
static void cache_prompt(BlockManager *bm, const int32_t *tok, int n) {
    BlockTable t = {0};
    blk_allocate(bm, &t, tok, n);
    blk_mark_computed(bm, &t, tok, n);
    blk_free(bm, &t);
}

static int cached_tokens(BlockManager *bm, const int32_t *tok, int n) {
    BlockTable t = {0};
    int c = blk_allocate(bm, &t, tok, n);
    blk_free(bm, &t);
    return c;
}

static void test_prefix_lru(void **state) {
    (void)state;
    int bs = 4, n = 2 * bs + 1;
    BlockManager *bm = make(8, 0, bs, 0.0f, 1);
    int32_t *x = seq_tokens(n, 100), *y = seq_tokens(n, 200), *z = seq_tokens(n, 300);
    int32_t *big = seq_tokens(6 * bs, 1000);
    cache_prompt(bm, x, n); /* LRU: x1 x0 */
    cache_prompt(bm, y, n); /* LRU: x1 x0 y1 y0 */
    assert_int_equal(bm->num_evictable, 4);
    /* Within one sequence the tail goes first: x's second block is the oldest. */
    assert_true(bm->gpu[bm->lru_head].parent != BLK_HASH_ROOT);
    BlockTable t = {0};
    blk_allocate(bm, &t, big, 5 * bs); /* 4 free + 1 eviction: x1 */
    assert_int_equal(blk_stats(bm).evictions, 1);
    blk_free(bm, &t);
    /* x keeps only its first block; y keeps both. */
    assert_int_equal(cached_tokens(bm, x, n), bs);
    assert_int_equal(cached_tokens(bm, y, n), 2 * bs);

    /* A hit refreshes: y was used last, so x (and big's unregistered) go first. */
    BlockManager *bm2 = make(8, 0, bs, 0.0f, 1);
    cache_prompt(bm2, x, n);
    cache_prompt(bm2, y, n);
    cache_prompt(bm2, z, n);                            /* 6 evictable, 2 free */
    assert_int_equal(cached_tokens(bm2, x, n), 2 * bs); /* x becomes the newest */
    BlockTable u = {0};
    blk_allocate(bm2, &u, big, 6 * bs); /* 2 free + 4 evicted: y's and z's */
    assert_int_equal(blk_stats(bm2).evictions, 4);
    blk_free(bm2, &u);
    assert_int_equal(cached_tokens(bm2, x, n), 2 * bs);
    assert_int_equal(cached_tokens(bm2, y, n), 0);
    assert_int_equal(cached_tokens(bm2, z, n), 0);
    check(bm2, NULL, NULL, NULL);
    check(bm, NULL, NULL, NULL);
    free(x);
    free(y);
    free(z);
    free(big);
    blk_destroy(bm);
    blk_destroy(bm2);
}

static void test_prefix_last_token_rule(void **state) {
    (void)state;
    int bs = 16;
    BlockManager *bm = make(16, 0, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(4 * bs, 0);
    BlockTable a = {0}, b = {0}, c = {0};
    blk_allocate(bm, &a, tok, 3 * bs + 1);
    blk_mark_computed(bm, &a, tok, 3 * bs + 1);
    /* Block-aligned and fully cached: the last block is computed again. */
    BlockStats st0 = blk_stats(bm);
    assert_int_equal(blk_allocate(bm, &b, tok, 3 * bs), 2 * bs);
    assert_int_not_equal(b.blocks[2], a.blocks[2]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    BlockStats st1 = blk_stats(bm);
    assert_int_equal(st1.prefix_queries - st0.prefix_queries, 2);
    assert_int_equal(st1.prefix_hits - st0.prefix_hits, 2);
    /* One block's worth: nothing can be reused (and nothing is queried). */
    assert_int_equal(blk_allocate(bm, &c, tok, bs), 0);
    assert_int_equal(blk_stats(bm).prefix_queries, st1.prefix_queries);
    /* One token past a cached block: that block is reused. */
    BlockTable d = {0};
    assert_int_equal(blk_allocate(bm, &d, tok, bs + 1), bs);
    assert_int_equal(ref(bm, a.blocks[0]), 3);
    check4(bm, &a, &b, &c, &d);
    blk_free(bm, &a);
    blk_free(bm, &b);
    blk_free(bm, &c);
    blk_free(bm, &d);
    BlockTable e = {0};
    assert_int_equal(blk_allocate(bm, &e, tok, 0), 0);
    assert_int_equal(e.num_blocks, 0);
    blk_free(bm, &e);
    free(tok);
    blk_destroy(bm);
}

/* A lookup compares the stored tokens, not just the hash: corrupting one stored token in the
 * middle of a registered block (same key, different content) must turn its hit into a miss. */
static void test_prefix_token_compare(void **state) {
    (void)state;
    int bs = 16, n = 3 * bs + 1;
    BlockManager *bm = make(16, 0, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(n, 77);
    cache_prompt(bm, tok, n);
    assert_int_equal(cached_tokens(bm, tok, n), 3 * bs);

    BlockTable t = {0};
    blk_allocate(bm, &t, tok, n);
    int32_t b1 = t.blocks[1];
    blk_free(bm, &t);
    int32_t *stored = blk_cache_tokens(bm, b1);
    stored[bs / 2] ^= 1;
    assert_int_equal(cached_tokens(bm, tok, n), bs); /* block 0 hits, block 1 does not */
    stored[bs / 2] ^= 1;
    assert_int_equal(cached_tokens(bm, tok, n), 3 * bs);
    /* Same for the stored parent hash (same hash and tokens, different predecessor). */
    bm->gpu[b1].parent ^= 1;
    assert_int_equal(cached_tokens(bm, tok, n), bs);
    bm->gpu[b1].parent ^= 1;
    assert_int_equal(cached_tokens(bm, tok, n), 3 * bs);
    /* The same for a prompt that differs in one token in the middle of block 1. */
    tok[bs + bs / 2] += 1000;
    assert_int_equal(cached_tokens(bm, tok, n), bs);
    tok[bs + bs / 2] -= 1000;
    /* And the parent hash is part of the key: block 1's tokens after a different block 0. */
    tok[0] += 1;
    assert_int_equal(cached_tokens(bm, tok, n), 0);
    tok[0] -= 1;
    check(bm, NULL, NULL, NULL);
    free(tok);
    blk_destroy(bm);
}

static void test_prefix_duplicate_compute(void **state) {
    (void)state;
    int bs = 8, n = 2 * bs + 3;
    BlockManager *bm = make(16, 0, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(n, 5);
    BlockTable a = {0}, b = {0}, c = {0};
    assert_int_equal(blk_allocate(bm, &a, tok, n), 0);
    assert_int_equal(blk_allocate(bm, &b, tok, n), 0); /* before a computed: no hit */
    blk_mark_computed(bm, &a, tok, n);
    blk_mark_computed(bm, &b, tok, n);
    assert_int_equal(bm->num_registered, 2);
    assert_int_equal(b.num_hashed, 2);
    assert_false(bm->gpu[b.blocks[0]].registered);
    assert_int_equal(blk_allocate(bm, &c, tok, n), 2 * bs);
    assert_int_equal(c.blocks[0], a.blocks[0]);
    check(bm, &a, &b, &c);
    /* a goes away; b's private copies do not take over, a's stay cached. */
    blk_free(bm, &a);
    blk_free(bm, &b);
    blk_free(bm, &c);
    assert_int_equal(cached_tokens(bm, tok, n), 2 * bs);
    check(bm, NULL, NULL, NULL);
    free(tok);
    blk_destroy(bm);
}

/* can_allocate counts a hit on an evictable block as taking a free block, and a hit on a
 * block in use as free; allocate agrees. */
static void test_prefix_admission(void **state) {
    (void)state;
    int bs = 4;
    BlockManager *bm = make(10, 0, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(5 * bs, 0);
    int32_t *other = seq_tokens(6 * bs, 500);
    cache_prompt(bm, tok, 3 * bs + 1); /* 3 evictable blocks */
    BlockTable x = {0}, a = {0};
    blk_allocate(bm, &x, other, 6 * bs);
    assert_int_equal(blk_num_free_gpu(bm), 4); /* 1 free + 3 evictable */
    assert_int_equal(blk_can_allocate(bm, tok, 3 * bs + 1), BLK_ALLOC_OK);    /* 1 + 3 hits */
    assert_int_equal(blk_can_allocate(bm, tok, 4 * bs + 1), BLK_ALLOC_LATER); /* 2 + 3 > 4 */
    assert_int_equal(blk_allocate(bm, &a, tok, 3 * bs + 1), 3 * bs);
    assert_int_equal(blk_num_free_gpu(bm), 0);
    assert_int_equal(blk_stats(bm).evictions, 0);
    /* Hits on blocks in use cost nothing. */
    blk_free(bm, &x);
    blk_allocate(bm, &x, other, 6 * bs - 1); /* 6 blocks: 0 free */
    assert_int_equal(blk_num_free_gpu(bm), 0);
    assert_int_equal(blk_can_allocate(bm, tok, 3 * bs + 1), BLK_ALLOC_LATER);
    blk_free(bm, &x);
    blk_allocate(bm, &x, other, 5 * bs); /* 1 free */
    assert_int_equal(blk_can_allocate(bm, tok, 3 * bs + 1), BLK_ALLOC_OK);
    BlockTable b = {0};
    assert_int_equal(blk_allocate(bm, &b, tok, 3 * bs + 1), 3 * bs);
    assert_int_equal(blk_num_free_gpu(bm), 0);
    check(bm, &x, &a, &b);
    /* NEVER depends on the prompt alone, not on what happens to be cached. */
    assert_int_equal(blk_can_allocate(bm, tok, 5 * bs), BLK_ALLOC_LATER);
    int32_t *huge = seq_tokens(11 * bs, 0);
    assert_int_equal(blk_can_allocate(bm, huge, 10 * bs + 1), BLK_ALLOC_NEVER);
    blk_free(bm, &x);
    blk_free(bm, &a);
    blk_free(bm, &b);
    free(tok);
    free(other);
    free(huge);
    blk_destroy(bm);
}

/* A swapped-out registered block stays cached on the GPU (its content is still there until
 * the block is taken); after swap-in the table's new copies are private, and the table keeps
 * registering blocks it completes later. */
static void test_prefix_swap(void **state) {
    (void)state;
    int bs = 4, n = 2 * bs + 2;
    BlockManager *bm = make(16, 8, bs, 0.0f, 1);
    int32_t *tok = seq_tokens(8 * bs, 60);
    BlockTable a = {0}, b = {0};
    BlockCopy map[8], cow;
    blk_allocate(bm, &a, tok, n);
    blk_mark_computed(bm, &a, tok, n);
    int32_t old0 = a.blocks[0];
    assert_int_equal(blk_swap_out(bm, &a, map), 3);
    assert_int_equal(a.num_hashed, 0);
    assert_int_equal(bm->num_registered, 2);
    assert_int_equal(bm->num_evictable, 2);
    check(bm, &a, NULL, NULL);
    assert_int_equal(blk_allocate(bm, &b, tok, n), 2 * bs);
    assert_int_equal(b.blocks[0], old0);
    assert_int_equal(blk_swap_in(bm, &a, map), 3);
    blk_mark_computed(bm, &a, tok, n);
    assert_int_equal(a.num_hashed, 2);
    assert_int_equal(bm->num_registered, 2);
    /* a grows past the cached prefix: its next full block is registered. */
    blk_append(bm, &a, 2 * bs, &cow);
    blk_mark_computed(bm, &a, tok, n + bs); /* one more full block: 14 tokens */
    assert_int_equal(a.num_hashed, 3);
    assert_int_equal(bm->num_registered, 3);
    check(bm, &a, &b, NULL);
    blk_free(bm, &a);
    blk_free(bm, &b);
    assert_int_equal(cached_tokens(bm, tok, 3 * bs + 1), 3 * bs);
    check(bm, NULL, NULL, NULL);
    free(tok);
    blk_destroy(bm);
}

static void test_hash_quality(void **state) {
    (void)state;
    /* Every single-token change and every parent change moves the hash; no collisions among
     * many small blocks of a two-letter alphabet. */
    int32_t tok[16] = {0};
    uint64_t h0 = blk_hash_block(BLK_HASH_ROOT, tok, 16);
    for (int i = 0; i < 16; i++) {
        tok[i] = 1;
        assert_true(blk_hash_block(BLK_HASH_ROOT, tok, 16) != h0);
        tok[i] = 0;
    }
    assert_true(blk_hash_block(BLK_HASH_ROOT + 1, tok, 16) != h0);
    assert_true(blk_hash_block(BLK_HASH_ROOT, tok, 15) != h0);
    enum { N = 1 << 16 };
    uint64_t *hs = malloc(sizeof(uint64_t) * N);
    for (int v = 0; v < N; v++) {
        for (int i = 0; i < 16; i++)
            tok[i] = (v >> i) & 1;
        hs[v] = blk_hash_block(BLK_HASH_ROOT, tok, 16);
    }
    for (int v = 0; v < N; v++) /* buckets: low bits must spread too */
        for (int w = v + 1; w < v + 64 && w < N; w++)
            assert_true(hs[v] != hs[w]);
    int low[256] = {0};
    for (int v = 0; v < N; v++)
        low[hs[v] & 255]++;
    for (int k = 0; k < 256; k++)
        assert_true(low[k] > 128 && low[k] < 384); /* expected 256 each */
    free(hs);
}

/* --- randomized --- */

typedef struct {
    BlockTable t;
    int32_t *tok; /* [cap] the sequence's tokens */
    uint64_t *ph; /* [cap] ph[p] = hash of tokens[0..p]: the KV a slot at p must hold */
    int cap;
    int num_computed;
    int swapped;
} Live;

typedef struct {
    uint64_t s;
} Rng;

static uint64_t rnd(Rng *r) {
    r->s += 0x9E3779B97F4A7C15ULL;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int rndi(Rng *r, int n) {
    return (int)(rnd(r) % (uint64_t)n);
}

static uint64_t ph_step(uint64_t prev, int32_t token) {
    uint64_t z = prev * 0x100000001B3ULL + (uint64_t)(uint32_t)token + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    return z ^ (z >> 29);
}

static void live_reserve(Live *l, int n) {
    if (n <= l->cap)
        return;
    while (l->cap < n)
        l->cap = l->cap ? 2 * l->cap : 64;
    l->tok = realloc(l->tok, sizeof(int32_t) * (size_t)l->cap);
    l->ph = realloc(l->ph, sizeof(uint64_t) * (size_t)l->cap);
}

/* Tokens [from, to): random ones when r is given (else already set), and their ph. */
static void live_set_tokens(Live *l, int from, int to, Rng *r, int alphabet) {
    live_reserve(l, to);
    for (int p = from; p < to; p++) {
        if (r)
            l->tok[p] = rndi(r, alphabet);
        l->ph[p] = ph_step(p > 0 ? l->ph[p - 1] : 0, l->tok[p]);
    }
}

typedef struct {
    BlockManager *bm;
    int bs;
    uint64_t *gkv, *ckv; /* simulated KV content per slot of each pool */
} Sim;

static uint64_t *slot(Sim *s, const BlockTable *t, int p) {
    int b = p / s->bs;
    size_t i = (size_t)t->blocks[b] * (size_t)s->bs + (size_t)(p % s->bs);
    return t->on_cpu[b] ? &s->ckv[i] : &s->gkv[i];
}

static void copy_blocks(Sim *s, const BlockCopy *m, int n, int from_cpu, int to_cpu) {
    for (int k = 0; k < n; k++)
        memcpy((to_cpu ? s->ckv : s->gkv) + (size_t)m[k].dst * s->bs,
               (from_cpu ? s->ckv : s->gkv) + (size_t)m[k].src * s->bs,
               sizeof(uint64_t) * (size_t)s->bs);
}

/* Every computed slot of every table holds the KV of its own prefix (those still held). */
static void verify_content(Sim *s, Live *live, int nlive) {
    for (int i = 0; i < nlive; i++)
        for (int p = live[i].t.num_released * s->bs; p < live[i].num_computed; p++)
            if (*slot(s, &live[i].t, p) != live[i].ph[p])
                fail_msg("table %d slot %d: wrong KV content", i, p);
}

static void verify_state(Sim *s, Live *live, int nlive, const BlockTable **tabs) {
    BlockManager *bm = s->bm;
    for (int i = 0; i < nlive; i++)
        tabs[i] = &live[i].t;
    blk_check(bm, tabs, nlive);
    /* Shadow counts: distinct referenced blocks + free == pool, in both pools. */
    uint8_t *gused = calloc((size_t)bm->num_gpu, 1), *cused = calloc((size_t)bm->num_cpu + 1, 1);
    int ng = 0, nc = 0;
    for (int i = 0; i < nlive; i++) {
        const BlockTable *t = &live[i].t;
        assert_true(t->num_blocks * s->bs >= t->num_tokens);
        assert_true(live[i].num_computed <= t->num_tokens);
        for (int b = t->num_released; b < t->num_blocks; b++) {
            uint8_t *u = t->on_cpu[b] ? &cused[t->blocks[b]] : &gused[t->blocks[b]];
            if (!*u) {
                *u = 1;
                t->on_cpu[b] ? nc++ : ng++;
            }
            /* A swapped table keeps on the GPU only blocks someone else shares (or shared
             * at swap-out: the sharer may have left since). A running one has none on CPU. */
            if (!live[i].swapped)
                assert_false(t->on_cpu[b]);
        }
    }
    assert_int_equal(ng + blk_num_free_gpu(bm), bm->num_gpu);
    assert_int_equal(nc + blk_num_free_cpu(bm), bm->num_cpu);
    free(gused);
    free(cused);
    verify_content(s, live, nlive);
}

static void live_free(Sim *s, Live *live, int *nlive, int i) {
    blk_free(s->bm, &live[i].t);
    free(live[i].tok);
    free(live[i].ph);
    live[i] = live[--*nlive];
}

typedef struct {
    int64_t allocs, hits_tokens, cows, swaps_out, swaps_in, forks, nevers, laters, swap_fails;
    int64_t evictions, released;
} Counts;

/* window > 0: a sliding window (steps of at most 2 bs tokens), the blocks behind it released
 * after each computation. */
static void random_run(int bs, int caching, int window, uint64_t seed, int ops, Counts *cnt) {
    enum { MAX_LIVE = 24, GPU = 48, CPU = 24, ALPHA = 2, FAMILIES = 3 };
    Sim s = {make_windowed(GPU, CPU, bs, 0.05f, caching, window, 2 * bs), bs, NULL, NULL};
    s.gkv = calloc((size_t)GPU * bs, sizeof(uint64_t));
    s.ckv = calloc((size_t)CPU * bs, sizeof(uint64_t));
    Rng r = {seed};
    int maxlen = 6 * bs;
    int32_t fam[FAMILIES][6 * 128];
    for (int f = 0; f < FAMILIES; f++)
        for (int p = 0; p < maxlen; p++)
            fam[f][p] = rndi(&r, ALPHA);
    Live live[MAX_LIVE];
    const BlockTable *tabs[MAX_LIVE];
    int nlive = 0;
    BlockCopy *map = malloc(sizeof(BlockCopy) * GPU * 4);
    memset(cnt, 0, sizeof *cnt);

    for (int op = 0; op < ops; op++) {
        int kind = rndi(&r, 100);
        int i = nlive > 0 ? rndi(&r, nlive) : -1;
        Live *l = i >= 0 ? &live[i] : NULL;
        if (kind < 22 && nlive < MAX_LIVE) { /* allocate a prompt from a family */
            int n = 1 + rndi(&r, maxlen);
            Live *nl = &live[nlive];
            memset(nl, 0, sizeof *nl);
            if (rndi(&r, 40) == 0) { /* now and then more than the pool minus watermark */
                n = (GPU - 1) * bs + 1 + rndi(&r, 2 * bs);
                live_set_tokens(nl, 0, n, &r, ALPHA);
            } else {
                live_reserve(nl, n);
                memcpy(nl->tok, fam[rndi(&r, FAMILIES)], sizeof(int32_t) * (size_t)n);
                if (rndi(&r, 3) == 0)
                    nl->tok[rndi(&r, n)] = rndi(&r, ALPHA); /* maybe a different tail */
                live_set_tokens(nl, 0, n, NULL, 0);
            }
            AllocStatus st = blk_can_allocate(s.bm, nl->tok, n);
            int total = (n + bs - 1) / bs;
            if (st == BLK_ALLOC_NEVER) {
                assert_true(blk_held_blocks(blk_config(s.bm), n, 2 * bs) >
                            GPU - s.bm->watermark_blocks);
                cnt->nevers++;
                free(nl->tok);
                free(nl->ph);
            } else if (st == BLK_ALLOC_LATER) {
                cnt->laters++;
                if (!window) /* (with one: the first chunk's blocks and the hits kept) */
                    assert_true(blk_num_free_gpu(s.bm) - total < s.bm->watermark_blocks);
                free(nl->tok);
                free(nl->ph);
            } else {
                int cached = blk_allocate(s.bm, &nl->t, nl->tok, n);
                assert_true(cached >= 0 && cached < n && cached % bs == 0);
                if (!caching)
                    assert_int_equal(cached, 0);
                nl->num_computed = cached; /* verified against ph below */
                cnt->allocs++;
                cnt->hits_tokens += cached;
                nlive++;
            }
        } else if (kind < 40 && l && !l->swapped && l->num_computed < l->t.num_tokens) {
            /* compute: the engine writes KV slots, which must be private to the table */
            int to = rndi(&r, 2)
                         ? l->t.num_tokens
                         : l->num_computed + 1 + rndi(&r, l->t.num_tokens - l->num_computed);
            for (int p = l->num_computed; p < to; p++) {
                int b = p / bs;
                assert_int_not_equal(l->t.blocks[b], BLK_RELEASED);
                assert_false(l->t.on_cpu[b]);
                assert_int_equal(s.bm->gpu[l->t.blocks[b]].ref, 1);
                assert_false(s.bm->gpu[l->t.blocks[b]].registered);
                *slot(&s, &l->t, p) = l->ph[p];
            }
            l->num_computed = to;
            blk_mark_computed(s.bm, &l->t, l->tok, to);
            blk_release_behind(s.bm, &l->t, to);
        } else if (kind < 58 && l && !l->swapped && l->num_computed == l->t.num_tokens) {
            /* decode: grow by a few tokens (copy-on-write if the last block is shared) */
            int k = 1 + rndi(&r, bs + 2), n0 = l->t.num_tokens;
            if (blk_can_append(s.bm, &l->t, k)) {
                int last = l->t.num_blocks - 1;
                int32_t before = n0 % bs ? l->t.blocks[last] : -1;
                int shared = before >= 0 && s.bm->gpu[before].ref > 1;
                BlockCopy cow = {-1, -1};
                int c = blk_append(s.bm, &l->t, k, &cow);
                assert_int_equal(c, shared);
                if (c) {
                    assert_int_equal(cow.src, before);
                    assert_int_equal(cow.dst, l->t.blocks[last]);
                    copy_blocks(&s, &cow, 1, 0, 0);
                    cnt->cows++;
                }
                assert_int_equal(l->t.num_tokens, n0 + k);
                live_set_tokens(l, n0, n0 + k, &r, ALPHA);
            }
        } else if (kind < 66 && l && nlive < MAX_LIVE && !l->swapped &&
                   l->num_computed == l->t.num_tokens) {
            Live *c = &live[nlive];
            l = &live[i];
            memset(c, 0, sizeof *c);
            live_reserve(c, l->t.num_tokens);
            memcpy(c->tok, l->tok, sizeof(int32_t) * (size_t)l->t.num_tokens);
            memcpy(c->ph, l->ph, sizeof(uint64_t) * (size_t)l->t.num_tokens);
            blk_fork(s.bm, &l->t, &c->t);
            c->num_computed = l->num_computed;
            nlive++;
            cnt->forks++;
        } else if (kind < 76 && l && !l->swapped) {
            int priv = 0, free_cpu = blk_num_free_cpu(s.bm);
            for (int b = l->t.num_released; b < l->t.num_blocks; b++)
                priv += s.bm->gpu[l->t.blocks[b]].ref == 1;
            int32_t *before = malloc(sizeof(int32_t) * (size_t)(l->t.num_blocks + 1));
            memcpy(before, l->t.blocks, sizeof(int32_t) * (size_t)l->t.num_blocks);
            int n = blk_swap_out(s.bm, &l->t, map);
            if (priv > free_cpu) {
                assert_int_equal(n, -1);
                assert_memory_equal(before, l->t.blocks, sizeof(int32_t) * l->t.num_blocks);
                cnt->swap_fails++;
            } else {
                assert_int_equal(n, priv);
                for (int b = l->t.num_released, k = 0; b < l->t.num_blocks; b++) {
                    if (l->t.on_cpu[b]) {
                        assert_int_equal(map[k].src, before[b]);
                        assert_int_equal(map[k].dst, l->t.blocks[b]);
                        k++;
                    } else {
                        assert_true(s.bm->gpu[l->t.blocks[b]].ref > 1);
                    }
                }
                copy_blocks(&s, map, n, 0, 1);
                l->swapped = 1;
                cnt->swaps_out++;
            }
            free(before);
        } else if (kind < 86 && l && l->swapped) {
            int extra = rndi(&r, 3);
            AllocStatus st = blk_can_swap_in(s.bm, &l->t, extra);
            if (st == BLK_ALLOC_OK) {
                int on_cpu = 0;
                for (int b = 0; b < l->t.num_blocks; b++)
                    on_cpu += l->t.on_cpu[b];
                int n = blk_swap_in(s.bm, &l->t, map);
                assert_int_equal(n, on_cpu);
                copy_blocks(&s, map, n, 1, 0);
                l->swapped = 0;
                cnt->swaps_in++;
                assert_true(blk_can_append(s.bm, &l->t, extra));
            }
        } else if (kind >= 86 && l) {
            live_free(&s, live, &nlive, i);
        }
        verify_state(&s, live, nlive, tabs);
    }
    while (nlive > 0)
        live_free(&s, live, &nlive, nlive - 1);
    blk_check(s.bm, tabs, 0);
    assert_int_equal(blk_num_free_gpu(s.bm), GPU);
    assert_int_equal(blk_num_free_cpu(s.bm), CPU);
    BlockStats st = blk_stats(s.bm);
    assert_true(st.prefix_hits <= st.prefix_queries);
    assert_int_equal(st.prefix_hits * bs, cnt->hits_tokens);
    assert_int_equal(st.cow_copies, cnt->cows);
    if (!caching)
        assert_int_equal(st.prefix_queries + st.evictions, 0);
    cnt->evictions = st.evictions;
    cnt->released = st.released;
    if (!window)
        assert_int_equal(st.released, 0);
    free(map);
    free(s.gkv);
    free(s.ckv);
    blk_destroy(s.bm);
}

/* Random operations on many tables, the simulated KV content and every invariant checked after
 * each; with windows (2 bs + 1, releasing behind them) in the second half. */
static void test_randomized(void **state) {
    (void)state;
    const int sizes[] = {4, 8, 16};
    int64_t hits = 0, cows = 0, swaps = 0, fails = 0, laters = 0, evictions = 0, nevers = 0;
    int64_t forks = 0, released = 0;
    for (int caching = 0; caching <= 3; caching++) {
        for (int s = 0; s < 3; s++) {
            for (uint64_t seed = 1; seed <= 2; seed++) {
                Counts c;
                const int window = caching >= 2 ? 2 * sizes[s] + 1 : 0;
                random_run(sizes[s], caching & 1, window, seed * 7919 + (uint64_t)sizes[s], 2500,
                           &c);
                if (getenv("BLK_TEST_VERBOSE"))
                    printf("bs %d caching %d window %d seed %d: allocs %lld hit-tokens %lld "
                           "cows %lld swaps %lld/%lld fails %lld forks %lld later %lld never %lld "
                           "evictions %lld released %lld\n",
                           sizes[s], caching & 1, window, (int)seed, (long long)c.allocs,
                           (long long)c.hits_tokens, (long long)c.cows, (long long)c.swaps_out,
                           (long long)c.swaps_in, (long long)c.swap_fails, (long long)c.forks,
                           (long long)c.laters, (long long)c.nevers, (long long)c.evictions,
                           (long long)c.released);
                hits += c.hits_tokens;
                cows += c.cows;
                swaps += c.swaps_in;
                fails += c.swap_fails;
                laters += c.laters;
                evictions += c.evictions;
                nevers += c.nevers;
                forks += c.forks;
                released += c.released;
            }
        }
    }
    /* The run must have exercised what it claims to test. */
    assert_true(hits > 0);
    assert_true(cows > 0);
    assert_true(swaps > 0);
    assert_true(fails > 0);
    assert_true(laters > 0);
    assert_true(nevers > 0);
    assert_true(forks > 0);
    assert_true(evictions > 0);
    assert_true(released > 0);
}

/* ---- sliding window ---- */

/* Blocks of the GPU pool in use (held by tables). */
static int used(const BlockManager *bm) {
    return blk_num_gpu(bm) - blk_num_free_gpu(bm);
}

/* A sequence as the scheduler drives it: a prompt in chunks of at most `step`, then decode
 * steps; after each step its computed tokens are registered and the blocks behind the window
 * released. Returns the most blocks in use seen. */
static int run_windowed(BlockManager *bm, BlockTable *t, const int32_t *tok, int prompt, int total,
                        int step) {
    int done = blk_allocate(bm, t, tok, prompt), most = used(bm);
    while (done < total) {
        int chunk = done < prompt ? (prompt - done < step ? prompt - done : step) : 1;
        if (done + chunk > t->num_tokens) {
            BlockCopy cow;
            assert_true(blk_can_append(bm, t, done + chunk - t->num_tokens));
            blk_append(bm, t, done + chunk - t->num_tokens, &cow);
        }
        most = used(bm) > most ? used(bm) : most;
        done += chunk;
        blk_mark_computed(bm, t, tok, done);
        blk_release_behind(bm, t, done);
        check(bm, t, NULL, NULL);
        /* every block the next token reads is held, every one before it released */
        int first = done >= 6 ? (done - 6 + 1) / 4 : 0;
        assert_int_equal(t->num_released, first);
        for (int i = 0; i < t->num_blocks; i++)
            assert_true((t->blocks[i] == BLK_RELEASED) == (i < first));
    }
    return most;
}

/* Window 6, blocks of 4, steps of at most 8 tokens: a 20-token prompt gets slots for its first
 * chunk only, and a 400-token sequence never holds more than blk_held_blocks' peak (the window
 * and a chunk: (6 - 1 + 8) / 4 + 1 = 5 blocks) in a pool of 6, nor more than the decode bound
 * ((6 - 1 + 1) / 4 + 1 = 3) once decoding; freeing it returns every block. */
static void test_window_release(void **state) {
    (void)state;
    for (int caching = 0; caching < 2; caching++) {
        BlockManager *bm = make_windowed(6, 0, 4, 0.0f, caching, 6, 8);
        int32_t *tok = seq_tokens(400, 1000);
        assert_int_equal(blk_held_blocks(blk_config(bm), 400, 8), 5);
        assert_int_equal(blk_held_blocks(blk_config(bm), 400, 1), 3);
        assert_int_equal(blk_held_blocks(blk_config(bm), 7, 8), 2); /* all of a short one */
        assert_int_equal(blk_can_allocate(bm, tok, 400), BLK_ALLOC_OK);
        BlockTable t = {0};
        int most = run_windowed(bm, &t, tok, 20, 20, 8);
        assert_true(most <= 5);
        int released = (int)blk_stats(bm).released;
        most = 0;
        for (int n = 21; n <= 400; n++) { /* decode, one token a step */
            BlockCopy cow;
            assert_true(blk_can_append(bm, &t, 1));
            blk_append(bm, &t, 1, &cow);
            most = used(bm) > most ? used(bm) : most;
            blk_mark_computed(bm, &t, tok, n);
            blk_release_behind(bm, &t, n);
        }
        assert_true(most <= 3);
        assert_int_equal(t.num_blocks, 100);
        assert_int_equal(t.num_released, (400 - 6 + 1) / 4);
        assert_true(blk_stats(bm).released > released);
        check(bm, &t, NULL, NULL);
        blk_free(bm, &t);
        assert_int_equal(used(bm), 0);
        check(bm, NULL, NULL, NULL);
        free(tok);
        blk_destroy(bm);
    }
}

/* Without a window nothing is released; with one, admission counts a long prompt as its
 * first chunk (5 blocks of a 6-block pool) and NEVER only beyond what it could ever hold. */
static void test_window_admission(void **state) {
    (void)state;
    BlockManager *plain = make(6, 0, 4, 0.0f, 0);
    int32_t *tok = seq_tokens(1000, 7);
    assert_int_equal(blk_can_allocate(plain, tok, 1000), BLK_ALLOC_NEVER);
    BlockTable t = {0};
    blk_allocate(plain, &t, tok, 24);
    blk_release_behind(plain, &t, 24);
    assert_int_equal(t.num_released, 0);
    blk_free(plain, &t);
    blk_destroy(plain);

    BlockManager *bm = make_windowed(6, 0, 4, 0.0f, 0, 6, 8);
    assert_int_equal(blk_can_allocate(bm, tok, 1000), BLK_ALLOC_OK);
    blk_allocate(bm, &t, tok, 1000);
    assert_int_equal(t.num_tokens, 8); /* the first step's slots */
    assert_int_equal(used(bm), 2);
    BlockTable u = {0}; /* 4 left: a second long prompt's 2 fit */
    assert_int_equal(blk_can_allocate(bm, tok, 1000), BLK_ALLOC_OK);
    blk_allocate(bm, &u, tok, 1000);
    BlockTable v = {0};
    assert_int_equal(blk_can_allocate(bm, tok, 30), BLK_ALLOC_OK);
    blk_allocate(bm, &v, tok, 30);
    assert_int_equal(blk_can_allocate(bm, tok, 30), BLK_ALLOC_LATER); /* 0 left */
    blk_free(bm, &t);
    blk_free(bm, &u);
    blk_free(bm, &v);
    blk_destroy(bm);
    /* a window and step so wide that one sequence could outgrow the pool: NEVER */
    bm = make_windowed(6, 0, 4, 0.0f, 0, 30, 8);
    assert_int_equal(blk_can_allocate(bm, tok, 1000), BLK_ALLOC_NEVER);
    assert_int_equal(blk_can_allocate(bm, tok, 24), BLK_ALLOC_OK);
    blk_destroy(bm);
    free(tok);
}

/* Prefix caching with released blocks: a sequence's blocks behind its window stay cached
 * (registered, evictable); a new request with the same prompt matches the whole run from the
 * first block, and the hits behind its own window are released at once (only the held ones
 * are referenced). After the first sequence's blocks are evicted the chain is broken at its
 * first block: no hit. */
static void test_window_prefix_cache(void **state) {
    (void)state;
    BlockManager *bm = make_windowed(16, 0, 4, 0.0f, 1, 6, 8);
    int32_t *tok = seq_tokens(64, 300);
    BlockTable a = {0};
    run_windowed(bm, &a, tok, 41, 41, 8);
    assert_int_equal(a.num_released, (41 - 6 + 1) / 4);
    int held_a = a.num_blocks - a.num_released;
    assert_int_equal(used(bm), held_a);

    BlockTable b = {0};
    assert_int_equal(blk_can_allocate(bm, tok, 41), BLK_ALLOC_OK);
    assert_int_equal(blk_allocate(bm, &b, tok, 41), 40); /* 10 full blocks cached */
    assert_int_equal(b.num_released, (40 - 6 + 1) / 4);  /* 8: behind position 40's window */
    assert_int_equal(b.num_tokens, 41);
    for (int i = b.num_released; i < 10; i++) /* block 8 from the cache, 9 shared with a */
        assert_int_equal(b.blocks[i], i < a.num_released ? b.blocks[i] : a.blocks[i]);
    assert_int_equal(a.num_released, 9);
    assert_true(b.blocks[8] >= 0);
    assert_int_equal(ref(bm, b.blocks[9]), 2);
    check(bm, &a, &b, NULL);
    blk_free(bm, &b);
    blk_free(bm, &a);
    check(bm, NULL, NULL, NULL);

    /* A fork shares the held blocks only; swapping copies those alone. */
    BlockManager *sw = make_windowed(12, 12, 4, 0.0f, 0, 6, 8);
    BlockTable p = {0}, c = {0};
    run_windowed(sw, &p, tok, 30, 30, 8);
    blk_fork(sw, &p, &c);
    assert_int_equal(c.num_released, p.num_released);
    check(sw, &p, &c, NULL);
    blk_free(sw, &c);
    BlockCopy map[16];
    int held = p.num_blocks - p.num_released;
    assert_int_equal(blk_swap_out(sw, &p, map), held);
    assert_int_equal(blk_num_free_cpu(sw), 12 - held);
    check(sw, &p, NULL, NULL);
    assert_int_equal(blk_can_swap_in(sw, &p, 1), BLK_ALLOC_OK);
    assert_int_equal(blk_swap_in(sw, &p, map), held);
    for (int i = 0; i < p.num_released; i++)
        assert_int_equal(p.blocks[i], BLK_RELEASED);
    check(sw, &p, NULL, NULL);
    blk_free(sw, &p);
    check(sw, NULL, NULL, NULL);
    blk_destroy(sw);
    free(tok);
    blk_destroy(bm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_invalid),
        cmocka_unit_test(test_basics_block_sizes),
        cmocka_unit_test(test_watermark),
        cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_swap),
        cmocka_unit_test(test_free_mixed_pools),
        cmocka_unit_test(test_swap_out_cpu_full),
        cmocka_unit_test(test_swap_in_watermark),
        cmocka_unit_test(test_prefix_identical_prompt),
        cmocka_unit_test(test_prefix_different_suffix),
        cmocka_unit_test(test_prefix_reuse_after_free),
        cmocka_unit_test(test_prefix_lru),
        cmocka_unit_test(test_prefix_last_token_rule),
        cmocka_unit_test(test_prefix_token_compare),
        cmocka_unit_test(test_prefix_duplicate_compute),
        cmocka_unit_test(test_prefix_admission),
        cmocka_unit_test(test_prefix_swap),
        cmocka_unit_test(test_hash_quality),
        cmocka_unit_test(test_randomized),
        cmocka_unit_test(test_window_release),
        cmocka_unit_test(test_window_admission),
        cmocka_unit_test(test_window_prefix_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
