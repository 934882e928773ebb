// combinations.test.mjs - random combinations of every request field the API takes, sent to
// POST /v1/completions and POST /v1/chat/completions of one live server (bundled model, CPU,
// --chat-template chatml), a few at a time (issue 34: "a combination test that would have
// caught it" - single fields were tested, but logprobs 0, best_of 2 and chat logprobs true
// each crashed the server).
//
// Every field takes values from an edge set: valid ones (0, 1, -1 where it means "off", the
// limit), invalid ones (limit + 1, wrong types: a string, a real, an object, a list, a
// boolean for a number; huge numbers, numbers JSON cannot hold, "NaN"-like strings) and null;
// prompts as a string, a list of strings, token ids and lists of token-id lists, with Unicode,
// "\u0000" and bytes that are not UTF-8. About two requests in three hold valid values only,
// so that most of them reach the engine; the others mix in invalid values.
//
// Each request must get a 200 or a 4xx, never a 5xx nor a dropped connection; a 4xx body must
// be {"error": {"message", "type", "param", "code"}}; a 200 must be a well-formed completion
// (a JSON body with choices, or SSE events, one data: line each, ending in "data: [DONE]").
// Cheap semantic checks: prompts x n choices, each index once and finished once, usage totals
// that add up (and bounded by max_tokens), prompt_tokens of token-id prompts (their last
// truncate_prompt_tokens when set), no stop string
// in the text, logprobs present exactly when asked for and well-formed, echo's prefix (in
// streams too), min_tokens, ignore_eos, the usage chunk exactly with include_usage, a role in
// every chat choice's first delta. Where the generator knows the request is invalid (a value
// out of range, a wrong type, a cross-field rule broken), a 200 is a failure too, and where
// it knows the request is valid, a 4xx is; values it is unsure of accept either. suffix,
// malformed tools and tool_choice (and vLLM's fields pagellm does not implement), and malformed
// structured-output constraints (response_format, guided_*), must be refused with a 400 that
// names them (tools and tool_choice on chat, suffix on completions; the other endpoint may
// ignore them). After the run the server must answer /health and exit 0 on
// SIGTERM (under ASan: no leak).
//
// PAGELLM_COMBO_SEED (default 34) and PAGELLM_COMBO_COUNT (default 2000) set the mix; each
// request is drawn from its own generator (seed, index), so PAGELLM_COMBO_ONLY=17,512 replays
// requests 17 and 512 alone. PAGELLM_COMBO_CONCURRENCY: requests in flight (default 8).
// Failures are grouped by kind; each kind prints its first request (seed, index, endpoint,
// the exact body as a curl command, the answer), how many requests failed that way and their
// indexes. When the server dies, each request that was in flight is sent again alone to a
// fresh server, which names the one that crashes it (with the server's output); the run then
// goes on with a new server, up to 4 crashes.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, assertErrorShape, MODEL_DIR, rng, sleep, T, scaled } from './server.mjs';

const envInt = (name, dflt) => {
    const v = process.env[name];
    if (v === undefined || v === '') return dflt;
    const n = Number(v);
    assert.ok(Number.isInteger(n) && n >= 0, `${name}=${v}: not a non-negative integer`);
    return n;
};
const SEED = envInt('PAGELLM_COMBO_SEED', 34);
const COUNT = envInt('PAGELLM_COMBO_COUNT', 2000);
const CONCURRENCY = Math.max(1, envInt('PAGELLM_COMBO_CONCURRENCY', 8));
const ONLY = (process.env.PAGELLM_COMBO_ONLY || '').split(',').filter(Boolean).map(Number);

// The server's limits on the bundled model (server/completion.c, completion_start).
const CONFIG = JSON.parse(readFileSync(path.join(MODEL_DIR, 'config.json'), 'utf8'));
const VOCAB = CONFIG.vocab_size; // 512
const MAX_LEN = CONFIG.max_position_embeddings; // max-model-len 512
const MAX_N = 128; // min(max-num-seqs 256 on CPU, 128)
const MAX_LOGPROBS = 20;
const MAX_STOP = 16;
// A request's generation budget: n x best_of x prompts x max_tokens above it gets max_tokens
// cut (a valid request stays valid), so that 2000 requests take seconds, not minutes.
const WORK_BUDGET = 1024;

// ---------------------------------------------------------------------------------------
// Seeded randomness

// murmur3's 32-bit finalizer: a bijection that mixes every bit.
function mix32(x) {
    x = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
    x = Math.imul(x ^ (x >>> 13), 0xc2b2ae35);
    return (x ^ (x >>> 16)) >>> 0;
}
/** The generator of request `index` of run `seed` (independent of the others; two seeds
 * give different requests, not the same ones in another order). */
function requestRng(seed, index) {
    return rng(mix32(mix32((seed + 0x9e3779b9) >>> 0) ^ mix32((index + 0x7f4a7c15) >>> 0)));
}

// ---------------------------------------------------------------------------------------
// JSON with literals JSON.stringify cannot write

/** A JSON literal written as is: 1e400, 5.0, -0.0, 18446744073709551616, NaN. */
class Raw {
    constructor(text) {
        this.text = text;
    }
}
/** A JSON string whose content is these bytes (may be ill-formed UTF-8). */
class Bytes {
    constructor(buf) {
        this.buf = buf;
    }
}
/** An object written with these [key, value] pairs in order (duplicate keys allowed). */
class Pairs {
    constructor(pairs) {
        this.pairs = pairs;
    }
}

function serialize(v, out) {
    if (v instanceof Raw) out.push(Buffer.from(v.text));
    else if (v instanceof Bytes) out.push(Buffer.from('"'), v.buf, Buffer.from('"'));
    else if (v instanceof Pairs) {
        out.push(Buffer.from('{'));
        v.pairs.forEach(([k, x], i) => {
            out.push(Buffer.from((i ? ',' : '') + JSON.stringify(k) + ':'));
            serialize(x, out);
        });
        out.push(Buffer.from('}'));
    } else if (Array.isArray(v)) {
        out.push(Buffer.from('['));
        v.forEach((x, i) => {
            if (i) out.push(Buffer.from(','));
            serialize(x, out);
        });
        out.push(Buffer.from(']'));
    } else if (v !== null && typeof v === 'object') {
        serialize(new Pairs(Object.entries(v)), out);
    } else {
        out.push(Buffer.from(JSON.stringify(v)));
    }
}
const toBody = (v) => {
    const out = [];
    serialize(v, out);
    return Buffer.concat(out);
};

// ---------------------------------------------------------------------------------------
// Value sets. An entry is [value, expectation]: 'ok' (must be accepted), 'bad' (must be
// refused with a 4xx) or 'any' (either; a 5xx is still a failure).

const ok = (...vs) => vs.map((v) => [v, 'ok']);
const bad = (...vs) => vs.map((v) => [v, 'bad']);
const any = (...vs) => vs.map((v) => [v, 'any']);

// Wrong types for a number field.
const NOT_NUMBERS = bad('5', '', 'NaN', 'Infinity', '-Infinity', 'nan', '1e999', true, false, {}, [], [1],
                        { value: 1 }, new Raw('NaN'), new Raw('Infinity'), new Raw('-Infinity'));
