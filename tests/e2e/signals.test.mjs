// signals.test.mjs - SIGTERM while requests are in flight: the server exits 0, a request
// admitted before the signal gets its whole answer, one that races the signal a 503 or a
// clean connection close (no reset, no hang).
// A second SIGTERM during the drain exits at once; SIGINT on an idle server exits 0 too.
// While it drains, GET /health answers 503 (issue 34, item 7), so a load balancer stops
// sending, and new completions get 503; the request in flight still finishes whole, and so
// does an answer the engine has finished but a slow client has not yet read.

import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, rawRequest, readSSE, postJSON, scrape, scrapeUntil, promValue, assertErrorShape, sleep, T, scaled } from './server.mjs';

const EXIT_WITHIN_MS = scaled(10000);

/** How an error thrown while reading a response ended: a clean close (the server closed the
 * connection: FIN, "other side closed") is fine; a reset is not. */
function closeKind(err) {
    const chain = [];
    for (let e = err; e; e = e.cause) chain.push(`${e.name}: ${e.code ?? ''} ${e.message}`);
    const text = chain.join(' <- ');
    if (/ECONNRESET|EPIPE/.test(text)) return { clean: false, text };
    if (/other side closed|terminated|UND_ERR_SOCKET|ECONNREFUSED/.test(text)) return { clean: true, text };
    return { clean: false, text };
}

async function exitsWithin(srv, ms) {
    const timer = sleep(ms).then(() => 'timeout');
    const r = await Promise.race([srv.exited, timer]);
    if (r === 'timeout') {
        srv.signal('SIGKILL');
        return { timedOut: true };
    }
    return r;
}

/** Requests the engine has finished (any finish reason but abort), from /metrics. */
const finished = (p) => ['stop', 'length'].reduce(
    (sum, r) => sum + (promValue(p, 'pagellm:request_success_total', { finished_reason: r }) ?? 0), 0);

/** Send, on a raw socket that reads nothing until resumed, a request for 32 samples x 480
 * tokens with 20 top logprobs each: an answer of about 8 MB, far more than the kernel's socket
 * buffers hold, so the server is still writing it while the client does not read. Returns the
 * socket once the engine has finished the request. */
async function unreadAnswer(srv) {
    const m0 = await scrape(srv);
    const sock = net.connect({ host: '127.0.0.1', port: srv.port });
    sock.pause();
    await new Promise((resolve, reject) => {
        sock.once('connect', resolve);
        sock.once('error', reject);
    });
    sock.write(Buffer.concat(rawRequest({ model: srv.model, prompt: '', max_tokens: 480, n: 32, logprobs: 20,
                                          ignore_eos: true, temperature: 1, seed: 7 }, 'Connection: close\r\n')));
    const m1 = await scrapeUntil(srv, (p) => finished(p) > finished(m0), 20000);
    if (finished(m1) <= finished(m0)) {
        sock.destroy();
        assert.fail('the request did not finish in the engine');
    }
    return sock;
}

