// tokenize.test.mjs - POST /tokenize and /detokenize (vLLM's shapes) on the bundled model:
// prompt and messages forms, the round trip, token strings, the chat prompt counted as chat
// counts it, errors as OpenAI error objects, and the API key.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, assertErrorShape, show, T } from './server.mjs';

const MESSAGES = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: 'Tell me about a cat.' },
];

describe('/tokenize and /detokenize', () => {
    let srv;
    let post; // (path, body, headers) -> curl response
    before(async () => {
        srv = await startServer(['--chat-template', 'chatml', '--api-key', 'k'], { apiKey: 'k' });
        post = (p, body, headers = { Authorization: 'Bearer k' }) => curl(`${srv.url}${p}`, { body, headers });
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('prompt form: BOS by default, round trip without it, token strings', T(), async () => {
        const prompt = 'Once upon a time, Lily saw a cat.';
        const r = await post('/tokenize', { model: srv.model, prompt });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.count, r.json.tokens.length);
        assert.equal(r.json.max_model_len, 512);
        assert.equal(r.json.tokens[0], 1, 'BOS first (add_special_tokens defaults to true)');
        assert.equal(r.json.token_strs, undefined);
        const plain = await post('/tokenize', { prompt, add_special_tokens: false, return_token_strs: true });
        assert.equal(plain.status, 200, show(plain));
        assert.deepEqual(plain.json.tokens, r.json.tokens.slice(1));
        assert.equal(plain.json.token_strs.length, plain.json.count);
        assert.equal(plain.json.token_strs[0], '▁Once');
        const back = await post('/detokenize', { model: srv.model, tokens: plain.json.tokens });
        assert.equal(back.status, 200, show(back));
        assert.deepEqual(back.json, { prompt });
    });

    it('messages form: the chat template, counted as chat counts it', T(), async () => {
        const r = await post('/tokenize', { messages: MESSAGES, return_token_strs: true });
        assert.equal(r.status, 200, show(r));
        const chat = await post('/v1/chat/completions', { messages: MESSAGES, max_tokens: 1 });
        assert.equal(chat.status, 200, show(chat));
        assert.equal(r.json.count, chat.json.usage.prompt_tokens);
        const text = await post('/detokenize', { tokens: r.json.tokens });
        assert.equal(text.json.prompt, '<|im_start|>system\nYou tell short stories.<|im_end|>\n' +
                     '<|im_start|>user\nTell me about a cat.<|im_end|>\n<|im_start|>assistant\n');
        const noGen = await post('/tokenize', { messages: MESSAGES, add_generation_prompt: false });
        assert.ok(noGen.json.count < r.json.count);
        const cont = await post('/tokenize', {
            messages: [...MESSAGES, { role: 'assistant', content: 'Once upon' }],
            add_generation_prompt: false, continue_final_message: true });
        assert.equal(cont.status, 200, show(cont));
        const contText = await post('/detokenize', { tokens: cont.json.tokens });
        assert.match(contText.json.prompt, /<\|im_start\|>assistant\nOnce upon$/);
    });

    it('bad bodies -> 400 / 404 OpenAI errors; the API key is required', T(), async () => {
        for (const [p, body, status, param] of [
            ['/tokenize', {}, 400, 'prompt'],
            ['/tokenize', { prompt: [1, 2] }, 400, 'prompt'],
            ['/tokenize', { prompt: 'x', add_special_tokens: 'yes' }, 400, 'add_special_tokens'],
            ['/tokenize', { messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages'],
            ['/tokenize', { messages: MESSAGES, continue_final_message: true }, 400, 'continue_final_message'],
            ['/tokenize', { prompt: 'x', model: 'other' }, 404, 'model'],
            ['/detokenize', { tokens: [512] }, 400, 'tokens'],
            ['/detokenize', { tokens: [-1] }, 400, 'tokens'],
            ['/detokenize', { tokens: ['a'] }, 400, 'tokens'],
            ['/detokenize', { tokens: 'abc' }, 400, 'tokens'],
            ['/detokenize', { tokens: [1], model: 'other' }, 404, 'model'],
        ]) {
            const r = await post(p, body);
            assert.equal(r.status, status, `${p} ${JSON.stringify(body)}: ${show(r)}`);
            assertErrorShape(r.json, p);
            assert.equal(r.json.error.param, param, show(r));
        }
        const bad = await post('/tokenize', '{"prompt": ', { Authorization: 'Bearer k' });
        assert.equal(bad.status, 400, show(bad));
        for (const p of ['/tokenize', '/detokenize']) {
            const r = await post(p, { prompt: 'x', tokens: [1] }, {});
            assert.equal(r.status, 401, show(r));
            assertErrorShape(r.json, p);
        }
        const get = await curl(`${srv.url}/tokenize`, { headers: { Authorization: 'Bearer k' } });
        assert.equal(get.status, 405, show(get));
    });
});
