#!/usr/bin/env python3
"""make_seeds.py - write the binary seed files of tests/fuzz/corpus/ (safetensors, tokenizer
and sse, whose inputs start with flag bytes); the text seeds of the other targets are
hand-written files. Run from anywhere; rewrites only the files it names.

    python3 tests/fuzz/make_seeds.py
"""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    path = os.path.join(HERE, "corpus", target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# ---- safetensors: 8-byte little-endian header length, JSON header, data -----------------

def safetensors(tensors, metadata=None, pad=True, header_override=None):
    """tensors: [(name, dtype, shape, bytes)] laid out in order."""
    header, blobs, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs += blob
        off += len(blob)
    h = header_override if header_override is not None else json.dumps(header).encode()
    if pad:  # the reference writer pads the header with spaces to a multiple of 8
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + blobs


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def st_seeds():
    w = lambda n, d: write("safetensors", n, d)
    w("f32_2x3.safetensors", safetensors([("w", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6))]))
    w("dtypes.safetensors", safetensors([
        ("bf16", "BF16", [4], b"\x80\x3f" * 4),
        ("f16", "F16", [2, 2], b"\x00\x3c" * 4),
        ("i64", "I64", [1], struct.pack("<q", -1)),
        ("bool", "BOOL", [3], b"\x01\x00\x01"),
        ("u8", "U8", [2, 1, 1], b"\xff\x00"),
        ("f4", "F4", [3], b"\x12\x34"),  # 3 x 4 bits: 2 bytes
        ("f64", "F64", [1], struct.pack("<d", 3.5)),
    ], metadata={"format": "pt"}))
    w("empty_and_scalar.safetensors", safetensors([
        ("empty", "F32", [0, 4], b""),
        ("scalar", "F32", [], f32(7)),
        ("also_empty", "I8", [5, 0], b""),
    ]))
    w("llama_names.safetensors", safetensors([
        ("model.embed_tokens.weight", "F32", [4, 2], f32(*range(8))),
        ("model.layers.0.self_attn.q_proj.weight", "F32", [2, 2], f32(1, 0, 0, 1)),
        ("model.norm.weight", "F32", [2], f32(1, 1)),
    ]))
    good = safetensors([("a", "F32", [4], f32(1, 2, 3, 4)), ("b", "F32", [2], f32(5, 6))])
    w("truncated.safetensors", good[:-5])
    w("header_only.safetensors", safetensors([], pad=False))
    w("overlap.safetensors", safetensors([], header_override=json.dumps({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()) + bytes(12))
    w("bad_entries.safetensors", safetensors([], header_override=json.dumps({
        "wrong_size": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
        "neg": {"dtype": "U16", "shape": [-1], "data_offsets": [0, 0]},
        "huge": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]},
        "nine_dims": {"dtype": "U8", "shape": [1] * 9, "data_offsets": [0, 1]}}).encode())
        + bytes(8))
    w("absurd_header_len.safetensors", struct.pack("<Q", 2**63 + 5) + b"{}")
    w("not_json.safetensors", struct.pack("<Q", 6) + b"[1, 2]" + bytes(4))


# ---- tokenizer: flags byte, cut byte, then text or ids ----------------------------------

STORIES, GPT2, IDS, SPECIAL = 0, 1, 2, 4


