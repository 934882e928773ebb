// chat.test.mjs - POST /v1/chat/completions: the bundled model has no chat template (400
// that says so); with --chat-template chatml chat works, plain and streaming, through curl
// and through the official openai client; a --chat-template FILE and a model folder's own
// chat_template.jinja are rendered (Jinja) with the request's kwargs, and a template's
// raise_exception is a 400; a template that does not parse stops the start-up.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, curl, parseSSE, assertErrorShape, show, T, scaled, PAGELLM, MODEL_DIR, ROOT, freePort } from './server.mjs';

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

describe('chat with the model\'s own template and with --chat-template FILE', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'pagellm-chat-'));
    const model = path.join(dir, 'model');
    const file = path.join(ROOT, 'tests/data/chat_templates/tinyllama-1.1b-chat-v1.0.jinja');
    let own, fromFile;
    before(async () => {
        cpSync(MODEL_DIR, model, { recursive: true });
        writeFileSync(path.join(model, 'chat_template.jinja'),
                      "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}" +
                      "{{ raise_exception('System role not supported') }}{% endif %}" +
                      '[{{ m.role }}] {{ m.content }}\n{% endfor %}' +
                      '{% if add_generation_prompt %}[assistant]{% if mood is defined %} ({{ mood }}){% endif %}{% endif %}');
        own = await startServer(['--model', model]);
        fromFile = await startServer(['--chat-template', file]);
    }, T(30000));
    after(async () => {
        if (own) await own.stop();
        if (fromFile) await fromFile.stop();
        rmSync(dir, { recursive: true, force: true });
    });

    // The messages' prompt is `text`: /tokenize of both gives the same ids (a decode would
    // not give the text back: SentencePiece puts a space after a special token).
    const promptIs = async (srv, body, text) => {
        const t = await curl(`${srv.url}/tokenize`, { body });
        assert.equal(t.status, 200, show(t));
        const want = await curl(`${srv.url}/tokenize`, { body: { prompt: text, add_special_tokens: false } });
        assert.deepEqual(t.json.tokens, want.json.tokens, `the prompt of ${JSON.stringify(body)} is not ${JSON.stringify(text)}`);
    };

    it('the model folder\'s chat_template.jinja, with chat_template_kwargs', T(), async () => {
        const user = [{ role: 'user', content: 'Hi' }];
        const r = await curl(`${own.url}/v1/chat/completions`, { body: { messages: user, max_tokens: 4, temperature: 0 } });
        assert.equal(r.status, 200, show(r));
        await promptIs(own, { messages: user }, '<s>[user] Hi\n[assistant]');
        await promptIs(own, { messages: user, chat_template_kwargs: { mood: 'calm' } }, '<s>[user] Hi\n[assistant] (calm)');
        const bad = await curl(`${own.url}/v1/chat/completions`, {
            body: { messages: [{ role: 'system', content: 's' }, ...user], max_tokens: 4 } });
        assert.equal(bad.status, 400, show(bad));
        assertErrorShape(bad.json, 'raise_exception');
        assert.equal(bad.json.error.message, 'System role not supported');
    });

    it('--chat-template FILE (TinyLlama\'s template) through the openai client', T(), async () => {
        const client = new OpenAI({ baseURL: `${fromFile.url}/v1`, apiKey: 'x', maxRetries: 0, timeout: scaled(15000) });
        const res = await client.chat.completions.create({ model: fromFile.model, messages: MESSAGES, max_tokens: 8, temperature: 0 });
        assert.equal(res.choices[0].message.role, 'assistant');
        await promptIs(fromFile, { messages: MESSAGES },
                       '<|system|>\nYou tell short stories.</s>\n<|user|>\nTell me about a cat.</s>\n<|assistant|>\n');
    });

    it('a template that does not parse, or an unknown name, stops the start-up', T(), async () => {
        const broken = path.join(dir, 'broken.jinja');
        writeFileSync(broken, 'ok\n{% for m in messages %}');
        for (const [arg, pattern] of [[broken, /broken\.jinja: line 2/], ['vicuna', /key 'chat-template' = 'vicuna'/]]) {
            const port = String(await freePort());
            const r = spawnSync(PAGELLM, ['serve', '--device', 'cpu', '--host', '127.0.0.1', '--port', port, '--chat-template', arg], { cwd: ROOT, encoding: 'utf8', timeout: scaled(20000) });
            assert.equal(r.status, 1, r.stderr);
            assert.match(r.stderr, pattern);
        }
    });
});
