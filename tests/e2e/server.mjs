// server.mjs - shared helpers of the end-to-end suite: start and stop a real
// `build/pagellm serve` on a free loopback port, talk to it with curl (child_process) and
// fetch, read Server-Sent Events, parse Prometheus text, check OpenAI error objects.
//
// Every test file starts the server(s) it needs with startServer(): each gets its own port
// and settings, and is killed when the test file's process exits, however it exits.

import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import assert from 'node:assert/strict';

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const PAGELLM = process.env.PAGELLM_BIN || path.join(ROOT, 'build', 'pagellm');
export const MODEL_DIR = path.join(ROOT, 'models', 'stories260K');
export const GOLDEN = JSON.parse(readFileSync(path.join(MODEL_DIR, 'golden.json'), 'utf8')).cases;
// Extra flags for every server, e.g. PAGELLM_E2E_ARGS="--log-level debug".
const EXTRA_ARGS = (process.env.PAGELLM_E2E_ARGS || '').split(/\s+/).filter(Boolean);
// PAGELLM_E2E_SLOW=F (a number >= 1) multiplies every time limit of the suite by F: the
// per-test limits (T), the server start limit and the windows tests wait for an event in
// (scaled()). For slow builds such as ASan + UBSan on 2 cores (.ci/run sets it); unset, 1.
export const SLOW = Math.max(1, Number(process.env.PAGELLM_E2E_SLOW) || 1);
/** A time window in ms, stretched by PAGELLM_E2E_SLOW. */
export const scaled = (ms) => Math.round(ms * SLOW);
const START_TIMEOUT_MS = scaled(20000);