describe('signals', () => {
    it('SIGTERM with requests in flight: exit 0; the admitted stream ends whole', T(30000), async () => {
        const srv = await startServer();
        try {
            const body = { model: srv.model, prompt: '', max_tokens: 480, ignore_eos: true, temperature: 0 };
            // A non-streaming request...
            const plain = postJSON(`${srv.url}/v1/completions`, body, { timeoutMs: EXIT_WITHIN_MS + 5000 })
                .then((r) => ({ r }), (err) => ({ err }));
            await sleep(20);
            // ...and a streaming one, read until its first chunk arrives; then SIGTERM.
            const res = await fetch(`${srv.url}/v1/completions`, {
                method: 'POST',
                headers: { 'Content-Type': 'application/json' },
                body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
                signal: AbortSignal.timeout(EXIT_WITHIN_MS + 5000),
            });
            assert.equal(res.status, 200);
            let first = true;
            let sigSent = false;
            let done = false;
            let usage = null;
            const stream = readSSE(res, (data) => {
                if (data === '[DONE]') {
                    done = true;
                    return false;
                }
                const ev = JSON.parse(data);
                if (ev.usage) usage = ev.usage;
                if (first) {
                    first = false;
                    srv.signal('SIGTERM');
                    sigSent = true;
                }
                return false;
            }).then(() => ({}), (err) => ({ err }));

            // the stream was admitted before the signal: the drain lets it end whole
            const s = await stream;
            assert.ok(sigSent, 'no chunk arrived before the stream ended');
            assert.ok(!s.err, `the stream was cut: ${s.err && closeKind(s.err).text}`);
            assert.ok(done, 'the stream ended without [DONE]');
            assert.equal(usage?.completion_tokens, 480, `the stream is complete: usage ${JSON.stringify(usage)}`);

            const p = await plain;
            if (p.err) {
                const k = closeKind(p.err);
                assert.ok(k.clean, `non-streaming client: not a clean close: ${k.text}`);
            } else {
                assert.ok([200, 503].includes(p.r.status), `non-streaming client got ${p.r.status}: ${p.r.text.slice(0, 300)}`);
                if (p.r.status === 200) assert.equal(p.r.json.usage.completion_tokens, 480, 'complete answer');
            }

            const e = await exitsWithin(srv, EXIT_WITHIN_MS);
            assert.ok(!e.timedOut, `the server did not exit within ${EXIT_WITHIN_MS} ms of SIGTERM`);
            assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null },
                             `exit after SIGTERM; its output:\n${srv.log().slice(-2000)}`);
        } finally {
            await srv.stop(1000);
        }
    });

    it('a second SIGTERM during the drain exits at once (status 1)', T(30000), async () => {
        const srv = await startServer();
        try {
            // 128 samples x 480 tokens: seconds of work, so the drain is still waiting for it
            // when the second signal comes.
            const plain = postJSON(`${srv.url}/v1/completions`, { model: srv.model, prompt: '', max_tokens: 480, n: 128,
                                                                  ignore_eos: true, temperature: 1, seed: 5 })
                .then((r) => ({ r }), (err) => ({ err }));
            await scrapeUntil(srv, (p) => promValue(p, 'pagellm:num_requests_running') >= 1, 5000);
            // The second signal goes once the server says it drains (two signals sent before
            // the first is handled would merge into one).
            const draining = new Promise((resolve, reject) => {
                const look = () => /shutting down: (\d+) requests in flight/.exec(srv.log());
                srv.proc.stderr.on('data', () => look() && resolve(look()));
                srv.exited.then((e) => reject(new Error(`exited before draining: ${JSON.stringify(e)}:\n${srv.log()}`)));
                if (look()) resolve(look());
            });
            srv.signal('SIGTERM');
            const m = await draining;
            assert.ok(Number(m[1]) >= 1, `nothing in flight when the drain began: ${m[0]}`);
            srv.signal('SIGTERM');
            const t1 = Date.now();
            const e = await exitsWithin(srv, EXIT_WITHIN_MS);
            const ms = Date.now() - t1;
            assert.ok(!e.timedOut, 'no exit after the second SIGTERM');
            assert.deepEqual({ code: e.code, signal: e.signal }, { code: 1, signal: null }, srv.log().slice(-2000));
            assert.ok(ms < scaled(1000), `exit ${ms} ms after the second SIGTERM`);
            const p = await plain;
            assert.ok(p.err || p.r.status !== 200, 'the request finished: the second signal did not cut the drain short');
        } finally {
            await srv.stop(1000);
        }
    });

    it('while draining, /health answers 503 and the request in flight finishes', T(30000), async () => {
        // one CPU thread and 64 samples x 480 tokens: about a second of work even on a fast
        // machine, so the drain is still waiting for it when /health is asked
        const srv = await startServer(['--cpu-threads', '1']);
        try {
            const plain = postJSON(`${srv.url}/v1/completions`, { model: srv.model, prompt: '', max_tokens: 480, n: 64,
                                                                  ignore_eos: true, temperature: 1, seed: 6 },
                                   { timeoutMs: EXIT_WITHIN_MS + 20000 })
                .then((r) => ({ r }), (err) => ({ err }));
            await scrapeUntil(srv, (p) => promValue(p, 'pagellm:num_requests_running') >= 1, 5000);
            const before = await fetch(`${srv.url}/health`);
            assert.equal(before.status, 200);
            const draining = new Promise((resolve, reject) => {
                const look = () => /shutting down: (\d+) requests in flight/.exec(srv.log());
                srv.proc.stderr.on('data', () => look() && resolve(look()));
                srv.exited.then((e) => reject(new Error(`exited before draining: ${JSON.stringify(e)}`)));
                if (look()) resolve(look());
            });
            srv.signal('SIGTERM');
            const m = await draining;
            assert.ok(Number(m[1]) >= 1, `nothing in flight when the drain began: ${m[0]}`);
            const h = await fetch(`${srv.url}/health`);
            const hj = await h.json();
            assert.equal(h.status, 503, `GET /health while draining: ${h.status} ${JSON.stringify(hj)}`);
            assertErrorShape(hj, '/health while draining');
            const c = await postJSON(`${srv.url}/v1/completions`, { model: srv.model, prompt: 'Hi', max_tokens: 2 });
            assert.equal(c.status, 503, `a completion while draining: ${c.status}`);
            const p = await plain;
            assert.ok(!p.err, `the request in flight was cut: ${p.err}`);
            assert.equal(p.r.status, 200, p.r.text?.slice(0, 300));
            assert.equal(p.r.json.usage.completion_tokens, 64 * 480, 'complete answer');
            const e = await exitsWithin(srv, EXIT_WITHIN_MS);
            assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null }, srv.log().slice(-2000));
        } finally {
            await srv.stop(1000);
        }
    });

    it('an answer generated but not yet read when SIGTERM comes still arrives whole', T(60000), async () => {
        // the server is still writing the answer (see unreadAnswer) while the client reads
        // nothing; the drain must wait for it rather than close the connection
        const srv = await startServer();
        let sock;
        try {
            sock = await unreadAnswer(srv);

            let exited = false;
            srv.exited.then(() => { exited = true; });
            srv.signal('SIGTERM');
            await sleep(scaled(1000));
            assert.ok(!exited, `the server exited with an answer unsent:\n${srv.log().slice(-2000)}`);

            const chunks = [];
            sock.on('data', (d) => chunks.push(d));
            const ended = new Promise((resolve) => sock.once('close', resolve));
            sock.resume();
            await ended;
            const raw = Buffer.concat(chunks);
            const split = raw.indexOf('\r\n\r\n');
            const head = raw.subarray(0, split).toString();
            assert.match(head, /^HTTP\/1\.1 200/, head);
            const length = Number(/content-length: *(\d+)/i.exec(head)?.[1]);
            const got = raw.length - split - 4;
            assert.equal(got, length, `the answer was cut: ${got} of ${length} bytes`);
            const json = JSON.parse(raw.subarray(split + 4).toString());
            assert.equal(json.usage.completion_tokens, 32 * 480, 'complete answer');

            const e = await exitsWithin(srv, EXIT_WITHIN_MS);
            assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null }, srv.log().slice(-2000));
        } finally {
            sock?.destroy();
            await srv.stop(1000);
        }
    });

    it('a client that never reads its answer holds the drain no longer than the grace', T(60000), async () => {
        // the grace is request-timeout (2 s here); the answer (as above) cannot all be sent
        const srv = await startServer(['--request-timeout', '2']);
        let sock;
        try {
            sock = await unreadAnswer(srv);
            const t0 = Date.now();
            srv.signal('SIGTERM');
            const e = await exitsWithin(srv, EXIT_WITHIN_MS);
            const ms = Date.now() - t0;
            assert.ok(!e.timedOut, `no exit ${EXIT_WITHIN_MS} ms after SIGTERM:\n${srv.log().slice(-2000)}`);
            assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null }, srv.log().slice(-2000));
            // without the wait the exit comes within milliseconds; the grace ends about 2 s after
            // the answer's last write, which came just before SIGTERM
            assert.ok(ms >= 500, `exit ${ms} ms after SIGTERM: the drain did not wait`);
        } finally {
            sock?.destroy();
            await srv.stop(1000);
        }
    });

    it('SIGINT on an idle server: exit 0', T(20000), async () => {
        const srv = await startServer();
        try {
            srv.signal('SIGINT');
            const e = await exitsWithin(srv, EXIT_WITHIN_MS);
            assert.ok(!e.timedOut, `the server did not exit within ${EXIT_WITHIN_MS} ms of SIGINT`);
            assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null },
                             `exit after SIGINT; its output:\n${srv.log().slice(-2000)}`);
        } finally {
            await srv.stop(1000);
        }
    });
});
