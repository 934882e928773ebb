// cors.test.mjs - CORS as vLLM does it (Starlette's CORSMiddleware): allowed-origins unset
// sends no CORS headers at all; a listed origin gets preflights answered (204, without the API
// key) and Access-Control-Allow-Origin on every answer, streaming ones included; another origin
// gets neither (its preflight is a 400 naming what is disallowed); "*" allows any.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, show, T } from './server.mjs';

const ORIGIN = 'https://app.example';
const preflight = (url, origin, method = 'POST', headers = 'authorization, content-type') =>
    curl(url, { method: 'OPTIONS', headers: { Origin: origin, 'Access-Control-Request-Method': method,
                                             'Access-Control-Request-Headers': headers } });

describe('CORS with allowed-origins', () => {
    let srv;
    before(async () => {
        srv = await startServer(['--allowed-origins', `${ORIGIN},https://other.example`, '--allowed-methods',
                                 'GET,POST', '--allowed-headers', 'Authorization', '--api-key', 'k'],
                                { apiKey: 'k' });
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('preflight of an allowed origin: 204 with the Access-Control-Allow-* headers, no key', T(), async () => {
        for (const p of ['/v1/chat/completions', '/v1/completions', '/tokenize', '/v1/models']) {
            const r = await preflight(`${srv.url}${p}`, ORIGIN);
            assert.equal(r.status, 204, `${p}: ${show(r)}`);
            assert.equal(r.headers['access-control-allow-origin'], ORIGIN);
            assert.equal(r.headers['access-control-allow-methods'], 'GET, POST');
            assert.equal(r.headers['access-control-allow-headers'],
                         'Accept, Accept-Language, Authorization, Content-Language, Content-Type');
            assert.equal(r.headers['access-control-max-age'], '600');
            assert.equal(r.headers.vary, 'Origin');
            assert.equal(r.headers['access-control-allow-credentials'], undefined);
        }
    });

    it('preflight of another origin, method or header: 400 that says which', T(), async () => {
        const r = await preflight(`${srv.url}/v1/completions`, 'https://evil.example');
        assert.equal(r.status, 400, show(r));
        assert.equal(r.headers['access-control-allow-origin'], undefined);
        assert.equal(r.text, 'Disallowed CORS origin');
        const m = await preflight(`${srv.url}/v1/completions`, ORIGIN, 'DELETE', 'x-custom');
        assert.equal(m.status, 400, show(m));
        assert.equal(m.text, 'Disallowed CORS method, headers');
    });

    it('answers carry Access-Control-Allow-Origin for an allowed Origin only', T(), async () => {
        const auth = { Authorization: 'Bearer k' };
        const ok = await curl(`${srv.url}/v1/models`, { headers: { ...auth, Origin: ORIGIN } });
        assert.equal(ok.status, 200, show(ok));
        assert.equal(ok.headers['access-control-allow-origin'], ORIGIN);
        assert.equal(ok.headers.vary, 'Origin');
        const err = await curl(`${srv.url}/v1/models`, { headers: { Origin: ORIGIN } });
        assert.equal(err.status, 401, show(err));
        assert.equal(err.headers['access-control-allow-origin'], ORIGIN, 'errors too, so the page can read them');
        const stream = await curl(`${srv.url}/v1/completions`, {
            headers: { ...auth, Origin: ORIGIN }, body: { prompt: 'Once', max_tokens: 2, stream: true } });
        assert.equal(stream.status, 200, show(stream));
        assert.equal(stream.headers['access-control-allow-origin'], ORIGIN);
        const other = await curl(`${srv.url}/v1/models`, { headers: { ...auth, Origin: 'https://evil.example' } });
        assert.equal(other.status, 200, show(other));
        assert.equal(other.headers['access-control-allow-origin'], undefined);
        const none = await curl(`${srv.url}/v1/models`, { headers: auth });
        assert.equal(none.headers['access-control-allow-origin'], undefined);
    });
});

describe('CORS with allowed-origins "*", and without allowed-origins', () => {
    let any, off;
    before(async () => {
        any = await startServer(['--allowed-origins', '["*"]', '--allow-credentials']);
        off = await startServer();
    }, T(30000));
    after(async () => {
        if (any) await any.stop();
        if (off) await off.stop();
    });

    it('"*": any origin; with credentials the origin itself is named', T(), async () => {
        const r = await preflight(`${any.url}/v1/completions`, 'https://x.example', 'PUT', 'x-anything');
        assert.equal(r.status, 204, show(r));
        assert.equal(r.headers['access-control-allow-origin'], 'https://x.example');
        assert.equal(r.headers['access-control-allow-headers'], 'x-anything');
        assert.equal(r.headers['access-control-allow-credentials'], 'true');
        const g = await curl(`${any.url}/v1/models`, { headers: { Origin: 'https://x.example' } });
        assert.equal(g.headers['access-control-allow-origin'], '*');
        assert.equal(g.headers['access-control-allow-credentials'], 'true');
        const c = await curl(`${any.url}/v1/models`, { headers: { Origin: 'https://x.example', Cookie: 'a=b' } });
        assert.equal(c.headers['access-control-allow-origin'], 'https://x.example');
    });

    it('unset: no CORS headers, OPTIONS is not a route', T(), async () => {
        const r = await preflight(`${off.url}/v1/completions`, ORIGIN);
        assert.equal(r.status, 405, show(r));
        assert.equal(r.headers['access-control-allow-origin'], undefined);
        const g = await curl(`${off.url}/v1/models`, { headers: { Origin: ORIGIN } });
        assert.equal(g.status, 200, show(g));
        assert.equal(g.headers['access-control-allow-origin'], undefined);
    });
});