// Numbers an integer field must refuse whatever its range (not integral, or beyond JSON).
const NOT_INTEGERS = bad(0.5, 1.5, -2.5, 1e-7, new Raw('1e400'), new Raw('-1e400'),
                         new Raw('18446744073709551616'), new Raw('-99999999999999999999'));
const NOT_BOOLEANS = bad(0, 1, 'true', 'false', '', [], {}, [true]);

function intField(okVals, badVals, anyVals = []) {
    return [...ok(...okVals), ...bad(...badVals), ...any(...anyVals), ...NOT_NUMBERS, ...NOT_INTEGERS,
            [null, 'ok']];
}
function floatField(okVals, badVals, anyVals = []) {
    return [...ok(...okVals), ...bad(...badVals), ...any(...anyVals), ...NOT_NUMBERS,
            ...bad(new Raw('1e400'), new Raw('-1e400')), [null, 'ok']];
}

const HUGE = [2147483647, 2147483648, 4294967296, 1e9, 1e15, 9007199254740993, 1e300,
              new Raw('9223372036854775807'), new Raw('-9223372036854775808')];

const SAMPLING = {
    temperature: floatField([0, 0.0001, 0.5, 1, 2, 100, new Raw('1.0'), new Raw('-0.0'), new Raw('1e-300')],
                            [-0.001, -1, 100.001, 1e9, -1e300, 1e300]),
    top_p: floatField([1e-9, 0.1, 0.5, 0.95, 1, new Raw('1.0')], [0, -0.1, 1.0001, 2, new Raw('-0.0'), 1e300]),
    top_k: intField([-1, 0, 1, 2, 5, 40, VOCAB - 1, VOCAB, VOCAB + 1, 100000, 2147483647, new Raw('5.0'),
                     new Raw('-0.0')],
                    [-2, -100, 2147483648, 1e15, new Raw('-9223372036854775808')]),
    min_p: floatField([0, 0.05, 0.5, 1, new Raw('1e-300')], [-0.01, 1.01, 2, -1e300]),
    presence_penalty: floatField([-2, -1, 0, 0.5, 2], [-2.0001, 2.0001, 100, -1e9]),
    frequency_penalty: floatField([-2, -0.5, 0, 1, 2], [-2.0001, 2.0001, 100, -1e9]),
    repetition_penalty: floatField([1e-6, 0.5, 1, 1.3, 2, 100], [0, -1, 100.0001, 1e9, new Raw('-0.0')]),
    seed: [...ok(0, 1, -1, 42, 2147483647, 2147483648, 4294967296, 9007199254740993, new Raw('7.0'),
                 new Raw('9223372036854775807'), new Raw('-9223372036854775808'), new Raw('-0.0')),
           ...any(new Raw('18446744073709551615')), ...bad(0.5, new Raw('1e400')), ...NOT_NUMBERS, [null, 'ok']],
    ignore_eos: [...ok(true, false, null), ...NOT_BOOLEANS],
    user: [...ok('', 'user-1', 'üñí©ødé ✓ 🙂', 'a'.repeat(1000), null, 'a\u0000b'), ...bad(5, {}, [], true, ['u'])],
};

const STOPS = [...ok('.', ' ', ',', 'the', 'Once', '\n', 'é', '🙂', '', [], [''], ['.', '!'], ['the', 'and', 'he'],
                     Array.from({ length: MAX_STOP }, (_, i) => String.fromCharCode(97 + i)),
                     [...Array.from({ length: MAX_STOP }, (_, i) => `w${i}`), '', ''], null),
               ...any('\u0000', 'a\u0000', ['\u0000']),
               ...bad(5, true, {}, [5], [null], ['a', 1], [['a']],
                      Array.from({ length: MAX_STOP + 1 }, (_, i) => `s${i}`))];
const STOP_IDS = [...ok([], [2], [0], [VOCAB - 1], [2, 13, 29], Array.from({ length: 64 }, (_, i) => i * 7 % VOCAB),
                        [new Raw('2.0')], null),
                  ...bad([VOCAB], [-1], [1.5], ['2'], 2, '2', {}, [null], [new Raw('1e400')],
                         Array.from({ length: 4097 }, () => 2))];

const LOGIT_BIAS = [...ok({}, { 1: 5 }, { 2: -100 }, { 13: 100, 29: -100 }, { [VOCAB - 1]: 0.5 }, { 0: 0 },
                          { 403: 100 }, { 5: -100, 6: -100, 7: -100, 8: -100 }, { 100: new Raw('1e-300') },
                          Object.fromEntries(Array.from({ length: 300 }, (_, i) => [String(i), (i % 201) - 100])),
                          null),
                    ...any({ '01': 1 }, { ' 1': 1 }, { '1.0': 1 }, { '+1': 1 }),
                    ...bad({ 1: 100.5 }, { 1: -100.5 }, { 1: 1e9 }, { abc: 1 }, { [VOCAB]: 1 }, { '-1': 1 },
                           { 99999999999: 1 }, { 1: '5' }, { 1: null }, { 1: [] }, { 1: true }, { '': 1 },
                           { 1: new Raw('1e400') }, { 1: new Raw('NaN') }, [], [1, 2], '1', 5, true)];

// vLLM's token restrictions. The allowed lists hold no EOS and no token of STOP_IDS' lists:
// with min_tokens holding stop tokens back they always leave a token to draw (a request whose
// list has none ends with finish reason abort: tests/e2e/sampling_fields.test.mjs).
const ALLOWED_IDS = [...ok([13, 29, 200], Array.from({ length: 64 }, (_, i) => 3 + i * 7), [VOCAB - 2], null),
                     ...bad([], [VOCAB], [-1], [1.5], ['2'], 2, '2', {}, [null], [new Raw('1e400')])];
const BAD_WORDS = [...ok([], ['the'], ['Once upon', ' a', 'é', 'the the the'], null),
                   ...bad([''], ['a', ''], 'the', {}, [5], [null], [['a']])];
// Structured-output fields: with them an allowed list may leave nothing to draw.
const CONSTRAINT_FIELDS = ['response_format', 'guided_json', 'guided_choice'];

// Fields that must be refused with a 400 naming them (non-null, non-trivial values): malformed
// tools and tool_choice, and fields pagellm does not implement. tools and tool_choice are chat
// fields: a completions request may ignore them, as suffix on chat.
const CHAT_ONLY_REFUSED = ['tools', 'tool_choice', 'functions', 'function_call'];
const COMPLETIONS_ONLY_REFUSED = ['suffix'];
const REFUSED = {
    suffix: [...bad('x', ' and then.', 'ü'), ...any('', null)],
    // Valid tools are left out: with them a 200 may carry tool_calls instead of content (their
    // semantics: tests/e2e/tools.test.mjs); without tools every tool_choice but none is refused.
    tools: [...bad('x', {}, [{ type: 'function' }], [{ type: 'function', function: { name: 'a b' } }],
                   [{ type: 'tool', function: { name: 'f' } }]), ...any([], null)],
    tool_choice: [...bad('auto', 'required', { type: 'function', function: { name: 'f' } }, 5, 'sometimes'),
                  ...any('none', null)],
    // Structured output: a malformed constraint is refused naming its field; a valid one is
    // served (its own semantics: tests/e2e/structured.test.mjs), two at once are refused.
    response_format: [...bad('json', 5, { type: 'xml' }, { type: 'json_schema' }),
                      ...any({ type: 'text' }, null, { type: 'json_object' },
                             { type: 'json_schema', json_schema: { name: 's', schema: { type: 'object' } } })],
    guided_json: [...bad(5, '{', { type: 'object', uniqueItems: true }), ...any(null, { type: 'object' }, '{}')],
    guided_choice: [...bad([], [1], 'x'), ...any(null, ['a', 'b'])],
    // Fields pagellm does not implement.
    prompt_logprobs: [...bad(1, 0), ...any(null)],
    functions: [...bad([{ name: 'f', parameters: {} }]), ...any(null, [])],
    function_call: [...bad('auto', { name: 'f' }), ...any(null, 'none')],
};
const REFUSED_COMMON = ['suffix', 'tools', 'tool_choice', 'response_format']; // the ones issue 34 names

