// chat.test.mjs - POST /v1/chat/completions: the bundled model has no chat template (400
// that says so); with --chat-template chatml chat works, plain and streaming, through curl
// and through the official openai client.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, curl, parseSSE, assertErrorShape, show, T, scaled } from './server.mjs';

const MESSAGES = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me about a cat.' },
];

describe('chat without a template', () => {
    let srv;
    before(async () => {
        srv = await startServer();
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('the bundled model has no chat template -> 400 that says so', T(), async () => {
        const r = await curl(`${srv.url}/v1/chat/completions`, {
            body: { model: srv.model, messages: MESSAGES, max_tokens: 8 },
        });
        assert.equal(r.status, 400, show(r));
        assertErrorShape(r.json, 'chat without template');
        assert.match(r.json.error.message, /template/i, 'the message should say there is no chat template');
    });
});

describe('chat with --chat-template chatml', () => {
    let srv;
    let chat; // body -> curl response
    before(async () => {
        srv = await startServer(['--chat-template', 'chatml']);
        chat = (body) => curl(`${srv.url}/v1/chat/completions`, { body: { model: srv.model, ...body } });
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    let plain; // the non-streaming answer, compared with the streaming one

    it('chat completion (curl)', T(), async () => {
        const r = await chat({ messages: MESSAGES, max_tokens: 16, temperature: 0 });
        assert.equal(r.status, 200, show(r));
        const j = r.json;
        assert.equal(typeof j.id, 'string');
        assert.equal(j.object, 'chat.completion');
        assert.equal(typeof j.created, 'number');
        assert.equal(j.model, srv.model);
        assert.equal(j.choices.length, 1);
        const c = j.choices[0];
        assert.equal(c.index, 0);
        assert.equal(c.message.role, 'assistant');
        assert.equal(typeof c.message.content, 'string');
        assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
        assert.ok(j.usage.prompt_tokens > 10, `the chatml prompt has more than 10 tokens: ${JSON.stringify(j.usage)}`);
        assert.ok(j.usage.completion_tokens >= 1 && j.usage.completion_tokens <= 16);
        assert.equal(j.usage.total_tokens, j.usage.prompt_tokens + j.usage.completion_tokens);
        plain = { content: c.message.content, finish_reason: c.finish_reason, usage: j.usage };

        // Content as a list of text parts is the same prompt.
        const parts = MESSAGES.map((m) => ({ role: m.role, content: [{ type: 'text', text: m.content }] }));
        const r2 = await chat({ messages: parts, max_tokens: 16, temperature: 0 });
        assert.equal(r2.status, 200, show(r2));
        assert.equal(r2.json.choices[0].message.content, plain.content);
        assert.deepEqual(r2.json.usage, plain.usage);
    });

    it('chat completion streaming (curl): chunks, same text, [DONE]', T(), async () => {
        assert.ok(plain, 'needs the non-streaming test');
        const r = await chat({ messages: MESSAGES, max_tokens: 16, temperature: 0, stream: true,
                               stream_options: { include_usage: true } });
        assert.equal(r.status, 200, show(r));
        assert.match(r.headers['content-type'] ?? '', /^text\/event-stream/);
        const { events, done } = parseSSE(r.text);
        assert.ok(done, 'data: [DONE]');
        const usage = events.at(-1);
        assert.deepEqual(usage.choices, [], `usage chunk: ${JSON.stringify(usage)}`);
        assert.deepEqual(usage.usage, plain.usage);
        const chunks = events.slice(0, -1);
        for (const ch of chunks) {
            assert.equal(ch.object, 'chat.completion.chunk', JSON.stringify(ch));
            assert.equal(ch.choices.length, 1);
            assert.equal(typeof ch.choices[0].delta, 'object', JSON.stringify(ch));
        }
        assert.equal(chunks[0].choices[0].delta.role, 'assistant', 'the first delta names the role');
        const text = chunks.map((ch) => ch.choices[0].delta.content ?? '').join('');
        assert.equal(text, plain.content);
        assert.equal(chunks.at(-1).choices[0].finish_reason, plain.finish_reason);
    });

    it('chat through the openai client, plain and streaming', T(), async () => {
        assert.ok(plain, 'needs the non-streaming test');
        const client = new OpenAI({ baseURL: `${srv.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: scaled(15000) });
        const res = await client.chat.completions.create({ model: srv.model, messages: MESSAGES, max_tokens: 16, temperature: 0 });
        assert.equal(res.choices[0].message.content, plain.content);
        assert.equal(res.choices[0].message.role, 'assistant');
        const stream = await client.chat.completions.create({ model: srv.model, messages: MESSAGES, max_tokens: 16, temperature: 0, stream: true });
        let text = '';
        let finish = null;
        for await (const chunk of stream) {
            text += chunk.choices[0]?.delta?.content ?? '';
            finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(text, plain.content);
        assert.equal(finish, plain.finish_reason);
    });

    it('bad chat bodies -> 400', T(), async () => {
        for (const [name, body] of [
            ['no messages', { max_tokens: 4 }],
            ['empty messages', { messages: [], max_tokens: 4 }],
            ['messages not a list', { messages: 'hi', max_tokens: 4 }],
            ['unknown role', { messages: [{ role: 'wizard', content: 'hi' }], max_tokens: 4 }],
            ['content of the wrong type', { messages: [{ role: 'user', content: 5 }], max_tokens: 4 }],
        ]) {
            const r = await chat(body);
            assert.equal(r.status, 400, `${name}: ${show(r)}`);
            assertErrorShape(r.json, name);
        }
    });
});
