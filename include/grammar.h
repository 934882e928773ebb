/* grammar.h - structured output: constrain decoding to a grammar, a JSON schema, a regex or a
 * list of choices, as llama.cpp's grammars, xgrammar and vLLM's guided decoding do.
 *
 * A constraint is compiled once into a GrCompiled: its rules become one byte-level pushdown
 * automaton (character classes are UTF-8 byte sequences, so tokens that end inside a
 * character or span several grammar elements need no special case). A GrVocab is a model's
 * vocabulary as a byte trie. A GrMatcher follows one sequence: each step it fills the bitmask
 * of tokens that may come next (gr_matcher_fill_mask) and advances on the token sampled
 * (gr_matcher_accept).
 *
 * Speed: the automaton is determinized lazily (a state is a set of (stack, position) pairs,
 * stacks interned), and each state's transitions and each state's mask over a vocabulary are
 * computed once and kept in the GrCompiled, so every matcher of every request that shares the
 * GrCompiled reuses them; a mask of a state seen before is one copy, and a state in a new
 * context (a string of another property) reuses the context-free part of a state seen before.
 * docs/ARCHITECTURE.md gives the measured times (tools/grammar_bench.c).
 *
 * Memory: a GrCompiled keeps at most 64 MiB of masks per vocabulary (later masks are computed
 * each time) and 64K automaton states (1 KiB each); a constraint that needs more fails in
 * gr_matcher_fill_mask / gr_matcher_accept with a message, as does nesting over 1000 rules
 * or an ambiguity of over 20000 parses at once (a grammar such as d ::= [0-9] d{0,3}).
 *
 * Threads: a GrCompiled and a GrVocab are immutable in meaning and may be shared by any number
 * of threads; the GrCompiled's caches are guarded by a mutex inside it. A GrMatcher belongs to
 * one thread at a time.
 *
 * JSON whitespace: wherever JSON allows whitespace, the schema and json_object grammars allow
 * at most `ws ::= ( " " | "\n" [ \t]{0,20} )?` (llama.cpp's choice): compact or indented
 * output, but a model cannot fill the output with spaces. */
#ifndef PAGELLM_GRAMMAR_H
#define PAGELLM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct GrCompiled GrCompiled;
typedef struct GrVocab GrVocab;
typedef struct GrMatcher GrMatcher;

/* Compile a GBNF grammar (llama.cpp's syntax: `name ::= ...` rules, `|`, `( )`, `*` `+` `?`,
 * `{m}` `{m,}` `{m,n}`, "literals" with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes,
 * [a-z] and [^...] classes, `.` any character, # comments; the start rule is `root`).
 * Left-recursive rules are refused, as are llama.cpp's token references (<[id]>). Returns NULL with
 * a message in err (errlen bytes, always NUL-terminated when errlen > 0): syntax errors name line
 * and column ("line 2 column 9: expected '::='"), others the rule ("rule 'expr' is
 * left-recursive"). The caller frees the result with gr_compiled_free. */
GrCompiled *gr_compile_gbnf(const char *src, size_t len, char *err, size_t errlen);

/* gr_compile_gbnf where the grammar may also refer to n rules given as JSON schemas: rule
 * names[i] matches what schemas[i] allows (as gr_compile_json_schema). The text must not
 * define those names itself. For a grammar around JSON values, such as a tool call
 * `"<tool_call>" ... "\"arguments\": " args0 ... "</tool_call>"` whose args0 is a function's
 * parameters schema. A schema's error (unsupported keywords named) is the error. */
GrCompiled *gr_compile_gbnf_schemas(const char *src, size_t len, const char *const *names,
                                    json_t *const *schemas, int n, char *err, size_t errlen);

/* Compile a JSON schema (OpenAI response_format json_schema, vLLM guided_json): type object
 * (properties in declared order, required, additionalProperties false / true / a schema),
 * array (items, prefixItems - all of them present -, minItems, maxItems), string (enum, const,
 * minLength, maxLength, pattern, format date / time / date-time / uuid), integer (minimum, maximum,
 * exclusiveMinimum, exclusiveMaximum), number, boolean, null, enum, const, anyOf, oneOf, allOf
 * of one schema, $ref to #/$defs/... or #/definitions/... (recursion allowed), type arrays
 * such as ["string", "null"]; annotations (title, description, default, examples, $schema,
 * $id, $comment) are ignored. A schema using anything else fails with the message
 * "unsupported JSON schema keyword(s): minimum, uniqueItems" naming every such keyword (minimum
 * of a number, for instance); other errors say what is wrong. An empty schema (or true) is any
 * JSON value. Object properties come in the schema's order; optional ones may be left out. */