const TEXTS = ['Once upon a time', 'Hi', 'The cat sat on the mat.', 'Lily and Ben went to the park',
               'héllo wörld ✓', '日本語のテキスト', '🙂🚀 emoji 👩‍👩‍👧', '\u202e right to left \u202c', 'e\u0301 combining',
               'tab\tand\nnewlines\r\n', '"quotes" and \\backslashes\\', '<|im_start|>user\n<|im_end|>', '<s></s>',
               ' ', 'a\u0000b', '\u0000', 'x\u0000\u0000y', '\u0085\u2028\uFEFF', '\uFFFD\uFFFF',
               'Once upon a time '.repeat(8)];
const ANY_TEXTS = ['', '\ud800 lone surrogate', 'trail \udfff', 'Once upon a time '.repeat(30)];

function pick(r, list) {
    return list[Math.floor(r() * list.length)];
}
const randInt = (r, lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
const chance = (r, p) => r() < p;
const utf8Len = (s) => Buffer.byteLength(s);

/** [value, expectation, meta] of the completions prompt. meta: { kind, count, texts, ids }. */
function genPrompt(r, clean) {
    const text = () => (chance(r, 0.9) ? pick(r, TEXTS) : pick(r, ANY_TEXTS));
    const textOk = (t) => (ANY_TEXTS.includes(t) ? 'any' : 'ok');
    const ids = () => Array.from({ length: randInt(r, 1, chance(r, 0.1) ? 200 : 12) },
                                 () => (chance(r, 0.1) ? pick(r, [0, 1, 2, VOCAB - 1]) : randInt(r, 0, VOCAB - 1)));
    const worst = (es) => (es.includes('bad') ? 'bad' : es.includes('any') ? 'any' : 'ok');
    const k = clean ? randInt(r, 0, 3) : randInt(r, 0, 5);
    if (k === 0) {
        const t = text();
        return [t, textOk(t), { kind: 'text', count: 1, texts: [t] }];
    }
    if (k === 1) {
        const ts = Array.from({ length: randInt(r, 1, 4) }, text);
        return [ts, worst(ts.map(textOk)), { kind: 'texts', count: ts.length, texts: ts }];
    }
    if (k === 2) {
        const v = ids();
        return [v, 'ok', { kind: 'ids', count: 1, ids: [v.length] }];
    }
    if (k === 3) {
        const vs = Array.from({ length: randInt(r, 1, 3) }, ids);
        return [vs, 'ok', { kind: 'idss', count: vs.length, ids: vs.map((v) => v.length) }];
    }
    // Invalid (or doubtful) prompts.
    const forms = [
        ...bad([], [[]], [[1], []], {}, 5, true, null, [1, 'a'], ['a', 1], [[1], 'a'], ['a', [1]], [1.5], [VOCAB],
               [-1], [[1, VOCAB]], [1, null], [null], [{}], ['a', null], [new Raw('1e400')], [[new Raw('-0.5')]],
               new Bytes(Buffer.from([0x61, 0xff, 0x62])), new Bytes(Buffer.from([0xc3])),
               new Bytes(Buffer.from([0xed, 0xa0, 0x80])), [new Bytes(Buffer.from([0xfe]))],
               'Once upon a time '.repeat(200), Array.from({ length: MAX_LEN + 88 }, () => 403),
               [Array.from({ length: MAX_LEN }, () => 403)]),
        ...ok([new Raw('1.0'), new Raw('403.0')], [new Raw('-0.0')], [[new Raw('2.0')]]),
        ...any([''], ['', ''], ANY_TEXTS, Array.from({ length: MAX_LEN - 1 }, () => 403)),
    ];
    const [v, e] = pick(r, forms);
    let meta = { kind: 'other', count: Array.isArray(v) && v.length && (typeof v[0] !== 'number' && !(v[0] instanceof Raw)) ? v.length : 1 };
    if (e !== 'bad' && Array.isArray(v) && v.every((x) => typeof x === 'string'))
        meta = { kind: 'texts', count: v.length, texts: v };
    else if (e !== 'bad' && Array.isArray(v) && v.every((x) => typeof x === 'number' || x instanceof Raw))
        meta = { kind: 'ids', count: 1, ids: [v.length] };
    else if (e !== 'bad' && Array.isArray(v) && v.every(Array.isArray))
        meta = { kind: 'idss', count: v.length, ids: v.map((x) => x.length) };
    return [v, e, meta];
}

const CONTENT_PARTS = (t) => [{ type: 'text', text: t }];
/** [messages, expectation, rough rendered length in bytes]. */
function genMessages(r, clean) {
    const text = () => pick(r, TEXTS);
    const content = () => (chance(r, 0.2) ? (chance(r, 0.5) ? CONTENT_PARTS(text()) : [{ type: 'text', text: text() },
                                                                                        { type: 'text', text: text() }])
                                         : text());
    const shapes = [
        () => [{ role: 'user', content: content() }],
        () => [{ role: 'system', content: content() }, { role: 'user', content: content() }],
        () => [{ role: 'user', content: content() }, { role: 'assistant', content: content() },
               { role: 'user', content: content() }],
        () => [{ role: 'user', content: content() }, { role: 'assistant' }],
        () => [{ role: 'user', content: content() }, { role: 'assistant', content: null }],
        () => [{ role: 'user', content: content(), name: 'bob', extra: [1, 2] }],
        () => [{ role: 'system', content: '' }, { role: 'user', content: '' }],
        () => Array.from({ length: randInt(r, 1, 6) }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: text() })),
    ];
    if (clean || chance(r, 0.5)) {
        const m = pick(r, shapes)();
        return [m, 'ok', JSON.stringify(m).length + 40 * m.length];
    }
    const [m, e] = pick(r, [
        ...bad([], 'hi', {}, 5, null, [{}], [null], [5], ['hi'], [{ role: 'user' }], [{ content: 'hi' }],
               [{ role: 5, content: 'hi' }], [{ role: null, content: 'hi' }], [{ role: 'user', content: 5 }],
               [{ role: 'user', content: {} }], [{ role: 'user', content: true }],
               [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }],
               [{ role: 'user', content: [{ type: 'text' }] }], [{ role: 'user', content: [{ text: 'hi' }] }],
               [{ role: 'user', content: [{ type: 'text', text: 5 }] }], [{ role: 'user', content: [5] }],
               [{ role: 'user', content: [null] }], [{ role: 'wizard', content: 'hi' }],
               [{ role: 'user', content: new Bytes(Buffer.from([0x68, 0xff])) }],
               [{ role: new Bytes(Buffer.from([0xff])), content: 'hi' }],
               [{ role: 'user', content: 'Once upon a time '.repeat(200) }]),
        ...any([{ role: 'tool', content: 'hi' }], [{ role: 'developer', content: 'hi' }],
               [{ role: 'function', content: 'hi' }], [{ role: 'User', content: 'hi' }], [{ role: '', content: 'hi' }],
               [{ role: 'user', content: [] }], [{ role: 'assistant', content: 'hi' }], [{ role: 'system', content: 'hi' }],
               [{ role: 'user', content: '\ud800' }], [{ role: 'user', content: 'Once upon a time '.repeat(25) }]),
    ]);
    return [m, e, 1000];
}

