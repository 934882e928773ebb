// startup.test.mjs - start-up faults of `pagellm serve`: each ends the process with a
// non-zero exit status and one error line on stderr that names the thing at fault (folder,
// file, key, tensor, port), with no crash, no hang and nothing else but the "listening"
// line the server prints before it loads the model.
//
// Faults: missing model folder; a file that cannot be read (chmod 000 when not root, a
// directory in the file's place always); truncated safetensors; a safetensors header that
// is not JSON or whose length is absurd; config.json that is not JSON, lacks a key or has
// a wrong type; a tokenizer.json that is not JSON; KV blocks beyond memory; the port in use.
// (Out of backend memory while loading weights and activations is tested in
// tests/test_engine.c with a memory-limited backend.)

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { cpSync, mkdtempSync, rmSync, mkdirSync, writeFileSync, readFileSync, truncateSync, chmodSync, statSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { PAGELLM, MODEL_DIR, ROOT, freePort, T, scaled } from './server.mjs';

const IS_ROOT = process.getuid?.() === 0;

/** Run `pagellm serve ...args`; resolves to { code, signal, stdout, stderr } or rejects on a hang. */
function serve(args) {
    return new Promise((resolve, reject) => {
        const p = spawn(PAGELLM, ['serve', '--device', 'cpu', '--host', '127.0.0.1', ...args], { cwd: ROOT });
        let stdout = '';
        let stderr = '';
        p.stdout.on('data', (d) => (stdout += d));
        p.stderr.on('data', (d) => (stderr += d));
        const timer = setTimeout(() => {
            p.kill('SIGKILL');
            reject(new Error(`pagellm serve ${args.join(' ')} still runs after ${scaled(20000)} ms:\n${stderr}`));
        }, scaled(20000));
        p.on('exit', (code, signal) => {
            clearTimeout(timer);
            p.stdout.on('end', () => {});
            setImmediate(() => resolve({ code, signal, stdout, stderr }));
        });
    });
}

/** The run failed with exit status 1 and one error line matching every pattern. */
function assertOneLineError(r, patterns, what) {
    // Not counted: the line the server prints before loading, and ASan's note on an allocation
    // it refuses (an ASan build with allocator_may_return_null=1, as .ci/run runs it).
    const lines = r.stderr.split('\n').filter((l) => l !== '' && !/^pagellm: listening on /.test(l) &&
                                                   !/^==\d+==WARNING: AddressSanitizer failed to allocate/.test(l));
    const ctx = `${what}: exit ${r.code} (signal ${r.signal}), stderr:\n${r.stderr}`;
    assert.equal(r.signal, null, ctx);
    assert.equal(r.code, 1, ctx);
    assert.equal(lines.length, 1, `not one error line: ${ctx}`);
    assert.match(lines[0], /^pagellm: \S/, ctx);
    for (const p of patterns) assert.match(lines[0], p, ctx);
    assert.equal(r.stdout, '', `${what}: stdout: ${r.stdout}`);
    assert.doesNotMatch(r.stderr, /ERROR: AddressSanitizer|LeakSanitizer|runtime error|Segmentation|Aborted|assert/i, ctx);
}

const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

describe('start-up faults', () => {
    let tmp;
    let port;
    // A copy of the bundled model folder, altered by `spoil(dir)`; returns its path.
    const model = (name, spoil) => {
        const dir = path.join(tmp, name);
        cpSync(MODEL_DIR, dir, { recursive: true });
        spoil(dir);
        return dir;
    };
    before(async () => {
        tmp = mkdtempSync(path.join(os.tmpdir(), 'pagellm-startup-'));
        port = await freePort();
    });
    after(() => {
        if (tmp) rmSync(tmp, { recursive: true, force: true });
    });

    it('missing model folder', T(30000), async () => {
        const dir = path.join(tmp, 'no-such-model');
        const r = await serve(['--port', String(port), '--model', dir]);
        assertOneLineError(r, [new RegExp(esc(dir)), /No such file or directory/], 'missing folder');
    });

    it('a file that cannot be read (a directory in its place; chmod 000 when not root)', T(30000), async (t) => {
        const dir = model('dir-in-place', (d) => {
            rmSync(path.join(d, 'model.safetensors'));
            mkdirSync(path.join(d, 'model.safetensors'));
        });
        let r = await serve(['--port', String(port), '--model', dir]);
        assertOneLineError(r, [new RegExp(esc(path.join(dir, 'model.safetensors')))], 'directory for a file');
        const dir2 = model('config-dir', (d) => {
            rmSync(path.join(d, 'config.json'));
            mkdirSync(path.join(d, 'config.json'));
        });
        r = await serve(['--port', String(port), '--model', dir2]);
        assertOneLineError(r, [/config\.json/], 'directory for config.json');
        if (IS_ROOT) {
            t.diagnostic('running as root: chmod 000 does not stop root reading, so that case is skipped');
            return;
        }
        const dir3 = model('unreadable', (d) => chmodSync(path.join(d, 'model.safetensors'), 0));
        r = await serve(['--port', String(port), '--model', dir3]);
        assertOneLineError(r, [/model\.safetensors/, /Permission denied/i], 'chmod 000');
    });

    it('corrupt safetensors: truncated, header not JSON, absurd header length', T(30000), async () => {
        const st = (d) => path.join(d, 'model.safetensors');
        const cases = [
            ['truncated', (d) => truncateSync(st(d), Math.floor(statSync(st(d)).size / 2)), /truncated|past|beyond|short/i],
            ['shorter than its header', (d) => truncateSync(st(d), 20), /safetensors/],
            ['header not JSON', (d) => {
                const h = Buffer.from('{"a": [1, 2], not json at all}   ');
                const len = Buffer.alloc(8);
                len.writeBigUInt64LE(BigInt(h.length));
                writeFileSync(st(d), Buffer.concat([len, h, Buffer.alloc(64)]));
            }, /JSON/],
            ['absurd header length', (d) => {
                const len = Buffer.alloc(8);
                len.writeBigUInt64LE(1n << 62n);
                writeFileSync(st(d), Buffer.concat([len, Buffer.from('{}')]));
            }, /header/],
            ['empty file', (d) => writeFileSync(st(d), ''), /safetensors/],
        ];
        for (const [name, spoil, why] of cases) {
            const dir = model(`st-${name.replace(/\W+/g, '-')}`, spoil);
            const r = await serve(['--port', String(port), '--model', dir]);
            assertOneLineError(r, [new RegExp(esc(st(dir))), why], `safetensors ${name}`);
        }
    });

    it('bad config.json: not JSON, a missing key, a wrong type; bad tokenizer.json', T(30000), async () => {
        const cfg = JSON.parse(readFileSync(path.join(MODEL_DIR, 'config.json'), 'utf8'));
        const write = (d, obj) => writeFileSync(path.join(d, 'config.json'), typeof obj === 'string' ? obj : JSON.stringify(obj));
        const cases = [
            ['not JSON', (d) => write(d, '{"hidden_size": 64,'), /config\.json/, /JSON/],
            ['missing key', (d) => write(d, { ...cfg, num_hidden_layers: undefined }), /config\.json/, /num_hidden_layers/],
            ['wrong type', (d) => write(d, { ...cfg, hidden_size: 'big' }), /config\.json/, /hidden_size/],
            ['negative size', (d) => write(d, { ...cfg, num_attention_heads: -8 }), /config\.json/, /num_attention_heads/],
            ['tokenizer.json not JSON', (d) => writeFileSync(path.join(d, 'tokenizer.json'), 'garbage'), /tokenizer\.json/, /JSON/],
        ];
        for (const [name, spoil, ...why] of cases) {
            const dir = model(`cfg-${name.replace(/\W+/g, '-')}`, spoil);
            const r = await serve(['--port', String(port), '--model', dir]);
            assertOneLineError(r, [new RegExp(esc(dir)), ...why], `config ${name}`);
        }
    });

    it('KV blocks beyond memory', T(30000), async () => {
        const r = await serve(['--port', String(port), '--num-gpu-blocks-override', '100000000']);
        assertOneLineError(r, [/out of .*memory/i, /num-gpu-blocks-override|gpu-memory-utilization/], 'KV blocks beyond memory');
    });

    it('port in use', T(30000), async () => {
        const holder = net.createServer();
        await new Promise((resolve, reject) => {
            holder.once('error', reject);
            holder.listen(0, '127.0.0.1', resolve);
        });
        const busy = holder.address().port;
        try {
            const r = await serve(['--port', String(busy)]);
            assertOneLineError(r, [new RegExp(`127\\.0\\.0\\.1:${busy}`), /in use/i], 'port in use');
        } finally {
            holder.close();
        }
    });
});
