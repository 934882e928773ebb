// sampling_fields.test.mjs - request fields that change what is sampled, through a real
// server on the bundled model: logit_bias moves the greedy choice, min_tokens holds back stop
// tokens and EOS, allowed_token_ids and bad_words (vLLM's) restrict the tokens drawn,
// include_stop_str_in_output keeps a matched stop string, truncate_prompt_tokens keeps the
// prompt's last tokens, fields pagellm does not implement
// are refused by name, the three requests that used to kill the server (logprobs 0, best_of >
// n, chat logprobs) are served, NUL characters (\u0000) travel both ways, and a streamed echo
// starts with the prompt.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, GOLDEN, assertErrorShape, show, T } from './server.mjs';

const ONCE = GOLDEN[0]; // "Once upon a time": greedy ids in golden.json

describe('sampling fields', () => {
    let srv;
    let complete, chat;
    before(async () => {
        srv = await startServer(['--chat-template', 'chatml']);
        complete = (body) => curl(`${srv.url}/v1/completions`, { body: { model: srv.model, ...body } });
        chat = (body) => curl(`${srv.url}/v1/chat/completions`, { body: { model: srv.model, ...body } });
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('logit_bias -100 on the greedy token changes the greedy output; +100 forces a token', T(), async () => {
        const base = { prompt: ONCE.prompt, max_tokens: 6, temperature: 0, logprobs: 1 };
        const plain = await complete(base);
        assert.equal(plain.status, 200, show(plain));
        assert.equal(plain.json.choices[0].text, ONCE.text.slice(0, plain.json.choices[0].text.length));
        const first = String(ONCE.completion_ids[0]);
        const down = await complete({ ...base, logit_bias: { [first]: -100 } });
        assert.equal(down.status, 200, show(down));
        assert.notEqual(down.json.choices[0].text, plain.json.choices[0].text);
        assert.notEqual(down.json.choices[0].logprobs.tokens[0], plain.json.choices[0].logprobs.tokens[0]);
        // logprobs stay those of the raw logits: the biased token still leads the top list
        assert.deepEqual(Object.keys(down.json.choices[0].logprobs.top_logprobs[0]),
                         [plain.json.choices[0].logprobs.tokens[0]]);
        const up = await complete({ prompt: ONCE.prompt, max_tokens: 4, temperature: 0, logit_bias: { 200: 100 } });
        assert.equal(up.status, 200, show(up));
        const c = await chat({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, temperature: 0,
                               logit_bias: { 200: 100 } });
        assert.equal(c.status, 200, show(c));
        assert.equal(c.json.choices[0].message.content, up.json.choices[0].text.slice(0, c.json.choices[0].message.content.length));
        assert.equal(c.json.usage.completion_tokens, 3);
    });

    it('allowed_token_ids draws only those tokens; bad_words keeps a word out', T(), async () => {
        const forced = await complete({ prompt: ONCE.prompt, max_tokens: 4, temperature: 0, logit_bias: { 200: 100 } });
        const only = await complete({ prompt: ONCE.prompt, max_tokens: 4, temperature: 0.8, seed: 3,
                                      allowed_token_ids: [200] });
        assert.equal(only.status, 200, show(only));
        assert.equal(only.json.choices[0].text, forced.json.choices[0].text);
        assert.equal(only.json.choices[0].finish_reason, 'length'); // EOS is not in the list
        const plain = await complete({ prompt: ONCE.prompt, max_tokens: 8, temperature: 0 });
        const word = plain.json.choices[0].text.match(/[a-z]+/)[0]; // "there"
        const banned = await complete({ prompt: ONCE.prompt, max_tokens: 8, temperature: 0, bad_words: [word] });
        assert.equal(banned.status, 200, show(banned));
        assert.ok(!banned.json.choices[0].text.includes(word), show(banned));
        const c = await chat({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, temperature: 0,
                               allowed_token_ids: [200], bad_words: ['Lily'] });
        assert.equal(c.status, 200, show(c));
        assert.equal(c.json.choices[0].message.content, forced.json.choices[0].text.slice(0, c.json.choices[0].message.content.length));
        for (const [body, param] of [[{ allowed_token_ids: [] }, 'allowed_token_ids'],
                                     [{ allowed_token_ids: [512] }, 'allowed_token_ids'],
                                     [{ bad_words: [''] }, 'bad_words'], [{ bad_words: 'the' }, 'bad_words']]) {
            const r = await complete({ prompt: 'Hi', ...body });
            assert.equal(r.status, 400, show(r));
            assertErrorShape(r.json);
            assert.equal(r.json.error.param, param);
        }
    });

    it('include_stop_str_in_output keeps the stop string matched, streamed or not', T(), async () => {
        const base = { prompt: ONCE.prompt, max_tokens: 12, temperature: 0, stop: ['girl', 'zzz'] };
        const cut = await complete(base);
        assert.equal(cut.status, 200, show(cut));
        assert.equal(cut.json.choices[0].finish_reason, 'stop');
        const kept = await complete({ ...base, include_stop_str_in_output: true });
        assert.equal(kept.json.choices[0].text, `${cut.json.choices[0].text}girl`);
        assert.equal(kept.json.choices[0].finish_reason, 'stop');
        const streamed = await complete({ ...base, include_stop_str_in_output: true, stream: true });
        const texts = streamed.text.split('\n').filter((l) => l.startsWith('data: {'))
            .map((l) => JSON.parse(l.slice(6)).choices[0].text);
        assert.equal(texts.join(''), kept.json.choices[0].text);
    });

    it('min_tokens with stop_token_ids gives exactly min_tokens tokens', T(), async () => {
        const stops = [];
        for (let i = 0; i < 512; i++) if (i !== 200) stops.push(i);
        const body = { prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stop_token_ids: stops };
        const none = await complete(body);
        assert.equal(none.status, 200, show(none));
        assert.equal(none.json.usage.completion_tokens, 0);
        for (const min of [1, 5]) {
            const r = await complete({ ...body, min_tokens: min });
            assert.equal(r.status, 200, show(r));
            assert.equal(r.json.usage.completion_tokens, min, show(r));
            assert.equal(r.json.choices[0].finish_reason, 'stop');
        }
        // a stop string, too, waits for min_tokens: '\u0000' after forced <0x00> tokens
        const forced = { prompt: ONCE.prompt, max_tokens: 8, temperature: 0, logit_bias: { 3: 100 }, stop: ['\u0000'] };
        const early = await complete(forced);
        assert.equal(early.json.usage.completion_tokens, 1, show(early));
        const held = await complete({ ...forced, min_tokens: 3 });
        assert.equal(held.status, 200, show(held));
        assert.equal(held.json.usage.completion_tokens, 3, show(held));
        assert.equal(held.json.choices[0].finish_reason, 'stop');
        const tooMany = await complete({ ...body, max_tokens: 4, min_tokens: 5 });
        assert.equal(tooMany.status, 400, show(tooMany));
        assertErrorShape(tooMany.json);
        assert.equal(tooMany.json.error.param, 'min_tokens');
    });

    it('the requests that crashed the server are served', T(), async () => {
        for (const body of [{ prompt: 'Hi', max_tokens: 4, logprobs: 0 },
                            { prompt: 'Hi', max_tokens: 4, best_of: 2 },
                            { prompt: 'Hi', max_tokens: 4, best_of: 3, n: 2, logprobs: 0 }]) {
            const r = await complete(body);
            assert.equal(r.status, 200, `${JSON.stringify(body)}: ${show(r)}`);
            assert.equal(r.json.choices.length, body.n ?? 1);
        }
        const c = await chat({ messages: [{ role: 'user', content: 'Hi' }], max_tokens: 3, logprobs: true });
        assert.equal(c.status, 200, show(c));
        assert.equal(c.json.choices[0].logprobs.content.length, 3);
        const health = await curl(`${srv.url}/health`);
        assert.equal(health.status, 200);
    });

    it('NUL characters: accepted in prompts, messages and stop strings, returned in text and SSE', T(), async () => {
        const r = await complete({ prompt: 'a\u0000b', max_tokens: 3, temperature: 0, echo: true });
        assert.equal(r.status, 200, show(r));
        assert.ok(r.json.choices[0].text.startsWith('a\u0000b'), show(r));
        assert.equal(r.json.usage.prompt_tokens, 4); // BOS, a, <0x00>, b
        // forcing <0x00> (id 3) makes the model write NULs: in the JSON body, logprobs, SSE
        const forced = { prompt: 'Once', max_tokens: 3, temperature: 0, logit_bias: { 3: 100 } };
        const body = await complete({ ...forced, logprobs: 1 });
        assert.equal(body.status, 200, show(body));
        assert.equal(body.json.choices[0].text, '\u0000\u0000\u0000');
        assert.deepEqual(body.json.choices[0].logprobs.tokens, ['\u0000', '\u0000', '\u0000']);
        const sse = await complete({ ...forced, stream: true });
        assert.equal(sse.status, 200, show(sse));
        const texts = sse.text.split('\n').filter((l) => l.startsWith('data: {'))
            .map((l) => JSON.parse(l.slice(6)).choices[0].text);
        assert.equal(texts.join(''), '\u0000\u0000\u0000');
        const stopped = await complete({ ...forced, max_tokens: 6, stop: ['\u0000\u0000'] });
        assert.equal(stopped.status, 200, show(stopped));
        assert.equal(stopped.json.choices[0].text, '');
        assert.equal(stopped.json.choices[0].finish_reason, 'stop');
        const c = await chat({ messages: [{ role: 'user', content: 'x\u0000y' }], max_tokens: 2 });
        assert.equal(c.status, 200, show(c));
    });

    it('streaming with echo sends the prompt first', T(), async () => {
        const r = await complete({ prompt: ONCE.prompt, max_tokens: 3, temperature: 0, echo: true, stream: true });
        assert.equal(r.status, 200, show(r));
        const texts = r.text.split('\n').filter((l) => l.startsWith('data: {'))
            .map((l) => JSON.parse(l.slice(6)).choices[0].text);
        assert.equal(texts[0], ONCE.prompt);
        assert.equal(texts.join(''), ONCE.prompt + ONCE.text.slice(0, texts.slice(1).join('').length));
    });

    it('truncate_prompt_tokens keeps the prompt\'s last tokens (vLLM)', T(), async () => {
        const ids = ONCE.prompt_ids; // [BOS, ...]: 5 tokens
        const cut = await complete({ prompt: ONCE.prompt, max_tokens: 6, temperature: 0, truncate_prompt_tokens: 2 });
        assert.equal(cut.status, 200, show(cut));
        assert.equal(cut.json.usage.prompt_tokens, 2);
        const tail = await complete({ prompt: ids.slice(-2), max_tokens: 6, temperature: 0 });
        assert.equal(tail.status, 200, show(tail));
        assert.equal(cut.json.choices[0].text, tail.json.choices[0].text);
        const head = await complete({ prompt: ids.slice(0, 2), max_tokens: 6, temperature: 0 });
        assert.notEqual(head.json.choices[0].text, cut.json.choices[0].text); // the last, not the first
        const whole = await complete({ prompt: ONCE.prompt, max_tokens: 6, temperature: 0 });
        // echo shows what the model read; a prompt within the limit and -1 are left whole
        const echo = await complete({ prompt: ONCE.prompt, max_tokens: 1, temperature: 0, echo: true,
                                      truncate_prompt_tokens: 2 });
        assert.equal(echo.status, 200, show(echo));
        const tailEcho = await complete({ prompt: ids.slice(-2), max_tokens: 1, temperature: 0, echo: true });
        assert.equal(echo.json.choices[0].text, tailEcho.json.choices[0].text);
        assert.ok(!echo.json.choices[0].text.includes('Once'), show(echo));
        for (const k of [5, 64, -1]) {
            const r = await complete({ prompt: ONCE.prompt, max_tokens: 6, temperature: 0, truncate_prompt_tokens: k });
            assert.equal(r.status, 200, show(r));
            assert.equal(r.json.usage.prompt_tokens, 5);
            assert.equal(r.json.choices[0].text, whole.json.choices[0].text);
        }
        const c = await chat({ messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 2, temperature: 0,
                               truncate_prompt_tokens: 2 });
        assert.equal(c.status, 200, show(c));
        assert.equal(c.json.usage.prompt_tokens, 2);
        for (const k of [0, -2, 'x']) {
            const r = await complete({ prompt: ONCE.prompt, max_tokens: 1, truncate_prompt_tokens: k });
            assert.equal(r.status, 400, show(r));
            assertErrorShape(r.json);
            assert.equal(r.json.error.param, 'truncate_prompt_tokens');
        }
    });

    it('fields not implemented are refused with a 400 naming them', T(), async () => {
        const cases = [
            [complete, { prompt: 'Hi', suffix: 'end' }, 'suffix'],
            [complete, { prompt: 'Hi', prompt_logprobs: 1 }, 'prompt_logprobs'],
            [chat, { messages: [{ role: 'user', content: 'Hi' }],
                     functions: [{ name: 'f', parameters: {} }] }, 'functions'],
            [chat, { messages: [{ role: 'user', content: 'Hi' }], prompt_logprobs: 2 }, 'prompt_logprobs'],
        ];
        for (const [send, body, param] of cases) {
            const r = await send(body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${show(r)}`);
            assertErrorShape(r.json);
            assert.equal(r.json.error.param, param);
            assert.match(r.json.error.message, new RegExp(param));
        }
        const unknown = await complete({ prompt: 'Hi', max_tokens: 2, some_future_field: 1 });
        assert.equal(unknown.status, 200, show(unknown));
    });
});
