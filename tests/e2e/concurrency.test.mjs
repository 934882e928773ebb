// concurrency.test.mjs - 256 concurrent streaming clients (greedy, the golden prompts round
// robin) all get complete answers equal to golden.json.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, readSSE, scrapeUntil, promValue, GOLDEN, T, scaled } from './server.mjs';

const CLIENTS = 256;

describe('concurrency', () => {
    let srv;
    before(async () => {
        srv = await startServer();
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it(`${CLIENTS} concurrent streaming clients all get the golden text`, T(45000), async () => {
        const one = async (i) => {
            const g = GOLDEN[i % GOLDEN.length];
            const res = await fetch(`${srv.url}/v1/completions`, {
                method: 'POST',
                headers: { 'Content-Type': 'application/json' },
                body: JSON.stringify({ model: srv.model, prompt: g.prompt, max_tokens: g.max_tokens,
                                       temperature: 0, stream: true, stream_options: { include_usage: true } }),
                signal: AbortSignal.timeout(scaled(40000)),
            });
            if (res.status !== 200) return { i, g, error: `status ${res.status}: ${await res.text()}` };
            let text = '';
            let finish = null;
            let usage = null;
            let done = false;
            let tokens = 0;
            await readSSE(res, (data) => {
                if (data === '[DONE]') {
                    done = true;
                    return false;
                }
                const ev = JSON.parse(data);
                if (ev.usage) usage = ev.usage;
                for (const c of ev.choices) {
                    text += c.text;
                    if (c.text !== '') tokens++;
                    finish = c.finish_reason ?? finish;
                }
                return false;
            });
            return { i, g, text, finish, usage, done, tokens };
        };
        const t0 = Date.now();
        const results = await Promise.all(Array.from({ length: CLIENTS }, (_, i) => one(i).catch((e) => ({ i, error: String(e) }))));
        const seconds = (Date.now() - t0) / 1000;
        const bad = [];
        for (const r of results) {
            const g = r.g ?? GOLDEN[r.i % GOLDEN.length];
            let why = r.error;
            if (!why && !r.done) why = 'no [DONE]';
            if (!why && r.text !== g.text) why = `text ${JSON.stringify(r.text)} != golden ${JSON.stringify(g.text)}`;
            if (!why && r.finish !== g.finish_reason) why = `finish_reason ${r.finish}`;
            if (!why && r.tokens !== g.completion_ids.length) why = `${r.tokens} token chunks, want ${g.completion_ids.length}`;
            if (!why && r.usage?.completion_tokens !== g.completion_ids.length) why = `usage ${JSON.stringify(r.usage)}`;
            if (why) bad.push(`client ${r.i} (prompt ${JSON.stringify(g.prompt)}): ${why}`);
        }
        assert.equal(bad.length, 0, `${bad.length} of ${CLIENTS} clients wrong (in ${seconds}s):\n${bad.slice(0, 10).join('\n')}`);
        const idle = (p) => promValue(p, 'pagellm:num_requests_running') === 0 && promValue(p, 'pagellm:gpu_cache_usage_perc') === 0;
        const prom = await scrapeUntil(srv, idle, 1000);
        assert.equal(promValue(prom, 'pagellm:num_requests_running'), 0);
        assert.equal(promValue(prom, 'pagellm:gpu_cache_usage_perc'), 0, 'every block freed');
    });
});
