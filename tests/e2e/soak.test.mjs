// soak.test.mjs - a few thousand requests from many concurrent clients, a fifth of which go
// away at a random point, against one real server on the bundled model (loopback only).
//
// Afterwards /metrics must show nothing running, waiting or swapped and every KV block free
// (pagellm:num_free_gpu_blocks == pagellm:num_gpu_blocks, the same for the CPU pool, and
// gpu_cache_usage_perc 0); the server's RSS (VmRSS) must not have grown by more than
// RSS_BOUND_MIB between the end of a warm-up phase and the end; every request that was not
// abandoned must have got a well-formed 200 whose greedy text equals golden.json; and the
// server must exit 0 on SIGTERM (under ASan this is also LeakSanitizer's verdict).
//
// Bounds: REQUESTS (default 12000, PAGELLM_SOAK_REQUESTS overrides) from CLIENTS = 48
// concurrent workers take 15-25 s on 2 CPU cores in the normal build (about 6000
// requests in 8 s measured) and 56-78 s under ASan; the test's limit is 120 s (times
// PAGELLM_E2E_SLOW). The abandoned fifth is split evenly over four
// points: before the headers are complete, before the body is complete, right after the
// whole request (a 400-token prompt, streaming: the client is gone during prefill) and
// mid-stream (after 1-30 SSE chunks of a 300-token stream). The random choices come from a
// seeded generator; the seed is printed and PAGELLM_SOAK_SEED replays a run.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { startServer, rawRequest, readSSE, parseSSE, scrape, promValue, assertCompletionShape, GOLDEN, rng, sleep, T, scaled } from './server.mjs';

const REQUESTS = Number(process.env.PAGELLM_SOAK_REQUESTS) || 12000;
const WARMUP = Math.round(REQUESTS / 6); // requests before the first RSS reading
const CLIENTS = 48;
const BLOCKS = 512; // a pool small enough that blocks are reused many times over
const RSS_BOUND_MIB = 24; // allowed VmRSS growth from after the warm-up to the end
const SEED = Number(process.env.PAGELLM_SOAK_SEED) || (Date.now() % 1000000);


const vmRSSkB = (pid) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);
const isAsan = (pid) => /libasan|libclang_rt\.asan/.test(readFileSync(`/proc/${pid}/maps`, 'utf8'));

/** Connect, write `bytes`, and once `untilChunks` SSE events arrived (0: at once after the
 * write), destroy the socket. Resolves to how many events had arrived. */
function abandon(port, bytes, untilChunks = 0) {
    return new Promise((resolve) => {
        const sock = net.connect({ host: '127.0.0.1', port });
        let seen = 0;
        let text = '';
        const quit = () => {
            sock.destroy();
            resolve(seen);
        };
        sock.on('error', () => resolve(seen)); // going away anyway; the checks come afterwards
        sock.on('close', () => resolve(seen));
        sock.on('data', (d) => {
            text += d.toString('latin1');
            seen = (text.match(/\ndata: /g) || []).length; // each event follows a chunk-size line
            if (untilChunks > 0 && seen >= untilChunks) quit();
        });
        sock.on('connect', () => sock.write(bytes, () => (untilChunks > 0 ? null : quit())));
    });
}

