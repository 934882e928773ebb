// disconnect.test.mjs - a client that goes away mid-stream aborts its request: /metrics
// shows nothing running and no KV block in use within a second. The same for a client that
// leaves a non-streaming request (issue 34, item 5: its connection is suspended until the
// whole answer is ready, so only server.c's watcher notices it). A client that sends part of
// a body and closes at once frees its connection within seconds, not at request-timeout.

import { describe, it, before, after } from 'node:test';
import { readdirSync } from 'node:fs';
import net from 'node:net';
import assert from 'node:assert/strict';
import { startServer, rawRequest, readSSE, scrape, scrapeUntil, promValue, sleep, T, scaled } from './server.mjs';

// A small KV pool, so one sequence's blocks are a visible share of it.
const BLOCKS = 64;

// Idle: nothing running, waiting or swapped, no block in use on either pool, and
// done(prom) (the aborted request counted).
async function waitIdle(srv, ms, done = () => true) {
    const deadline = Date.now() + scaled(ms);
    let prom;
    for (;;) {
        prom = await scrape(srv);
        const running = promValue(prom, 'pagellm:num_requests_running');
        const waiting = promValue(prom, 'pagellm:num_requests_waiting');
        const swapped = promValue(prom, 'pagellm:num_requests_swapped');
        const usage = promValue(prom, 'pagellm:gpu_cache_usage_perc');
        const cpuUsage = promValue(prom, 'pagellm:cpu_cache_usage_perc');
        if (running === 0 && waiting === 0 && swapped === 0 && usage === 0 && cpuUsage === 0 && done(prom)) return { ok: true, prom };
        if (Date.now() > deadline) return { ok: false, prom, running, waiting, swapped, usage, cpuUsage };
        await sleep(20);
    }
}

