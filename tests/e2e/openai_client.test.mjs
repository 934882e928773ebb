// openai_client.test.mjs - the official `openai` npm package talks to the server unchanged:
// models.list, completions.create plain and streaming (with the usage chunk), error objects.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, GOLDEN, T, scaled } from './server.mjs';

describe('openai client', () => {
    let srv;
    let client;
    before(async () => {
        srv = await startServer();
        client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: scaled(15000) });
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('models.list()', T(), async () => {
        const page = await client.models.list();
        assert.deepEqual(page.data.map((m) => m.id), [srv.model]);
    });

    it('completions.create() equals golden.json', T(), async () => {
        for (const g of GOLDEN) {
            const res = await client.completions.create({
                model: srv.model, prompt: g.prompt, max_tokens: g.max_tokens, temperature: 0,
            });
            assert.equal(res.object, 'text_completion');
            assert.equal(res.choices[0].text, g.text, JSON.stringify(g.prompt));
            assert.equal(res.choices[0].finish_reason, g.finish_reason);
            assert.equal(res.usage.completion_tokens, g.completion_ids.length);
        }
    });

    it('completions.create({stream: true}) equals golden.json', T(), async () => {
        for (const g of GOLDEN) {
            const stream = await client.completions.create({
                model: srv.model, prompt: g.prompt, max_tokens: g.max_tokens, temperature: 0,
                stream: true, stream_options: { include_usage: true },
            });
            let text = '';
            let finish = null;
            let usage = null;
            let chunks = 0;
            for await (const chunk of stream) {
                if (chunk.usage) usage = chunk.usage;
                if (chunk.choices.length === 0) continue;
                chunks++;
                text += chunk.choices[0].text;
                finish = chunk.choices[0].finish_reason ?? finish;
            }
            assert.equal(text, g.text, JSON.stringify(g.prompt));
            assert.equal(finish, g.finish_reason);
            assert.ok(chunks >= g.completion_ids.length, `${chunks} chunks`);
            assert.deepEqual(usage, {
                prompt_tokens: g.prompt_ids.length,
                completion_tokens: g.completion_ids.length,
                total_tokens: g.prompt_ids.length + g.completion_ids.length,
            });
        }
    });

    it('errors reach the client as APIError with status and message', T(), async () => {
        await assert.rejects(
            client.completions.create({ model: srv.model, prompt: 'hi', temperature: -1 }),
            (err) => {
                assert.ok(err instanceof OpenAI.APIError, String(err));
                assert.equal(err.status, 400);
                assert.ok(err.error?.message || err.message, 'a message');
                return true;
            });
        await assert.rejects(
            client.completions.create({ model: 'no-such-model', prompt: 'hi' }),
            (err) => err instanceof OpenAI.NotFoundError);
    });
});