// ---------------------------------------------------------------------------------------
// One random request

/**
 * Draw request `index`: { index, endpoint, fields: [[key, value, expectation]], body (Buffer),
 * expect: 'ok' | 'bad' | 'any', why: [reasons], refused: [refused field names], meta }.
 */
function genRequest(seed, index, model) {
    const r = requestRng(seed, index);
    const chat = chance(r, 0.4);
    const clean = chance(r, 0.65); // valid values only
    const p = clean ? 0.3 : 0.35; // each optional field's chance to be there
    const fields = []; // [key, value, expectation]
    const put = (k, list) => {
        const choices = clean ? list.filter(([, e]) => e === 'ok') : chance(r, 0.4) ? list : list.filter(([, e]) => e === 'ok');
        const [v, e] = pick(r, choices.length ? choices : list);
        fields.push([k, v, e]);
        return v;
    };
    const has = (k) => fields.some(([key]) => key === k);
    const val = (k) => fields.find(([key]) => key === k)?.[1];
    const exp = (k) => fields.find(([key]) => key === k)?.[2];
    const meta = { chat };

    // model: the served name most of the time.
    if (chance(r, 0.5)) put('model', [[model, 'ok'], [null, 'ok'], ...bad('no-such-model', '', 5, {}, [model], model + ' ')]);

    if (chat) {
        if (clean || chance(r, 0.9)) {
            const [m, e, len] = genMessages(r, clean);
            fields.push(['messages', m, e]);
            meta.promptBytes = len;
        }
        meta.count = 1;
    } else if (clean || chance(r, 0.95)) {
        const [v, e, pm] = genPrompt(r, clean);
        fields.push(['prompt', v, e]);
        Object.assign(meta, pm);
    }

    // max_tokens (small most of the time) and, for chat, max_completion_tokens.
    const MAXT = intField([1, 2, 3, 4, 5, 8, 16, 16, 32, 64, new Raw('4.0'), new Raw('1.0')],
                          [0, -1, MAX_LEN, MAX_LEN + 1, ...HUGE, new Raw('-0.0')],
                          [MAX_LEN - 1, 200, 400]);
    const tokenKeys = chat ? ['max_tokens', 'max_completion_tokens'] : ['max_tokens'];
    for (const k of tokenKeys) if (chance(r, chat ? 0.7 : 0.85)) put(k, MAXT);
    if (chat && !has('max_tokens') && !has('max_completion_tokens') && chance(r, 0.8))
        put('max_tokens', ok(1, 4, 8, 16)); // chat's default is "what is left of max-model-len"

    if (chance(r, p)) put('n', intField([1, 1, 2, 3, 4, MAX_N], [0, -1, MAX_N + 1, ...HUGE, new Raw('-0.0')], []));
    const n = exp('n') === 'ok' && val('n') !== null && val('n') !== undefined ? numOf(val('n')) : 1;
    if (!chat && chance(r, p)) {
        const bo = [...ok(n, n + 1, n + 2).filter(([v]) => v <= MAX_N), ...(n < MAX_N ? [] : bad(MAX_N + 1))];
        put('best_of', [...bo, ...bad(...(n > 1 ? [n - 1] : []), 0, -1, MAX_N + 1, 1e9), ...NOT_NUMBERS, ...NOT_INTEGERS, [null, 'ok']]);
    } else if (chat && chance(r, 0.03)) {
        put('best_of', any(1, 2, 0, 'x')); // not a chat field: ignored or refused
    }
    for (const k of Object.keys(SAMPLING)) if (chance(r, p)) put(k, SAMPLING[k]);
    if (chance(r, p)) put('stop', STOPS);
    if (chance(r, p * 0.6)) put('stop_token_ids', STOP_IDS);
    if (chance(r, 0.35)) put('stream', [...ok(true, true, false, null), ...NOT_BOOLEANS]);
    if (val('stream') === true ? chance(r, 0.6) : chance(r, clean ? 0 : 0.1))
        put('stream_options', [...ok({ include_usage: true }, { include_usage: false }, {}, { include_usage: null }, null,
                                     { include_usage: true, continuous_usage_stats: false }),
                               ...bad({ include_usage: 'yes' }, { include_usage: 1 }, 'x', 5, [], true)]);
    if (chat) {
        if (chance(r, 0.3)) put('logprobs', [...ok(true, true, false, null), ...bad(0, 1, 5, 'true', {}, [])]);
        if (chance(r, 0.3)) put('top_logprobs', intField([0, 1, 2, 5, MAX_LOGPROBS], [-1, MAX_LOGPROBS + 1, ...HUGE], []));
        if (chance(r, 0.03)) put('echo', any(true, false, 'x'));
    } else {
        if (chance(r, 0.3)) put('logprobs', intField([0, 0, 1, 2, 5, MAX_LOGPROBS], [-1, MAX_LOGPROBS + 1, ...HUGE], []));
        if (chance(r, 0.2)) put('echo', [...ok(true, false, null), ...NOT_BOOLEANS]);
    }
    if (chance(r, 0.25)) put('logit_bias', LOGIT_BIAS);
    if (chance(r, 0.25)) put('min_tokens', intField([0, 1, 2, 4, 8], [-1, -100, ...HUGE], []));
    for (const k of Object.keys(REFUSED)) {
        if (chance(r, (clean ? 0.01 : 0.05) * (REFUSED_COMMON.includes(k) ? 1 : 0.3))) {
            // A field of the other endpoint: ignored or refused.
            if (chat ? COMPLETIONS_ONLY_REFUSED.includes(k) : CHAT_ONLY_REFUSED.includes(k))
                put(k, REFUSED[k].map(([v]) => [v, 'any']));
            else put(k, REFUSED[k]);
        }
    }
    if (chance(r, 0.15) && !CONSTRAINT_FIELDS.some(has)) put('allowed_token_ids', ALLOWED_IDS);
    if (chance(r, 0.15)) put('bad_words', BAD_WORDS);
    if (chance(r, 0.1)) put('truncate_prompt_tokens', intField([1, 2, 4, 64, MAX_LEN, -1], [0, -2, MAX_LEN + 1, ...HUGE], []));
    if (chance(r, 0.04)) fields.push([pick(r, ['foo', 'metadata', 'service_tier', 'store', '', 'ÿ', 'prompt ']),
                                      pick(r, [1, 'x', null, {}, [], true]), 'ok']);

    // Keep the work small: cut max_tokens of requests that would generate a lot.
    const prompts = meta.count ?? 1;
    const bestOf = exp('best_of') === 'ok' && val('best_of') != null ? numOf(val('best_of')) : n;
    const mt = tokenKeys.filter(has).map((k) => (exp(k) === 'ok' && val(k) != null ? numOf(val(k)) : null));
    const effMax = mt.length ? (mt.at(-1) ?? 16) : chat ? MAX_LEN : 16;
    if (prompts * Math.max(n, bestOf) * effMax > WORK_BUDGET) {
        const cut = Math.max(1, Math.floor(WORK_BUDGET / (prompts * Math.max(n, bestOf))));
        for (const k of tokenKeys) {
            const f = fields.find(([key]) => key === k);
            if (f && f[2] === 'ok') f[1] = Math.min(cut, 16);
        }
        if (!tokenKeys.some(has)) fields.push(['max_tokens', Math.min(cut, 16), 'ok']);
    }

    // Duplicate keys now and then (jansson keeps one of them; either outcome is fine), of
    // fields the answer's checks do not depend on.
    const dupable = fields.filter(([k]) => DUPABLE.includes(k));
    if (chance(r, 0.03) && dupable.length) {
        const [k] = pick(r, dupable);
        fields.push([k, pick(r, [1, 'x', null, true]), 'any']);
        meta.duplicate = k;
    }

    // Shuffle the field order.
    for (let i = fields.length - 1; i > 0; i--) {
        const j = Math.floor(r() * (i + 1));
        [fields[i], fields[j]] = [fields[j], fields[i]];
    }
    const req = { index, endpoint: chat ? '/v1/chat/completions' : '/v1/completions', fields, meta };
    req.body = toBody(new Pairs(fields.map(([k, v]) => [k, v])));
    Object.assign(req, expectation(req, model));
    return req;
}

