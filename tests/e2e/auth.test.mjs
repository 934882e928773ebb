// auth.test.mjs - with --api-key K, requests need "Authorization: Bearer K" (else 401 with
// an OpenAI error object); /health needs no key.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, assertErrorShape, GOLDEN, show, T } from './server.mjs';

const KEY = 'e2e-secret-key';
const ONCE = GOLDEN[0];

describe('api-key', () => {
    let srv;
    let body;
    before(async () => {
        srv = await startServer(['--api-key', KEY], { apiKey: KEY });
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
});
