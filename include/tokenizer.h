/* tokenizer.h - Hugging Face tokenizer.json in C: BPE encode, decode, incremental decode.
 *
 * Supports the two BPE families LLMs ship: SentencePiece style (Prepend/Replace "\u2581"
 * normalizers or a Metaspace pre-tokenizer, byte_fallback; Llama 2, Mistral, TinyLlama) and
 * byte-level (ByteLevel pre-tokenizer/decoder, Split regex pre-tokenizers run through PCRE2
 * with Unicode properties, Digits, Punctuation; GPT-2, Llama 3, Qwen2, Falcon, SmolLM).
 * Added tokens (special or not) are matched in the input text before the model runs, as
 * Hugging Face `tokenizers` does. Reference: Hugging Face `tokenizers` gives the same ids.
 * A Tokenizer is immutable after tok_load and safe to use from many threads at once. */
#ifndef PAGELLM_TOKENIZER_H
#define PAGELLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef struct Tokenizer Tokenizer;

/* Load dir/tokenizer.json and, if present, dir/tokenizer_config.json (bos/eos token names,
 * add_bos_token / add_eos_token). Errors name the file and what is wrong. */
Status tok_load(const char *dir, Tokenizer **out);

/* Same with explicit paths; config_path may be NULL. */
Status tok_load_files(const char *tokenizer_json_path, const char *config_path, Tokenizer **out);

void tok_destroy(Tokenizer *t);

int tok_vocab_size(const Tokenizer *t); /* highest id + 1, added tokens included */
int tok_bos_id(const Tokenizer *t);     /* -1 if none */
int tok_eos_id(const Tokenizer *t);     /* -1 if none */

/* Encode `len` bytes of text (any bytes; invalid UTF-8 is handled as HF does, never a
 * crash). add_special adds what the post-processor / add_bos_token adds (BOS for Llama).
 * *ids is malloc'd (caller frees), *n its length. */
Status tok_encode(const Tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                  int *n);

/* Decode ids to a malloc'd NUL-terminated string, as HF decode(ids, skip_special_tokens).
 * Out-of-range ids are skipped. The text may hold NUL characters (a <0x00> byte token): *len
 * (when len is not NULL) gets its length. */
char *tok_decode(const Tokenizer *t, const int32_t *ids, int n, int skip_special, size_t *len);

/* The exact bytes token `id` adds inside a text (not at its start or end: a Metaspace or
 * Strip decoder's dropped leading space is kept), malloc'd, not NUL-terminated as text may
 * hold any byte (a byte-fallback or byte-level token may be part of a UTF-8 character); the
 * length in *len. NULL for special tokens and ids without a string. For constrained decoding,
 * which matches the output text byte by byte. */
char *tok_token_bytes(const Tokenizer *t, int id, size_t *len);

/* The vocabulary string of an id (e.g. "\u2581time", "<0x0A>", "\u0120the"), or NULL. */
const char *tok_id_to_token(const Tokenizer *t, int id);

/* Id of an exact vocabulary or added-token string, or -1. */
int tok_token_to_id(const Tokenizer *t, const char *token);

/* 1 if `id` is a special added token (skipped when skip_special is set). */
int tok_is_special(const Tokenizer *t, int id);

/* Incremental detokenizer for streaming: the text of each new token in the context of the
 * whole sequence, so that concatenating every piece returned after tok_stream_init equals
 * decode(prompt + generated)[strlen(decode(prompt)):]. Never returns part of a UTF-8
 * character: bytes of an unfinished character are held until it completes (or flushed as
 * U+FFFD by tok_stream_finish, as HF decode would). skip_special: special tokens add no text
 * (HF decode's skip_special_tokens); else their text is kept. */
typedef struct TokStream TokStream;

TokStream *tok_stream_create(const Tokenizer *t, const int32_t *prompt, int n, int skip_special);
/* Append one token; returns the new text (owned by the stream, valid until the next call;
 * "" when nothing is complete yet; NUL-terminated, and *len, when len is not NULL, its length,
 * which counts NUL characters of the text itself). */
const char *tok_stream_push(TokStream *s, int32_t id, size_t *len);
/* Text still held back at the end of the sequence ("" if none); *len as for push. */
const char *tok_stream_finish(TokStream *s, size_t *len);
void tok_stream_destroy(TokStream *s);

#endif