/** A well-behaved client: a golden prompt, streaming or not. Returns null or what is wrong. */
async function goodRequest(srv, g, stream) {
    const body = { model: srv.model, prompt: g.prompt, max_tokens: g.max_tokens, temperature: 0 };
    if (stream) Object.assign(body, { stream: true, stream_options: { include_usage: true } });
    const res = await fetch(`${srv.url}/v1/completions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(scaled(60000)),
    });
    if (res.status !== 200) return `status ${res.status}: ${(await res.text()).slice(0, 300)}`;
    const usageWant = { prompt_tokens: g.prompt_ids.length, completion_tokens: g.completion_ids.length,
                        total_tokens: g.prompt_ids.length + g.completion_ids.length };
    if (!stream) {
        const json = await res.json();
        assertCompletionShape(json, srv.model);
        const c = json.choices[0];
        if (json.choices.length !== 1 || c.text !== g.text || c.finish_reason !== g.finish_reason)
            return `body ${JSON.stringify(json).slice(0, 300)}, want text ${JSON.stringify(g.text)}`;
        assert.deepEqual(json.usage, usageWant);
        return null;
    }
    if (!/^text\/event-stream/.test(res.headers.get('content-type') ?? '')) return 'not an event stream';
    const { events, done, afterDone } = parseSSE(await readSSE(res));
    if (!done || afterDone) return `stream without a final [DONE] (done ${done}, after ${afterDone})`;
    const usage = events.at(-1);
    const chunks = events.slice(0, -1);
    const text = chunks.map((e) => e.choices[0]?.text ?? '').join('');
    const finish = chunks.at(-1)?.choices[0]?.finish_reason;
    if (text !== g.text || finish !== g.finish_reason)
        return `stream text ${JSON.stringify(text)} (${finish}), want ${JSON.stringify(g.text)}`;
    if (new Set(chunks.map((e) => e.id)).size !== 1) return 'chunks with different ids';
    assert.deepEqual(usage.usage, usageWant);
    return null;
}

describe('soak', () => {
    let srv;
    before(async () => {
        srv = await startServer(['--num-gpu-blocks-override', String(BLOCKS)]);
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it(`${REQUESTS} requests from ${CLIENTS} clients, a fifth abandoned: no block, request or memory left behind`, T(120000), async () => {
        const random = rng(SEED);
        const longPrompt = Array.from({ length: 400 }, (_, i) => 1 + ((i * 37) % 500));
        const counts = { good: 0, beforeHeaders: 0, beforeBody: 0, duringPrefill: 0, midStream: 0 };
        const wrong = [];
        const t0 = Date.now();
        let next = 0;
        const one = async (i) => {
            const r = random();
            if (r >= 0.2) {
                counts.good++;
                const g = GOLDEN[Math.floor(random() * GOLDEN.length)];
                const why = await goodRequest(srv, g, random() < 0.5).catch((e) => String(e));
                if (why) wrong.push(`request ${i} (${JSON.stringify(g.prompt)}): ${why}`);
                return;
            }
            const kind = Math.floor(r / 0.05); // 0..3, a quarter of the fifth each
            const cut = random();
            if (kind === 0) {
                counts.beforeHeaders++;
                const [head] = rawRequest({ model: srv.model, prompt: 'Once upon a time' });
                await abandon(srv.port, head.subarray(0, 1 + Math.floor(cut * (head.length - 2))));
            } else if (kind === 1) {
                counts.beforeBody++;
                const [head, body] = rawRequest({ model: srv.model, prompt: 'Once upon a time', max_tokens: 64 });
                await abandon(srv.port, Buffer.concat([head, body.subarray(0, Math.floor(cut * (body.length - 1)))]));
            } else if (kind === 2) {
                counts.duringPrefill++;
                const [head, body] = rawRequest({ model: srv.model, prompt: longPrompt, max_tokens: 100,
                                                  ignore_eos: true, stream: true });
                await abandon(srv.port, Buffer.concat([head, body]));
            } else {
                counts.midStream++;
                const [head, body] = rawRequest({ model: srv.model, prompt: 'Once upon a time', max_tokens: 300,
                                                  ignore_eos: true, temperature: 1, seed: i, stream: true });
                await abandon(srv.port, Buffer.concat([head, body]), 1 + Math.floor(cut * 30));
            }
        };
        const phase = async (end) => {
            const worker = async () => {
                while (next < end) await one(next++);
            };
            await Promise.all(Array.from({ length: CLIENTS }, worker));
        };

        // Every block free, nothing running, waiting or swapped: polled, since the server's
        // snapshot follows the engine step that applies the last aborts.
        const idleNow = (p) => {
            const v = (n) => promValue(p, `pagellm:${n}`);
            return v('num_requests_running') === 0 && v('num_requests_waiting') === 0 &&
                   v('num_requests_swapped') === 0 && v('num_free_gpu_blocks') === v('num_gpu_blocks') &&
                   v('num_free_cpu_blocks') === v('num_cpu_blocks') && v('gpu_cache_usage_perc') === 0;
        };
        const waitIdle = async () => {
            const deadline = Date.now() + scaled(5000);
            for (;;) {
                const p = await scrape(srv);
                if (idleNow(p) || Date.now() > deadline) return p;
                await sleep(25);
            }
        };

        await phase(WARMUP);
        await waitIdle();
        const pid = srv.proc.pid;
        const rss0 = vmRSSkB(pid);
        await phase(REQUESTS);
        const seconds = (Date.now() - t0) / 1000;
        const prom = await waitIdle();
        const rss1 = vmRSSkB(pid);
        const v = (n) => promValue(prom, `pagellm:${n}`);
        const summary = `seed ${SEED}, ${seconds.toFixed(1)} s, ${JSON.stringify(counts)}, ` +
                        `VmRSS ${(rss0 / 1024).toFixed(1)} -> ${(rss1 / 1024).toFixed(1)} MiB`;
        console.log(`soak: ${summary}`);

        assert.equal(wrong.length, 0, `${wrong.length} wrong answers (${summary}):\n${wrong.slice(0, 10).join('\n')}`);
        assert.ok(counts.good > REQUESTS * 0.7 && counts.midStream > 0 && counts.beforeHeaders > 0, summary);
        assert.equal(v('num_requests_running'), 0, `running after the soak (${summary})`);
        assert.equal(v('num_requests_waiting'), 0, `waiting after the soak (${summary})`);
        assert.equal(v('num_requests_swapped'), 0, `swapped after the soak (${summary})`);
        assert.equal(v('num_gpu_blocks'), BLOCKS);
        assert.equal(v('num_free_gpu_blocks'), BLOCKS, `GPU blocks not freed (${summary})`);
        assert.equal(v('num_free_cpu_blocks'), v('num_cpu_blocks'), `CPU blocks not freed (${summary})`);
        assert.equal(v('gpu_cache_usage_perc'), 0);
        // Every abandoned stream was aborted (its 300 tokens never all generated).
        assert.ok((promValue(prom, 'pagellm:request_success_total', { finished_reason: 'abort' }) ?? 0) >= counts.midStream,
                  `aborts counted: ${promValue(prom, 'pagellm:request_success_total', { finished_reason: 'abort' })} (${summary})`);
        if (isAsan(pid)) {
            console.log('soak: ASan build: the RSS bound is not checked (quarantine); LeakSanitizer checks at exit');
        } else {
            assert.ok(rss1 - rss0 <= RSS_BOUND_MIB * 1024, `VmRSS grew by more than ${RSS_BOUND_MIB} MiB (${summary})`);
        }
        // The server still answers, then drains and exits 0 (LeakSanitizer passes under ASan).
        assert.equal(await goodRequest(srv, GOLDEN[0], false), null);
        const e = await srv.stop(scaled(10000));
        assert.deepEqual({ code: e.code, signal: e.signal }, { code: 0, signal: null },
                         `exit after SIGTERM; its output:\n${srv.log().slice(-3000)}`);
    });
});
