/* block_manager.h - fixed-size KV-cache blocks: a GPU pool and a CPU (swap) pool, per-
 * sequence block tables, reference counts, copy-on-write, swapping and prefix caching.
 *
 * Pure bookkeeping (no memory of its own besides ids): it decides which physical block
 * holds which tokens and returns the block copies the engine must perform (GPU->CPU on swap
 * out, CPU->GPU on swap in, GPU->GPU for copy-on-write). One engine thread owns it: no
 * locks.
 *
 * Blocks: a sequence's token position p lives in table->blocks[p / block_size]. Blocks are
 * shared by reference count between forked sequences (n > 1) and, with prefix caching, between
 * requests whose prompts start with the same full blocks. A full block whose KV has been
 * computed is registered under a chained hash of (predecessor's hash, its tokens); a new
 * request reuses the longest run of registered blocks matching its prompt. Freed registered
 * blocks stay cached (reusable) until the pool needs them, evicted least recently used.
 *
 * Swapping moves only the blocks a sequence owns alone (ref count 1): blocks it shares stay
 * on the GPU, still referenced, so swapping never takes a block away from another sequence.
 * A registered block that is swapped out stays registered (and evictable) on the GPU: its
 * data there is valid until the block is reused, which happens only after the engine has
 * performed the step's swap-out copies.
 *
 * Sliding window (BlockManagerConfig.sliding_window: every layer of the model reads only the
 * last W positions, as Mistral-7B-v0.1's): the blocks wholly behind the window of the next
 * token a running sequence computes are released as it advances (blk_release_behind), their
 * table entries left as BLK_RELEASED, which the attention kernels never read; a new prompt gets
 * slots for its first step's tokens only (the scheduler's per-step budget, max_step_tokens),
 * later chunks growing the table by blk_append. A sequence thus holds at most about
 * (W + max_step_tokens) / block_size + 2 blocks whatever its length, and about W / block_size
 * + 1 while it decodes (blk_held_blocks), which admission counts. Released blocks stay in the
 * prefix cache like the blocks of a finished sequence (registered, evictable): a prompt still
 * matches its longest cached run of full blocks from the first one, and the hits behind its window
 * are released at once. */
#ifndef PAGELLM_BLOCK_MANAGER_H
#define PAGELLM_BLOCK_MANAGER_H

#include <stdint.h>

#include "common.h"

typedef struct {
    int num_gpu_blocks;
    int num_cpu_blocks;
    int block_size;            /* tokens per block */
    float watermark;           /* fraction of GPU blocks kept free at admission (0.01) */
    int enable_prefix_caching; /* reuse computed full blocks across requests */
    int sliding_window;        /* > 0: no position more than this far behind the newest is read */
    int max_step_tokens;       /* sliding_window only: most tokens a sequence computes in a step */
} BlockManagerConfig;

/* The table entry of a block released behind the sliding window. */
#define BLK_RELEASED (-1)

/* One block copy the engine must perform, in block ids of the pools named by the call. */
typedef struct {
    int32_t src;
    int32_t dst;
} BlockCopy;

/* A sequence's blocks. Owned by the caller (embedded in its sequence), filled by the block
 * manager; zero-initialise before first use. */
typedef struct {
    int32_t *blocks; /* [num_blocks] physical ids (GPU ids, or CPU ids where on_cpu) */
    uint8_t *on_cpu; /* [num_blocks] 1 = the block lives in the CPU pool (swapped out) */
    int num_blocks;
    int num_released; /* leading entries released behind the window (BLK_RELEASED, on_cpu 0) */
    int capacity;
    int num_tokens;     /* tokens the table has slots for */
    int num_hashed;     /* leading full blocks registered in the prefix cache */
    uint64_t last_hash; /* chained hash of block num_hashed - 1 */
} BlockTable;

typedef enum {
    BLK_ALLOC_OK,    /* enough free blocks now */
    BLK_ALLOC_LATER, /* not now; after others finish */
    BLK_ALLOC_NEVER, /* more blocks than the whole pool minus the watermark, cached or
                      * not: reject the request (the caller keeps sequences shorter) */
} AllocStatus;

typedef struct {
    int64_t prefix_queries; /* full prompt blocks looked up */
    int64_t prefix_hits;    /* of those, found cached */
    int64_t swapped_out;    /* blocks copied GPU -> CPU */
    int64_t swapped_in;     /* blocks copied CPU -> GPU */
    int64_t cow_copies;     /* copy-on-write block copies */
    int64_t evictions;      /* cached blocks reused for other content */
    int64_t released;       /* blocks released behind a sliding window */
} BlockStats;

