#!/usr/bin/env python3
"""make_fp8_checkpoints.py - tiny fp8 checkpoints for tests/test_fp8_models.c, from the bundled
stories260K (models/stories260K, float32) quantized here with numpy only (no torch).

Writes, under tests/data/fp8/ (run from the repository root: python3 tests/data/fp8/make_fp8_checkpoints.py):
  fp8-block128/  quant_method "fp8", weight_block_size [128, 128], dynamic activations; every
                 projection F8_E4M3 + weight_scale_inv F32 [ceil(N/128), ceil(K/128)] (the
                 Qwen3-FP8 / DeepSeek-V3 / transformers FineGrainedFP8 layout); layer 1's
                 down_proj in modules_to_not_convert, kept float32
  fp8-block32/   the same with 32 x 32 blocks (q/k/v rows 64/32/32 fall on the block grid, so
                 pagellm keeps their fused block scales; gate/up (172 rows) do not)
  ct-channel/    compressed-tensors "float-quantized": weights per channel (weight_scale
                 [N, 1] BF16), input_activations dynamic per token; ignore ["lm_head",
                 "re:.*layers\\.1\\.self_attn\\.o_proj$"] (that o_proj kept float32)
  ct-tensor/     compressed-tensors "naive-quantized": weights per tensor (weight_scale
                 scalar), static per-tensor input_scale (scalar F32); ignore ["lm_head"]

Quantization as transformers / llm-compressor do it: scale = amax / 448 over the group (a
block, a row or the whole tensor), q = e4m3(w / scale), round to nearest even, saturating.
Embeddings and norms stay as they are (BF16 embeddings to keep the files small). The static
input scales are amax / 448 of the float model's activations on one prompt, times 1.5.
Deterministic: the same files every run."""
import json
import os
import struct
import sys

import numpy as np

