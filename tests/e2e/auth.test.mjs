// auth.test.mjs - with --api-key K, requests need "Authorization: Bearer K" (else 401 with
// an OpenAI error object) on every route but /health: /v1/models, /v1/completions,
// /v1/chat/completions, /version and /metrics. (vLLM guards only /v1/*; pagellm guards
// /metrics and /version too, as issue 9 asks: they tell traffic and build to anyone.)
// The key never appears in the server's output (stdout and stderr, --log-level debug),
// whatever the requests, nor in the output of the command's start-up errors.

import { describe, it, before, after } from 'node:test';
import { spawnSync } from 'node:child_process';
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';
import { startServer, curl, assertErrorShape, GOLDEN, PAGELLM, ROOT, show, T } from './server.mjs';

const KEY = 'e2e-secret-key-Zq8xW3vR7tLm';
// Routes and what each answers with the right key (chat: 400, the model has no chat template).
const ROUTES = [
    ['GET', '/v1/models', 200], ['GET', '/version', 200], ['GET', '/metrics', 200],
    ['POST', '/v1/completions', 200], ['POST', '/v1/chat/completions', 400],
];
const leaks = (text) => text.includes(KEY) || text.includes(KEY.slice(4, 20));
const ONCE = GOLDEN[0];

describe('api-key', () => {
    let srv;
    let body;
    before(async () => {
        srv = await startServer(['--api-key', KEY, '--log-level', 'debug', '--max-request-bytes', '4096'], { apiKey: KEY });
        body = { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0 };
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('no Authorization header -> 401', T(), async () => {
        const r = await curl(`${srv.url}/v1/completions`, { body });
        assert.equal(r.status, 401, show(r));
        assertErrorShape(r.json, '401');
        const m = await curl(`${srv.url}/v1/models`);
        assert.equal(m.status, 401, `GET /v1/models without a key: ${show(m)}`);
        assertErrorShape(m.json, '401 /v1/models');
    });

    it('wrong key -> 401', T(), async () => {
        for (const auth of [`Bearer ${KEY}x`, `Bearer ${KEY.slice(0, -1)}`, `Basic ${KEY}`, KEY, 'Bearer ']) {
            const r = await curl(`${srv.url}/v1/completions`, { body, headers: { Authorization: auth } });
            assert.equal(r.status, 401, `Authorization: ${auth}: ${show(r)}`);
            assertErrorShape(r.json, `401 (${auth})`);
        }
    });

    it('Authorization: Bearer K -> 200', T(), async () => {
        const r = await curl(`${srv.url}/v1/completions`, { body, headers: { Authorization: `Bearer ${KEY}` } });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, ONCE.text);
        const m = await curl(`${srv.url}/v1/models`, { headers: { Authorization: `Bearer ${KEY}` } });
        assert.equal(m.status, 200, show(m));
        assert.equal(m.json.data[0].id, srv.model);
    });

    it('/health needs no key', T(), async () => {
        const r = await curl(`${srv.url}/health`);
        assert.equal(r.status, 200, show(r));
    });
    const bodyFor = (p) => (p === '/v1/completions' ? body
        : p === '/v1/chat/completions' ? { model: srv.model, messages: [{ role: 'user', content: 'hi' }] } : undefined);

    it('every route but /health needs the key', T(), async () => {
        for (const [method, p, okStatus] of ROUTES) {
            for (const headers of [{}, { Authorization: `Bearer ${KEY}x` }, { Authorization: `Bearer ${KEY.slice(1)}` }]) {
                const r = await curl(`${srv.url}${p}`, { method, body: bodyFor(p), headers });
                assert.equal(r.status, 401, `${method} ${p} with ${JSON.stringify(headers)}: ${show(r)}`);
                assertErrorShape(r.json, `401 ${p}`);
                assert.ok(!leaks(r.text), `${p}: the 401 body echoes the key`);
            }
            const r = await curl(`${srv.url}${p}`, { method, body: bodyFor(p), headers: { Authorization: `Bearer ${KEY}` } });
            assert.equal(r.status, okStatus, `${method} ${p} with the key: ${show(r)}`);
        }
        const h = await curl(`${srv.url}/health`, { headers: { Authorization: 'Bearer wrong' } });
        assert.equal(h.status, 200, `/health with a wrong key: ${show(h)}`);
    });

    it('the key never appears in the server\'s output, error paths included', T(20000), async () => {
        const auth = { Authorization: `Bearer ${KEY}` };
        const tries = [
            { body: '{"prompt": "Once upon', headers: auth },                       // 400 malformed JSON
            { body: { ...body, max_tokens: -1 }, headers: auth },                   // 400 bad value
            { body: { ...body, model: KEY }, headers: auth },                       // 404 unknown model (named)
            { body: { prompt: 'x'.repeat(8192) }, headers: auth },                  // 413
            { body, headers: { Authorization: `Bearer ${KEY}${KEY}` } },            // 401
            { body, headers: { Authorization: KEY } },                              // 401, no Bearer
            { body, headers: { Authorization: `Bearer ${KEY}`, 'X-Api-Key': KEY } },// 200
        ];
        for (const t of tries) await curl(`${srv.url}/v1/completions`, t);
        await curl(`${srv.url}/no/such/route`, { headers: auth });
        const e = await srv.stop();
        assert.equal(e.code, 0, srv.log().slice(-2000));
        const log = srv.log();
        assert.ok(log.length > 0 && /serving/.test(log), `no server output captured: ${log}`);
        assert.ok(!leaks(log), `the key appears in the server's output:\n${log}`);
        srv = null;
    });

    it('start-up errors do not print the key', T(20000), async () => {
        const dir = mkdtempSync(path.join(os.tmpdir(), 'pagellm-auth-'));
        try {
            const yaml = (name, text) => {
                const f = path.join(dir, name);
                writeFileSync(f, text);
                return f;
            };
            const cases = [
                ['--api-key', KEY, '--port', 'notaport'],
                ['--api-key', KEY, '--model', path.join(dir, 'no-such-model')],
                ['--api-key', KEY, '--no-such-flag'],
                ['--config', yaml('unknown.yaml', `api-key: ${KEY}\nbogus: 1\n`)],
                ['--config', yaml('list.yaml', `api-key: [${KEY}]\n`)],
                ['--config', yaml('twice.yaml', `api-key: ${KEY}\napi-key: ${KEY}\n`)],
                ['--config', yaml('quote.yaml', `api-key: "${KEY}\n`)],
            ];
            for (const args of cases) {
                const r = spawnSync(PAGELLM, ['serve', '--device', 'cpu', '--port', '1', ...args], { cwd: ROOT, encoding: 'utf8', timeout: 20000 });
                const out = `${r.stdout}${r.stderr}`;
                assert.notEqual(r.status, 0, `${args.join(' ')}: exit ${r.status}: ${out}`);
                assert.ok(out.trim().length > 0, `${args.join(' ')}: no error message`);
                assert.ok(!leaks(out), `${args.join(' ')} prints the key: ${out}`);
            }
        } finally {
            rmSync(dir, { recursive: true, force: true });
        }
    });
});
