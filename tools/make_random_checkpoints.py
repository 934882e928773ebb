#!/usr/bin/env python3
"""make_random_checkpoints.py - random-weight Hugging Face checkpoints for logit comparison.

Builds with transformers, from a fixed seed, small random-weight models in the shapes that
matter to pagellm and saves them as checkpoint folders (config.json, generation_config.json,
safetensors) for tools/compare_logits.py to run through both transformers and pagellm:

  OUTDIR/llama       LlamaForCausalLM, float32: hidden 512, 4 heads of head_dim 128, 1 KV head
                     (GQA 4:1), intermediate 1024, 3 layers, vocab 1024, untied lm_head,
                     rope_theta 500000 with Llama-3.1 "llama3" scaling (factor 8)
  OUTDIR/qwen2       Qwen2ForCausalLM, float32: hidden 512, 8 heads of 64, 2 KV heads (GQA 4:1),
                     q/k/v biases, tied embeddings, rope_theta 1e6, eos [2, 3]
  OUTDIR/llama-bf16  the llama model's weights in bfloat16, saved in several shards
                     (model.safetensors.index.json)
  OUTDIR/llama-wide  (with --wide) a llama model as above with 64 heads of 128, 8 KV heads (hidden
                     8192, intermediate 2048, 2 layers, 1.8 GB in float32): 8 query heads and
                     one KV head per rank at tensor-parallel-size 8, 16 and 2 at size 4

After transformers' own init the weights are redrawn so every path is exercised and the
logits are O(1) (so greedy argmax is meaningful): norm weights ~ U(0.5, 1.5) rather than 1,
biases ~ N(0, 0.1^2) rather than 0, projections ~ N(0, 1/fan_in), embeddings ~ N(0, 1)
(untied) or N(0, 1/sqrt(hidden)) (tied, so the logits stay moderate).

  OUTDIR/qwen3      Qwen3ForCausalLM, float32: hidden 256, 4 heads of head_dim 128 (heads x
                     head_dim = 512 != hidden), 2 KV heads, per-head q/k RMSNorm, no q/k/v bias,
                     intermediate 512, vocab 512, tied embeddings, rope_theta 1e6
  OUTDIR/qwen3-moe   Qwen3MoeForCausalLM, float32: hidden 256, 4 heads of 64, 2 KV heads, 8 experts
                     of moe_intermediate 128, top 2, norm_topk_prob true; layer 0 dense
                     (mlp_only_layers [0], intermediate 384), the others sparse; vocab 512, untied
  OUTDIR/mixtral     MixtralForCausalLM, float32: hidden 256, 4 heads of 64, 2 KV heads, 4 experts
                     of intermediate 256, top 2; vocab 512, untied, rope_theta 1e6

  OUTDIR/gemma2     Gemma2ForCausalLM, float32: hidden 256, 4 heads of 64, 2 KV heads, GeGLU,
                     4 norms per layer, query_pre_attn_scalar 48, attention and final logit
                     soft-capping (20, 15), sliding_window 16 on layers 0, 2, tied
  OUTDIR/gemma3     Gemma3ForCausalLM (text), float32: hidden 256, 4 heads of 64, 2 KV heads,
                     q/k norms, layer_types sliding, sliding, full (window 16), local RoPE base
                     1e4, global 1e6 with linear scaling 8, tied
  OUTDIR/phi3       Phi3ForCausalLM, float32: hidden 256, 8 heads of 32, 4 KV heads, fused
                     qkv_proj and gate_up_proj, partial_rotary_factor 0.75, longrope (short and
                     long factors, original_max_position_embeddings 64, max 256), untied
  OUTDIR/mistral    MistralForCausalLM, float32: hidden 256, 4 heads of 64, 2 KV heads, intermediate
                     512, vocab 512, untied, sliding_window 32 on every layer
  OUTDIR/qwen2-sliding
                     Qwen2ForCausalLM, float32: as mistral with q/k/v biases, tied embeddings,
                     use_sliding_window true, sliding_window 32, max_window_layers 1 (layer 0
                     attends to everything, the others slide)
  OUTDIR/llama-linear, llama-dynamic, llama-yarn
                     LlamaForCausalLM, float32: hidden 256, 4 heads of 64, 2 KV heads, rope_theta
                     1e4 with linear (factor 4), dynamic NTK (factor 2, max_position_embeddings
                     128) or YaRN (factor 4, original 32, beta_fast 32, beta_slow 1) scaling

Mixture-of-experts checkpoints are written as Hub checkpoints are: one tensor per expert and
projection (Mixtral: model.layers.N.block_sparse_moe.gate.weight and
block_sparse_moe.experts.E.{w1,w2,w3}.weight; Qwen3-MoE: model.layers.N.mlp.gate.weight and
mlp.experts.E.{gate_proj,up_proj,down_proj}.weight), whatever layout this transformers version
keeps in memory (5.x fuses the experts into mlp.experts.gate_up_proj [E, 2I, H] and
mlp.experts.down_proj [E, H, I]). Each folder is reloaded with from_pretrained and its logits
must equal the in-memory model's; the tensor names written are printed.

With --tiny DIR it also writes, for each of qwen3, qwen3-moe, mixtral, gemma2, gemma3, phi3,
llama-linear, llama-dynamic, llama-yarn, mistral and qwen2-sliding (those of --only, when given),
a tiny version (hidden
64, 2-3 layers, vocab 256; a few hundred KB in float32) into DIR/<name>/ (meant to be committed
as tests/data/families/<name>/): config.json, generation_config.json, model.safetensors and
expected.json, which holds the fixed prompt (16 token ids), the float32 logits of every prompt
position ("logits", [16][256], 8 significant digits) and the greedy 16-token continuation
("greedy_ids": argmax of the last position, appended, run again without a KV cache, EOS
ignored), with each greedy step's top-1/top-2 logit margin ("greedy_margins"), and, where
transformers' RoPE initialiser gives them, its inverse frequencies and cos/sin factor ("rope":
inv_freq, attention_scaling; longrope also long_inv_freq, used past
original_max_position_embeddings). The tiny gemma2 and gemma3 have sliding_window 8, so the
16-token prompt and its continuation cross the window. The tiny mistral and qwen2-sliding have
sliding_window 16 and a 24-token prompt with a 24-token continuation: 3x the window.

Needs torch, transformers (4.4x or 5.x), safetensors; no network and no tokenizer (the
comparison works on token ids). Usage:

    python3 tools/make_random_checkpoints.py OUTDIR [--seed 0] [--layers 3] [--wide]
                                             [--only qwen3,qwen3-moe,mixtral] [--tiny DIR]

e.g. the reference data of tests/test_families.c:

    python3 tools/make_random_checkpoints.py /tmp/rc --only qwen3,qwen3-moe,mixtral \
        --tiny /tmp/refdata/families
    python3 tools/make_random_checkpoints.py /tmp/rc --only \
        gemma2,gemma3,phi3,llama-linear,llama-dynamic,llama-yarn --tiny /tmp/refdata/families
    python3 tools/make_random_checkpoints.py /tmp/rc --only mistral,qwen2-sliding \
        --tiny /tmp/refdata/families
"""
import argparse
import copy
import json
import math
import os
import re
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5