const DUPABLE = ['model', 'temperature', 'top_p', 'top_k', 'min_p', 'presence_penalty', 'frequency_penalty',
                 'repetition_penalty', 'seed', 'user', 'logit_bias', ...Object.keys(REFUSED)];

/** The number a valid numeric value stands for (Raw literals included). */
function numOf(v) {
    return v instanceof Raw ? Number(v.text) : v;
}

/** What the server should answer: { expect, why, refused, params } (params: the effective
 * values of the fields the response checks use). */
function expectation(req) {
    const { fields, meta } = req;
    const chat = meta.chat;
    const why = [];
    let expect = 'ok';
    const worse = (e, reason) => {
        if (e === 'bad') {
            expect = 'bad';
            why.push(reason);
        } else if (e === 'any' && expect === 'ok') {
            expect = 'any';
        }
        if (e === 'any') why.push(`(${reason}?)`);
    };
    const last = {}; // key -> [value, expectation] (the last one written: jansson keeps it)
    for (const [k, v, e] of fields) last[k] = [v, e];
    for (const [k, [, e]] of Object.entries(last)) worse(e, k);
    if (meta.duplicate) worse('any', `duplicate ${meta.duplicate}`);
    const refused = Object.entries(last).filter(([k, [, e]]) => k in REFUSED && e === 'bad').map(([k]) => k);
    // The value the server should use: valid ('ok') or doubtful ('any') ones; not a
    // duplicated key's (either copy may win).
    const get = (k, dflt) => {
        const f = last[k];
        if (!f || f[1] === 'bad' || f[0] === null || meta.duplicate === k) return dflt;
        return f[0];
    };
    if (!last[chat ? 'messages' : 'prompt']) worse('bad', chat ? 'no messages' : 'no prompt');

    const n = numOf(get('n', 1));
    const stream = get('stream', false) === true;
    let maxTokens = numOf(get('max_tokens', chat ? -1 : 16));
    if (chat) maxTokens = numOf(get('max_completion_tokens', maxTokens));
    const bestOf = chat ? n : numOf(get('best_of', n));
    if (!chat && bestOf < n) worse('bad', 'best_of < n');
    // max-seqs-per-request (256 by default) bounds prompts x best_of: a 400 above it.
    if ((meta.count ?? 1) * Math.max(n, bestOf) > 256) worse('any', 'prompts x best_of over 256');
    if (!chat && stream && bestOf > n) worse('bad', 'stream with best_of > n');
    if (last.stream_options && last.stream_options[0] !== null && !stream) worse('bad', 'stream_options without stream');
    const so = get('stream_options', null);
    const includeUsage = stream && so && typeof so === 'object' && so.include_usage === true;
    let logprobs = -1; // completions: k; chat: top_logprobs when logprobs is true
    if (chat) {
        const want = get('logprobs', false) === true;
        const top = numOf(get('top_logprobs', 0));
        if (top > 0 && !want) worse('bad', 'top_logprobs without logprobs');
        logprobs = want ? top : -1;
    } else {
        logprobs = numOf(get('logprobs', -1));
    }
    const echo = !chat && get('echo', false) === true;
    if (echo && logprobs >= 0) worse('any', 'echo with logprobs');
    const model = get('model', null);
    const minTokens = numOf(get('min_tokens', 0));
    if (maxTokens > 0 && minTokens > maxTokens) worse('any', 'min_tokens > max_tokens');
    const truncate = numOf(get('truncate_prompt_tokens', 0));
    const keep = truncate < 0 ? MAX_LEN : truncate; // vLLM's: the prompt's last `keep` tokens
    // Length: a prompt has at most its UTF-8 bytes + 1 (BOS) tokens.
    if (expect === 'ok') {
        const room = maxTokens > 0 ? maxTokens : 1;
        let most = 0;
        if (chat) most = meta.promptBytes;
        else if (meta.texts) most = Math.max(...meta.texts.map((t) => utf8Len(t) + 1));
        else if (meta.ids) most = Math.max(...meta.ids);
        if (keep > 0) most = Math.min(most, keep);
        if (most + room > MAX_LEN) worse('any', 'prompt + max_tokens near max-model-len');
    }
    const stops = (() => {
        const s = get('stop', null);
        if (s === null) return [];
        return (Array.isArray(s) ? s : [s]).filter((x) => typeof x === 'string' && x.length > 0 && !x.includes('\u0000'));
    })();
    const stopIds = get('stop_token_ids', []);
    return {
        expect, why, refused,
        params: { n, bestOf, stream, includeUsage, logprobs, echo, maxTokens, minTokens, stops, model, keep,
                  hasStopIds: Array.isArray(stopIds) && stopIds.length > 0, ignoreEos: get('ignore_eos', false) === true,
                  hasStopStrings: last.stop !== undefined && last.stop[0] !== null },
    };
}

// ---------------------------------------------------------------------------------------
// Sending

/** POST body to path over a fresh connection; resolves to { status, headers, text } or
 * { dropped: 'why' } when the connection fails, closes early or times out. */
