#!/usr/bin/env python3
"""compare_logits.py - check pagellm's logits against Hugging Face transformers.

Runs the same token ids through transformers (float32 on the CPU, eager attention: the
reference) and through `pagellm logits` (which writes raw little-endian float32 logits
[n_tokens, vocab] for every prompt position), then compares them position by position:

  rel_err(row) = max_j |pagellm - ref| / max_j |ref|     (error relative to the row's scale)
  rel_err      = max over rows

and greedy agreement (argmax of each row). It fails (exit 1) when rel_err > --tol
(default 1e-4, right for float32 weights and math; use e.g. --tol 2e-2 for a bf16 backend),
when pagellm's output is not finite or not [n_tokens, vocab], or when an argmax differs at
a position whose reference top-1/top-2 margin exceeds twice that row's max abs error (a
disagreement numerical error cannot explain). Ties within the error are reported, not failed.

A bf16 or fp16 checkpoint is upcast exactly to float32 for the reference, so the default
tolerance also holds for it when pagellm computes in float32 (as the CPU backend does).

Token ids are drawn at random from the vocabulary (--n-tokens, --seed) unless --token-ids
gives them. Usage:

    python3 tools/compare_logits.py --model DIR --pagellm build/pagellm \\
        [--n-tokens 40] [--seed 0] [--token-ids 1,2,3] [--tol 1e-4] \\
        [--pagellm-args "--device cpu"] [--save DIR]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np


def reference_logits(model_dir, ids):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    five = int(transformers.__version__.split(".")[0]) >= 5
    kw = {"dtype": torch.float32} if five else {"torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", **kw)
    model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float().cpu().numpy().astype(np.float32)


def pagellm_logits(binary, model_dir, ids, extra):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "logits.f32")
        cmd = [binary, "logits", "--model", model_dir,
               "--token-ids", ",".join(str(i) for i in ids), "--output", path] + extra
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        dt = time.time() - t0
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            sys.exit(f"error: pagellm exited with status {r.returncode}: {shlex.join(cmd[:4])} ...")
        print(f"pagellm logits: {dt:.2f} s")
        return np.fromfile(path, dtype="<f4")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face checkpoint folder")
    ap.add_argument("--pagellm", required=True, help="path of the pagellm binary")
    ap.add_argument("--n-tokens", type=int, default=40, help="random prompt length")
    ap.add_argument("--seed", type=int, default=0, help="seed for the random token ids")
    ap.add_argument("--token-ids", help="comma-separated ids instead of random ones")
    ap.add_argument("--tol", type=float, default=1e-4, help="largest rel_err accepted")
    ap.add_argument("--pagellm-args", default="", help="more flags for `pagellm logits`")
    ap.add_argument("--save", help="folder to save ref.npy, pagellm.npy and ids.txt into")
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    if args.token_ids:
        ids = [int(x) for x in args.token_ids.split(",")]
    else:
        ids = np.random.default_rng(args.seed).integers(0, vocab, args.n_tokens).tolist()
    n = len(ids)
    print(f"model {args.model}: vocab {vocab}, {n} tokens: {ids[:8]}{' ...' if n > 8 else ''}")

    t0 = time.time()
    ref = reference_logits(args.model, ids)
    print(f"transformers reference: {time.time() - t0:.2f} s")
    got = pagellm_logits(args.pagellm, args.model, ids, shlex.split(args.pagellm_args))

    if got.size != n * ref.shape[1]:
        sys.exit(f"FAIL: pagellm wrote {got.size} floats, expected {n} x {ref.shape[1]}")
    got = got.reshape(n, ref.shape[1])
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        np.save(os.path.join(args.save, "ref.npy"), ref)
        np.save(os.path.join(args.save, "pagellm.npy"), got)
        with open(os.path.join(args.save, "ids.txt"), "w") as f:
            f.write(",".join(map(str, ids)) + "\n")
    if not np.all(np.isfinite(got)):
        bad = np.argwhere(~np.isfinite(got))[0]
        sys.exit(f"FAIL: pagellm logits are not finite (first at position {bad[0]}, id {bad[1]})")

    return 0 if compare(ref, got, ids, args.tol) else 1


def row_errors(got, ref):
    """Each row's max |got - ref| and that over max |ref| (float64)."""
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    row_abs = diff.max(axis=1)
    return row_abs, row_abs / np.maximum(np.abs(ref).max(axis=1).astype(np.float64), 1e-30)


def compare(ref, got, ids, tol):
    """Print the per-position table and the summary of got against ref ([n, vocab] each);
    True when rel_err <= tol and no argmax differs beyond numerical error."""
    n = len(ids)
    row_abs, row_rel = row_errors(got, ref)
    row_scale = np.abs(ref).max(axis=1).astype(np.float64)
    ref_top = np.argsort(-ref, axis=1)[:, :2]
    ref_arg, got_arg = ref_top[:, 0], got.argmax(axis=1)
    margin = ref[np.arange(n), ref_top[:, 0]] - ref[np.arange(n), ref_top[:, 1]]

    print(f"{'pos':>4} {'id':>6} {'max|ref|':>10} {'max|err|':>10} {'rel_err':>10} "
          f"{'argmax ref/pagellm':>19} {'margin':>9}")
    worst = set(np.argsort(-row_rel)[:5].tolist())
    for i in range(n):
        if n <= 16 or i < 4 or i in worst or ref_arg[i] != got_arg[i]:
            mark = "" if ref_arg[i] == got_arg[i] else "  <- differs"
            print(f"{i:>4} {ids[i]:>6} {row_scale[i]:>10.4g} {row_abs[i]:>10.3g} "
                  f"{row_rel[i]:>10.3g} {ref_arg[i]:>9}/{got_arg[i]:<9} {margin[i]:>9.3g}{mark}")

    rel_err = float(row_rel.max())
    agree = int((ref_arg == got_arg).sum())
    unexplained = [i for i in range(n)
                   if ref_arg[i] != got_arg[i] and margin[i] > 2 * row_abs[i]]
    print(f"rel_err (max_abs_err / max_abs_ref, worst row) = {rel_err:.3g} (tol {tol:g}); "
          f"overall max_abs_err = {row_abs.max():.3g}, max_abs_ref = {np.abs(ref).max():.4g}")
    print(f"greedy argmax agreement: {agree}/{n}"
          + (f" (disagreements beyond numerical error at {unexplained})" if unexplained else ""))
    ok = rel_err <= tol and not unexplained
    print("PASS" if ok else "FAIL")
    return ok


if __name__ == "__main__":
    sys.exit(main())
