/* ops.c - the CPU backend's KernelOps table. Every op is plain C on host memory with fp32
 * activations; it is both a real backend and the reference the CUDA kernels are tested
 * against. The ops themselves live in one file each (see cpu_internal.h). */
#include "cpu_internal.h"

static const KernelOps cpu_ops = {
    .name = "cpu",
    .act = DT_F32,
    .host_memory = 1,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .to_device = cpu_copy,
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
    .gather_rows = cpu_gather_rows,
    .to_f32 = cpu_to_f32_op,
    .copy_blocks = cpu_copy_blocks,
    .sample = cpu_sample,
    .logits_add = cpu_logits_add,
    .logprobs = cpu_logprobs,
    .embedding_slice = cpu_embedding_slice,
    .vocab_logits_f32 = cpu_vocab_logits_f32,
};

const KernelOps *k_cpu_ops(void) {
    return &cpu_ops;
}