const live = new Set(); // child processes not yet reaped
process.on('exit', () => {
    for (const child of live) {
        try {
            child.kill('SIGKILL');
        } catch {}
    }
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => process.exit(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGTERM' ? 15 : 1)));
}

const server_argv_text = (argv) => [PAGELLM, ...argv].join(' ') + '\n';

// mulberry32: a small seeded generator of numbers in [0, 1), so a failing mix can be replayed.
export function rng(seed) {
    let a = seed >>> 0;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The raw bytes of POST /v1/completions with a JSON body: [head, body]. `extraHeaders`:
 * more header lines, each ending in CRLF. */
export function rawRequest(body, extraHeaders = '') {
    const b = Buffer.from(JSON.stringify(body));
    const head = Buffer.from('POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n' +
                             `Content-Type: application/json\r\nContent-Length: ${b.length}\r\n${extraHeaders}\r\n`);
    return [head, b];
}

/** A TCP port that was free a moment ago on 127.0.0.1. */
export function freePort() {
    return new Promise((resolve, reject) => {
        const srv = net.createServer();
        srv.unref();
        srv.on('error', reject);
        srv.listen(0, '127.0.0.1', () => {
            const { port } = srv.address();
            srv.close(() => resolve(port));
        });
    });
}

/**
 * Start `build/pagellm serve --device cpu --host 127.0.0.1 --port P ...args` and wait until
 * GET /health answers 200. Returns { url, port, proc, log(), model, stop(), exited }.
 * `model` is the id GET /v1/models lists (fetched with `apiKey` when given).
 */
export async function startServer(args = [], { apiKey } = {}) {
    let lastError;
    for (let attempt = 0; attempt < 3; attempt++) {
        const port = await freePort();
        try {
            return await startOn(port, args, apiKey);
        } catch (err) {
            lastError = err;
            if (!err.portInUse) break; // only a lost race for the port is worth a retry
        }
    }
    throw lastError;
}

async function startOn(port, args, apiKey) {
    const argv = ['serve', '--device', 'cpu', '--host', '127.0.0.1', '--port', String(port),
                  ...EXTRA_ARGS, ...args];
    const proc = spawn(PAGELLM, argv, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(proc);
    // run.sh kills what is listed in PAGELLM_E2E_PIDDIR should this process die unclean.
    const pidFile = process.env.PAGELLM_E2E_PIDDIR && proc.pid
        ? path.join(process.env.PAGELLM_E2E_PIDDIR, String(proc.pid)) : null;
    if (pidFile) writeFileSync(pidFile, server_argv_text(argv));
    let output = '';
    const keep = (chunk) => {
        output += chunk.toString();
        if (output.length > 200000) output = output.slice(-100000);
    };
    proc.stdout.on('data', keep);
    proc.stderr.on('data', keep);
    let stopping = false;
    const exited = new Promise((resolve) => {
        proc.on('exit', (code, signal) => {
            live.delete(proc);
            if (pidFile) rmSync(pidFile, { force: true });
            // A server that dies on its own (a crash, a sanitizer report) says why in the report.
            if (!stopping && (code !== 0 || signal))
                console.error(`e2e: server ${argv.join(' ')} exited on its own (code ${code}, signal ${signal}); ` +
                              `its last output:\n${output.slice(-6000)}`);
            resolve({ code, signal });
        });
        proc.on('error', (err) => {
            live.delete(proc);
            keep(`spawn error: ${err.message}\n`);
            resolve({ code: null, signal: null, error: err });
        });
    });
    let exitInfo = null;
    exited.then((e) => (exitInfo = e));
    const url = `http://127.0.0.1:${port}`;
    const server = {
        url,
        port,
        proc,
        argv: [PAGELLM, ...argv].join(' '),
        exited,
        log: () => output,
        /** Send a signal on purpose (the exit that follows is not reported as a death). */
        signal(sig) {
            stopping = true;
            proc.kill(sig);
        },
        /** SIGTERM, then SIGKILL after graceMs; resolves to {code, signal}. */
        async stop(graceMs = 5000) {
            stopping = true;
            if (exitInfo) return exitInfo;
            proc.kill('SIGTERM');
            const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
            const e = await exited;
            clearTimeout(timer);
            return e;
        },
    };
    const deadline = Date.now() + START_TIMEOUT_MS;
    for (;;) {
        if (exitInfo) {
            const err = new Error(`${server.argv} exited (${JSON.stringify(exitInfo)}) before ` +
                                  `/health answered 200; its output:\n${output.slice(-4000)}`);
            err.portInUse = /address already in use|EADDRINUSE/i.test(output);
            throw err;
        }
        try {
            const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(1000) });
            await res.arrayBuffer();
            if (res.status === 200) break;
        } catch {}
        if (Date.now() > deadline) {
            proc.kill('SIGKILL');
            throw new Error(`${server.argv}: /health not 200 within ${START_TIMEOUT_MS} ms; ` +
                            `its output:\n${output.slice(-4000)}`);
        }
        await sleep(50);
    }
    const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
    const res = await fetch(`${url}/v1/models`, { headers, signal: AbortSignal.timeout(5000) });
    const body = await res.json();
    assert.equal(res.status, 200, `GET /v1/models: ${JSON.stringify(body)}`);
    server.model = body.data[0].id;
    return server;
}

// ---------------------------------------------------------------------------------------
// curl

let curlOk;
/** Is the curl command there? */
export function haveCurl() {
    if (curlOk === undefined) curlOk = spawnSync('curl', ['--version']).status === 0;
    return curlOk;
}

/**
 * One HTTP request through the curl command. `body`: a string/Buffer sent as is, or any
 * other value sent as JSON. Resolves to { status, headers (lower-case names), text, json }
 * where json is the parsed body or undefined.
 */
export function curl(url, { method, body, headers = {}, timeoutS = 30 * SLOW } = {}) {
    const args = ['-sS', '--http1.1', '--max-time', String(timeoutS), '-D', '-', '-o', '-',
                  '-H', 'Expect:'];
    let input = null;
    if (body !== undefined) {
        input = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
        if (!Object.keys(headers).some((h) => h.toLowerCase() === 'content-type'))
            args.push('-H', 'Content-Type: application/json');
        args.push('--data-binary', '@-');
    }
    args.push('-X', method || (body !== undefined ? 'POST' : 'GET'));
    for (const [k, v] of Object.entries(headers)) args.push('-H', `${k}: ${v}`);
    args.push(url);
    return new Promise((resolve, reject) => {
        const child = spawn('curl', args, { stdio: ['pipe', 'pipe', 'pipe'] });
        const out = [];
        let err = '';
        child.stdout.on('data', (c) => out.push(c));
        child.stderr.on('data', (c) => (err += c));
        child.on('error', reject);
        child.stdin.on('error', () => {}); // the server may answer before reading it all
        child.on('close', (code) => {
            const raw = Buffer.concat(out).toString('utf8');
            if (code !== 0) {
                return reject(new Error(`curl ${method || ''} ${url} failed (exit ${code}): ` +
                                        `${err.trim()}; got so far: ${raw.slice(0, 500)}`));
            }
            resolve(parseCurlOutput(raw));
        });
        child.stdin.end(input ?? undefined);
    });
}

function parseCurlOutput(raw) {
    // -D - puts every header block (1xx ones included) before the body.
    let rest = raw;
    for (;;) {
        const end = rest.indexOf('\r\n\r\n');
        if (!rest.startsWith('HTTP/') || end < 0) throw new Error(`bad curl output: ${raw.slice(0, 300)}`);
        const block = rest.slice(0, end);
        rest = rest.slice(end + 4);
        const lines = block.split('\r\n');
        const status = Number(lines[0].split(' ')[1]);
        if (status >= 100 && status < 200) continue;
        const headers = {};
        for (const line of lines.slice(1)) {
            const i = line.indexOf(':');
            if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
        }
        let json;
        try {
            json = JSON.parse(rest);
        } catch {}
        return { status, headers, text: rest, json };
    }
}

// ---------------------------------------------------------------------------------------
// fetch helpers

/** POST JSON with fetch; resolves to { status, headers, json, text }. */
export async function postJSON(url, body, { headers = {}, timeoutMs = scaled(30000) } = {}) {
    const res = await fetch(url, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', ...headers },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    let json;
    try {
        json = JSON.parse(text);
    } catch {}
    return { status: res.status, headers: res.headers, text, json };
}

/**
 * Split an SSE body into its events' data fields. Returns { events: [parsed JSON],
 * done: saw "data: [DONE]", afterDone: events after [DONE] }.
 */
export function parseSSE(text) {
    const events = [];
    let done = false;
    let afterDone = 0;
    for (const block of text.split(/\r?\n\r?\n/)) {
        const data = block
            .split(/\r?\n/)
            .filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).replace(/^ /, ''))
            .join('\n');
        if (!data) continue;
        if (done) {
            afterDone++;
            continue;
        }
        if (data === '[DONE]') {
            done = true;
            continue;
        }
        events.push(JSON.parse(data));
    }
    return { events, done, afterDone };
}

/**
 * Read an SSE response body (fetch) incrementally; onEvent(data string) is called for each
 * event's data, and may return true to stop reading. Stopping leaves the connection open
 * (the reader's lock is released, the body is not cancelled): closing it is the caller's
 * choice (an AbortController). Resolves to the whole text read.
 */
export async function readSSE(res, onEvent) {
    const decoder = new TextDecoder();
    const reader = res.body.getReader();
    let buf = '';
    let all = '';
    try {
        for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            const s = decoder.decode(value, { stream: true });
            buf += s;
            all += s;
            let i;
            while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
                const block = buf.slice(0, i);
                buf = buf.slice(i).replace(/^\r?\n\r?\n/, '');
                const data = block
                    .split(/\r?\n/)
                    .filter((l) => l.startsWith('data:'))
                    .map((l) => l.slice(5).replace(/^ /, ''))
                    .join('\n');
                if (data && onEvent && onEvent(data)) return all;
            }
        }
    } finally {
        reader.releaseLock();
    }
    return all;
}

