// hostile.test.mjs - slow and hostile clients, through raw sockets (node:net):
//   - slowloris: headers (or a body) dripped one byte every 100 ms never trip the idle
//     timeout, but the connection is cut once it has taken request-timeout seconds to send
//     its request (server/deadline.c), while other clients are served meanwhile;
//   - a connection that sends nothing is closed after request-timeout (the idle timeout);
//   - a request that is answered slowly (streaming or not) is not cut: the deadline covers
//     receiving the request only;
//   - a 64 KiB header gets 431; a body over max-request-bytes gets 413 with an OpenAI error
//     object, before it is sent when Content-Length declares it, after it when chunked;
//   - issue 34, item 6: request smuggling (two different Content-Length headers, both
//     Content-Length and Transfer-Encoding) gets a JSON 400 and the connection closes before
//     the smuggled request is read; an unknown Transfer-Encoding a JSON 501; the errors
//     libmicrohttpd answers itself (414, 505, 400/413 for a Content-Length it cannot parse,
//     400 for a malformed chunk)
//     keep their status and close only that connection; max-connections-per-ip closes a
//     client's connections past the limit while other addresses are served.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, curl, postJSON, assertErrorShape, GOLDEN, show, sleep, T, scaled } from './server.mjs';

const TIMEOUT_S = 2; // --request-timeout
const MAX_BODY = 16384; // --max-request-bytes
const DRIP_MS = 100;
const ONCE = GOLDEN[0];

/**
 * Connect and send `head` at once, then one byte of `drip` (cycled) every DRIP_MS until the
 * server closes the connection or `maxMs` pass. Resolves to { ms: time to the close (null if
 * it stayed open), received: what the server sent }.
 */
function slowClient(port, head, drip, maxMs) {
    return new Promise((resolve) => {
        const t0 = Date.now();
        const sock = net.connect({ host: '127.0.0.1', port });
        let received = '';
        let timer = null;
        let i = 0;
        let finished = false;
        const finish = (ms) => {
            if (finished) return;
            finished = true;
            clearInterval(timer);
            sock.destroy();
            resolve({ ms, received });
        };
        sock.on('data', (d) => (received += d.toString('latin1')));
        sock.on('end', () => finish(Date.now() - t0)); // the server's FIN
        sock.on('close', () => finish(Date.now() - t0));
        sock.on('error', () => finish(Date.now() - t0)); // a write after the server's close
        sock.on('connect', () => {
            if (head) sock.write(head);
            if (drip) {
                timer = setInterval(() => {
                    if (Date.now() - t0 > maxMs) return finish(null);
                    sock.write(drip.subarray(i % drip.length, (i % drip.length) + 1));
                    i++;
                }, DRIP_MS);
            } else {
                timer = setInterval(() => Date.now() - t0 > maxMs && finish(null), DRIP_MS);
            }
        });
    });
}

/** One raw request; resolves to { status, headers, body, ms } of the first response. */
function rawExchange(port, bytes, { endAfterMs = scaled(10000) } = {}) {
    return new Promise((resolve, reject) => {
        const t0 = Date.now();
        const sock = net.connect({ host: '127.0.0.1', port });
        let text = '';
        const timer = setTimeout(() => {
            sock.destroy();
            reject(new Error(`no complete response within ${endAfterMs} ms; got ${JSON.stringify(text.slice(0, 300))}`));
        }, endAfterMs);
        const tryParse = () => {
            const end = text.indexOf('\r\n\r\n');
            if (end < 0) return;
            const lines = text.slice(0, end).split('\r\n');
            const headers = {};
            for (const l of lines.slice(1)) {
                const k = l.indexOf(':');
                headers[l.slice(0, k).trim().toLowerCase()] = l.slice(k + 1).trim();
            }
            const len = Number(headers['content-length']);
            const body = text.slice(end + 4);
            if (Number.isNaN(len) || Buffer.byteLength(body, 'latin1') < len) return;
            clearTimeout(timer);
            sock.destroy();
            resolve({ status: Number(lines[0].split(' ')[1]), headers, body: body.slice(0, len), ms: Date.now() - t0 });
        };
        sock.on('data', (d) => {
            text += d.toString('latin1');
            tryParse();
        });
        sock.on('error', () => {}); // the server may close before reading all we send
        sock.on('connect', () => sock.write(bytes));
    });
}

