#!/usr/bin/env python3
"""bf16_yardstick.py - transformers' own bfloat16 error on a checkpoint: the yardstick for
pagellm's bf16 logits in tools/compare_logits.py. Runs compare_logits' token ids (40 random ids,
seed 0) through transformers in float32 on the CPU (the reference compare_logits uses) and in
bfloat16 on the GPU, and prints the worst row's rel_err (max |bf16 - fp32| / max |fp32|), the
greedy agreement and the rows over 3e-2. Needs torch with CUDA and transformers 5.x:

    python3 tools/bf16_yardstick.py /tmp/rc2/qwen3-moe
"""
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM


def logits(model_dir, ids, dtype, device):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager",
                                                 dtype=dtype).to(device).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids], device=device), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tools/bf16_yardstick.py MODEL_DIR")
    model_dir = sys.argv[1]
    with open(model_dir + "/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    ids = np.random.default_rng(0).integers(0, vocab, 40).tolist()  # as compare_logits.py
    ref = logits(model_dir, ids, torch.float32, "cpu")
    got = logits(model_dir, ids, torch.bfloat16, "cuda")
    rel = np.abs(got - ref).max(1) / np.abs(ref).max(1)
    agree = int((got.argmax(1) == ref.argmax(1)).sum())
    over = [int(i) for i in np.where(rel > 3e-2)[0]]
    print(f"{model_dir}: transformers bf16 vs fp32: worst row {int(rel.argmax())} rel_err "
          f"{rel.max():.3g}, greedy {agree}/{len(ids)}; rows over 3e-2: {over}")


if __name__ == "__main__":
    main()
