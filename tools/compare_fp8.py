#!/usr/bin/env python3
"""compare_fp8.py - pagellm's fp8 checkpoints on the GPU against Hugging Face transformers.

Needs a CUDA GPU with fp8 (sm_89 or newer), torch and transformers. From a fixed seed it makes
a random-weight Llama in bfloat16 whose dims are multiples of 128 (make_random_checkpoints.py's
build_llama: hidden 512, 4 heads of 128, 1 KV head, intermediate 1024, vocab 1024, 2 layers)
and three fp8 checkpoints of it in WORKDIR:

  fp8-block   quantized by transformers (FineGrainedFP8Config(weight_block_size=(128, 128))
              at load) and saved by save_pretrained: quant_method "fp8", e4m3 weights and
              their weight_scale_inv per 128 x 128 block; the tensor names and dtypes saved,
              and the quantization_config, are printed
  ct-dynamic  compressed-tensors "float-quantized" written here: per-channel weight_scale
              (BF16 [N, 1], amax / 448 of each row), dynamic per-token activations
  ct-static   the same weights with a static per-tensor input_scale on every projection
              (F32 [1]: the largest |input| the bf16 model gives it on the prompt, / 448)

and runs `pagellm logits` on each (--device cuda, bf16 activations, and float32) against
references computed by transformers on the GPU from the same prompt of random ids:

  bf16    the original bf16 model in bf16
  fp8     transformers running the checkpoint's fp8 arithmetic: the bf16 model with every
          projection replaced by the file's dequantized weights (w_fp8 * scale, fp32) applied
          to its input rounded to e4m3 as the matmul op documents (include/kernels.h: per token
          and 128 columns for block scales, per token for compressed-tensors dynamic, the
          static input_scale), in fp32, the output rounded to the model dtype; run in bf16,
          and in fp32 ("fp8 fp32"). transformers' own FP8Linear is tried first on fp8-block and
          used where it runs (5.17's needs the `kernels` package, absent on the H200 host);
          compressed-tensors has no transformers path without its package
  deq     the dequantized weights without activation rounding, in bf16 (not gated)

  tol = rel_err(fp8, bf16): how far fp8 itself moves transformers' logits on this model.
  PASS: pagellm bf16 against fp8 within tol, and greedy argmax equal wherever fp8's top-1 /
  top-2 margin exceeds twice the row's error (compare_logits.compare); and pagellm float32,
  CUDA and CPU, against "fp8 fp32" within tol as well. The same arithmetic in fp32 differs
  only in the order of sums, but where that moves an activation across an e4m3 rounding
  boundary the element changes by a whole e4m3 step (up to 2^-3 of it), and every later token
  attending to it shifts. The CPU and few such moves agree to ~1e-6 on most rows (the rows
  above 1e-4 are counted); cuBLASLt's fp8 GEMM (prefills beyond 8 rows) accumulates to about
  2^-12 and bf16 rounds every activation, which moves many, so that two correct fp8
  implementations then differ by a good part of fp8's own error.

rel_err is compare_logits.py's: max |got - ref| / max |ref| over a row, worst row. Usage:

    python3 tools/compare_fp8.py --pagellm build/pagellm --workdir /tmp/fp8cmp [--n-tokens 40]
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_logits import compare, pagellm_logits, row_errors  # noqa: E402
from make_random_checkpoints import build_llama, save  # noqa: E402

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
MIN_SCALE = 1.0 / (448.0 * 512.0)  # PL_F8E4M3_MIN_SCALE
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load(model_dir, dtype, **kw):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map="cuda",
                                             attn_implementation="eager", **kw)
    return m.eval()


def run(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids], device="cuda"), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def tensors_of(model_dir):
    from safetensors.torch import load_file
    t = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            t.update(load_file(os.path.join(model_dir, f)))
    return t


def print_file(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        print(f"{model_dir}: quantization_config",
              json.dumps(json.load(f).get("quantization_config")))
    for name, v in sorted(tensors_of(model_dir).items()):
        if ".layers.0." in name or ".layers." not in name:
            print(f"  {name}: {str(v.dtype).replace('torch.', '')} {list(v.shape)}")


def make_block(bf16_dir, out):
    from transformers import FineGrainedFP8Config
    m = load(bf16_dir, torch.bfloat16,
             quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128)))
    m.save_pretrained(out)
    print_file(out)


def quantize_rows(w):
    """Per-channel e4m3 of w [N, K]: (q, scale [N, 1] bf16), scale = amax / 448 in bf16."""
    s = (w.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=MIN_SCALE)
    s = s.to(torch.bfloat16)
    return (w.float() / s.float()).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), s


def input_amax(bf16_dir, ids):
    """The largest |input| of every projection on the prompt (the bf16 model in fp32)."""
    m, amax = load(bf16_dir, torch.float32), {}

    def hook(name):
        return lambda mod, args: amax.__setitem__(name, float(args[0].abs().max()))

    for name, mod in m.named_modules():
        if name.endswith(PROJ):
            mod.register_forward_pre_hook(hook(name))
    run(m, ids)
    return amax


def make_ct(bf16_dir, out, static_amax):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    t = {}
    for name, v in tensors_of(bf16_dir).items():
        module = name[:-len(".weight")]
        if not module.endswith(PROJ):
            t[name] = v
            continue
        t[name], t[module + ".weight_scale"] = quantize_rows(v)
        if static_amax:
            s = max(static_amax[module] / E4M3_MAX, MIN_SCALE)
            t[module + ".input_scale"] = torch.tensor([s], dtype=torch.float32)
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    for f in os.listdir(bf16_dir):
        if f.endswith(".json") and f != "model.safetensors.index.json":
            shutil.copy(os.path.join(bf16_dir, f), out)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    act = ({"strategy": "tensor", "dynamic": False} if static_amax
           else {"strategy": "token", "dynamic": True})
    scheme = {"num_bits": 8, "type": "float", "symmetric": True}
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": dict(scheme, strategy="channel", dynamic=False),
            "input_activations": dict(scheme, **act), "output_activations": None}}}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print_file(out)


def dequantized(tensors, module):
    """The weight the file stands for, fp32, and the projection's static input scale (or 0)."""
    q = tensors[module + ".weight"].float()
    if module + ".weight_scale_inv" in tensors:  # 128 x 128 blocks
        s = tensors[module + ".weight_scale_inv"].float()
        s = s.repeat_interleave(128, 0)[:q.shape[0]].repeat_interleave(128, 1)[:, :q.shape[1]]
    else:
        s = tensors[module + ".weight_scale"].float().reshape(-1, 1)
    static = tensors.get(module + ".input_scale")
    return q * s, float(static) if static is not None else 0.0