def rope_kwargs(theta, scaling=None):
    """RoPE settings in the spelling this transformers version expects."""
    if TRANSFORMERS_5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            params.update(scaling)
        return {"rope_parameters": params}
    kw = {"rope_theta": theta}
    if scaling:
        kw["rope_scaling"] = scaling
    return kw


def randomize(model, tied, seed, norm_offset=0.5):
    """Redraw every parameter (see the module docstring for the distributions). Gemma's norms
    multiply by (1 + w): norm_offset -0.5 gives them the same U(0.5, 1.5) factors."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + norm_offset)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "embed_tokens" in name:
                std = hidden ** -0.25 if tied else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name.endswith(".gate.weight"):  # MoE router [E, H]: decisive top-k margins
                p.copy_(torch.randn(p.shape, generator=gen) * 2 / math.sqrt(p.shape[-1]))
            else:  # [out, in] projections (or [E, out, in] experts) and an untied lm_head
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def build_llama(layers, seed, heads=4, kv_heads=1, intermediate=1024):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=1024,
        hidden_size=heads * 128,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=128,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        **rope_kwargs(
            500000.0,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=False, seed=seed + 1)
    return model


def build_qwen2(layers, seed):
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=1024,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=[2, 3],
        **rope_kwargs(1000000.0),
    )
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=True, seed=seed + 2)
    return model


def build_qwen3(layers, seed, hidden=256, heads=4, head_dim=128, kv_heads=2, intermediate=512,
                vocab=512):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
        **rope_kwargs(1000000.0),
    )
    model = transformers.Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=True, seed=seed + 3)
    return model


def build_qwen3_moe(layers, seed, hidden=256, heads=4, head_dim=64, kv_heads=2, intermediate=384,
                    moe_intermediate=96, experts=8, top_k=2, vocab=512, tied=False):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        moe_intermediate_size=moe_intermediate,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[0],
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=tied,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=1,
        eos_token_id=2,
        **rope_kwargs(1000000.0),
    )
    model = transformers.Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=tied, seed=seed + 4)
    return model


def decoder_kwargs(layers, hidden, heads, kv_heads, intermediate, vocab, window, theta=10000.0):
    """The config arguments Mixtral and the sliding-window Mistral and Qwen2 share."""
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        sliding_window=window,
        bos_token_id=1,
        eos_token_id=2,
        **rope_kwargs(theta),
    )


def build_mixtral(layers, seed, hidden=256, heads=4, kv_heads=2, intermediate=320, experts=4,
                  top_k=2, vocab=512):
    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        tie_word_embeddings=False,
        router_jitter_noise=0.0,
        **decoder_kwargs(layers, hidden, heads, kv_heads, intermediate, vocab, None, 1000000.0),
    )
    model = transformers.MixtralForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=False, seed=seed + 5)
    return model


def eager(cfg):
    """Eager attention (soft-capping, sliding windows as transformers' reference computes them)."""
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # pragma: no cover - older or newer config classes
        pass
    return cfg


def gemma_kwargs(layers, hidden, heads, head_dim, kv_heads, intermediate, vocab, window,
                 query_pre_attn_scalar):
    """The config arguments Gemma 2 and Gemma 3 share."""
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        query_pre_attn_scalar=query_pre_attn_scalar,
        sliding_window=window,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )


