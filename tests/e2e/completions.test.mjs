// completions.test.mjs - POST /v1/completions through curl against a real server on the
// bundled model: greedy output equals golden.json, streaming, n > 1, stop, logprobs, echo,
// seeds, token-id prompts and lists of prompts.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, curl, parseSSE, GOLDEN, assertCompletionShape, show, T } from './server.mjs';

const ONCE = GOLDEN[0]; // "Once upon a time", 16 tokens
const LILY = GOLDEN.find((c) => c.prompt === 'Lily and Tom'); // completion starts with a space

describe('completions', () => {
    let srv;
    let complete; // (body) => curl response of POST /v1/completions
    before(async () => {
        srv = await startServer();
        complete = (body) => curl(`${srv.url}/v1/completions`, { body: { model: srv.model, ...body } });
    }, T(30000));
    after(async () => {
        if (srv) await srv.stop();
    });

    it('skip_special_tokens false keeps special tokens in the text, stream and not', T(20000), async () => {
        // EOS (</s>, id 2) forced by logit_bias and kept going by ignore_eos
        const body = { prompt: 'Once', max_tokens: 3, temperature: 0, ignore_eos: true, logit_bias: { 2: 100 } };
        const kept = await complete({ ...body, skip_special_tokens: false });
        assert.equal(kept.status, 200, show(kept));
        assert.equal(kept.json.choices[0].text, '</s></s></s>');
        const dropped = await complete(body);
        assert.equal(dropped.status, 200, show(dropped));
        assert.equal(dropped.json.choices[0].text, '');
        const streamed = await complete({ ...body, skip_special_tokens: false, stream: true });
        const { events, done } = parseSSE(streamed.text);
        assert.ok(done, show(streamed));
        const text = events.map((e) => e.choices?.[0]?.text ?? '').join('');
        assert.equal(text, '</s></s></s>');
    });

    it('greedy completions equal golden.json (text, finish_reason, usage)', T(20000), async () => {
        for (const g of GOLDEN) {
            const r = await complete({ prompt: g.prompt, max_tokens: g.max_tokens, temperature: 0 });
            assert.equal(r.status, 200, show(r));
            assert.match(r.headers['content-type'] ?? '', /^application\/json/);
            assertCompletionShape(r.json, srv.model);
            assert.equal(r.json.choices.length, 1);
            const c = r.json.choices[0];
            assert.equal(c.index, 0);
            assert.equal(c.text, g.text, `prompt ${JSON.stringify(g.prompt)} max_tokens ${g.max_tokens}`);
            assert.equal(c.finish_reason, g.finish_reason);
            assert.equal(c.logprobs, null);
            assert.deepEqual(r.json.usage, {
                prompt_tokens: g.prompt_ids.length,
                completion_tokens: g.completion_ids.length,
                total_tokens: g.prompt_ids.length + g.completion_ids.length,
            }, `usage for prompt ${JSON.stringify(g.prompt)}`);
        }
    });

    it('max_tokens defaults to 16', T(), async () => {
        const r = await complete({ prompt: ONCE.prompt, temperature: 0 });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, ONCE.text);
        assert.equal(r.json.usage.completion_tokens, 16);
    });

    it('streaming: SSE, one token per chunk, same text as non-streaming, [DONE], usage chunk', T(20000), async () => {
        for (const g of GOLDEN) {
            const body = { prompt: g.prompt, max_tokens: g.max_tokens, temperature: 0, stream: true,
                           stream_options: { include_usage: true } };
            const r = await complete(body);
            const what = `stream of ${JSON.stringify(g.prompt)}`;
            assert.equal(r.status, 200, show(r));
            assert.match(r.headers['content-type'] ?? '', /^text\/event-stream/, what);
            const { events, done, afterDone } = parseSSE(r.text);
            assert.ok(done, `${what}: no "data: [DONE]": ${r.text.slice(-300)}`);
            assert.equal(afterDone, 0, `${what}: events after [DONE]`);
            assert.ok(r.text.trimEnd().endsWith('data: [DONE]'), `${what}: does not end with data: [DONE]`);
            const usageChunk = events.at(-1);
            assert.deepEqual(usageChunk.choices, [], `${what}: last chunk should have empty choices: ${JSON.stringify(usageChunk)}`);
            assert.deepEqual(usageChunk.usage, {
                prompt_tokens: g.prompt_ids.length,
                completion_tokens: g.completion_ids.length,
                total_tokens: g.prompt_ids.length + g.completion_ids.length,
            }, what);
            const chunks = events.slice(0, -1);
            const ids = new Set();
            for (const ch of chunks) {
                assert.equal(ch.object, 'text_completion', JSON.stringify(ch));
                assert.equal(ch.model, srv.model);
                assert.equal(ch.choices.length, 1, JSON.stringify(ch));
                assert.equal(ch.choices[0].index, 0);
                assert.ok(ch.usage === undefined || ch.usage === null, `${what}: usage in a token chunk: ${JSON.stringify(ch)}`);
                ids.add(ch.id);
            }
            assert.equal(ids.size, 1, `${what}: every chunk should carry the same id`);
            const texts = chunks.map((ch) => ch.choices[0].text);
            assert.equal(texts.join(''), g.text, what);
            const withText = texts.filter((t) => t !== '');
            assert.equal(withText.length, g.completion_ids.length, `${what}: one token per chunk: ${JSON.stringify(texts)}`);
            const reasons = chunks.map((ch) => ch.choices[0].finish_reason ?? null);
            assert.equal(reasons.at(-1), g.finish_reason, `${what}: finish_reason of the last chunk`);
            assert.ok(reasons.slice(0, -1).every((x) => x === null), `${what}: finish_reason before the end: ${reasons}`);
        }
        // Non-streaming gives the same text (here checked against the golden text above), and
        // without include_usage there is no usage chunk.
        const r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stream: true });
        assert.equal(r.status, 200, show(r));
        const { events, done } = parseSSE(r.text);
        assert.ok(done);
        assert.ok(events.every((e) => e.choices.length === 1), 'usage chunk without include_usage');
        assert.equal(events.map((e) => e.choices[0].text).join(''), ONCE.text);
    });

    it('n = 3 with a seed and temperature 1: three choices, indexes 0..2', T(), async () => {
        const r = await complete({ prompt: ONCE.prompt, max_tokens: 16, n: 3, seed: 1234, temperature: 1 });
        assert.equal(r.status, 200, show(r));
        assertCompletionShape(r.json, srv.model);
        const idx = r.json.choices.map((c) => c.index);
        assert.deepEqual(idx, [0, 1, 2]);
        const texts = r.json.choices.map((c) => c.text);
        assert.ok(new Set(texts).size > 1, `three samples at temperature 1 are all the same: ${JSON.stringify(texts)}`);
        assert.equal(r.json.usage.prompt_tokens, ONCE.prompt_ids.length, 'the prompt is counted once');
        assert.ok(r.json.usage.completion_tokens > 16, 'completion tokens of all three choices');
        // The same request again gives the same three choices.
        const r2 = await complete({ prompt: ONCE.prompt, max_tokens: 16, n: 3, seed: 1234, temperature: 1 });
        assert.deepEqual(r2.json.choices.map((c) => c.text), texts, 'same seed, same n choices');
    });

    it('stop: string and list; the stop text is not returned; finish_reason "stop"', T(), async () => {
        // ONCE.text = ", there was a little girl named Lily. She loved to play"
        const cut = (s) => ONCE.text.slice(0, ONCE.text.indexOf(s));
        let r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stop: 'Lily' });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, cut('Lily'));
        assert.equal(r.json.choices[0].finish_reason, 'stop');

        r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stop: ['play', 'girl'] });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, cut('girl'), 'the earliest stop string wins');
        assert.equal(r.json.choices[0].finish_reason, 'stop');

        // A stop string that spans a token boundary (" named Li" + "ly").
        r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stop: ['med Lil'] });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, cut('med Lil'));
        assert.equal(r.json.choices[0].finish_reason, 'stop');

        r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stop: ['xyzzy'] });
        assert.equal(r.json.choices[0].text, ONCE.text);
        assert.equal(r.json.choices[0].finish_reason, 'length');

        // Streaming holds back a possible stop prefix and never sends the stop text.
        r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, stop: 'Lily', stream: true });
        assert.equal(r.status, 200, show(r));
        const { events, done } = parseSSE(r.text);
        assert.ok(done);
        assert.equal(events.map((e) => e.choices[0]?.text ?? '').join(''), cut('Lily'));
        assert.equal(events.at(-1).choices[0].finish_reason, 'stop');
    });

    it('logprobs: 2 gives tokens, token_logprobs, top_logprobs (2 each), text_offset; greedy token is the top one', T(), async () => {
        const r = await complete({ prompt: ONCE.prompt, max_tokens: 16, temperature: 0, logprobs: 2 });
        assert.equal(r.status, 200, show(r));
        const c = r.json.choices[0];
        assert.equal(c.text, ONCE.text);
        const lp = c.logprobs;
        assert.ok(lp && typeof lp === 'object', `logprobs: ${JSON.stringify(lp)}`);
        const n = ONCE.completion_ids.length;
        for (const key of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset'])
            assert.ok(Array.isArray(lp[key]) && lp[key].length === n, `logprobs.${key} should have ${n} entries: ${JSON.stringify(lp[key])}`);
        assert.equal(lp.tokens.join(''), c.text, 'tokens join to the text');
        for (let i = 0; i < n; i++) {
            const lpi = lp.token_logprobs[i];
            assert.ok(typeof lpi === 'number' && lpi <= 0, `token_logprobs[${i}] = ${lpi}`);
            const top = lp.top_logprobs[i];
            assert.equal(Object.keys(top).length, 2, `top_logprobs[${i}] = ${JSON.stringify(top)}`);
            const best = Object.entries(top).sort((a, b) => b[1] - a[1])[0];
            assert.equal(best[0], lp.tokens[i], `token ${i}: the greedy token is the most likely: ${JSON.stringify(top)}`);
            assert.ok(Math.abs(best[1] - lpi) < 1e-4, `token ${i}: top logprob ${best[1]} vs token_logprobs ${lpi}`);
            if (i + 1 < n)
                assert.equal(lp.text_offset[i + 1] - lp.text_offset[i], lp.tokens[i].length, `text_offset[${i + 1}]`);
        }
        // The first step's top-2 gap equals golden.json's logit gap (logprob differences are
        // logit differences).
        const [[, l1], [, l2]] = ONCE.first_step_top5_logits;
        const v = Object.values(lp.top_logprobs[0]).sort((a, b) => b - a);
        assert.ok(Math.abs((v[0] - v[1]) - (l1 - l2)) < 2e-3, `top-2 gap ${v[0] - v[1]}, golden ${l1 - l2}`);
    });

    it('echo: the text starts with the prompt', T(), async () => {
        const r = await complete({ prompt: LILY.prompt, max_tokens: 16, temperature: 0, echo: true });
        assert.equal(r.status, 200, show(r));
        const text = r.json.choices[0].text;
        assert.ok(text.startsWith(LILY.prompt), JSON.stringify(text));
        assert.equal(text, LILY.prompt + LILY.text);
    });

    it('seed: same seed gives the same text, another seed a different one', T(), async () => {
        const body = (seed) => ({ prompt: ONCE.prompt, max_tokens: 32, temperature: 1, seed });
        const a = await complete(body(42));
        const b = await complete(body(42));
        assert.equal(a.status, 200, show(a));
        assert.equal(b.json.choices[0].text, a.json.choices[0].text);
        const others = [];
        for (const seed of [43, 44, 45]) others.push((await complete(body(seed))).json.choices[0].text);
        assert.ok(others.some((t) => t !== a.json.choices[0].text),
                  `seeds 43, 44, 45 all give seed 42's text: ${JSON.stringify(a.json.choices[0].text)}`);
    });

    it('prompt as token ids, and as a list of token-id lists', T(), async () => {
        let r = await complete({ prompt: ONCE.prompt_ids, max_tokens: 16, temperature: 0 });
        assert.equal(r.status, 200, show(r));
        assert.equal(r.json.choices[0].text, ONCE.text);
        assert.equal(r.json.usage.prompt_tokens, ONCE.prompt_ids.length);

        r = await complete({ prompt: [ONCE.prompt_ids, LILY.prompt_ids], max_tokens: 16, temperature: 0 });
        assert.equal(r.status, 200, show(r));
        assert.deepEqual(r.json.choices.map((c) => [c.index, c.text]), [[0, ONCE.text], [1, LILY.text]]);
        assert.equal(r.json.usage.prompt_tokens, ONCE.prompt_ids.length + LILY.prompt_ids.length);
    });

    it('a list of prompts with n = 2: choices ordered by prompt, then n', T(), async () => {
        const r = await complete({ prompt: [ONCE.prompt, LILY.prompt], n: 2, max_tokens: 16, temperature: 0 });
        assert.equal(r.status, 200, show(r));
        assertCompletionShape(r.json, srv.model);
        assert.deepEqual(r.json.choices.map((c) => [c.index, c.text]),
                         [[0, ONCE.text], [1, ONCE.text], [2, LILY.text], [3, LILY.text]]);
        assert.deepEqual(r.json.usage, {
            prompt_tokens: ONCE.prompt_ids.length + LILY.prompt_ids.length,
            completion_tokens: 64,
            total_tokens: ONCE.prompt_ids.length + LILY.prompt_ids.length + 64,
        });
    });
});