/**
 * Send `bytes` and read until the server closes the connection (or `maxMs` pass): resolves to
 * { text (latin1), closed, responses (the number of status lines) }.
 */
function readToClose(port, bytes, { maxMs = scaled(5000), localAddress } = {}) {
    return new Promise((resolve) => {
        const sock = net.connect({ host: '127.0.0.1', port, localAddress });
        let text = '';
        let done = false;
        const finish = (closed) => {
            if (done) return;
            done = true;
            clearTimeout(timer);
            sock.destroy();
            resolve({ text, closed, responses: (text.match(/^HTTP\/1\.[01] \d{3} /gm) || []).length });
        };
        const timer = setTimeout(() => finish(false), maxMs);
        sock.on('data', (d) => (text += d.toString('latin1')));
        sock.on('end', () => finish(true));
        sock.on('close', () => finish(true));
        sock.on('error', () => finish(true));
        sock.on('connect', () => bytes && sock.write(bytes));
    });
}

/** The JSON body of the first response in `text` (with a Content-Length). */
function firstJSON(text) {
    const end = text.indexOf('\r\n\r\n');
    const len = Number(/\r\ncontent-length: *(\d+)/i.exec(text.slice(0, end))?.[1]);
    return JSON.parse(text.slice(end + 4, end + 4 + len));
}

const postHead = (extra) => Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
                                        `Content-Type: application/json\r\n${extra}\r\n`);