def build_gemma2(layers, seed, hidden=256, heads=4, head_dim=64, kv_heads=2, intermediate=512,
                 vocab=512, window=16, query_pre_attn_scalar=48, attn_cap=20.0, final_cap=15.0):
    torch.manual_seed(seed)
    kw = gemma_kwargs(layers, hidden, heads, head_dim, kv_heads, intermediate, vocab, window,
                      query_pre_attn_scalar)
    kw.update(attn_logit_softcapping=attn_cap, final_logit_softcapping=final_cap,
              **rope_kwargs(10000.0))
    if TRANSFORMERS_5:  # layers 0, 2, ... slide (transformers' default pattern, explicit)
        kw["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                             for i in range(layers)]
    model = transformers.Gemma2ForCausalLM(eager(transformers.Gemma2Config(**kw)))
    model = model.to(torch.float32).eval()
    randomize(model, tied=True, seed=seed + 6, norm_offset=-0.5)
    return model


def build_gemma3(layers, seed, hidden=256, heads=4, head_dim=64, kv_heads=2, intermediate=512,
                 vocab=512, window=16, query_pre_attn_scalar=48):
    """Layers slide except every third (layer_types; sliding_window_pattern 3 on 4.x)."""
    torch.manual_seed(seed)
    kw = gemma_kwargs(layers, hidden, heads, head_dim, kv_heads, intermediate, vocab, window,
                      query_pre_attn_scalar)
    linear = {"rope_type": "linear", "factor": 8.0}
    if TRANSFORMERS_5:
        kw["layer_types"] = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention"
                             for i in range(layers)]
        kw["rope_parameters"] = {
            "full_attention": dict(linear, rope_theta=1000000.0),
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
    else:
        kw.update(sliding_window_pattern=3, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                  rope_scaling=linear)
    model = transformers.Gemma3ForCausalLM(eager(transformers.Gemma3TextConfig(**kw)))
    model = model.to(torch.float32).eval()
    randomize(model, tied=True, seed=seed + 7, norm_offset=-0.5)
    return model


def build_phi3(layers, seed, hidden=256, heads=8, kv_heads=4, intermediate=512, vocab=512,
               original_max=64, max_pos=256, partial=0.75):
    """longrope: short factors in [1, 1.5), long in [1, 8); factor None, so transformers derives
    it as max_position_embeddings / original_max_position_embeddings (4) and the cos/sin factor
    sqrt(1 + ln 4 / ln original) from it, as for Phi-3-mini-128k."""
    torch.manual_seed(seed)
    half = int(hidden // heads * partial) // 2
    gen = torch.Generator().manual_seed(seed + 8)
    short = [round(1.0 + 0.5 * x, 4) for x in torch.rand(half, generator=gen).tolist()]
    long_ = [round(1.0 + 7.0 * (i / max(half - 1, 1)) ** 2 + 0.1 * x, 4)
             for i, x in enumerate(torch.rand(half, generator=gen).tolist())]
    scaling = {"rope_type": "longrope", "short_factor": short, "long_factor": long_}
    kw = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        hidden_act="silu",
        max_position_embeddings=max_pos,
        original_max_position_embeddings=original_max,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        sliding_window=None,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if TRANSFORMERS_5:
        kw["rope_parameters"] = dict(scaling, rope_theta=10000.0, partial_rotary_factor=partial)
    else:
        kw.update(rope_theta=10000.0, rope_scaling=scaling, partial_rotary_factor=partial)
    model = transformers.Phi3ForCausalLM(eager(transformers.Phi3Config(**kw)))
    model = model.to(torch.float32).eval()
    randomize(model, tied=False, seed=seed + 9)
    return model


ROPE_VARIANTS = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, 4096),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 128),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
              "beta_fast": 32.0, "beta_slow": 1.0}, 128),
}