// ---------------------------------------------------------------------------------------
// Prometheus text

/**
 * Parse Prometheus text format 0.0.4. Returns { samples: [{name, labels, value}], types:
 * {family: type}, help: {family: text} }. Throws on a line that is not valid.
 */
export function parseProm(text) {
    const samples = [];
    const types = {};
    const help = {};
    const sampleRe = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$/;
    for (const line of text.split('\n')) {
        if (line === '') continue;
        let m;
        if ((m = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/.exec(line))) {
            assert.ok(!(m[1] in types), `two # TYPE lines for ${m[1]}`);
            types[m[1]] = m[2];
        } else if ((m = /^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$/.exec(line))) {
            help[m[1]] = m[2];
        } else if (line.startsWith('#')) {
            continue;
        } else {
            m = sampleRe.exec(line);
            assert.ok(m, `not a Prometheus sample line: ${JSON.stringify(line)}`);
            const labels = {};
            if (m[3]) {
                const labelRe = /\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)/y;
                let lm;
                labelRe.lastIndex = 0;
                while (labelRe.lastIndex < m[3].length && (lm = labelRe.exec(m[3])))
                    labels[lm[1]] = lm[2];
                assert.ok(labelRe.lastIndex >= m[3].length || m[3].trim() === '',
                          `bad labels in ${JSON.stringify(line)}`);
            }
            const v = m[4];
            const value = v === '+Inf' ? Infinity : v === '-Inf' ? -Infinity : v === 'NaN' ? NaN : Number(v);
            assert.ok(!Number.isNaN(value) || v === 'NaN', `bad value in ${JSON.stringify(line)}`);
            samples.push({ name: m[1], labels, value });
        }
    }
    return { samples, types, help };
}

