#!/usr/bin/env python3
"""http_fields_check.py - the sampling fields of a running server on the bundled model, over
HTTP, with python3's standard library only: for the GPU host, where the Node end-to-end suite
cannot run (no node there). The same checks as tests/e2e/sampling_fields.test.mjs, a
concurrent batch mixing biased, masked, penalised and plain rows in one step, and structured
output (tests/e2e/structured.test.mjs) with n = 1 rows, which a GPU samples on the device
(masks uploaded with the rows), concurrent with unconstrained ones.

    build/pagellm serve --port 8011 &    # on the bundled model (models/stories260K)
    tools/http_fields_check.py http://localhost:8011

Prints PASS / FAIL per check and exits 1 on any failure."""
import json
import sys
import threading
import urllib.error
import urllib.request

if len(sys.argv) != 2:
    sys.exit("usage: tools/http_fields_check.py URL   (a server on the bundled model)")
URL = sys.argv[1]


def post(path, body):
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
fails = 0
def check(name, ok, detail=""):
    global fails
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + detail[:300]))
    fails += not ok
g = json.load(open("models/stories260K/golden.json"))["cases"][0]
base = {"prompt": g["prompt"], "max_tokens": 6, "temperature": 0, "logprobs": 1}
s, plain = post("/v1/completions", base); plain = json.loads(plain)
check("greedy equals golden", s == 200 and g["text"].startswith(plain["choices"][0]["text"]), json.dumps(plain))
s, down = post("/v1/completions", dict(base, logit_bias={str(g["completion_ids"][0]): -100})); down = json.loads(down)
check("logit_bias -100 changes greedy output", s == 200 and down["choices"][0]["text"] != plain["choices"][0]["text"], json.dumps(down))
s, up = post("/v1/completions", {"prompt": "Once", "max_tokens": 4, "temperature": 0, "logit_bias": {"3": 100}})
check("logit_bias +100 forces <0x00> (NUL text)", s == 200 and json.loads(up)["choices"][0]["text"] == "\u0000" * 4, up)
stops = [i for i in range(512) if i != 200]
for m in (0, 1, 5):
    s, r = post("/v1/completions", {"prompt": g["prompt"], "max_tokens": 16, "temperature": 0, "stop_token_ids": stops, "min_tokens": m})
    check(f"min_tokens {m} with stop_token_ids gives exactly {m}", s == 200 and json.loads(r)["usage"]["completion_tokens"] == m, r)
for body in ({"prompt": "Hi", "max_tokens": 4, "logprobs": 0}, {"prompt": "Hi", "max_tokens": 4, "best_of": 2}, {"prompt": "Hi", "max_tokens": 4, "n": 3, "best_of": 4, "logprobs": 2, "temperature": 0.8}):
    s, r = post("/v1/completions", body)
    check("served: " + json.dumps(body), s == 200, r)
s, r = post("/v1/completions", {"prompt": "a\u0000b", "max_tokens": 3, "echo": True})
check("NUL prompt 200 and echoed", s == 200 and json.loads(r)["choices"][0]["text"].startswith("a\u0000b"), r)
# a batch mixing biased, masked, penalised and plain rows, sampled on the GPU in one step
res = []
def one(i):
    b = {"prompt": g["prompt"], "max_tokens": 8, "temperature": 0}
    if i % 3 == 0: b["logit_bias"] = {"200": 100}
    if i % 3 == 1: b.update(stop_token_ids=stops, min_tokens=3)
    if i % 4 == 0: b["presence_penalty"] = 0.5
    res.append((i, b, *post("/v1/completions", b)))
ts = [threading.Thread(target=one, args=(i,)) for i in range(24)]
[t.start() for t in ts]; [t.join() for t in ts]
for i, b, s, r in res:
    j = json.loads(r)
    ok = s == 200
    if ok and i % 3 == 0 and "presence_penalty" not in b: ok = j["usage"]["completion_tokens"] == 8
    if ok and i % 3 == 1: ok = j["usage"]["completion_tokens"] == 3
    check(f"concurrent {i} {json.dumps({k: v for k, v in b.items() if k != 'stop_token_ids'})}", ok, r)
# structured output: one sample per request (the device path on a GPU), 40 at once
import re
schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}, "mood": {"enum": ["happy", "sad"]},
          "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3}},
          "required": ["name", "age", "mood", "tags"], "additionalProperties": False}
def schema_ok(t):
    try:
        v = json.loads(t)
    except ValueError:
        return False
    return (set(v) == set(schema["required"]) and isinstance(v["name"], str) and len(v["name"]) <= 12
            and isinstance(v["age"], int) and 0 <= v["age"] <= 120 and v["mood"] in ("happy", "sad")
            and 1 <= len(v["tags"]) <= 3 and all(isinstance(x, str) and len(x) <= 6 for x in v["tags"]))
pattern = "[A-Z][a-z]{2,8} (is|was) [0-9]{1,3} (cats|dogs)\\."
kinds = [({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}}, schema_ok),
         ({"guided_regex": pattern}, lambda t: re.fullmatch(pattern, t) is not None),
         ({"guided_choice": ["red", "green", "blue sky"]}, lambda t: t in ("red", "green", "blue sky")),
         ({}, lambda t: True)]
res = []
def constrained(i):
    extra, _ = kinds[i % 4]
    b = dict({"prompt": "Once upon a time", "max_tokens": 300, "temperature": 1, "seed": 100 + i}, **extra)
    res.append((i, *post("/v1/completions", b)))
ts = [threading.Thread(target=constrained, args=(i,)) for i in range(40)]
[t.start() for t in ts]; [t.join() for t in ts]
for i, s, r in sorted(res):
    j = json.loads(r)
    ok = s == 200 and (i % 4 == 3 or j["choices"][0]["finish_reason"] == "stop") and kinds[i % 4][1](j["choices"][0]["text"])
    check(f"structured {i} ({list(kinds[i % 4][0]) or ['plain']})", ok, r)
print("FAILS", fails)
sys.exit(1 if fails else 0)