GrCompiled *gr_compile_json_schema(json_t *schema, char *err, size_t errlen);

/* Any JSON object (response_format {type: json_object}). */
GrCompiled *gr_compile_json_object(char *err, size_t errlen);

/* Compile a regular expression (vLLM guided_regex) that the whole output must match: literals,
 * escapes (\n \t \r \f \v \0 \xHH \uHHHH and escaped punctuation), classes [a-z] [^...] with
 * \d \w \s \D \W \S inside or outside them, `.` (any character but \n), groups ( ) (?: ),
 * alternation, * + ? {m} {m,} {m,n} (lazy forms accepted, same language); ^ and $ only at
 * the ends (anchoring is implicit). Backreferences, lookaround and \b are refused by name. */
GrCompiled *gr_compile_regex(const char *pattern, size_t len, char *err, size_t errlen);

/* Exactly one of n strings (vLLM guided_choice); n >= 1. */
GrCompiled *gr_compile_choice(const char *const *choices, const size_t *lens, int n, char *err,
                              size_t errlen);

/* Free a compiled constraint after every matcher on it; gr_compiled_free(NULL) is a no-op. */
void gr_compiled_free(GrCompiled *c);

/* Whether the compiled constraint accepts `len` bytes as a whole output (tests, validation). */
int gr_compiled_accepts(GrCompiled *c, const char *bytes, size_t len);

/* A vocabulary: token i decodes to token_bytes[i] (lens[i] bytes, may hold NUL bytes). A NULL
 * entry or length 0 marks a token never allowed (special and control tokens, padding rows of
 * the LM head past the tokenizer's vocabulary). eos_ids (n_eos of them) are allowed exactly
 * when the constraint accepts the output so far. Copies what it needs; returns NULL with a
 * message on bad input. Shared by every request of a model; free with gr_vocab_free. */
GrVocab *gr_vocab_new(const char *const *token_bytes, const size_t *lens, int n, const int *eos_ids,
                      int n_eos, char *err, size_t errlen);
void gr_vocab_free(GrVocab *v);

/* Tokens in the vocabulary, and 32-bit words of a mask over it: (n + 31) / 32. */
int gr_vocab_size(const GrVocab *v);
size_t gr_vocab_mask_words(const GrVocab *v);

/* Token id's bytes (*len of them; NULL, *len 0 for a token never allowed or out of range). */
const char *gr_vocab_token(const GrVocab *v, int id, size_t *len);

/* A matcher for one sequence at the start of the output. The compiled constraint and the
 * vocabulary must outlive it. Free with gr_matcher_free (NULL is a no-op). */
GrMatcher *gr_matcher_new(GrCompiled *c, const GrVocab *v);
void gr_matcher_free(GrMatcher *m);

/* Write the allowed-token bitmask of the next step into mask (gr_vocab_mask_words words): bit
 * (i % 32) of word i / 32 is set when token i may come next. A finished matcher allows nothing.
 * Returns 0, or -1 when the automaton grew past its state limit (the message in
 * gr_matcher_error): the request should end with an error. */
int gr_matcher_fill_mask(GrMatcher *m, uint32_t *mask);

/* Advance on the chosen token. Returns 0, or -1 (state unchanged, gr_matcher_error says why)
 * when the token is not allowed here. An EOS token accepted finishes the matcher. */
int gr_matcher_accept(GrMatcher *m, int token);

/* Advance on raw bytes (a forced prefix, or text the caller inserted); 0 or -1 as accept. */
int gr_matcher_accept_bytes(GrMatcher *m, const char *bytes, size_t len);

/* can_end: the output so far is a complete match (EOS would be allowed). is_finished: EOS was
 * accepted, or the output is complete and nothing but EOS can follow (the engine may stop). */
int gr_matcher_can_end(GrMatcher *m);
int gr_matcher_is_finished(GrMatcher *m);

/* Undo the last n accepted tokens (n <= gr_matcher_num_accepted), e.g. after a rejected
 * speculative draft. Returns 0, or -1 when n is too large. */
int gr_matcher_rollback(GrMatcher *m, int n);
int gr_matcher_num_accepted(const GrMatcher *m);

/* A new matcher in the same state (an n > 1 request forking after the prompt), and going
 * back to the start (reuse for a new request with the same constraint). */
GrMatcher *gr_matcher_copy(const GrMatcher *m);
void gr_matcher_reset(GrMatcher *m);

/* The reason of the last failed call on this matcher ("" if none). */
const char *gr_matcher_error(const GrMatcher *m);

#endif