def round_input(xf, group, static):
    """xf (fp32) as the matmul quantizes it (include/kernels.h): per token and group of
    columns, s = static, or max(amax / 448, MIN_SCALE); e4m3 satfinite of x * (1 / s), times s."""
    K = xf.shape[-1]
    g = xf.reshape(*xf.shape[:-1], -1, group) if group < K else xf.unsqueeze(-2)
    if static:
        s = torch.full_like(g[..., :1], static)
    else:
        s = (g.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=MIN_SCALE)
    q = (g * (1.0 / s)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * s
    return q.reshape(xf.shape)


def emulated(bf16_dir, fp8_dir, dtype, ids, act_rounding=True):
    """The bf16 model in dtype with every projection replaced by the fp8 file's arithmetic in
    fp32 (dequantized weights, the input rounded as the matmul does unless not act_rounding),
    its output rounded to dtype as an fp8 GEMM's is."""
    m, t = load(bf16_dir, dtype), tensors_of(fp8_dir)
    group_of = 128 if any(k.endswith(".weight_scale_inv") for k in t) else None
    for name, mod in m.named_modules():
        if not name.endswith(PROJ):
            continue
        w, static = dequantized(t, name)
        w, g = w.cuda(), group_of or w.shape[1]

        def forward(x, w=w, g=g, s=static):
            xf = round_input(x.float(), g, s) if act_rounding else x.float()
            return torch.nn.functional.linear(xf, w).to(x.dtype)
        mod.forward = forward
    return run(m, ids)


def rel(got, ref):
    return float(row_errors(got, ref)[1].max())


def pagellm(binary, model_dir, ids, device, dtype):
    return pagellm_logits(binary, model_dir, ids, [
        "--device", device, "--dtype", dtype, "--num-gpu-blocks-override", "64",
        "--max-model-len", "256"]).reshape(len(ids), -1)


def check_f32(what, got, ref, tol):
    rows = row_errors(got, ref)[1]
    ok = bool(np.all(np.isfinite(got))) and rows.max() <= tol
    print(f"-- {what} against the fp32 run: rel_err {rows.max():.3g} (tol {tol:.3g}), rows above "
          f"1e-4: {int((rows > 1e-4).sum())}/{len(rows)}, argmax agreement "
          f"{int((got.argmax(1) == ref.argmax(1)).sum())}/{len(rows)}: {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pagellm", required=True, help="path of the pagellm binary")
    ap.add_argument("--workdir", required=True, help="folder for the checkpoints")
    ap.add_argument("--n-tokens", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    import transformers
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    bf16_dir = os.path.join(args.workdir, "bf16")
    save(build_llama(2, args.seed), bf16_dir, torch.bfloat16)
    ids = np.random.default_rng(args.seed).integers(0, 1024, args.n_tokens).tolist()
    ref_bf16 = run(load(bf16_dir, torch.bfloat16), ids)
    dirs = {n: os.path.join(args.workdir, n) for n in ("fp8-block", "ct-dynamic", "ct-static")}
    make_block(bf16_dir, dirs["fp8-block"])
    make_ct(bf16_dir, dirs["ct-dynamic"], None)
    make_ct(bf16_dir, dirs["ct-static"], input_amax(bf16_dir, ids))

    failed = []
    for name, d in dirs.items():
        print(f"\n==== {name}")
        emu = emulated(bf16_dir, d, torch.bfloat16, ids)
        emu32 = emulated(bf16_dir, d, torch.float32, ids)
        deq = emulated(bf16_dir, d, torch.bfloat16, ids, act_rounding=False)
        ref = emu
        if name == "fp8-block":
            try:
                ref = run(load(d, torch.bfloat16), ids)
                print(f"transformers FP8Linear against the emulation (bf16): "
                      f"rel_err {rel(ref, emu):.3g}")
            except Exception as e:  # noqa: BLE001 - report and use the emulation
                print(f"transformers cannot run the fp8 checkpoint ({type(e).__name__}: {e}); "
                      f"the reference is the emulation")
        tol = rel(ref, ref_bf16)
        print(f"tol = rel_err(transformers fp8, bf16) = {tol:.3g}; dequantized weights alone "
              f"against bf16: {rel(deq, ref_bf16):.3g}; the fp8 run in bf16 against it in fp32 "
              f"(what bf16 rounding does to fp8, not gated): {rel(emu, emu32):.3g}")
        try:
            got = pagellm(args.pagellm, d, ids, "cuda", "bfloat16")
            got32 = pagellm(args.pagellm, d, ids, "cuda", "float32")
            cpu32 = pagellm(args.pagellm, d, ids, "cpu", "float32")
        except SystemExit as e:
            print(f"FAIL: {e}")
            failed.append(name)
            continue
        print("-- pagellm CUDA bfloat16 against transformers fp8 (bf16):")
        ok = compare(ref, got, ids, tol)
        print(f"pagellm bfloat16 against the dequantized weights (not gated): "
              f"rel_err {rel(got, deq):.3g}")
        ok32 = check_f32("pagellm CUDA float32", got32, emu32, tol)
        ok32 &= check_f32("pagellm CPU float32", cpu32, emu32, tol)
        if not (ok and ok32):
            failed.append(name)
    print(f"\n{'FAIL: ' + ', '.join(failed) if failed else 'all PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