typedef struct BlockManager BlockManager;

/* NULL with pl_error() set when the config is invalid (no GPU block, negative CPU pool
 * (0 = no swap space), block size not a power of two up to 1024, watermark outside [0, 1)). */
BlockManager *blk_create(const BlockManagerConfig *cfg);
void blk_destroy(BlockManager *bm);

int blk_block_size(const BlockManager *bm);
int blk_num_free_gpu(const BlockManager *bm); /* free + evictable cached blocks */
int blk_num_free_cpu(const BlockManager *bm);
int blk_num_gpu(const BlockManager *bm);
int blk_num_cpu(const BlockManager *bm);
BlockStats blk_stats(const BlockManager *bm);

/* The most GPU blocks a sequence of num_tokens tokens holds under cfg while it computes up to
 * step_tokens tokens a step: all of them, or with a sliding window at most those of
 * (window - 1 + step_tokens) positions (+1 for where they start in a block). Its peak is at
 * step_tokens = max_step_tokens (a prompt chunk), its decode steps need step_tokens = 1. */
int blk_held_blocks(const BlockManagerConfig *cfg, int num_tokens, int step_tokens);
/* The peak of blk_held_blocks: a prompt chunk of max_step_tokens (unbounded: the whole). */
int blk_peak_blocks(const BlockManagerConfig *cfg, int num_tokens);
const BlockManagerConfig *blk_config(const BlockManager *bm);

/* Can a new sequence with this prompt get its blocks (counting prefix-cache hits)? */
AllocStatus blk_can_allocate(BlockManager *bm, const int32_t *tokens, int num_tokens);

/* Give an empty table blocks for `num_tokens` prompt tokens, reusing cached prefix blocks
 * (with a sliding window: slots up to the first step's tokens after the cached ones, the hits
 * behind the window released). Returns the number of leading tokens whose KV is already cached
 * (a multiple of the block size, always < num_tokens so at least one token is computed). Call
 * only after blk_can_allocate said OK. */
int blk_allocate(BlockManager *bm, BlockTable *t, const int32_t *tokens, int num_tokens);

/* Register the table's full blocks whose KV is now computed (the first num_computed tokens)
 * in the prefix cache. tokens[0..num_computed) are the sequence's tokens. No-op when
 * prefix caching is off. */
void blk_mark_computed(BlockManager *bm, BlockTable *t, const int32_t *tokens, int num_computed);

/* Can the table grow by `num_new` tokens (new blocks and copy-on-write included)? */
int blk_can_append(BlockManager *bm, const BlockTable *t, int num_new);

/* Grow the table by `num_new` token slots. If the block being written is shared, it is
 * replaced by a private copy: *cow gets the GPU->GPU copy and the return value is 1 (else
 * 0). Call only after blk_can_append said yes. */
int blk_append(BlockManager *bm, BlockTable *t, int num_new, BlockCopy *cow);

/* With a sliding window, release the table's GPU blocks wholly behind the window of the token
 * at position next_pos (those before next_pos - window + 1; a swapped table keeps its blocks).
 * The first num_computed tokens of a running sequence are computed: call it with next_pos =
 * num_computed after each step. No-op without a window. */
void blk_release_behind(BlockManager *bm, BlockTable *t, int next_pos);

/* child (empty) shares every block of parent (ref counts incremented). */
void blk_fork(BlockManager *bm, const BlockTable *parent, BlockTable *child);

/* Swap out: move the table's solely-owned GPU blocks to the CPU pool. Writes the GPU->CPU
 * copies to map (room for t->num_blocks) and returns their count, or -1 when the CPU pool
 * lacks room (nothing changed). */
int blk_swap_out(BlockManager *bm, BlockTable *t, BlockCopy *map);

/* Can the swapped table come back (with room for `num_new` more tokens afterwards)? */
AllocStatus blk_can_swap_in(BlockManager *bm, const BlockTable *t, int num_new);

/* Swap in: move the table's CPU blocks back to fresh GPU blocks. Writes the CPU->GPU copies
 * and returns their count. Call only after blk_can_swap_in said OK. */
int blk_swap_in(BlockManager *bm, BlockTable *t, BlockCopy *map);

/* Release every block of the table (ref counts decremented; registered blocks stay cached)
 * and free its arrays. The table is empty afterwards. */
void blk_free(BlockManager *bm, BlockTable *t);

/* Verify every invariant (ref counts equal the references held by `tables`, no block both
 * free and used, free lists consistent, hash table consistent). Aborts with a message on
 * violation. Used by tests and debug builds. */
void blk_check(const BlockManager *bm, const BlockTable *const *tables, int num_tables);

#endif
