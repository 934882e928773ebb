/* hf_vocab.h - a Hugging Face tokenizer.json's vocabulary as the bytes each token decodes to,
 * for tests and benchmarks of the grammar library (which takes vocabularies as bytes, not a
 * tokenizer): byte-level BPE tokens ('Ġ' = space) through GPT-2's byte-to-character table,
 * SentencePiece tokens with '▁' as space and <0xHH> byte tokens. Special added tokens have no
 * bytes (NULL); eos is the first of </s>, <|endoftext|>, <|im_end|> present. */
#ifndef PAGELLM_HF_VOCAB_H
#define PAGELLM_HF_VOCAB_H

#include <stddef.h>

typedef struct {
    int n;        /* tokens: the highest id + 1 */
    char **bytes; /* [n] malloc'd, NULL for special tokens and unused ids */
    size_t *lens; /* [n] */
    int eos;      /* -1 if none of the names is present */
} HfVocab;

/* 0, or -1 with a message on stderr. */
int hf_vocab_load(const char *path, HfVocab *v);
void hf_vocab_free(HfVocab *v);

#endif