SRC = "models/stories260K"
OUT = "tests/data/fp8"


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e["dtype"]
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(e["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, numpy array of the raw element type)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)  # 8-byte aligned data, as the safetensors library
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def e4m3_table():
    """The 256 e4m3fn values (NaN for 0x7f / 0xff)."""
    v = np.zeros(256, dtype=np.float64)
    for q in range(256):
        s, e, m = q >> 7, (q >> 3) & 15, q & 7
        if e == 15 and m == 7:
            v[q] = np.nan
        elif e == 0:
            v[q] = m * 2.0 ** -9
        else:
            v[q] = (1 + m / 8) * 2.0 ** (e - 7)
        if s:
            v[q] = -v[q]
    return v


E4M3 = e4m3_table()
POS = E4M3[:0x7F]  # 0 .. 448, increasing


def to_e4m3(x):
    """Nearest e4m3 code of float32 x, ties to even code, saturating at +-448."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.searchsorted(POS, a, side="left").clip(0, 0x7E)
    lo = (hi - 1).clip(0, 0x7E)
    dl, dh = a - POS[lo], POS[hi] - a
    pick = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    pick = np.where(a == POS[hi], hi, pick)
    return (pick | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def bf16(x):
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


def quant_block(w, B):
    N, K = w.shape
    nb, kb = -(-N // B), -(-K // B)
    q = np.zeros((N, K), np.uint8)
    s = np.zeros((nb, kb), np.float32)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * B:(i + 1) * B, j * B:(j + 1) * B]
            sc = np.float32(np.abs(blk).max()) / np.float32(448)
            sc = sc if sc > 0 else np.float32(1)
            s[i, j] = sc
            q[i * B:(i + 1) * B, j * B:(j + 1) * B] = to_e4m3(blk / sc)
    return q, s


def quant_rows(w):
    s = (np.abs(w).max(axis=1) / np.float32(448)).astype(np.float32)
    s = np.where(s > 0, s, np.float32(1)).astype(np.float32)
    return to_e4m3(w / s[:, None]), s


def quant_tensor(w):
    s = np.float32(np.abs(w).max() / np.float32(448))
    return to_e4m3(w / s), s


PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def layer_inputs(w, cfg, ids):
    """Inputs of every projection of the float model on one prompt (numpy float64): for the
    static input scales."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = H // nh
    x = w["model.embed_tokens.weight"].astype(np.float64)[ids]
    T = len(ids)
    inv = 1.0 / (10000.0 ** (np.arange(0, D, 2) / D))
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rms(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * g

    def rope(v):
        h = v.shape[-1] // 2
        rot = np.concatenate([-v[..., h:], v[..., :h]], -1)
        return v * cos[:, None, :] + rot * sin[:, None, :]

    amax = {}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t = rms(x, w[p + "input_layernorm.weight"])
        for k in PROJ[:3]:
            amax[p + k] = np.abs(t).max()
        q = rope((t @ w[p + "self_attn.q_proj.weight"].T).reshape(T, nh, D))
        k_ = rope((t @ w[p + "self_attn.k_proj.weight"].T).reshape(T, nkv, D))
        v = (t @ w[p + "self_attn.v_proj.weight"].T).reshape(T, nkv, D)
        rep = nh // nkv
        k_, v = np.repeat(k_, rep, 1), np.repeat(v, rep, 1)
        att = np.einsum("thd,shd->hts", q, k_) / np.sqrt(D)
        att += np.triu(np.full((T, T), -np.inf), 1)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, H)
        amax[p + "self_attn.o_proj"] = np.abs(o).max()
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        t = rms(x, w[p + "post_attention_layernorm.weight"])
        amax[p + "mlp.gate_proj"] = amax[p + "mlp.up_proj"] = np.abs(t).max()
        g, u = t @ w[p + "mlp.gate_proj.weight"].T, t @ w[p + "mlp.up_proj.weight"].T
        a = g / (1 + np.exp(-g)) * u
        amax[p + "mlp.down_proj"] = np.abs(a).max()
        x = x + a @ w[p + "mlp.down_proj.weight"].T
    return amax


def make(name, w, cfg, kind, qconfig, keep_float, layers):
    out = os.path.join(OUT, name)
    os.makedirs(out, exist_ok=True)
    c = dict(cfg)
    c["num_hidden_layers"] = layers
    c["quantization_config"] = qconfig
    c["torch_dtype"] = "bfloat16"
    t = {"model.embed_tokens.weight": ("BF16", bf16(w["model.embed_tokens.weight"])),
         "model.norm.weight": ("F32", w["model.norm.weight"])}
    amax = layer_inputs(w, cfg, [1, 403, 407, 261, 378]) if kind == "tensor-static" else None
    for l in range(layers):
        p = f"model.layers.{l}."
        for n in ["input_layernorm.weight", "post_attention_layernorm.weight"]:
            t[p + n] = ("F32", w[p + n])
        for k in PROJ:
            m, wt = p + k, w[p + k + ".weight"]
            if m in keep_float:
                t[m + ".weight"] = ("F32", wt)
                continue
            if kind.startswith("block"):
                q, s = quant_block(wt, int(kind[5:]))
                t[m + ".weight"] = ("F8_E4M3", q)
                t[m + ".weight_scale_inv"] = ("F32", s)
            elif kind == "channel":
                q, s = quant_rows(wt)
                t[m + ".weight"] = ("F8_E4M3", q)
                t[m + ".weight_scale"] = ("BF16", bf16(s)[:, None])
            else:
                q, s = quant_tensor(wt)
                t[m + ".weight"] = ("F8_E4M3", q)
                t[m + ".weight_scale"] = ("F32", np.array(s, np.float32).reshape(()))
                isc = np.float32(amax[m] / 448 * 1.5)
                t[m + ".input_scale"] = ("F32", np.array(isc, np.float32).reshape(()))
    write_safetensors(os.path.join(out, "model.safetensors"), t)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
        f.write("\n")


def main():
    if not os.path.isdir(SRC):
        sys.exit("run from the repository root")
    w = read_safetensors(os.path.join(SRC, "model.safetensors"))
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    make("fp8-block128", w, cfg, "block128",
         {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 128], "modules_to_not_convert": ["layers.1.mlp.down_proj"]},
         {"model.layers.1.mlp.down_proj"}, 5)
    make("fp8-block32", w, cfg, "block32",
         {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32]},
         set(), 2)
    group = lambda ws, act: {"group_0": {"targets": ["Linear"], "weights": ws,
                                         "input_activations": act, "output_activations": None}}
    make("ct-channel", w, cfg, "channel",
         {"quant_method": "compressed-tensors", "format": "float-quantized",
          "quantization_status": "compressed", "kv_cache_scheme": None,
          "config_groups": group(
              {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
               "dynamic": False, "group_size": None},
              {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
               "dynamic": True}),
          "ignore": ["lm_head", "re:.*layers\\.1\\.self_attn\\.o_proj$"]},
         {"model.layers.1.self_attn.o_proj"}, 5)
    make("ct-tensor", w, cfg, "tensor-static",
         {"quant_method": "compressed-tensors", "format": "naive-quantized",
          "config_groups": group(
              {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
               "dynamic": False},
              {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True,
               "dynamic": False}),
          "ignore": ["lm_head"]},
         set(), 2)


if __name__ == "__main__":
    main()
