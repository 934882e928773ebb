// tools.test.mjs - chat tool calling and reasoning output through real servers on the bundled
// 260K-parameter model, which knows nothing of tools: tool_choice "required" and a named
// function are enforced by constrained decoding, so 20 of 20 seeded samples (JSON body and
// SSE stream, without a parser and with the hermes parser) return tool_calls whose arguments
// parse and validate against the function's parameters schema, with finish_reason
// "tool_calls"; the official openai client's tools call works unchanged; "auto" without
// enable-auto-tool-choice and malformed tools are 400s naming the field. Reasoning: with a
// reasoning parser a constraint applies after the reasoning, as vLLM's reasoning-aware
// structured output does: this model never writes </think> by itself, so an answer that starts
// in its reasoning (deepseek_r1, or a prompt that opens <think>) stays free, token for token the
// unconstrained answer; a prompt that closed its think block (enable_thinking false) is
// constrained from the first token, which lets a guided_regex force a think block of the
// output's own, and the test checks how deepseek_r1 and qwen3 split it (reasoning_content,
// content, markers never shown); an unconstrained deepseek_r1 answer is all reasoning, as vLLM's
// parser makes it. The parsers of real models' formats are unit tested in
// tests/test_tool_parser.c.

import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';
import { startServer, curl, parseSSE, assertErrorShape, show, T } from './server.mjs';

const WEATHER = {
    type: 'object',
    properties: {
        city: { type: 'string', minLength: 1, maxLength: 10 },
        days: { type: 'integer', minimum: 1, maximum: 7 },
        unit: { enum: ['c', 'f'] },
    },
    required: ['city', 'days'],
    additionalProperties: false,
};
const TIME = { type: 'object', properties: { tz: { enum: ['UTC', 'CET'] } }, required: ['tz'], additionalProperties: false };
const TOOLS = [
    { type: 'function', function: { name: 'get_weather', description: 'The weather', parameters: WEATHER } },
    { type: 'function', function: { name: 'get_time', parameters: TIME } },
];
const SCHEMAS = { get_weather: WEATHER, get_time: TIME };
const MESSAGES = [{ role: 'user', content: 'What is the weather in Paris?' }];
// chatml with a think block the prompt opens, or closes (as Qwen3's enable_thinking false does)
const CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
    '<|im_start|>assistant\n';
const OPEN_THINK = `${CHATML}<think>\n`;
const CLOSED_THINK = `${CHATML}<think>\n\n</think>\n\n`;
// Qwen3's own template (tests/data/chat_templates/qwen3-0.6b.jinja)
const QWEN3 = readFileSync(new URL('../data/chat_templates/qwen3-0.6b.jinja', import.meta.url), 'utf8');

/** The keywords WEATHER and TIME use, checked by hand: a list of what is wrong. */
function validate(v, s) {
    const errs = [];
    if (typeof v !== 'object' || v === null || Array.isArray(v)) return ['not an object'];
    for (const k of s.required) if (!(k in v)) errs.push(`missing ${k}`);
    for (const [k, x] of Object.entries(v)) {
        const p = s.properties[k];
        if (!p) errs.push(`extra ${k}`);
        else if (p.enum && !p.enum.includes(x)) errs.push(`${k} not in enum`);
        else if (p.type === 'string' && (typeof x !== 'string' || x.length < p.minLength || x.length > p.maxLength))
            errs.push(`${k} bad string`);
        else if (p.type === 'integer' && (!Number.isInteger(x) || x < p.minimum || x > p.maximum)) errs.push(`${k} bad integer`);
    }
    return errs;
}

function checkCalls(calls, names = Object.keys(SCHEMAS), what = '') {
    assert.ok(Array.isArray(calls) && calls.length >= 1, `no tool_calls ${what}`);
    for (const c of calls) {
        assert.equal(c.type, 'function', what);
        assert.match(c.id, /^call_[A-Za-z0-9]{24}$/, what);
        assert.ok(names.includes(c.function.name), `${c.function.name} ${what}`);
        let args;
        assert.doesNotThrow(() => { args = JSON.parse(c.function.arguments); }, `${c.function.arguments} ${what}`);
        assert.deepEqual(validate(args, SCHEMAS[c.function.name]), [], `${c.function.arguments} ${what}`);
    }
}