describe('client disconnect', () => {
    let srv;
    before(async () => {
        srv = await startServer(['--num-gpu-blocks-override', String(BLOCKS)]);
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    // The request runs n sequences of 480 tokens (about a second for n = 8 on the CPU
    // backend); the client reads `readChunks` SSE chunks, checks the request holds blocks,
    // and goes away. With n = 16 and 64 blocks of 16 tokens, the sequences outgrow the pool
    // after 64 tokens each, so some are preempted (swapped out) when the client leaves.
    for (const [n, readChunks, preempted] of [[8, 3, false], [16, 16 * 100, true]]) {
        const what = preempted ? 'with sequences swapped out' : 'early';
        it(`aborting a streaming request (n=${n}) mid-stream ${what} frees its blocks within a second`, T(20000), async () => {
            const m0 = await scrape(srv);
            const abortsBefore = promValue(m0, 'pagellm:request_success_total', { finished_reason: 'abort' }) ?? 0;
            const ac = new AbortController();
            const res = await fetch(`${srv.url}/v1/completions`, {
                method: 'POST',
                headers: { 'Content-Type': 'application/json' },
                body: JSON.stringify({ model: srv.model, prompt: '', max_tokens: 480, ignore_eos: true,
                                       temperature: 1, seed: 7, n, stream: true }),
                signal: ac.signal,
            });
            assert.equal(res.status, 200);
            let chunks = 0;
            let sawDone = false;
            let during;
            try {
                await readSSE(res, (data) => {
                    if (data === '[DONE]') sawDone = true;
                    return ++chunks >= readChunks;
                });
                // Mid-stream the request holds blocks.
                during = await scrape(srv);
            } finally {
                ac.abort();
            }
            const t0 = Date.now();
            assert.ok(!sawDone && chunks >= readChunks, `the request finished before the client went away (${chunks} chunks)`);
            assert.ok(promValue(during, 'pagellm:num_requests_running') >= 1, 'running while streaming');
            assert.ok(promValue(during, 'pagellm:gpu_cache_usage_perc') > 0, 'blocks in use while streaming');
            if (preempted) {
                const p = promValue(during, 'pagellm:num_preemptions_total') - promValue(m0, 'pagellm:num_preemptions_total');
                assert.ok(p > 0, `no preemption before the disconnect (${chunks} chunks read)`);
            }

            const abortsOf = (p) => promValue(p, 'pagellm:request_success_total', { finished_reason: 'abort' }) ?? 0;
            const idle = await waitIdle(srv, 1000, (p) => abortsOf(p) > abortsBefore);
            assert.ok(idle.ok, `1 s after the disconnect: num_requests_running ${idle.running}, ` +
                               `num_requests_waiting ${idle.waiting}, num_requests_swapped ${idle.swapped}, ` +
                               `gpu_cache_usage_perc ${idle.usage}, cpu_cache_usage_perc ${idle.cpuUsage}, ` +
                               `request_success_total{finished_reason="abort"} +${abortsOf(idle.prom) - abortsBefore}`);
            assert.equal(abortsOf(idle.prom) - abortsBefore, 1,
                         'pagellm:request_success_total{finished_reason="abort"} counts the aborted request');
            const gen = promValue(idle.prom, 'pagellm:generation_tokens_total') - promValue(m0, 'pagellm:generation_tokens_total');
            assert.ok(gen < 480 * n, `generation stopped early (${gen} tokens of ${480 * n}), freed after ${Date.now() - t0} ms`);
        });
    }

    // Issue 34, item 5: a non-streaming request of 64 samples x 400 tokens (seconds of work
    // on the CPU backend) whose client goes away is aborted, not run to its end.
    it('aborting a non-streaming request (n=64, max_tokens=400) frees its blocks within a second', T(30000), async () => {
        const m0 = await scrape(srv);
        const abortsOf = (p) => promValue(p, 'pagellm:request_success_total', { finished_reason: 'abort' }) ?? 0;
        const abortsBefore = abortsOf(m0);
        const ac = new AbortController();
        const pending = fetch(`${srv.url}/v1/completions`, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ model: srv.model, prompt: '', max_tokens: 400, ignore_eos: true,
                                   temperature: 1, seed: 11, n: 64 }),
            signal: ac.signal,
        }).then((r) => ({ status: r.status }), (err) => ({ err }));
        // Wait until it runs and holds blocks, then go away.
        const during = await scrapeUntil(srv, (p) => promValue(p, 'pagellm:num_requests_running') >= 1 &&
                                          promValue(p, 'pagellm:gpu_cache_usage_perc') > 0, 5000);
        assert.ok(promValue(during, 'pagellm:num_requests_running') >= 1, 'the request never ran');
        ac.abort();
        const t0 = Date.now();
        const got = await pending;
        assert.ok(got.err, `the request finished before the client went away: ${JSON.stringify(got)}`);
        const idle = await waitIdle(srv, 1000, (p) => abortsOf(p) > abortsBefore);
        assert.ok(idle.ok, `1 s after the disconnect: num_requests_running ${idle.running}, ` +
                           `num_requests_waiting ${idle.waiting}, num_requests_swapped ${idle.swapped}, ` +
                           `gpu_cache_usage_perc ${idle.usage}, cpu_cache_usage_perc ${idle.cpuUsage}, ` +
                           `aborts +${abortsOf(idle.prom) - abortsBefore}`);
        assert.equal(abortsOf(idle.prom) - abortsBefore, 1, 'the abandoned request is counted as aborted');
        const gen = promValue(idle.prom, 'pagellm:generation_tokens_total') - promValue(m0, 'pagellm:generation_tokens_total');
        assert.ok(gen < 400 * 64, `generation stopped early (${gen} tokens of ${400 * 64}), freed after ${Date.now() - t0} ms`);
        // and the server serves the next request
        const res = await fetch(`${srv.url}/v1/completions`, {
            method: 'POST', headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ model: srv.model, prompt: 'Lily and Tom', max_tokens: 8, temperature: 0 }),
        });
        assert.equal(res.status, 200);
        assert.equal((await res.json()).choices[0].text, ' were playing in the par');
    });

    // A client that keeps its connection open but never reads: the server must not buffer
    // its stream without bound nor let it hold KV blocks; it aborts the request (the SSE
    // buffer limit is 4 MiB; 128 samples x 500 tokens with logprobs make about 40 MB, more than the kernel's socket buffers hold) and keeps
    // serving others.
    it('a streaming client that never reads is aborted, and others are still served', T(30000), async () => {
        const m0 = await scrape(srv);
        // finished requests of any reason: with n = 128 the oldest sample may end by length
        // before the rest are aborted, and the request is reported by its first sample
        const doneOf = (p) => ['stop', 'length', 'abort'].reduce(
            (sum, r) => sum + (promValue(p, 'pagellm:request_success_total', { finished_reason: r }) ?? 0), 0);
        const body = JSON.stringify({ model: srv.model, prompt: 'Once upon a time', max_tokens: 500,
                                      n: 128, logprobs: 5, ignore_eos: true, stream: true });
        const sock = net.connect({ host: '127.0.0.1', port: srv.port });
        await new Promise((resolve) => sock.once('connect', resolve));
        sock.pause(); // never read
        sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                   `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
        try {
            const idle = await waitIdle(srv, 20000, (p) => doneOf(p) > doneOf(m0));
            assert.ok(idle.ok, `the unread request still runs: running ${idle.running}, waiting ${idle.waiting}, ` +
                               `swapped ${idle.swapped}, usage ${idle.usage}`);
            const gen = promValue(idle.prom, 'pagellm:generation_tokens_total') - promValue(m0, 'pagellm:generation_tokens_total');
            assert.ok(gen < 500 * 128, `generation stopped early (${gen} of ${500 * 128} tokens)`);
            const res = await fetch(`${srv.url}/v1/completions`, {
                method: 'POST', headers: { 'Content-Type': 'application/json' },
                body: JSON.stringify({ model: srv.model, prompt: 'Lily and Tom', max_tokens: 8, temperature: 0 }),
            });
            assert.equal(res.status, 200);
            assert.equal((await res.json()).choices[0].text, ' were playing in the par');
        } finally {
            sock.destroy();
        }
    });
    // libmicrohttpd (epoll) misses such a close; server.c's watcher shuts the socket a second
    // after the client's FIN. Counted in the server's open descriptors (Linux /proc).
    it('clients that send half a body and close at once free their connections', T(30000), async () => {
        const fds = () => readdirSync(`/proc/${srv.proc.pid}/fd`).length;
        const before = fds();
        const [head, body] = rawRequest({ model: srv.model, prompt: 'Once upon a time', max_tokens: 64 });
        await Promise.all(Array.from({ length: 40 }, () => new Promise((resolve) => {
            const sock = net.connect({ host: '127.0.0.1', port: srv.port });
            sock.on('error', resolve);
            sock.on('close', resolve);
            // the part of the body and the FIN back to back: libmicrohttpd then misses the FIN
            sock.on('connect', () => {
                sock.write(Buffer.concat([head, body.subarray(0, body.length >> 1)]));
                sock.destroy();
            });
        })));
        await sleep(200);
        const held = fds() - before; // how many libmicrohttpd still holds (it varies by timing)
        const deadline = Date.now() + scaled(5000);
        while (fds() > before && Date.now() < deadline) await sleep(50);
        assert.ok(fds() <= before, `${fds() - before} of 40 connections still open after ` +
                                   `${scaled(5000)} ms (${held} 200 ms after the clients left)`);
        const res = await fetch(`${srv.url}/v1/completions`, {
            method: 'POST', headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ model: srv.model, prompt: 'Lily and Tom', max_tokens: 8, temperature: 0 }),
        });
        assert.equal(res.status, 200);
    });
});
