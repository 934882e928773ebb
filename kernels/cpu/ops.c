/* ops.c - the CPU backend's op table, and opening one: its state is the worker pool its ops
 * run on. Every op is plain C on host memory with fp32 activations; it is both a real backend
 * and the reference the CUDA kernels are tested against. The ops themselves live in one file
 * each (see cpu_internal.h). */
#include <limits.h>
#include <stdlib.h>

#include "cpu_internal.h"

static size_t cpu_sample_workspace_bytes(const KernelOps *ops, int max_rows, int vocab,
                                         int max_history) {
    return 0; /* per-thread scratch instead */
}

static void cpu_bind(const KernelOps *ops) {} /* any thread may call the ops */

static const KernelOps cpu_table = {
    .name = "cpu",
    .act = DT_F32,
    .size = 1,
    .max_top_logprobs = INT_MAX,
    .host_memory = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
    .to_device_rows = cpu_copy_rows,
    .to_host = cpu_copy,
    .free_memory = cpu_free_memory,
    .alloc_host = cpu_alloc,
    .free_host = cpu_free,
    .swap_blocks = cpu_swap_blocks,
    .scatter_tokens = cpu_scatter_tokens,
    .embedding = cpu_embedding,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .qkv_rope_cache = cpu_qkv_rope_cache,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .gelu_tanh_mul = cpu_gelu_tanh_mul,
    .scale = cpu_scale,
    .logits_softcap = cpu_logits_softcap,
    .moe_workspace_bytes = cpu_moe_workspace_bytes,
    .moe_mlp = cpu_moe_mlp,
    .gather_rows = cpu_gather_rows,
    .to_f32 = cpu_to_f32_op,
    .copy_blocks = cpu_copy_blocks,
    .sample_workspace_bytes = cpu_sample_workspace_bytes,
    .sample_rows = cpu_sample_rows,
    .logits_add = cpu_logits_add,
    .logits_mask = cpu_logits_mask,
    .logprobs = cpu_logprobs,
    .embedding_slice = cpu_embedding_slice,
    .vocab_logits_f32 = cpu_vocab_logits_f32,
    .bind = cpu_bind,
};

Status cpu_open(const KernelOpenOptions *o, KernelOps **out) {
    if (o->act != DT_F32)
        return pl_error_set(PL_ERR_UNSUPPORTED, "the cpu backend computes in float32, not %s",
                            pl_dtype_name(o->act));
    if (o->size > 1 && !o->mpi)
        return pl_error_set(PL_ERR_UNSUPPORTED,
                            "tensor-parallel-size %d on the cpu backend runs as %d MPI "
                            "processes (mpirun -np %d pagellm ...), or in one process on the "
                            "cuda backend built with NCCL",
                            o->size, o->size, o->size);
    CpuState *st = pl_xcalloc(1, sizeof *st);
    st->pool = cpu_pool_create(o->cpu_threads);
    KernelOps *k = pl_xmalloc(sizeof *k);
    *k = cpu_table;
    k->state = st;
    Status s = o->size > 1 ? cpu_mpi_join(k, o->size) : PL_OK;
    if (s != PL_OK) {
        cpu_close(k);
        return s;
    }
    *out = k;
    return PL_OK;
}

void cpu_close(KernelOps *ops) {
    CpuState *st = ops->state;
    cpu_pool_destroy(st->pool);
    free(st->gather);
    free(st);
    free(ops);
}