/** A streamed chat answer put back together: per choice, content, reasoning and tool calls. */
function assemble(text) {
    const { events, done } = parseSSE(text);
    assert.ok(done, 'no [DONE]');
    const out = {};
    for (const ev of events) {
        for (const c of ev.choices) {
            const o = (out[c.index] ??= { content: '', reasoning: '', calls: [], finish: null });
            const d = c.delta ?? {};
            if (d.content) o.content += d.content;
            if (d.reasoning_content) o.reasoning += d.reasoning_content;
            for (const tc of d.tool_calls ?? []) {
                if (tc.id) {
                    assert.equal(tc.index, o.calls.length, 'calls start in order');
                    assert.equal(tc.function.arguments, '');
                    o.calls.push({ id: tc.id, type: tc.type, function: { name: tc.function.name, arguments: '' } });
                } else {
                    assert.ok(o.calls[tc.index], 'arguments before their call');
                    o.calls[tc.index].function.arguments += tc.function.arguments;
                }
            }
            if (c.finish_reason) o.finish = c.finish_reason;
        }
    }
    return Object.values(out);
}

describe('tool calling and reasoning', () => {
    let plain, hermes, r1;
    const chat = (srv, body) => curl(`${srv.url}/v1/chat/completions`,
        { body: { model: srv.model, messages: MESSAGES, ...body }, timeoutS: 120 });
    before(async () => {
        [plain, hermes, r1] = await Promise.all([
            startServer(['--chat-template', 'chatml']),
            startServer(['--chat-template', 'chatml', '--tool-call-parser', 'hermes', '--enable-auto-tool-choice',
                         '--reasoning-parser', 'qwen3']),
            startServer(['--chat-template', 'chatml', '--reasoning-parser', 'deepseek_r1']),
        ]);
    }, T(60000));
    after(async () => {
        await Promise.all([plain, hermes, r1].filter(Boolean).map((s) => s.stop()));
    });

    for (const [label, srv] of [['no parser', () => plain], ['hermes', () => hermes]]) {
        it(`required (${label}): 20 of 20 samples call a tool with valid arguments`, T(120000), async () => {
            const rs = await Promise.all([1, 2].map((seed) => chat(srv(), {
                tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false, n: 10, seed, max_tokens: 300 })));
            let count = 0;
            for (const r of rs) {
                assert.equal(r.status, 200, show(r));
                for (const c of r.json.choices) {
                    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
                    assert.equal(c.message.content, null);
                    assert.equal(c.message.tool_calls.length, 1);
                    checkCalls(c.message.tool_calls, undefined, JSON.stringify(c.message));
                    count++;
                }
            }
            assert.equal(count, 20);
        });

        it(`required (${label}), streamed: 20 of 20 samples, argument fragments add up`, T(120000), async () => {
            const rs = await Promise.all([3, 4].map((seed) => chat(srv(), {
                tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false, n: 10, seed, max_tokens: 300,
                stream: true })));
            let count = 0;
            for (const r of rs) {
                assert.equal(r.status, 200, show(r));
                for (const o of assemble(r.text)) {
                    assert.equal(o.finish, 'tool_calls', JSON.stringify(o));
                    assert.equal(o.content.trim(), '', 'no marker or call text as content');
                    checkCalls(o.calls, undefined, JSON.stringify(o));
                    count++;
                }
            }
            assert.equal(count, 20);
        });
    }

    it('the same seed gives the same calls streamed and not', T(60000), async () => {
        const body = { tools: TOOLS, tool_choice: 'required', seed: 11, max_tokens: 300 };
        const [a, b] = await Promise.all([chat(hermes, body), chat(hermes, { ...body, stream: true })]);
        const whole = a.json.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]);
        const streamed = assemble(b.text)[0].calls.map((c) => [c.function.name, c.function.arguments]);
        assert.deepEqual(streamed, whole);
    });

    it('parallel calls (the default): every call valid', T(60000), async () => {
        const r = await chat(hermes, { tools: TOOLS, tool_choice: 'required', n: 4, seed: 21, max_tokens: 450 });
        assert.equal(r.status, 200, show(r));
        assert.ok(r.json.choices.some((c) => c.finish_reason === 'tool_calls'), show(r));
        for (const c of r.json.choices) {
            if (c.finish_reason === 'length') continue; // cut short: no calls claimed
            assert.equal(c.finish_reason, 'tool_calls');
            checkCalls(c.message.tool_calls);
        }
    });

    it('a named function is the one called', T(60000), async () => {
        for (const srv of [plain, hermes]) {
            const r = await chat(srv, { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_time' } },
                                        n: 5, seed: 8, max_tokens: 200 });
            assert.equal(r.status, 200, show(r));
            for (const c of r.json.choices) {
                assert.equal(c.finish_reason, 'tool_calls');
                assert.equal(c.message.tool_calls.length, 1);
                checkCalls(c.message.tool_calls, ['get_time']);
            }
        }
    });

    it('auto: 400 without enable-auto-tool-choice; with it, plain text stays content', T(60000), async () => {
        for (const body of [{ tools: TOOLS }, { tools: TOOLS, tool_choice: 'auto' }]) {
            const r = await chat(plain, body);
            assert.equal(r.status, 400, show(r));
            assertErrorShape(r.json);
            assert.equal(r.json.error.param, 'tool_choice');
            assert.match(r.json.error.message, /--enable-auto-tool-choice/);
        }
        const r = await chat(hermes, { tools: TOOLS, seed: 3, max_tokens: 30,
                                       chat_template_kwargs: { enable_thinking: false } });
        assert.equal(r.status, 200, show(r));
        const c = r.json.choices[0];
        assert.equal(typeof c.message.content, 'string');
        assert.equal(c.message.tool_calls, undefined);
        assert.notEqual(c.finish_reason, 'tool_calls');
        const none = await chat(plain, { tools: TOOLS, tool_choice: 'none', seed: 3, max_tokens: 10 });
        assert.equal(none.status, 200, show(none));
        assert.equal(typeof none.json.choices[0].message.content, 'string');
    });

    it('auto: calls are read from the text as written, unchecked against the schema (as vLLM)', T(60000), async () => {
        // a guided_regex makes the model write the calls: auto does not constrain the arguments,
        // so a call whose arguments break get_weather's schema (city a number, days missing, an
        // unknown key) comes back as written, and one that is not JSON leaves the text as content
        const esc = (t) => t.replace(/[{}[\]()*+?.\\|^$]/g, '\\$&');
        const wrong = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5, "zz": true}}\n</tool_call>';
        const broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>';
        const r = await chat(hermes, { tools: TOOLS, tool_choice: 'auto', guided_regex: esc(wrong), max_tokens: 200 });
        assert.equal(r.status, 200, show(r));
        const c = r.json.choices[0];
        assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
        assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
        assert.equal(c.message.tool_calls[0].function.arguments, '{"city": 5, "zz": true}');
        assert.notDeepEqual(validate(JSON.parse(c.message.tool_calls[0].function.arguments), WEATHER), []);
        const b = await chat(hermes, { tools: TOOLS, tool_choice: 'auto', guided_regex: esc(broken), max_tokens: 200 });
        assert.equal(b.status, 200, show(b));
        assert.equal(b.json.choices[0].message.tool_calls, undefined);
        assert.equal(b.json.choices[0].message.content, broken);
        assert.notEqual(b.json.choices[0].finish_reason, 'tool_calls');
    });

    it('malformed tools and tool_choice: 400 naming the field', T(30000), async () => {
        const cases = [
            [{ tools: {} }, 'tools', /'tools' must be a list/],
            [{ tools: [{ type: 'function' }] }, 'tools', /'tools\[0\]\.function' must be an object/],
            [{ tools: [{ type: 'x', function: { name: 'f' } }] }, 'tools', /'tools\[0\]\.type'/],
            [{ tools: [{ type: 'function', function: { name: 'bad name' } }], tool_choice: 'none' }, 'tools',
             /'tools\[0\]\.function\.name'/],
            [{ tools: [{ type: 'function', function: { name: 'f', parameters: 3 } }], tool_choice: 'none' }, 'tools',
             /'tools\[0\]\.function\.parameters'/],
            [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice', /'nope'/],
            [{ tools: TOOLS, tool_choice: 'sometimes' }, 'tool_choice', /must be "none"/],
            [{ tool_choice: 'required' }, 'tool_choice', /needs 'tools'/],
            [{ tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice',
             /response_format/],
            [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties:
                { a: { type: 'number', multipleOf: 2 } } } } }], tool_choice: 'required' }, 'tools', /multipleOf/],
            [{ chat_template: '{% for %}' }, 'chat_template', /line 1/],
        ];
        for (const [body, param, re] of cases) {
            const r = await chat(plain, body);
            assert.equal(r.status, 400, `${JSON.stringify(body)}: ${show(r)}`);
            assertErrorShape(r.json);
            assert.equal(r.json.error.param, param, JSON.stringify(body));
            assert.match(r.json.error.message, re);
        }
    });

    it('a request chat_template renders the prompt', T(30000), async () => {
        const tmpl = '{% for m in messages %}{{ m.content }}{% endfor %} Once upon a time';
        const r = await curl(`${plain.url}/tokenize`, { body: { messages: MESSAGES } });
        const r2 = await chat(plain, { chat_template: tmpl, max_tokens: 5, seed: 1 });
        assert.equal(r2.status, 200, show(r2));
        assert.notEqual(r2.json.usage.prompt_tokens, r.json.count); // not the chatml prompt
    });

    it('the official openai client: tools with tool_choice required, stream and not', T(60000), async () => {
        const client = new OpenAI({ baseURL: `${hermes.url}/v1`, apiKey: 'unused', maxRetries: 0 });
        const res = await client.chat.completions.create({
            model: hermes.model, messages: MESSAGES, tools: TOOLS, tool_choice: 'required', parallel_tool_calls: false,
            max_tokens: 300, seed: 5 });
        assert.equal(res.choices[0].finish_reason, 'tool_calls');
        checkCalls(res.choices[0].message.tool_calls);
        const stream = await client.chat.completions.create({
            model: hermes.model, messages: MESSAGES, tools: TOOLS,
            tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 300, seed: 6, stream: true });
        const calls = [];
        let finish;
        for await (const chunk of stream) {
            for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
                if (tc.id) calls[tc.index] = { id: tc.id, type: tc.type, function: { name: tc.function.name, arguments: '' } };
                else calls[tc.index].function.arguments += tc.function.arguments;
            }
            finish = chunk.choices[0]?.finish_reason ?? finish;
        }
        assert.equal(finish, 'tool_calls');
        checkCalls(calls, ['get_weather']);
    });

    it('reasoning: a forced think block is split off, stream and not', T(60000), async () => {
        // the prompt closed its think block: the pattern applies from the first token
        const guided_regex = '<think>[a-z]{2,6}( [a-z]{2,6}){1,4}</think>[A-Z][a-z]{2,8}';
        for (const srv of [r1, hermes]) { // deepseek_r1 and qwen3
            const r = await chat(srv, { guided_regex, seed: 4, max_tokens: 100, chat_template: CLOSED_THINK });
            assert.equal(r.status, 200, show(r));
            const m = r.json.choices[0].message;
            assert.match(m.reasoning_content, /^[a-z]{2,6}( [a-z]{2,6}){1,4}$/, JSON.stringify(m));
            assert.equal(m.reasoning, m.reasoning_content);
            assert.match(m.content, /^[A-Z][a-z]{2,8}$/, JSON.stringify(m));
            const s = await chat(srv, { guided_regex, seed: 4, max_tokens: 100, stream: true,
                                        chat_template: CLOSED_THINK });
            const events = parseSSE(s.text).events;
            const kinds = events.flatMap((e) => Object.keys(e.choices[0]?.delta ?? {}))
                .filter((k) => k === 'content' || k === 'reasoning_content');
            assert.ok(kinds.indexOf('content') > kinds.lastIndexOf('reasoning_content'), 'reasoning first, then content');
            const o = assemble(s.text)[0];
            assert.equal(o.reasoning, m.reasoning_content);
            assert.equal(o.content, m.content);
            assert.ok(!s.text.includes('think>'), 'a marker went out');
        }
    });

    it('reasoning: a constraint applies after the reasoning, which stays free', T(60000), async () => {
        const constraints = [
            { response_format: { type: 'json_schema', json_schema: { name: 'w', schema: WEATHER } } },
            { guided_choice: ['yes', 'no'] },
            { tools: TOOLS, tool_choice: 'required' },
        ];
        // deepseek_r1 (the answer starts in its reasoning) and qwen3 under a prompt that opens <think>
        for (const [srv, extra] of [[r1, {}], [hermes, { chat_template: OPEN_THINK }]]) {
            const base = { seed: 6, max_tokens: 24, ...extra };
            const free = (await chat(srv, base)).json.choices[0].message.reasoning_content;
            assert.ok(free.length > 0);
            for (const c of constraints) {
                const r = await chat(srv, { ...base, ...c });
                assert.equal(r.status, 200, show(r));
                const ch = r.json.choices[0];
                assert.equal(ch.message.reasoning_content, free, JSON.stringify(c)); // untouched
                assert.equal(ch.message.content, null);
                assert.equal(ch.finish_reason, 'length');
                const s = assemble((await chat(srv, { ...base, ...c, stream: true })).text)[0];
                assert.equal(s.reasoning, free);
                assert.equal(s.content, '');
            }
        }
        // the prompt closed its think block (Qwen3's template, enable_thinking false): constrained
        // from the first token, all content
        for (const srv of [r1, hermes]) {
            const r = await chat(srv, { seed: 6, max_tokens: 200, chat_template: QWEN3,
                                        chat_template_kwargs: { enable_thinking: false },
                                        response_format: { type: 'json_schema', json_schema: { name: 'w', schema: WEATHER } } });
            assert.equal(r.status, 200, show(r));
            const m = r.json.choices[0].message;
            assert.equal(m.reasoning_content, null);
            assert.deepEqual(validate(JSON.parse(m.content), WEATHER), [], m.content);
        }
    });

    it('reasoning: unconstrained deepseek_r1 output is all reasoning; qwen3 without <think> all content', T(60000), async () => {
        const a = await chat(r1, { seed: 2, max_tokens: 20 });
        assert.equal(a.status, 200, show(a));
        assert.equal(a.json.choices[0].message.content, null);
        assert.ok(a.json.choices[0].message.reasoning_content.length > 0);
        const b = await chat(hermes, { seed: 2, max_tokens: 20, chat_template_kwargs: { enable_thinking: false } });
        assert.equal(b.json.choices[0].message.reasoning_content, null);
        assert.ok(b.json.choices[0].message.content.length > 0);
    });
});