def build_llama_rope(kind, layers, seed, hidden=256, heads=4, head_dim=64, kv_heads=2,
                     intermediate=512, vocab=512):
    """A Llama with one of the RoPE scalings of ROPE_VARIANTS (rope_theta 1e4, so that the
    scaling moves the low frequencies within a few dozen positions)."""
    torch.manual_seed(seed)
    scaling, max_pos = ROPE_VARIANTS[kind]
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        **rope_kwargs(10000.0, dict(scaling)),
    )
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=False, seed=seed + 10)
    return model


def build_mistral(layers, seed, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=512,
                  window=32):
    """Every layer slides (Mistral-7B-v0.1's shape of attention)."""
    torch.manual_seed(seed)
    kw = decoder_kwargs(layers, hidden, heads, kv_heads, intermediate, vocab, window)
    cfg = eager(transformers.MistralConfig(tie_word_embeddings=False, **kw))
    model = transformers.MistralForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=False, seed=seed + 11)
    return model


def build_qwen2_sliding(layers, seed, hidden=256, heads=4, kv_heads=2, intermediate=512,
                        vocab=512, window=32, max_window_layers=1):
    """Layers from max_window_layers on slide, the first ones attend to everything."""
    torch.manual_seed(seed)
    kw = decoder_kwargs(layers, hidden, heads, kv_heads, intermediate, vocab, window)
    cfg = eager(Qwen2Config(tie_word_embeddings=True, use_sliding_window=True,
                            max_window_layers=max_window_layers, **kw))
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=True, seed=seed + 12)
    print(f"  qwen2-sliding: layer_types {getattr(model.config, 'layer_types', None)}, "
          f"sliding_window {model.config.sliding_window}")
    return model


def hub_tensors(model):
    """The model's weights under the names Hub checkpoints use: per-expert MoE tensors (5.x
    keeps them fused in memory as mlp.experts.gate_up_proj [E, 2I, H] and
    mlp.experts.down_proj [E, H, I], gate rows first), Mixtral's block_sparse_moe prefix, no
    lm_head when tied."""
    cfg = model.config
    mixtral = cfg.model_type == "mixtral"
    hidden = cfg.hidden_size
    inter = cfg.intermediate_size if mixtral else getattr(cfg, "moe_intermediate_size", None)
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for key, t in model.state_dict().items():
        t = t.detach()
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        m = re.match(r"(model\.layers\.\d+)\.(mlp|block_sparse_moe)\.(.*)$", key)
        if not m or not (m.group(3).startswith("experts.") or m.group(3) == "gate.weight"):
            out[key] = t.contiguous().clone()
            continue
        prefix = f"{m.group(1)}.{'block_sparse_moe' if mixtral else 'mlp'}"
        rest = m.group(3)
        if rest in ("experts.gate_up_proj", "experts.down_proj"):
            if rest == "experts.gate_up_proj":
                if t.shape[1] != 2 * inter:  # stored [E, H, 2I]
                    t = t.transpose(1, 2)
                assert tuple(t.shape[1:]) == (2 * inter, hidden), (key, t.shape)
                parts = [(names[0], t[:, :inter]), (names[1], t[:, inter:])]
            else:
                if t.shape[1] != hidden:  # stored [E, I, H]
                    t = t.transpose(1, 2)
                assert tuple(t.shape[1:]) == (hidden, inter), (key, t.shape)
                parts = [(names[2], t)]
            for name, w in parts:
                for e in range(w.shape[0]):
                    out[f"{prefix}.experts.{e}.{name}.weight"] = w[e].contiguous().clone()
        else:  # the router, or 4.x per-expert tensors already named as on the Hub
            out[f"{prefix}.{rest}"] = t.contiguous().clone()
    return out