def tok_seeds():
    w = lambda n, flags, cut, body: write("tokenizer", n, bytes([flags, cut]) + body)
    w("stories_ascii", STORIES | SPECIAL, 128,
      b"Once upon a time, there was a little girl named Lily. She liked to play.")
    w("gpt2_ascii", GPT2, 100, b"The quick brown fox's 123 jumps  over\tthe lazy dog!!\n")
    w("stories_cjk_emoji", STORIES, 200,
      "日本語のテキスト 中文 한국어 👩‍👩‍👧 👍🏽 e\u0301".encode())
    w("gpt2_cjk_emoji", GPT2 | SPECIAL, 90, "日本語 🤗🎉 naïve café Ωmega".encode())
    w("stories_invalid_utf8", STORIES, 64, b"ok \xff\xfe bad \xc3 cut \xe2\x82 more \xf0\x9f\x98 \xed\xa0\x80 end\xc3")
    w("gpt2_invalid_utf8", GPT2, 128, b"\x80\x81abc\xc0\xaf\xf4\x90\x80\x80 \xe0\x80\x80 z\xf0")
    w("stories_special_text", STORIES | SPECIAL, 30, "<s>Hello</s> <unk> <s<s>> ▁x▁▁y".encode())
    w("gpt2_special_text", GPT2, 50, b"<|endoftext|>Hi<|endoftext|><|endoftext|> <|endof")
    w("gpt2_whitespace", GPT2, 10, b"   \r\n\r\n\t\t  x  \xc2\xa0 \xe2\x80\xa8 \xe3\x80\x80 \x0b\x0c  ")
    # ids mode: little-endian uint16, id = v % (vocab + 4) - 2
    ids = lambda *v: b"".join(struct.pack("<H", x) for x in v)
    # stories: <0xE4><0xB8><0xAD> (a CJK character in byte-fallback tokens, cut by the
    # prompt/generated split), specials, out-of-range ids (0, 1 -> -2, -1; 514, 515 -> vocab+)
    w("stories_ids_bytes", STORIES | IDS, 100,
      ids(3, 0xE4 + 5, 0xB8 + 5, 0xAD + 5, 3, 4, 0, 1, 514, 515, 300, 301, 0x80 + 5, 0xF0 + 5))
    w("gpt2_ids", GPT2 | IDS, 128,
      ids(50256 + 2, 464 + 2, 2068 + 2, 7586 + 2, 171 + 2, 120 + 2, 50257 + 2, 1, 0, 50260))


# ---- sse: flags byte, split seed byte, then the response body ---------------------------

CHAT, ST500, ST404 = 1, 4, 6
PARTIAL, RECV, TIMEOUT, WEIRD = 4 << 3, 5 << 3, 6 << 3, 7 << 3


def sse_seeds():
    w = lambda n, flags, seed, body: write("sse", n, bytes([flags, seed]) + body)

    def chunk(text, finish=None, chat=False):
        c = ({"delta": {"content": text}} if chat else {"text": text})
        c.update(index=0, finish_reason=finish)
        return b"data: " + json.dumps({"id": "cmpl-1", "choices": [c]}).encode() + b"\n\n"

    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}\n\n'
    w("completion_usage_done", 0, 1,
      chunk(" Once") + chunk(" upon") + chunk(" a", "length") + usage + b"data: [DONE]\n\n")
    w("chat_deltas", CHAT, 2,
      b'data: {"choices": [{"delta": {"role": "assistant"}, "index": 0}]}\n\n'
      + chunk("Hi", chat=True) + chunk(" \u00e9\u4e2d", "stop", chat=True) + b"data: [DONE]\n\n")
    w("crlf_fields_comments", 0, 3,
      b": keep-alive\r\nevent: message\r\nid: 7\r\nretry: 100\r\n"
      + chunk("x").replace(b"\n", b"\r\n") + b"data:" + b'{"choices":[{"text":"y",\r\ndata: "finish_reason":"stop"}]}\r\n\r\n'
      + b"data: [DONE]\r\n\r\n")
    w("no_done_finish_reason", 0, 4, chunk("a") + chunk("b", "stop"))
    w("no_finish_cut_mid_event", 0, 5, chunk("a") + b'data: {"choices": [{"text": "b"')
    w("last_event_without_blank", 0, 6, chunk("a") + b'data: {"choices": [{"text": "b", "finish_reason": "stop"}]}')
    w("error_in_stream", 0, 7, chunk("a") + b'data: {"error": {"message": "engine died \xff", "code": 500}}\n\n')
    w("garbage_line", 0, 8, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + chunk("a"))
    w("not_json_event", 0, 9, b"data: {not json}\n\ndata: [DONE]\n\n")
    w("http_500_error_body", ST500, 10, b'{"error": {"message": "boom", "type": "server_error"}}')
    w("partial_transfer_stop", PARTIAL | CHAT, 11, chunk("a", chat=True) + b"data: STOP\n\n" + chunk("b"))
    w("http_404_detail", ST404 | TIMEOUT, 12, b'{"detail": "Not Found"}')


if __name__ == "__main__":
    st_seeds()
    tok_seeds()
    sse_seeds()
