// endpoints.test.mjs - GET /v1/models, /health, /version and /metrics (Prometheus text
// with vLLM's metric names under a pagellm: prefix), through curl.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, parseProm, promValue, scrapeUntil, GOLDEN, ROOT, show, T } from './server.mjs';

// Families the issue asks for; the ones the suite reads are checked in detail below.
const GAUGES = [
    'pagellm:num_requests_running',
    'pagellm:num_requests_waiting',
    'pagellm:num_requests_swapped',
    'pagellm:gpu_cache_usage_perc',
    'pagellm:cpu_cache_usage_perc',
];
const COUNTERS = ['pagellm:num_preemptions_total', 'pagellm:prompt_tokens_total', 'pagellm:generation_tokens_total'];
const HISTOGRAMS = [
    'pagellm:time_to_first_token_seconds',
    'pagellm:time_per_output_token_seconds',
    'pagellm:e2e_request_latency_seconds',
    'pagellm:request_queue_time_seconds',
];

describe('endpoints', () => {
    let srv;
    before(async () => {
        srv = await startServer();
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('GET /v1/models lists the served model', T(), async () => {
        const r = await curl(`${srv.url}/v1/models`);
        assert.equal(r.status, 200, show(r));
        assert.match(r.headers['content-type'] ?? '', /^application\/json/);
        assert.equal(r.json.object, 'list');
        assert.ok(Array.isArray(r.json.data) && r.json.data.length >= 1, show(r));
        const m = r.json.data[0];
        assert.equal(typeof m.id, 'string');
        assert.ok(m.id.length > 0);
        assert.equal(m.object, 'model');
        assert.equal(typeof m.created, 'number');
        assert.equal(typeof m.owned_by, 'string');
        // The listed id is the name requests use.
        const c = await curl(`${srv.url}/v1/completions`, {
            body: { model: m.id, prompt: GOLDEN[0].prompt, max_tokens: 16, temperature: 0 },
        });
        assert.equal(c.status, 200, show(c));
        assert.equal(c.json.model, m.id);
    });

    // Issue 34, item 7: the model card names the model, never the server's file system; it
    // lists max_model_len as vLLM's does (bench serve reads it).
    it('GET /v1/models: root is the model folder\'s name, not a path; max_model_len', T(), async () => {
        const r = await curl(`${srv.url}/v1/models`);
        const m = r.json.data[0];
        assert.equal(m.root, 'stories260K', show(r));
        assert.ok(!r.text.includes(ROOT) && !r.text.includes('/models/'), `a path in /v1/models: ${r.text}`);
        assert.equal(m.parent, null);
        assert.equal(m.max_model_len, 512);
    });

    // Issue 34, item 8: swap-space beyond what max-num-seqs sequences can use is capped, and
    // the start-up line says so (the default 4 GiB is far more than the bundled model needs).
    it('the start-up line says when swap-space is capped', T(30000), async () => {
        assert.match(srv.log(), /swap: \d+ blocks \([\d.]+ MiB; swap-space 4 GiB capped to what max-num-seqs \(\d+\) sequences/, srv.log());
        const small = await startServer(['--swap-space', '0.001']);
        try {
            assert.match(small.log(), /swap: \d+ blocks \([\d.]+ MiB\); max-model-len/, small.log());
            assert.doesNotMatch(small.log(), /capped/);
        } finally {
            await small.stop();
        }
    });

    it('GET /health answers 200', T(), async () => {
        const r = await curl(`${srv.url}/health`);
        assert.equal(r.status, 200, show(r));
    });

    it('GET /version answers {"version": "..."}', T(), async () => {
        const r = await curl(`${srv.url}/version`);
        assert.equal(r.status, 200, show(r));
        assert.equal(typeof r.json?.version, 'string', show(r));
        assert.ok(r.json.version.length > 0);
    });

    it('GET /metrics is Prometheus text with the pagellm: families', T(), async () => {
        const r = await curl(`${srv.url}/metrics`);
        assert.equal(r.status, 200, show(r));
        assert.match(r.headers['content-type'] ?? '', /^text\/plain/);
        const prom = parseProm(r.text);
        for (const name of GAUGES) {
            assert.equal(prom.types[name], 'gauge', `# TYPE ${name} gauge`);
            assert.ok(name in prom.help, `# HELP ${name}`);
            const s = prom.samples.find((x) => x.name === name);
            assert.ok(s, `no sample of ${name}`);
            assert.equal(s.labels.model_name, srv.model, `${name} model_name label`);
        }
        assert.equal(promValue(prom, 'pagellm:num_requests_running'), 0, 'idle server: nothing running');
        assert.equal(promValue(prom, 'pagellm:gpu_cache_usage_perc'), 0, 'idle server: no KV blocks used');
        for (const name of COUNTERS) {
            assert.equal(prom.types[name.replace(/_total$/, '')] ?? prom.types[name], 'counter', `# TYPE of ${name}`);
            assert.ok(promValue(prom, name) !== undefined, `no sample of ${name}`);
        }
        for (const name of HISTOGRAMS) {
            assert.equal(prom.types[name], 'histogram', `# TYPE ${name} histogram`);
            const buckets = prom.samples.filter((s) => s.name === `${name}_bucket`);
            assert.ok(buckets.length >= 2, `${name}_bucket samples`);
            assert.ok(buckets.some((b) => b.labels.le === '+Inf'), `${name}_bucket{le="+Inf"}`);
            assert.ok(promValue(prom, `${name}_sum`) !== undefined, `${name}_sum`);
            assert.ok(promValue(prom, `${name}_count`) !== undefined, `${name}_count`);
        }
        assert.ok(prom.samples.some((s) => s.name === 'pagellm:time_to_first_token_seconds_bucket'));
    });

    it('GET /metrics counters and histograms grow after requests', T(), async () => {
        const m0 = parseProm((await curl(`${srv.url}/metrics`)).text);
        const g = GOLDEN[0];
        const r = await curl(`${srv.url}/v1/completions`, {
            body: { model: srv.model, prompt: g.prompt, max_tokens: g.max_tokens, temperature: 0 },
        });
        assert.equal(r.status, 200, show(r));
        const count = (p) => promValue(p, 'pagellm:e2e_request_latency_seconds_count');
        const m1 = await scrapeUntil(srv, (p) => count(p) > count(m0) && promValue(p, 'pagellm:gpu_cache_usage_perc') === 0);
        const delta = (name, labels) => promValue(m1, name, labels) - promValue(m0, name, labels);
        assert.equal(delta('pagellm:prompt_tokens_total'), g.prompt_ids.length, 'prompt_tokens_total');
        assert.equal(delta('pagellm:generation_tokens_total'), g.completion_ids.length, 'generation_tokens_total');
        assert.equal(delta('pagellm:time_to_first_token_seconds_count'), 1, 'time_to_first_token_seconds_count');
        assert.equal(delta('pagellm:e2e_request_latency_seconds_count'), 1, 'e2e_request_latency_seconds_count');
        assert.equal(delta('pagellm:request_queue_time_seconds_count'), 1, 'request_queue_time_seconds_count');
        assert.equal(delta('pagellm:time_per_output_token_seconds_count'), g.completion_ids.length - 1,
                     'time_per_output_token_seconds_count: one per token after the first');
        assert.ok(delta('pagellm:e2e_request_latency_seconds_sum') > 0, 'e2e latency sum grows');
        // Buckets are cumulative and +Inf equals _count.
        for (const name of ['pagellm:time_to_first_token_seconds', 'pagellm:e2e_request_latency_seconds']) {
            const buckets = m1.samples.filter((s) => s.name === `${name}_bucket`);
            const values = buckets.map((b) => b.value);
            assert.deepEqual(values, [...values].sort((a, b) => a - b), `${name} buckets cumulative`);
            assert.equal(buckets.find((b) => b.labels.le === '+Inf').value, promValue(m1, `${name}_count`));
        }
        assert.equal(promValue(m1, 'pagellm:num_requests_running'), 0);
        assert.equal(promValue(m1, 'pagellm:gpu_cache_usage_perc'), 0, 'blocks freed after the request');
    });
});
