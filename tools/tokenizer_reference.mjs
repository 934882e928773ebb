#!/usr/bin/env node
// tokenizer_reference.mjs - expected token ids from Hugging Face `tokenizers` (the Rust core,
// npm package "tokenizers") for pagellm's tokenizer tests.
//
// Usage:
//   npm install tokenizers@0.23.2          (in tools/, or any folder named by TOKENIZERS_DIR)
//   node tools/tokenizer_reference.mjs CORPUS.json OUT.json TOKENIZER.json [NAME]
//
// CORPUS.json is a JSON array of strings. OUT.json gets, for every string: the ids without and
// with special tokens (encode(text, add_special_tokens)), and decode(ids_special) with and
// without skip_special_tokens. Paths written into OUT.json are as given on the command line.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const [corpusPath, outPath, tokPath, name] = process.argv.slice(2);
if (!tokPath) {
    console.error('usage: node tools/tokenizer_reference.mjs CORPUS.json OUT.json TOKENIZER.json [NAME]');
    process.exit(2);
}
const base = process.env.TOKENIZERS_DIR
    ? path.resolve(process.env.TOKENIZERS_DIR) + '/'
    : import.meta.url;
const require = createRequire(base);
const { Tokenizer } = require('tokenizers');
const pkg = require('tokenizers/package.json');

const corpus = JSON.parse(fs.readFileSync(corpusPath, 'utf8'));
const tok = Tokenizer.fromFile(tokPath);
tok.disableTruncation(); // SmolLM's file sets truncation and padding; pagellm ignores both
tok.disablePadding();

const cases = [];
for (const text of corpus) {
    const plain = await tok.encode(text, null, { addSpecialTokens: false });
    const special = await tok.encode(text, null, { addSpecialTokens: true });
    const ids = special.getIds();
    cases.push({
        text,
        ids: plain.getIds(),
        ids_special: ids,
        decoded: await tok.decode(ids, false),
        decoded_skip: await tok.decode(ids, true),
    });
}
const out = {
    generator: 'tools/tokenizer_reference.mjs',
    package: `${pkg.name}@${pkg.version}`,
    name: name || path.basename(path.dirname(tokPath)),
    tokenizer: tokPath,
    corpus: corpusPath,
    cases,
};
fs.writeFileSync(outPath, JSON.stringify(out, null, 0).replace(/\},\{/g, '},\n{') + '\n');
console.log(`${outPath}: ${cases.length} cases (${out.package})`);