function send(port, pathName, body, timeoutMs) {
    return new Promise((resolve) => {
        let settled = false;
        const done = (v) => {
            if (!settled) {
                settled = true;
                resolve(v);
            }
        };
        const req = http.request({
            host: '127.0.0.1', port, path: pathName, method: 'POST', agent: false,
            headers: { 'Content-Type': 'application/json', 'Content-Length': body.length },
        }, (res) => {
            const chunks = [];
            res.on('data', (c) => chunks.push(c));
            res.on('error', (e) => done({ dropped: `response error: ${e.code || e.message}` }));
            res.on('aborted', () => done({ dropped: 'response aborted (connection closed mid-body)' }));
            res.on('end', () => {
                if (!res.complete) return done({ dropped: 'response incomplete (connection closed mid-body)' });
                done({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') });
            });
        });
        req.setTimeout(timeoutMs, () => {
            req.destroy();
            done({ dropped: `no complete answer within ${timeoutMs} ms` });
        });
        req.on('error', (e) => done({ dropped: `request error: ${e.code || e.message}` }));
        req.end(body);
    });
}

// ---------------------------------------------------------------------------------------
// Checking. Each check returns a list of [kind, detail]: kind groups failures in the report.

function checkError(req, res, json) {
    const out = [];
    try {
        assertErrorShape(json, 'error body');
    } catch (e) {
        out.push(['4xx body is not an OpenAI error object', e.message.split('\n')[0]]);
        return out;
    }
    if (req.expect === 'ok') {
        const gist = json.error.message.replace(/\d+/g, 'N').slice(0, 70);
        out.push([`valid request refused (${res.status}, param ${json.error.param}: "${gist}")`, json.error.message]);
    }
    const onlyRefused = req.refused.length > 0 && req.why.every((w) => req.refused.includes(w));
    if (onlyRefused) {
        const e = json.error;
        const named = req.refused.some((k) => e.param === k || e.message.includes(k));
        if (res.status !== 400 || !named)
            out.push([`refused field not named in a 400 (${req.refused.join(', ')})`, `${res.status} ${JSON.stringify(e)}`]);
    }
    if (res.status === 404 && json.error.param !== 'model') // the one 404 of these routes: an unknown model
        out.push(['404 whose param is not model', JSON.stringify(json.error)]);
    return out;
}

function checkLogprobs(req, choice, where) {
    const { logprobs } = req.params;
    const lp = choice.logprobs;
    if (logprobs < 0) return lp === null || lp === undefined ? [] : [[`${where}: logprobs not asked for but present`, JSON.stringify(lp).slice(0, 200)]];
    if (!lp || typeof lp !== 'object') return [[`${where}: logprobs asked for but missing`, JSON.stringify(choice).slice(0, 300)]];
    const out = [];
    if (req.meta.chat) {
        if (!Array.isArray(lp.content)) return [[`${where}: chat logprobs.content not a list`, JSON.stringify(lp).slice(0, 300)]];
        for (const t of lp.content) {
            if (typeof t.token !== 'string' || typeof t.logprob !== 'number' || !Array.isArray(t.bytes) ||
                !Array.isArray(t.top_logprobs) || t.top_logprobs.length > logprobs)
                return [[`${where}: chat logprobs entry malformed`, JSON.stringify(t).slice(0, 300)]];
        }
    } else {
        const keys = ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'];
        if (!keys.every((k) => Array.isArray(lp[k]))) return [[`${where}: completions logprobs malformed`, JSON.stringify(lp).slice(0, 300)]];
        const len = lp.tokens.length;
        if (!keys.every((k) => lp[k].length === len))
            out.push([`${where}: logprobs lists of different lengths`, JSON.stringify(lp).slice(0, 300)]);
        for (const top of lp.top_logprobs) {
            if (top === null) continue;
            if (typeof top !== 'object' || Object.keys(top).length > Math.max(logprobs, 1) + 1)
                out.push([`${where}: top_logprobs entry has more than logprobs + 1 tokens`, JSON.stringify(top).slice(0, 300)]);
        }
        if (!lp.token_logprobs.every((x) => typeof x === 'number' && x <= 1e-3))
            out.push([`${where}: token_logprobs not numbers <= 0`, JSON.stringify(lp.token_logprobs).slice(0, 300)]);
    }
    return out;
}

function checkUsage(req, usage, where) {
    const out = [];
    if (!usage || typeof usage !== 'object' || !['prompt_tokens', 'completion_tokens', 'total_tokens'].every((k) => Number.isInteger(usage[k]) && usage[k] >= 0))
        return [[`${where}: usage malformed`, JSON.stringify(usage)]];
    if (usage.total_tokens !== usage.prompt_tokens + usage.completion_tokens)
        out.push([`${where}: usage total != prompt + completion`, JSON.stringify(usage)]);
    const { meta, params } = req;
    if (!meta.chat && meta.ids && meta.kind !== 'other') {
        const want = meta.ids.reduce((a, b) => a + (params.keep > 0 ? Math.min(b, params.keep) : b), 0);
        if (usage.prompt_tokens !== want)
            out.push([`${where}: prompt_tokens != number of prompt token ids`, `${JSON.stringify(usage)}, ids ${want}`]);
    }
    if (params.maxTokens > 0) {
        const most = params.maxTokens * (meta.count ?? 1) * Math.max(params.n, params.bestOf);
        if (usage.completion_tokens > most)
            out.push([`${where}: completion_tokens above max_tokens x prompts x best_of`, `${JSON.stringify(usage)}, at most ${most}`]);
    }
    if (params.minTokens > 0 && params.maxTokens > 0 && !params.hasStopStrings) {
        const least = Math.min(params.minTokens, params.maxTokens) * (meta.count ?? 1) * params.n;
        if (usage.completion_tokens < least)
            out.push([`${where}: completion_tokens below min_tokens x choices`, `${JSON.stringify(usage)}, at least ${least}`]);
    }
    return out;
}

/** Per-choice text checks: stop strings, echo, finish_reason. */
function checkChoiceText(req, index, text, finish, where) {
    const out = [];
    const { params, meta } = req;
    if (!['stop', 'length'].includes(finish)) out.push([`${where}: finish_reason not stop or length`, JSON.stringify(finish)]);
    let gen = text;
    if (params.echo && !meta.chat && meta.texts && !(params.keep > 0)) {
        const prompt = meta.texts[Math.floor(index / params.n)];
        if (prompt !== undefined && !text.startsWith(prompt))
            out.push([`${where}: echo text does not start with the prompt`, `${JSON.stringify(text.slice(0, 80))} vs prompt ${JSON.stringify(prompt.slice(0, 80))}`]);
        else if (prompt !== undefined) gen = text.slice(prompt.length);
    }
    // id prompts and truncated ones: the prompt's text is not known here
    if (params.echo && !meta.chat && (!meta.texts || params.keep > 0)) gen = null;
    // stop strings act only once min_tokens are generated (as vLLM): before, the text may hold one
    for (const s of (params.minTokens > 0 ? [] : params.stops))
        if (gen !== null && gen.includes(s)) out.push([`${where}: text holds a stop string`, `${JSON.stringify(s)} in ${JSON.stringify(gen.slice(0, 200))}`]);
    if (params.ignoreEos && !params.hasStopStrings && !params.hasStopIds && finish !== 'length')
        out.push([`${where}: ignore_eos without stops finished with ${finish}`, JSON.stringify(text.slice(0, 100))]);
    return out;
}

function check200(req, res) {
    const { params, meta } = req;
    const want = (meta.count ?? 1) * params.n;
    const ctype = res.headers['content-type'] ?? '';
    const out = [];
    if (params.stream) {
        if (!/^text\/event-stream/.test(ctype)) return [['stream: not text/event-stream', ctype]];
        const text = res.text;
        if (!text.endsWith('data: [DONE]\n\n')) return [['stream: does not end with data: [DONE]', text.slice(-300)]];
        const blocks = text.slice(0, -'data: [DONE]\n\n'.length).split('\n\n');
        if (blocks.at(-1) !== '') return [['stream: events not separated by a blank line', text.slice(-300)]];
        blocks.pop();
        const events = [];
        for (const b of blocks) {
            if (!b.startsWith('data: ') || b.includes('\n')) return [['stream: an event that is not one data: line', JSON.stringify(b.slice(0, 300))]];
            try {
                events.push(JSON.parse(b.slice(6)));
            } catch {
                return [['stream: data that is not JSON', b.slice(0, 300)]];
            }
        }
        if (text.includes('data: [DONE]') && text.indexOf('data: [DONE]') !== text.length - 14)
            out.push(['stream: [DONE] before the end', text.slice(0, 300)]);
        const object = meta.chat ? 'chat.completion.chunk' : 'text_completion';
        let usageEvent = null;
        const finishes = new Map();
        const texts = new Map();
        const firstDelta = new Map();
        const ids = new Set();
        events.forEach((ev, i) => {
            ids.add(ev.id);
            if (ev.object !== object) out.push(['stream: chunk object wrong', JSON.stringify(ev).slice(0, 300)]);
            if (!Array.isArray(ev.choices)) {
                out.push(['stream: chunk without choices', JSON.stringify(ev).slice(0, 300)]);
                return;
            }
            if (ev.usage !== undefined && ev.usage !== null) {
                if (i !== events.length - 1 || ev.choices.length !== 0)
                    out.push(['stream: usage outside a last chunk with no choices', JSON.stringify(ev).slice(0, 300)]);
                usageEvent = ev;
            }
            for (const c of ev.choices) {
                if (!Number.isInteger(c.index) || c.index < 0 || c.index >= want) {
                    out.push(['stream: choice index out of range', `${c.index} of ${want}`]);
                    continue;
                }
                if (finishes.has(c.index)) out.push(['stream: chunk after the choice finished', JSON.stringify(ev).slice(0, 300)]);
                let piece;
                if (meta.chat) {
                    if (!c.delta || typeof c.delta !== 'object') out.push(['stream: chat chunk without delta', JSON.stringify(c).slice(0, 300)]);
                    if (!firstDelta.has(c.index)) firstDelta.set(c.index, c.delta ?? {});
                    piece = c.delta?.content ?? '';
                } else {
                    piece = c.text;
                }
                if (typeof piece !== 'string') out.push(['stream: chunk text not a string', JSON.stringify(c).slice(0, 300)]);
                texts.set(c.index, (texts.get(c.index) ?? '') + (piece ?? ''));
                if (params.logprobs >= 0 && c.logprobs !== null && c.logprobs !== undefined)
                    out.push(...checkLogprobs(req, c, 'stream'));
                if (c.finish_reason !== null && c.finish_reason !== undefined) finishes.set(c.index, c.finish_reason);
            }
        });
        if (ids.size > 1) out.push(['stream: chunks with different ids', [...ids].join(' ')]);
        for (let i = 0; i < want; i++) {
            if (!finishes.has(i)) {
                out.push([`stream: a choice never finished (${want} choices)`, `index ${i}; finished ${[...finishes.keys()].join(',')}`]);
                break;
            }
        }
        for (const [i, f] of finishes) out.push(...checkChoiceText(req, i, texts.get(i) ?? '', f, 'stream'));
        if (meta.chat)
            for (const [i, d] of firstDelta)
                if (d.role !== 'assistant') {
                    out.push(['stream: chat choice whose first delta has no role', `index ${i} of ${want}: ${JSON.stringify(d)}`]);
                    break;
                }
        if (params.includeUsage) {
            if (!usageEvent) out.push(['stream: include_usage but no usage chunk', text.slice(-300)]);
            else out.push(...checkUsage(req, usageEvent.usage, 'stream'));
        } else if (usageEvent) {
            out.push(['stream: usage chunk without include_usage', JSON.stringify(usageEvent)]);
        }
        return out;
    }
    let json;
    try {
        json = JSON.parse(res.text);
    } catch {
        return [['200 body is not JSON', res.text.slice(0, 300)]];
    }
    if (!json || !Array.isArray(json.choices)) return [['200 body without a choices list', res.text.slice(0, 300)]];
    if (json.object !== (meta.chat ? 'chat.completion' : 'text_completion'))
        out.push(['200 body: object wrong', JSON.stringify(json.object)]);
    if (typeof json.id !== 'string' || typeof json.created !== 'number' || typeof json.model !== 'string')
        out.push(['200 body: id, created or model missing', res.text.slice(0, 300)]);
    if (json.choices.length !== want)
        out.push(['number of choices != prompts x n', `${json.choices.length} choices, want ${meta.count ?? 1} x ${params.n}`]);
    const seen = new Set(json.choices.map((c) => c.index));
    if (seen.size !== json.choices.length || ![...seen].every((i) => Number.isInteger(i) && i >= 0 && i < json.choices.length))
        out.push(['choice indexes not 0..N-1 once each', JSON.stringify([...seen])]);
    for (const c of json.choices) {
        let text;
        if (meta.chat) {
            if (!c.message || c.message.role !== 'assistant' || typeof c.message.content !== 'string') {
                out.push(['chat choice without an assistant message', JSON.stringify(c).slice(0, 300)]);
                continue;
            }
            text = c.message.content;
        } else {
            if (typeof c.text !== 'string') {
                out.push(['choice without text', JSON.stringify(c).slice(0, 300)]);
                continue;
            }
            text = c.text;
        }
        out.push(...checkChoiceText(req, c.index, text, c.finish_reason, 'body'));
        out.push(...checkLogprobs(req, c, 'body'));
        if (!meta.chat && params.logprobs >= 0 && c.logprobs?.tokens && params.maxTokens > 0) {
            const k = c.logprobs.tokens.length;
            if (k > params.maxTokens) out.push(['more logprobs tokens than max_tokens', `${k} > ${params.maxTokens}`]);
            if (c.finish_reason === 'length' && k !== params.maxTokens)
                out.push(['finish_reason length but fewer tokens than max_tokens', `${k} tokens, max_tokens ${params.maxTokens}`]);
        }
    }
    out.push(...checkUsage(req, json.usage, 'body'));
    return out;
}

function check(req, res) {
    if (res.dropped) return [[`connection dropped`, res.dropped]];
    const { status } = res;
    if (status >= 500) return [[`${status} (5xx)`, res.text.slice(0, 500)]];
    if (status !== 200 && (status < 400 || status > 499)) return [[`status ${status}`, res.text.slice(0, 500)]];
    if (status !== 200) {
        let json;
        try {
            json = JSON.parse(res.text);
        } catch {}
        if (!/^application\/json/.test(res.headers['content-type'] ?? ''))
            return [['4xx not application/json', `${res.headers['content-type']}: ${res.text.slice(0, 300)}`]];
        return checkError(req, res, json);
    }
    const out = [];
    if (req.expect === 'bad')
        out.push([`invalid request accepted (${req.why.filter((w) => !w.startsWith('(')).join(', ')})`, res.text.slice(0, 200)]);
    return out.concat(check200(req, res));
}

// ---------------------------------------------------------------------------------------
// Reporting

function bodyText(body) {
    const s = body.toString('utf8');
    return Buffer.from(s).equals(body) ? s : null;
}

/** A shell command that sends the same bytes. */
function curlCommand(port, req) {
    const url = `http://127.0.0.1:${port}${req.endpoint}`;
    const text = bodyText(req.body);
    if (text !== null && !text.includes('\nEOF\n'))
        return `curl -sS ${url} -H 'Content-Type: application/json' --data-binary @- <<'EOF'\n${text}\nEOF`;
    const esc = [...req.body].map((b) => (b >= 0x20 && b < 0x7f && b !== 0x27 && b !== 0x5c && b !== 0x25 ? String.fromCharCode(b)
                                          : '\\x' + b.toString(16).padStart(2, '0'))).join('');
    return `printf '${esc}' | curl -sS ${url} -H 'Content-Type: application/json' --data-binary @-`;
}

function describeFailure(port, req, res, detail) {
    const answer = res.dropped ? `(no answer: ${res.dropped})`
        : `${res.status} ${res.headers['content-type'] ?? ''}\n${res.text.length > 1500 ? res.text.slice(0, 1500) + ` ... (${res.text.length} bytes)` : res.text}`;
    return [`seed ${SEED}, request ${req.index} (PAGELLM_COMBO_SEED=${SEED} PAGELLM_COMBO_ONLY=${req.index}), POST ${req.endpoint}`,
            `expected: ${req.expect}${req.why.length ? ` (${req.why.join(', ')})` : ''}`,
            `detail: ${detail}`,
            `body (${req.body.length} bytes):`, curlCommand(port, req),
            `answer: ${answer}`].join('\n');
}

// ---------------------------------------------------------------------------------------

describe('random combinations of request fields', () => {
    const servers = [];
    let srv = null; // the live server
    let dead = null; // how `srv` exited, once it has
    const start = async () => {
        // A queue long enough that 8 requests of up to 256 sequences each are never a 503.
        const s = await startServer(['--chat-template', 'chatml', '--max-queue-len', '65536']);
        servers.push(s);
        srv = s;
        dead = null;
        s.exited.then((e) => {
            if (srv === s) dead = e;
        });
        return s;
    };
    const crashes = []; // requests that crashed a server on their own
    before(async () => {
        await start();
    }, T(30000));
    after(async () => {
        for (const s of servers) await s.stop();
    });

    const indexes = ONLY.length ? ONLY : Array.from({ length: COUNT }, (_, i) => i);
    it(`${indexes.length} requests (seed ${SEED}, ${CONCURRENCY} at a time): 200 or 4xx, well-formed`, T(300000), async () => {
        const kinds = new Map(); // kind -> { count, first: [descriptions] }
        const record = (kind, text, keep = 1, index = null) => {
            const e = kinds.get(kind) ?? { count: 0, first: [], indexes: [] };
            e.count++;
            if (e.first.length < keep) e.first.push(text);
            if (index !== null) e.indexes.push(index);
            kinds.set(kind, e);
        };
        const tally = new Map();
        const t0 = Date.now();
        let next = 0;
        let sent = 0;
        let restarts = 0;
        const judge = (req, res) => {
            sent++;
            const key = `${req.meta.chat ? 'chat' : 'completions'} ${res.dropped ? 'dropped' : res.status}` +
                        `${req.params.stream && res.status === 200 ? ' stream' : ''}`;
            tally.set(key, (tally.get(key) ?? 0) + 1);
            const seen = new Set(); // a kind once per request (n choices may each fail the same way)
            for (const [kind, detail] of check(req, res)) {
                if (seen.has(kind)) continue;
                seen.add(kind);
                record(kind, describeFailure(srv.port, req, res, detail), 1, req.index);
            }
        };
        for (;;) {
            const casualties = []; // dropped while the server died
            const worker = async () => {
                while (next < indexes.length && !dead) {
                    const req = genRequest(SEED, indexes[next++], srv.model);
                    const res = await send(srv.port, req.endpoint, req.body, scaled(60000));
                    if (res.dropped && !dead) await sleep(scaled(500)); // a crash? let its exit be seen
                    if (res.dropped && dead) casualties.push(req);
                    else judge(req, res);
                }
            };
            await Promise.all(Array.from({ length: CONCURRENCY }, worker));
            if (!dead) break;
            // A crash: send each request that was in flight again, alone, to a fresh server,
            // to find the one(s) that crash it (the others are checked as usual).
            console.log(`combinations: the server exited (${JSON.stringify(dead)}); ` +
                        `replaying the ${casualties.length} request(s) in flight one at a time`);
            for (const req of casualties.sort((a, b) => a.index - b.index)) {
                if (dead) await start();
                const res = await send(srv.port, req.endpoint, req.body, scaled(60000));
                if (res.dropped) await sleep(scaled(500));
                if (dead) {
                    crashes.push(req.index);
                    record(`the server crashed (${dead.signal ?? `exit ${dead.code}`})`,
                           describeFailure(srv.port, req, res, `this request alone crashes a fresh server ` +
                                           `(${JSON.stringify(dead)}); its output:\n${srv.log().slice(-3000)}`), 10);
                } else {
                    judge(req, res);
                }
            }
            if (next >= indexes.length) break;
            if (restarts++ >= 3) {
                record('run stopped after 4 crashes', `${indexes.length - next} request(s) not sent`);
                break;
            }
            if (dead) await start();
        }
        const seconds = (Date.now() - t0) / 1000;
        const counts = [...tally.entries()].sort().map(([k, v]) => `${k}: ${v}`).join(', ');
        console.log(`combinations: seed ${SEED}, ${sent} requests in ${seconds.toFixed(1)} s (${counts})`);
        let report = '';
        for (const [kind, e] of [...kinds.entries()].sort((a, b) => b[1].count - a[1].count))
            report += `\n=== ${kind}: ${e.count} request(s)` +
                      `${e.indexes.length > 1 ? ` (${e.indexes.slice(0, 12).join(', ')}${e.indexes.length > 12 ? ', ...' : ''})` : ''}` +
                      `; ${e.first.length > 1 ? 'each' : 'the first'}:\n${e.first.join('\n---\n')}\n`;
        if (report) {
            console.log(report);
            assert.fail(`${[...kinds.values()].reduce((a, e) => a + e.count, 0)} failure(s) of ${kinds.size} kind(s) ` +
                        `in ${sent} requests (seed ${SEED}): ` +
                        `${[...kinds.entries()].map(([k, e]) => `${k} x${e.count}`).join('; ')} (details above)`);
        }
    });

    it('the server never exited, still answers /health, then exits 0 on SIGTERM', T(30000), async () => {
        assert.deepEqual(crashes, [], `requests that crashed the server: ${crashes.join(', ')}`);
        assert.equal(dead, null, `the server exited: ${JSON.stringify(dead)}`);
        const res = await fetch(`${srv.url}/health`, { signal: AbortSignal.timeout(scaled(5000)) });
        await res.arrayBuffer();
        assert.equal(res.status, 200);
        const e = await srv.stop(scaled(10000));
        assert.deepEqual(e, { code: 0, signal: null }, 'exit status after SIGTERM (under ASan: LeakSanitizer\'s ' +
                         `verdict); the server's last output:\n${srv.log().slice(-12000)}`);
    });
});
