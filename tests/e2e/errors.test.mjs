// errors.test.mjs - every bad input of issue 4 answers with the right status and an
// OpenAI-shaped {"error": {"message", "type", "param", "code"}}, and the server keeps serving
// everyone else; a full queue answers 503 with Retry-After at once (under a second), the
// admitted requests finish whole, and the server answers again after the burst.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, parseSSE, readSSE, postJSON, assertErrorShape, GOLDEN, show, sleep, T, scaled } from './server.mjs';

const MAX_REQUEST_BYTES = 16384;
const QUEUE_N = 8; // --max-num-seqs and --max-queue-len of the queue test's server, and n of its requests

/** A streaming completion (body, on srv) that holds its places in the queue: resolves once its
 * first chunk arrived, when it is surely admitted, to a function that aborts it. */
async function holdQueue(srv, body) {
    const ac = new AbortController();
    const res = await fetch(`${srv.url}/v1/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ model: srv.model, ...body, stream: true }), signal: ac.signal,
    });
    assert.equal(res.status, 200);
    let first;
    const gotFirst = new Promise((r) => (first = r));
    const done = readSSE(res, () => {
        first();
        return false;
    }).catch(() => {});
    await gotFirst;
    return async () => {
        ac.abort();
        await done;
    };
}

const ONCE = GOLDEN[0];

// [name, status, request, param expected in error.param (undefined: not checked)]
// request: { method, path, body } with body a JSON value (model added), or raw: a string.
const CASES = [
    ['malformed JSON', 400, { raw: '{"model": "m", "prompt": "Once upon' }],
    ['body that is not an object', 400, { raw: '[1, 2, 3]' }],
    ['empty body', 400, { raw: '' }],
    ['missing prompt', 400, { body: { max_tokens: 4 } }],
    ['prompt of the wrong type (object)', 400, { body: { prompt: { text: 'hi' } } }, 'prompt'],
    ['prompt of the wrong type (number)', 400, { body: { prompt: 5 } }, 'prompt'],
    ['prompt list mixing strings and ids', 400, { body: { prompt: ['hi', 5] } }, 'prompt'],
    ['max_tokens of the wrong type', 400, { body: { prompt: 'hi', max_tokens: 'sixteen' } }, 'max_tokens'],
    ['max_tokens not an integer', 400, { body: { prompt: 'hi', max_tokens: 2.5 } }, 'max_tokens'],
    ['temperature of the wrong type', 400, { body: { prompt: 'hi', temperature: [1] } }, 'temperature'],
    ['stream of the wrong type', 400, { body: { prompt: 'hi', stream: 'yes please' } }, 'stream'],
    ['stop of the wrong type', 400, { body: { prompt: 'hi', stop: 5 } }, 'stop'],
    ['n of the wrong type', 400, { body: { prompt: 'hi', n: 'three' } }, 'n'],
    ['max_tokens -1', 400, { body: { prompt: 'hi', max_tokens: -1 } }, 'max_tokens'],
    ['max_tokens 10^9', 400, { body: { prompt: 'hi', max_tokens: 1e9 } }],
    ['temperature -1', 400, { body: { prompt: 'hi', temperature: -1 } }, 'temperature'],
    ['top_p 0', 400, { body: { prompt: 'hi', top_p: 0 } }, 'top_p'],
    ['top_p 1.5', 400, { body: { prompt: 'hi', top_p: 1.5 } }, 'top_p'],
    ['n over the limit (10000)', 400, { body: { prompt: 'hi', n: 10000 } }, 'n'],
    ['n 0', 400, { body: { prompt: 'hi', n: 0 } }, 'n'],
    ['best_of below n', 400, { body: { prompt: 'hi', n: 3, best_of: 2, temperature: 1 } }],
    ['prompt longer than max-model-len (text)', 400, { body: { prompt: 'Once upon a time '.repeat(200) } }],
    ['prompt longer than max-model-len (token ids)', 400, { body: { prompt: new Array(600).fill(403) } }],
    ['prompt + max_tokens over max-model-len', 400, { body: { prompt: new Array(500).fill(403), max_tokens: 100 } }],
    ['empty prompt list', 400, { body: { prompt: [] } }, 'prompt'],
    ['token id 99999 (vocabulary is 512)', 400, { body: { prompt: [1, 99999] } }, 'prompt'],
    ['token id -1', 400, { body: { prompt: [1, -1] } }, 'prompt'],
    ['token id out of vocabulary in a list of lists', 400, { body: { prompt: [[1, 403], [1, 512]] } }, 'prompt'],
    ['body over --max-request-bytes', 413, { body: { prompt: 'x'.repeat(2 * MAX_REQUEST_BYTES) } }],
    ['unknown model', 404, { body: { prompt: 'hi', model: 'no-such-model' } }, 'model'],
    ['unknown route (GET)', 404, { method: 'GET', path: '/v1/no-such-route' }],
    ['unknown route (POST)', 404, { method: 'POST', path: '/no-such-route', body: { prompt: 'hi' } }],
    ['wrong method: GET /v1/completions', 405, { method: 'GET', path: '/v1/completions' }],
    ['wrong method: GET /v1/chat/completions', 405, { method: 'GET', path: '/v1/chat/completions' }],
    ['wrong method: POST /v1/models', 405, { method: 'POST', path: '/v1/models', body: {} }],
    ['wrong method: DELETE /health', 405, { method: 'DELETE', path: '/health' }],
];

function bodyOf(srv, req) {
    if (req.raw !== undefined) return req.raw;
    if (req.body !== undefined) return { model: srv.model, ...req.body };
    return undefined;
}

/** A CASES request through curl. */
function send(srv, req) {
    return curl(`${srv.url}${req.path ?? '/v1/completions'}`, { method: req.method ?? 'POST', body: bodyOf(srv, req) });
}

/** A CASES request through fetch (many at once without a process each). */
async function sendFetch(srv, req) {
    const body = bodyOf(srv, req);
    const res = await fetch(`${srv.url}${req.path ?? '/v1/completions'}`, {
        method: req.method ?? 'POST',
        headers: body === undefined ? {} : { 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
        signal: AbortSignal.timeout(scaled(15000)),
    });
    return { status: res.status, text: await res.text() };
}

describe('bad input', () => {
    let srv;
    before(async () => {
        srv = await startServer(['--max-request-bytes', String(MAX_REQUEST_BYTES)]);
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    for (const [name, status, req, param] of CASES) {
        it(`${name} -> ${status}`, T(), async () => {
            const r = await send(srv, req);
            assert.equal(r.status, status, `${name}: ${show(r)}`);
            assert.match(r.headers['content-type'] ?? '', /^application\/json/, `${name}: content-type`);
            assertErrorShape(r.json, name);
            if (param !== undefined) assert.equal(r.json.error.param, param, `${name}: error.param: ${show(r)}`);
            if (status === 405) assert.ok(r.headers.allow, `${name}: 405 without an Allow header`);
        });
    }

    it('the server keeps serving others while it refuses bad input', T(20000), async () => {
        const good = curl(`${srv.url}/v1/completions`, {
            body: { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stream: true },
        });
        const bad = await Promise.all(CASES.map(([, , req]) => sendFetch(srv, req)));
        CASES.forEach(([name, status], i) => assert.equal(bad[i].status, status, `${name}: ${show(bad[i])}`));
        const r = await good;
        assert.equal(r.status, 200, show(r));
        const { events, done } = parseSSE(r.text);
        assert.ok(done);
        assert.equal(events.map((e) => e.choices[0].text).join(''), ONCE.text);
        const again = await curl(`${srv.url}/v1/completions`, {
            body: { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0 },
        });
        assert.equal(again.status, 200, show(again));
        assert.equal(again.json.choices[0].text, ONCE.text);
    });
});

describe('queue over --max-queue-len', () => {
    let srv;
    before(async () => {
        // max-queue-len counts sequences (issue 34): one request of QUEUE_N samples fills it
        srv = await startServer(['--max-queue-len', String(QUEUE_N), '--max-num-seqs', String(QUEUE_N)]);
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('answers 503 with Retry-After and an error object; accepted requests complete', T(30000), async () => {
        // Each request runs QUEUE_N sequences of 480 tokens (about a second on the CPU
        // backend) and fills every sequence slot and the queue; most of these 8 simultaneous
        // requests find the queue full.
        const body = { model: srv.model, prompt: '', max_tokens: 480, n: QUEUE_N, ignore_eos: true, temperature: 1, seed: 1 };
        const results = await Promise.all(Array.from({ length: 8 }, () => postJSON(`${srv.url}/v1/completions`, body)));
        const statuses = results.map((r) => r.status);
        const full = results.filter((r) => r.status === 503);
        const ok = results.filter((r) => r.status === 200);
        assert.ok(full.length >= 1, `no 503 among ${statuses}`);
        assert.ok(ok.length >= 1, `no 200 among ${statuses}`);
        assert.equal(full.length + ok.length, results.length, `statuses ${statuses}`);
        for (const r of full) {
            const ra = r.headers.get('retry-after');
            assert.ok(ra !== null && /^\d+$/.test(ra), `Retry-After: ${ra}`);
            assertErrorShape(r.json, '503');
        }
        for (const r of ok) assert.equal(r.json.usage.completion_tokens, QUEUE_N * 480, show(r));
        // And once the queue drains, the server answers again.
        await sleep(50);
        const again = await curl(`${srv.url}/v1/completions`, {
            body: { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0 },
        });
        assert.equal(again.status, 200, show(again));
        assert.equal(again.json.choices[0].text, ONCE.text);
    });

    it('a burst beyond the queue gets 503 + Retry-After within a second; the admitted request finishes; then it recovers', T(30000), async () => {
        // The queue is taken by a long streaming request (QUEUE_N x 480 tokens),
        // admitted for sure once its first chunk arrived; a burst of 32 then finds the queue full.
        const long = { model: srv.model, prompt: '', max_tokens: 480, n: QUEUE_N, ignore_eos: true, temperature: 1, seed: 2 };
        const res = await fetch(`${srv.url}/v1/completions`, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ ...long, stream: true, stream_options: { include_usage: true } }),
            signal: AbortSignal.timeout(scaled(20000)),
        });
        assert.equal(res.status, 200);
        let usage = null;
        let first;
        const gotFirst = new Promise((r) => (first = r));
        const holder = readSSE(res, (data) => {
            first();
            if (data !== '[DONE]' && JSON.parse(data).usage) usage = JSON.parse(data).usage;
            return false;
        });
        await gotFirst;
        const burst = await Promise.all(Array.from({ length: 32 }, async () => {
            const t0 = performance.now();
            const r = await postJSON(`${srv.url}/v1/completions`, { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0 });
            return { ...r, ms: performance.now() - t0 };
        }));
        const holderDone = holder.then(() => performance.now());
        const burstDone = performance.now();
        for (const r of burst) {
            assert.equal(r.status, 503, show(r));
            assert.match(r.headers.get('retry-after') ?? '', /^\d+$/, 'Retry-After');
            assertErrorShape(r.json, '503 (burst)');
            assert.ok(r.ms < scaled(1000), `a 503 took ${r.ms.toFixed(0)} ms`);
        }
        // The admitted request was not disturbed: it finishes whole, after the burst's answers.
        assert.ok(await holderDone > burstDone, 'the burst was answered while the admitted request ran');
        assert.equal(usage?.completion_tokens, QUEUE_N * 480, `admitted request: usage ${JSON.stringify(usage)}`);
        const again = await postJSON(`${srv.url}/v1/completions`, { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0 });
        assert.equal(again.status, 200, show(again));
        assert.equal(again.json.choices[0].text, ONCE.text);
        const max = Math.max(...burst.map((r) => r.ms));
        console.log(`overload: 32 x 503 in at most ${max.toFixed(1)} ms each`);
    });

    it('a request sent on the previous answer finds its seats free', T(30000), async () => {
        // Each request takes every seat of the queue; the server frees them before the
        // client can read the end of its answer, so the next one is admitted (the next
        // test's streaming request is sent the same way).
        for (let i = 0; i < 40; i++) {
            const r = await postJSON(`${srv.url}/v1/completions`, { model: srv.model, prompt: ONCE.prompt, max_tokens: 1, n: QUEUE_N, temperature: 1, seed: i });
            assert.equal(r.status, 200, `request ${i}: ${show(r)}`);
        }
    });

    it('a 503 through curl has Retry-After too', T(30000), async () => {
        // A streaming request of QUEUE_N sequences fills the queue, surely once its first chunk
        // arrived (a fixed wait was not enough on a loaded machine).
        const stop = await holdQueue(srv, { prompt: '', max_tokens: 480, n: QUEUE_N, ignore_eos: true, temperature: 1, seed: 1 });
        try {
            const r = await curl(`${srv.url}/v1/completions`, { body: { model: srv.model, prompt: ONCE.prompt, max_tokens: 4 } });
            assert.equal(r.status, 503, show(r));
            assert.match(r.headers['retry-after'] ?? '', /^\d+$/);
            assertErrorShape(r.json, '503 (curl)');
        } finally {
            await stop();
        }
    });
});

// Issue 34, item 5: max-queue-len counts sequences (prompts x best_of), not HTTP requests, and
// max-seqs-per-request caps one request, so a single 1 MB request cannot occupy the engine.
describe('admission by sequences', () => {
    let srv;
    const QUEUE = 6;
    const PER_REQUEST = 4;
    before(async () => {
        srv = await startServer(['--max-queue-len', String(QUEUE), '--max-seqs-per-request', String(PER_REQUEST)]);
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });
    const post = (body) => postJSON(`${srv.url}/v1/completions`, { model: srv.model, max_tokens: 2, ...body });

    it('a request of more sequences than max-seqs-per-request -> 400 naming the field', T(), async () => {
        for (const [body, param] of [
            [{ prompt: 'Hi', n: 5 }, 'n'],
            [{ prompt: ['a', 'b', 'c'], n: 2 }, 'n'],
            [{ prompt: 'Hi', n: 1, best_of: 5 }, 'best_of'],
            [{ prompt: ['a', 'b', 'c', 'd', 'e'] }, 'prompt'],
        ]) {
            const r = await post(body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${show(r)}`);
            assertErrorShape(r.json, JSON.stringify(body));
            assert.equal(r.json.error.param, param, show(r));
            assert.match(r.json.error.message, /max-seqs-per-request \(4\)/, show(r));
        }
        // exactly the cap is served
        const ok = await post({ prompt: ['a', 'b'], n: 2, temperature: 0 });
        assert.equal(ok.status, 200, show(ok));
        assert.equal(ok.json.choices.length, 4);
    });

    it('a 1 MB request of many prompts is refused at once', T(), async () => {
        // 200000 one-token prompts: before the cap, 200000 sequences queued in the engine
        const body = { model: srv.model, prompt: Array.from({ length: 200000 }, () => [1]), max_tokens: 400 };
        const t0 = Date.now();
        const r = await postJSON(`${srv.url}/v1/completions`, body);
        const ms = Date.now() - t0;
        assert.equal(r.status, 400, show(r));
        assert.equal(r.json.error.param, 'prompt');
        assert.ok(ms < scaled(2000), `answered after ${ms} ms`);
        const m = await curl(`${srv.url}/metrics`);
        assert.match(m.text, /pagellm:num_requests_waiting\{[^}]*\} 0\b/, 'nothing was queued');
    });

    it('max-queue-len counts sequences, not requests', T(30000), async () => {
        // A streaming request of 4 sequences holds 4 of the 6 places...
        const stop = await holdQueue(srv, { prompt: '', max_tokens: 480, n: 4, ignore_eos: true, temperature: 1, seed: 4 });
        try {
            // ...so 3 more do not fit (one HTTP request, but 4 + 3 > 6 sequences)...
            const full = await post({ prompt: 'Hi', n: 3 });
            assert.equal(full.status, 503, show(full));
            assert.match(full.headers.get('retry-after') ?? '', /^\d+$/);
            assertErrorShape(full.json, '503');
            // ...and 2 do.
            const fits = await post({ prompt: 'Hi', n: 2, temperature: 0 });
            assert.equal(fits.status, 200, show(fits));
        } finally {
            await stop();
        }
    });

    it('a request above max-queue-len can never be admitted: 400, not 503', T(), async () => {
        const q = await startServer(['--max-queue-len', '2']);
        try {
            const r = await postJSON(`${q.url}/v1/completions`, { model: q.model, prompt: 'Hi', max_tokens: 2, n: 3 });
            assert.equal(r.status, 400, show(r));
            assert.equal(r.json.error.param, 'n');
            assert.match(r.json.error.message, /max-queue-len \(2\)/, show(r));
        } finally {
            await q.stop();
        }
    });
});