/** Sum of the values of every sample called `name` whose labels include `labels`. */
export function promValue(prom, name, labels = {}) {
    const found = prom.samples.filter(
        (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
    if (found.length === 0) return undefined;
    return found.reduce((a, s) => a + s.value, 0);
}

/**
 * Scrape /metrics until ok(prom) is true or `ms` pass; returns the last parsed scrape.
 * (A finished request's counters may land a moment after its last byte reaches the client.)
 */
export async function scrapeUntil(server, ok, ms = 1000) {
    const deadline = Date.now() + scaled(ms);
    for (;;) {
        const prom = await scrape(server);
        if (ok(prom) || Date.now() > deadline) return prom;
        await sleep(20);
    }
}

export async function scrape(server) {
    const res = await fetch(`${server.url}/metrics`, { signal: AbortSignal.timeout(5000) });
    const text = await res.text();
    assert.equal(res.status, 200, `GET /metrics: ${text.slice(0, 300)}`);
    return parseProm(text);
}

// ---------------------------------------------------------------------------------------
// OpenAI shapes

/** Assert `json` is {"error": {"message", "type", "param", "code"}}. */
export function assertErrorShape(json, what = '') {
    assert.ok(json && typeof json === 'object', `${what}: body is not JSON: ${JSON.stringify(json)}`);
    const e = json.error;
    assert.ok(e && typeof e === 'object' && !Array.isArray(e), `${what}: no "error" object: ${JSON.stringify(json)}`);
    assert.equal(typeof e.message, 'string', `${what}: error.message not a string: ${JSON.stringify(json)}`);
    assert.ok(e.message.length > 0, `${what}: empty error.message`);
    assert.equal(typeof e.type, 'string', `${what}: error.type not a string: ${JSON.stringify(json)}`);
    assert.ok('param' in e, `${what}: error.param missing: ${JSON.stringify(json)}`);
    assert.ok(e.param === null || typeof e.param === 'string', `${what}: error.param: ${JSON.stringify(json)}`);
    assert.ok('code' in e, `${what}: error.code missing: ${JSON.stringify(json)}`);
    assert.ok(e.code === null || ['string', 'number'].includes(typeof e.code),
              `${what}: error.code: ${JSON.stringify(json)}`);
}

/** Assert a non-streaming completion response has OpenAI's shape. */
export function assertCompletionShape(json, model) {
    assert.equal(typeof json.id, 'string', JSON.stringify(json));
    assert.equal(json.object, 'text_completion');
    assert.equal(typeof json.created, 'number');
    assert.equal(json.model, model);
    assert.ok(Array.isArray(json.choices) && json.choices.length > 0, JSON.stringify(json));
    for (const c of json.choices) {
        assert.equal(typeof c.index, 'number');
        assert.equal(typeof c.text, 'string');
        assert.ok('logprobs' in c, `choice without logprobs key: ${JSON.stringify(c)}`);
        assert.ok(['stop', 'length'].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
    }
    assert.equal(typeof json.usage?.prompt_tokens, 'number', JSON.stringify(json));
    assert.equal(typeof json.usage?.completion_tokens, 'number');
    assert.equal(json.usage.total_tokens, json.usage.prompt_tokens + json.usage.completion_tokens);
}

/** Options object for test(): a per-test time bound. */
export const T = (ms = 15000) => ({ timeout: scaled(ms) });

/** A short description of a response for assertion messages. */
export const show = (r) => `${r.status} ${(r.text ?? '').slice(0, 400)}`;

