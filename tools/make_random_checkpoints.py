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

Needs torch, transformers (4.4x or 5.x), safetensors; no network and no tokenizer (the
comparison works on token ids). Usage:

    python3 tools/make_random_checkpoints.py OUTDIR [--seed 0] [--layers 3] [--wide]
"""
import argparse
import copy
import json
import math
import os
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


def randomize(model, tied, seed):
    """Redraw every parameter (see the module docstring for the distributions)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif "embed_tokens" in name:
                std = hidden ** -0.25 if tied else 1.0
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:  # [out, in] projections and an untied lm_head
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
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
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    llama = build_llama(args.layers, args.seed)
    qwen2 = build_qwen2(args.layers, args.seed)
    outputs = [
        (llama, "llama", torch.float32, None),
        (qwen2, "qwen2", torch.float32, None),
        (llama, "llama-bf16", torch.bfloat16, "4MB"),
    ]
    if args.wide:
        wide = build_llama(2, args.seed, heads=64, kv_heads=8, intermediate=2048)
        outputs.append((wide, "llama-wide", torch.float32, "2GB"))
    for model, name, dtype, shard in outputs:
        path = os.path.join(args.outdir, name)
        # A copy, so that saving in bf16 leaves the fp32 model intact for the next one.
        clone = copy.deepcopy(model)
        save(clone, path, dtype, shard)
        check(path, clone)
    print("ok")


if __name__ == "__main__":
    main()