def save_hub(model, outdir, dtype):
    """Config files by save_pretrained, weights as one model.safetensors of hub_tensors."""
    from safetensors.torch import save_file

    model = model.to(dtype)
    if TRANSFORMERS_5:
        model.config.dtype = dtype
    else:
        model.config.torch_dtype = dtype
    os.makedirs(outdir, exist_ok=True)
    model.config.architectures = [type(model).__name__]  # as model.save_pretrained sets it
    model.config.save_pretrained(outdir)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(outdir)
    for f in os.listdir(outdir):
        if f.endswith(".safetensors") or f.endswith(".safetensors.index.json"):
            os.remove(os.path.join(outdir, f))
    tensors = hub_tensors(model)
    save_file(tensors, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    return tensors


def print_names(outdir, tensors):
    """The tensor names written, layer numbers and expert numbers folded."""
    folded = {}
    for k, t in tensors.items():
        f = re.sub(r"\.experts\.\d+\.", ".experts.E.", re.sub(r"layers\.\d+\.", "layers.N.", k))
        folded.setdefault(f, tuple(t.shape))
    print(f"  {outdir}: {len(tensors)} tensors")
    for f in sorted(folded):
        print(f"    {f} {list(folded[f])}")


def reference_ids(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()


def check_logits(outdir, reference):
    """Reload the folder (transformers maps Hub names to its own) and require the same logits."""
    kw = {"dtype": torch.float32} if TRANSFORMERS_5 else {"torch_dtype": torch.float32}
    again = type(reference).from_pretrained(outdir, attn_implementation="eager", **kw).eval()
    ids = torch.randint(0, reference.config.vocab_size, (24,),
                        generator=torch.Generator().manual_seed(7)).tolist()
    a, b = reference_ids(reference.float(), ids), reference_ids(again, ids)
    err = (a - b).abs().max().item()
    if err > 1e-5 * max(1.0, a.abs().max().item()):
        sys.exit(f"error: {outdir}: logits differ by {err:g} after reload")
    return again


def rope_info(model):
    """transformers' own inverse frequencies and cos/sin factor for a single (not per layer
    type) RoPE configuration; longrope also the long ones. None where not available."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        cfg = model.config
        params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if "full_attention" in params or "sliding_attention" in params:
            return None
        kind = params.get("rope_type", params.get("type", "default"))
        rot = model.model.rotary_emb
        inv = getattr(rot, "original_inv_freq", None)
        if inv is None:
            inv = rot.inv_freq
        doc = {"rope_type": kind, "inv_freq": [float(f"{x:.9g}") for x in inv.tolist()],
               "attention_scaling": float(getattr(rot, "attention_scaling", 1.0))}
        if kind == "longrope":
            orig = params.get("original_max_position_embeddings",
                              getattr(cfg, "original_max_position_embeddings", None))
            long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu", seq_len=orig + 1)
            doc["long_inv_freq"] = [float(f"{x:.9g}") for x in long_inv.tolist()]
            doc["original_max_position_embeddings"] = orig
        return doc
    except Exception as e:  # the comparison data stays useful without it
        print(f"  (no rope info: {e})")
        return None


def write_expected(outdir, model, seed, n_prompt=16, n_new=16):
    """expected.json: the prompt, the float32 logits of every prompt position, the greedy
    continuation (argmax, ties to the lower id as torch.argmax; no KV cache, EOS ignored)."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed + 99)
    prompt = torch.randint(0, vocab, (n_prompt,), generator=gen).tolist()
    logits = reference_ids(model, prompt)
    seq, margins = list(prompt), []
    for _ in range(n_new):
        last = reference_ids(model, seq)[-1]
        top = torch.topk(last, 2)
        margins.append(float(f"{(top.values[0] - top.values[1]).item():.4g}"))
        seq.append(int(torch.argmax(last).item()))
    doc = {
        "generator": "tools/make_random_checkpoints.py --tiny",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "architecture": model.config.architectures[0] if model.config.architectures
        else type(model).__name__,
        "prompt_ids": prompt,
        "logits": [[float(f"{x:.8g}") for x in row] for row in logits.tolist()],
        "greedy_ids": seq[n_prompt:],
        "greedy_margins": margins,
    }
    rope = rope_info(model)
    if rope:
        doc["rope"] = rope
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"  {outdir}/expected.json: prompt {prompt}, greedy {doc['greedy_ids']}, "
          f"smallest greedy margin {min(margins):.3g}")


def tiny_models(seed, only=None):
    """Tiny versions of the new families for tests/data/families/ (a few hundred KB each), as
    (name, builder[, prompt tokens, new tokens]); only those named in `only` when given."""
    tiny = [
        ("gemma2", lambda: build_gemma2(3, seed, hidden=64, heads=2, head_dim=32, kv_heads=1,
                                        intermediate=128, vocab=256, window=8,
                                        query_pre_attn_scalar=24, attn_cap=2.0, final_cap=5.0)),
        ("gemma3", lambda: build_gemma3(3, seed, hidden=64, heads=2, head_dim=32, kv_heads=1,
                                        intermediate=128, vocab=256, window=8,
                                        query_pre_attn_scalar=24)),
        ("phi3", lambda: build_phi3(2, seed, hidden=64, heads=4, kv_heads=2, intermediate=96,
                                    vocab=256, original_max=64, max_pos=256)),
    ] + [(f"llama-{k}", (lambda k=k: build_llama_rope(k, 2, seed, hidden=64, heads=2,
                                                       head_dim=32, kv_heads=1,
                                                       intermediate=96, vocab=256)))
         for k in ROPE_VARIANTS]
    sliding = dict(hidden=64, heads=4, kv_heads=2, intermediate=96, vocab=256, window=16)
    tiny += [  # 24 + 24 tokens: 3x the window
        ("mistral", lambda: build_mistral(2, seed, **sliding), 24, 24),
        ("qwen2-sliding", lambda: build_qwen2_sliding(3, seed, **sliding), 24, 24),
    ]
    old = [  # each builder seeds itself: building lazily changes no value
        ("qwen3", lambda: build_qwen3(2, seed, hidden=64, heads=2, head_dim=48, kv_heads=1,
                                      intermediate=64, vocab=256)),
        ("qwen3-moe", lambda: build_qwen3_moe(2, seed, hidden=64, heads=2, head_dim=32,
                                              kv_heads=1, intermediate=64, moe_intermediate=48,
                                              experts=4, top_k=2, vocab=256, tied=True)),
        ("mixtral", lambda: build_mixtral(2, seed, hidden=64, heads=4, kv_heads=2,
                                          intermediate=24, experts=4, top_k=2, vocab=256)),
    ]
    return [t for t in old + tiny if only is None or t[0] in only]


def save(model, outdir, dtype, max_shard_size=None):
    model = model.to(dtype)
    # Declare the weights' dtype in config.json (transformers 5 writes `dtype`).
    if TRANSFORMERS_5:
        model.config.dtype = dtype
    else:
        model.config.torch_dtype = dtype
    kw = {"safe_serialization": True}
    if max_shard_size:
        kw["max_shard_size"] = max_shard_size
    model.save_pretrained(outdir, **kw)


def check(outdir, reference):
    """Reload the folder and make sure transformers sees the same weights and config."""
    with open(os.path.join(outdir, "config.json")) as f:
        cfg = json.load(f)
    keys = ["architectures", "dtype", "torch_dtype", "rope_theta", "rope_scaling",
            "rope_parameters", "tie_word_embeddings", "head_dim", "num_key_value_heads",
            "eos_token_id"]
    print(f"{outdir}/config.json:", json.dumps({k: cfg[k] for k in keys if k in cfg}))
    files = sorted(f for f in os.listdir(outdir) if f.endswith((".safetensors", ".json")))
    print(f"  files: {', '.join(files)}")
    kw = {"dtype": torch.float32} if TRANSFORMERS_5 else {"torch_dtype": torch.float32}
    again = type(reference).from_pretrained(outdir, **kw)
    ref = {k: v.float() for k, v in reference.state_dict().items()}
    for k, v in again.state_dict().items():
        if not torch.equal(v.float(), ref[k]):
            sys.exit(f"error: {outdir}: tensor {k} differs after reload")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", help="folder to write llama/, qwen2/ and llama-bf16/ into")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=3, help="decoder layers of each model")
    ap.add_argument("--wide", action="store_true",
                    help="also write llama-wide/ (for tensor-parallel sizes 4 and 8)")
    ap.add_argument("--only", help="comma-separated names of the models to write (default all)")
    ap.add_argument("--tiny", metavar="DIR",
                    help="also write tiny models of the families (those of --only) with "
                         "expected.json into DIR/<name>/ (tests/data/families/)")
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    only = set(args.only.split(",")) if args.only else None
    builders = {
        "llama": lambda: build_llama(args.layers, args.seed),
        "qwen2": lambda: build_qwen2(args.layers, args.seed),
        "qwen3": lambda: build_qwen3(args.layers, args.seed),
        "qwen3-moe": lambda: build_qwen3_moe(args.layers, args.seed),
        "mixtral": lambda: build_mixtral(args.layers, args.seed),
        "gemma2": lambda: build_gemma2(args.layers, args.seed),
        "gemma3": lambda: build_gemma3(args.layers, args.seed),
        "phi3": lambda: build_phi3(args.layers, args.seed),
        "mistral": lambda: build_mistral(args.layers, args.seed),
        "qwen2-sliding": lambda: build_qwen2_sliding(args.layers, args.seed),
    }
    for kind in ROPE_VARIANTS:
        builders[f"llama-{kind}"] = (lambda k=kind: build_llama_rope(k, args.layers, args.seed))
    outputs = [("llama", "llama", torch.float32, None),
               ("qwen2", "qwen2", torch.float32, None),
               ("llama", "llama-bf16", torch.bfloat16, "4MB"),
               ("qwen3", "qwen3", torch.float32, None),
               ("qwen3-moe", "qwen3-moe", torch.float32, None),
               ("mixtral", "mixtral", torch.float32, None),
               ("gemma2", "gemma2", torch.float32, None),
               ("gemma3", "gemma3", torch.float32, None),
               ("phi3", "phi3", torch.float32, None),
               ("mistral", "mistral", torch.float32, None),
               ("qwen2-sliding", "qwen2-sliding", torch.float32, None)]
    outputs += [(f"llama-{k}", f"llama-{k}", torch.float32, None) for k in ROPE_VARIANTS]
    if args.wide:
        builders["llama-wide"] = lambda: build_llama(2, args.seed, heads=64, kv_heads=8,
                                                     intermediate=2048)
        outputs.append(("llama-wide", "llama-wide", torch.float32, "2GB"))
    if only is not None:
        unknown = only - {name for _, name, _, _ in outputs}
        if unknown:
            sys.exit(f"error: --only: unknown model(s) {', '.join(sorted(unknown))}")
        outputs = [o for o in outputs if o[1] in only]
    built = {}
    for key, name, dtype, shard in outputs:
        if key not in built:
            built[key] = builders[key]()
        path = os.path.join(args.outdir, name)
        # A copy, so that saving in bf16 leaves the fp32 model intact for the next one.
        clone = copy.deepcopy(built[key])
        if key not in ("llama", "qwen2", "llama-wide"):
            print_names(path, save_hub(clone, path, dtype))
            check_logits(path, clone)
        else:
            save(clone, path, dtype, shard)
            check(path, clone)
    if args.tiny:
        for name, build, *lengths in tiny_models(args.seed, only):
            model = build()
            path = os.path.join(args.tiny, name)
            print_names(path, save_hub(model, path, torch.float32))
            again = check_logits(path, model)
            write_expected(path, again, args.seed, *lengths)
            size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
            print(f"  {path}: {size / 1024:.0f} KB")
    print("ok")


if __name__ == "__main__":
    main()