describe('slow and hostile clients', () => {
    let srv;
    before(async () => {
        srv = await startServer(['--request-timeout', String(TIMEOUT_S), '--max-request-bytes', String(MAX_BODY)]);
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    const golden = async () => {
        const r = await curl(`${srv.url}/v1/completions`, {
            body: { model: srv.model, prompt: ONCE.prompt, max_tokens: 16, temperature: 0 },
        });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, ONCE.text);
    };

    // A drip of a byte every 100 ms is never idle for request-timeout, so only the deadline
    // for the whole request can end it; and it must, within request-timeout plus slack.
    const cutWithin = (r, what) => {
        assert.notEqual(r.ms, null, `${what}: still open after ${scaled(10000)} ms of dripping`);
        assert.ok(r.ms >= TIMEOUT_S * 1000 - 250, `${what}: cut after ${r.ms} ms, before request-timeout`);
        assert.ok(r.ms <= TIMEOUT_S * 1000 + scaled(1500), `${what}: cut only after ${r.ms} ms`);
    };

    it('slowloris headers: cut after request-timeout; others are served meanwhile', T(30000), async () => {
        const head = Buffer.from('GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n');
        const drip = Buffer.from('X-Slow: ' + 'a'.repeat(200) + '\r\n');
        const t0 = Date.now();
        const slow = Array.from({ length: 16 }, () => slowClient(srv.port, head, drip, scaled(10000)));
        await golden(); // while 16 slowloris clients hold connections
        await golden();
        assert.ok(Date.now() - t0 < TIMEOUT_S * 1000, 'others were served while the slow clients were connected');
        for (const r of await Promise.all(slow)) {
            cutWithin(r, 'slow headers');
            assert.equal(r.received, '', 'no answer for a request that never arrived');
        }
        await golden();
    });

    it('slow body: cut after request-timeout', T(30000), async () => {
        const body = Buffer.from(JSON.stringify({ model: srv.model, prompt: 'x'.repeat(8000) }));
        const r = await slowClient(srv.port, postHead(`Content-Length: ${body.length}\r\n`), body, scaled(10000));
        cutWithin(r, 'slow body');
        await golden();
    });

    it('a connection that sends nothing is closed after request-timeout', T(30000), async () => {
        const r = await slowClient(srv.port, null, null, scaled(10000));
        assert.notEqual(r.ms, null, 'a silent connection stayed open');
        assert.ok(r.ms >= TIMEOUT_S * 1000 - 250 && r.ms <= TIMEOUT_S * 1000 + scaled(1500), `closed after ${r.ms} ms`);
    });

    it('answers that take longer than request-timeout are not cut (plain and streaming)', T(60000), async () => {
        // A server of its own with request-timeout 1 s, and requests of 64 samples x 480
        // tokens (32 when streaming): seconds each on the CPU backend.
        const quick = await startServer(['--request-timeout', '1']);
        try {
            const body = { model: quick.model, prompt: '', max_tokens: 480, n: 64, ignore_eos: true, temperature: 1, seed: 3 };
            let t0 = Date.now();
            const plain = await postJSON(`${quick.url}/v1/completions`, body);
            const plainMs = Date.now() - t0;
            assert.equal(plain.status, 200, show(plain));
            assert.equal(plain.json.usage.completion_tokens, 64 * 480);
            t0 = Date.now();
            const stream = await curl(`${quick.url}/v1/completions`, { body: { ...body, n: 32, stream: true } });
            const streamMs = Date.now() - t0;
            assert.equal(stream.status, 200);
            assert.ok(stream.text.trimEnd().endsWith('data: [DONE]'), `stream cut: ${stream.text.slice(-200)}`);
            console.log(`slow answers: ${plainMs} ms plain, ${streamMs} ms streaming`);
            assert.ok(plainMs > 1000 && streamMs > 1000,
                      `the requests took only ${plainMs} / ${streamMs} ms: they do not test the point`);
        } finally {
            await quick.stop();
        }
    });

    it('a 64 KiB header -> 431, and the server goes on', T(), async () => {
        const r = await rawExchange(srv.port, Buffer.from(
            `GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(65536)}\r\n\r\n`));
        assert.equal(r.status, 431, JSON.stringify(r).slice(0, 300));
        await golden();
    });

    it('Content-Length over max-request-bytes -> 413 before the body is sent', T(), async () => {
        // Only the headers go out: the answer must not wait for 10 MiB that never come.
        const r = await rawExchange(srv.port, postHead(`Content-Length: ${10 << 20}\r\n`));
        assert.equal(r.status, 413, JSON.stringify(r).slice(0, 300));
        assertErrorShape(JSON.parse(r.body), '413');
        assert.ok(r.ms < scaled(1000), `413 after ${r.ms} ms`);
        await golden();
    });

    it('a chunked body over max-request-bytes -> 413', T(), async () => {
        const chunk = 'x'.repeat(4096);
        const chunks = Array.from({ length: 8 }, () => `1000\r\n${chunk}\r\n`).join('');
        const r = await rawExchange(srv.port, Buffer.concat([postHead('Transfer-Encoding: chunked\r\n'),
                                                             Buffer.from(chunks + '0\r\n\r\n')]));
        assert.equal(r.status, 413, JSON.stringify(r).slice(0, 300));
        assertErrorShape(JSON.parse(r.body), '413 (chunked)');
        await golden();
    });

    // Issue 34, item 6: request smuggling. A proxy that frames the body by the other header
    // would see the tail of this body as a second request; pagellm refuses the request before
    // reading its body and closes the connection, so nothing after it is ever answered.
    const body = JSON.stringify({ model: 'x', prompt: 'Hi', max_tokens: 2 });
    const smuggled = 'GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n';

    it('two different Content-Length headers -> JSON 400, connection closed', T(), async () => {
        const r = await readToClose(srv.port, Buffer.concat([
            postHead(`Content-Length: ${body.length}\r\nContent-Length: ${body.length + smuggled.length}\r\n`),
            Buffer.from(body + smuggled)]));
        assert.ok(r.closed, `the connection stayed open: ${r.text.slice(0, 300)}`);
        assert.match(r.text, /^HTTP\/1\.1 400 /, r.text.slice(0, 300));
        assert.equal(r.responses, 1, `the smuggled request was answered: ${r.text.slice(0, 600)}`);
        const j = firstJSON(r.text);
        assertErrorShape(j, 'two Content-Length');
        assert.match(j.error.message, /Content-Length/);
        // the same value twice is one length: served
        const good = JSON.stringify({ model: srv.model, prompt: 'Hi', max_tokens: 2 });
        const same = await readToClose(srv.port, Buffer.concat([
            postHead(`Connection: close\r\nContent-Length: ${good.length}\r\nContent-Length: ${good.length}\r\n`),
            Buffer.from(good)]));
        assert.match(same.text, /^HTTP\/1\.1 200 /, same.text.slice(0, 300));
        await golden();
    });

    it('Content-Length together with Transfer-Encoding -> JSON 400; an unknown Transfer-Encoding -> JSON 501', T(), async () => {
        const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
        const r = await readToClose(srv.port, Buffer.concat([
            postHead('Content-Length: 4\r\nTransfer-Encoding: chunked\r\n'), Buffer.from(chunked + smuggled)]));
        assert.ok(r.closed, 'the connection stayed open');
        assert.match(r.text, /^HTTP\/1\.1 400 /, r.text.slice(0, 300));
        assert.equal(r.responses, 1, `the smuggled request was answered: ${r.text.slice(0, 600)}`);
        assertErrorShape(firstJSON(r.text), 'CL + TE');
        const g = await readToClose(srv.port, Buffer.concat([postHead('Transfer-Encoding: gzip\r\n'), Buffer.from('abc')]));
        assert.ok(g.closed, 'the connection stayed open (it waited for a body it cannot frame)');
        assert.match(g.text, /^HTTP\/1\.1 501 /, g.text.slice(0, 300));
        assertErrorShape(firstJSON(g.text), 'TE gzip');
        await golden();
    });

    // libmicrohttpd answers these itself, before any pagellm code sees the request: the status
    // is right and the connection closes, but the body is its own short HTML (docs/RELIABILITY.md).
    it('errors libmicrohttpd answers itself: 414, 505, malformed or huge Content-Length; the server goes on', T(), async () => {
        for (const [what, bytes, status] of [
            ['a 40 KB URL', `GET /${'a'.repeat(40000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 414],
            ['HTTP/2.0 in an HTTP/1 request line', 'GET /health HTTP/2.0\r\nHost: x\r\n\r\n', 505],
            ['Content-Length: abc', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n', 400],
            ['Content-Length: -5', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n', 400],
            ['Content-Length: 1, 2', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1, 2\r\n\r\n', 400],
            ['Content-Length past 2^64', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n', 413],
            ['a malformed chunk', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n', 400],
        ]) {
            const r = await readToClose(srv.port, Buffer.from(bytes));
            assert.ok(r.closed, `${what}: the connection stayed open`);
            assert.match(r.text, new RegExp(`^HTTP/1\\.1 ${status} `), `${what}: ${r.text.slice(0, 200)}`);
        }
        // a declared Content-Length that parses, however large, reaches pagellm: JSON 413
        const big = await readToClose(srv.port, postHead('Content-Length: 18446744073709551615\r\n'));
        assert.match(big.text, /^HTTP\/1\.1 413 /, big.text.slice(0, 200));
        assertErrorShape(firstJSON(big.text), '413 (2^64 - 1)');
        await golden();
    });

    it('max-connections-per-ip: connections past the limit are closed; other addresses are served', T(30000), async () => {
        const LIMIT = 8;
        const limited = await startServer(['--max-connections-per-ip', String(LIMIT)]);
        const hog = [];
        try {
            // One client (127.0.0.2) opens LIMIT idle connections and holds them...
            for (let i = 0; i < LIMIT; i++) {
                const sock = net.connect({ host: '127.0.0.1', port: limited.port, localAddress: '127.0.0.2' });
                sock.on('error', () => {});
                await new Promise((r) => sock.once('connect', r));
                hog.push(sock);
            }
            // ...its next one is closed without an answer...
            const health = Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
            const refused = await readToClose(limited.port, health, { localAddress: '127.0.0.2' });
            assert.ok(refused.closed && refused.text === '', `connection ${LIMIT + 1} of one address was served: ${refused.text.slice(0, 200)}`);
            // ...while another address is served.
            const other = await readToClose(limited.port, Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'),
                                            { localAddress: '127.0.0.1' });
            assert.match(other.text, /^HTTP\/1\.1 200 /, other.text.slice(0, 200));
            // Once the client lets go of one, it may connect again.
            hog.pop().destroy();
            await sleep(200);
            const again = await readToClose(limited.port, Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'),
                                            { localAddress: '127.0.0.2' });
            assert.match(again.text, /^HTTP\/1\.1 200 /, again.text.slice(0, 200));
        } finally {
            for (const sock of hog) sock.destroy();
            await limited.stop();
        }
    });
});
