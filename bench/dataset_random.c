/* dataset_random.c - vLLM's random dataset: per request an input length and an output
 * length drawn uniformly around --random-input-len / --random-output-len (within
 * --random-range-ratio), a shared random prefix of --random-prefix-len tokens, then a run of
 * consecutive non-special vocabulary tokens from a random offset. The ids are decoded to text
 * and re-encoded, truncating or padding with random tokens up to 10 times, so that the text
 * tokenizes to the length wanted (decode(encode(x)) is not the identity for every tokenizer).
 * Special and byte-fallback tokens are never drawn.
 * The input length counts the special tokens the tokenizer adds (BOS), as vLLM's does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

/* SentencePiece byte-fallback tokens ("<0x41>"): a run of them decodes to U+FFFD unless
 * the bytes happen to form UTF-8, and each U+FFFD re-encodes as three byte tokens, so a
 * prompt made of them never converges to its length. vLLM keeps them (they are rare in a
 * 32000-token vocabulary); in a small one such as the bundled model's they are half of it. */
static int byte_token(const char *s) {
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>';
}

/* Non-special vocabulary ids that have a token string and are no byte-fallback token. */
static int32_t *allowed_tokens(const Tokenizer *t, int *n) {
    int v = tok_vocab_size(t);
    int32_t *ids = pl_xmalloc((size_t)(v > 0 ? v : 1) * sizeof *ids);
    *n = 0;
    for (int id = 0; id < v; id++) {
        const char *s = tok_id_to_token(t, id);
        if (s && !tok_is_special(t, id) && !byte_token(s) && id != tok_bos_id(t) &&
            id != tok_eos_id(t))
            ids[(*n)++] = id;
    }
    return ids;
}

/* Decode, re-encode, cut or pad to `target` ids (vLLM's gen_prompt_decode_to_target_len).
 * Returns the text; *seq / *len hold the final ids (without special tokens). */
static char *decode_to_target(const Tokenizer *t, int32_t **seq, int *len, int target,
                              const int32_t *allowed, int num_allowed, BenchRng *rng,
                              int *mismatch) {
    *mismatch = 0;
    for (int tries = 10;; tries--) {
        char *text = tok_decode(t, *seq, *len, 0, NULL);
        int32_t *ids;
        int n;
        if (tok_encode(t, text, strlen(text), 0, &ids, &n) != PL_OK) {
            free(text);
            return NULL;
        }
        free(*seq);
        *seq = ids;
        *len = n;
        if (n == target || tries == 0) {
            *mismatch = n - target;
            return text;
        }
        free(text);
        if (n > target) {
            *len = target;
        } else {
            *seq = pl_xrealloc(*seq, (size_t)(target > 0 ? target : 1) * sizeof **seq);
            for (int i = n; i < target; i++)
                (*seq)[i] = allowed[brng_int(rng, 0, num_allowed - 1)];
            *len = target;
        }
    }
}

Status ds_load_random(const BenchDatasetOptions *o, const Tokenizer *t, int keep_ids,
                      BenchDataset *d) {
    int num_special = ds_count_tokens(t, "", 1, NULL);
    if (num_special < 0)
        return PL_ERR_INVALID;
    double r = o->range_ratio;
    int real_input = o->input_len - num_special > 0 ? o->input_len - num_special : 0;
    int in_lo = (int)floor(real_input * (1 - r)), in_hi = (int)ceil(real_input * (1 + r));
    int out_lo = (int)floor(o->output_len * (1 - r)), out_hi = (int)ceil(o->output_len * (1 + r));
    out_lo = out_lo > 1 ? out_lo : 1;
    out_hi = out_hi > 1 ? out_hi : 1;
    if (o->prefix_len + in_lo < 1)
        return pl_error_set(PL_ERR_INVALID,
                            "--random-input-len %d is too small: the tokenizer adds %d special "
                            "token(s), so no token of the prompt would be random",
                            o->input_len, num_special);
    int num_allowed;
    int32_t *allowed = allowed_tokens(t, &num_allowed);
    if (num_allowed == 0) {
        free(allowed);
        return pl_error_set(PL_ERR_INVALID, "the tokenizer has no non-special token");
    }
    BenchRng rng;
    brng_seed(&rng, o->seed);
    int n = o->num_prompts;
    int *in_len = pl_xmalloc((size_t)n * sizeof *in_len),
        *out_len = pl_xmalloc((size_t)n * sizeof(int));
    int64_t *offset = pl_xmalloc((size_t)n * sizeof *offset);
    for (int i = 0; i < n; i++)
        in_len[i] = (int)brng_int(&rng, in_lo, in_hi);
    for (int i = 0; i < n; i++)
        out_len[i] = (int)brng_int(&rng, out_lo, out_hi);
    for (int i = 0; i < n; i++)
        offset[i] = brng_int(&rng, 0, tok_vocab_size(t) - 1);
    int32_t *prefix = pl_xmalloc((size_t)(o->prefix_len + 1) * sizeof *prefix);
    for (int i = 0; i < o->prefix_len; i++)
        prefix[i] = allowed[brng_int(&rng, 0, num_allowed - 1)];

    Status st = PL_OK;
    int cap = 0;
    long mismatch_total = 0;
    for (int i = 0; i < n && st == PL_OK; i++) {
        int len = o->prefix_len + in_len[i], mismatch;
        int32_t *seq = pl_xmalloc((size_t)(len > 0 ? len : 1) * sizeof *seq);
        memcpy(seq, prefix, (size_t)o->prefix_len * sizeof *seq);
        for (int j = 0; j < in_len[i]; j++)
            seq[o->prefix_len + j] = allowed[(offset[i] + i + j) % num_allowed];
        char *text = decode_to_target(t, &seq, &len, o->prefix_len + in_len[i], allowed,
                                      num_allowed, &rng, &mismatch);
        free(seq);
        if (!text) {
            st = PL_ERR_INVALID;
            break;
        }
        mismatch_total += mismatch;
        char *valid = bench_utf8_copy(text, strlen(text));
        free(text);
        int32_t *ids = NULL;
        int count = ds_count_tokens(t, valid, 1, keep_ids ? &ids : NULL);
        if (count < 0) {
            free(valid);
            st = PL_ERR_INVALID;
            break;
        }
        ds_add(d, &cap, valid, count, out_len[i], ids);
    }
    if (st == PL_OK && mismatch_total)
        fprintf(stderr,
                "pagellm bench: across all random prompts there are %ld %s tokens than asked "
                "for after decoding and re-encoding (as vLLM warns: expected now and then)\n",
                labs(mismatch_total), mismatch_total > 0 ? "more" : "fewer");
    free(in_len);
    free(out_len);
    free(offset);
    free(prefix);
    free(allowed);
    return st;
}

char *bench_utf8_copy(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    char *out = pl_xmalloc(n * 3 + 1), *o = out;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + (size_t)len <= n && !(len > 1 && c < 0xC2) && c != 0;
        for (int k = 1; ok && k < len; k++)
            ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && len == 3) { /* no overlongs or surrogates */
            unsigned cp = ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6);
            ok = cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok && len == 4) {
            unsigned cp = ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12);
            ok = cp >= 0x10000 && cp <= 0x10FFFF;
        }
        if (ok) {
            memcpy(o, p + i, (size_t)len);
            o += len;
            i += (size_t)len;
        } else {
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    *o = '\0';
    return out;
}

/* Tokens of the longest request the random dataset makes: prefix, input and output at the
 * top of the range ratio (the special tokens are inside the input length). */
static long long random_longest(const BenchDatasetOptions *o, int in, int out) {
    double g = 1 + o->range_ratio;
    return (long long)o->prefix_len + (long long)ceil(in * g) + (long long)ceil(out * g);
}

int bench_fit_model_len(BenchDatasetOptions *o, int max_model_len, char *note, size_t size) {
    if (max_model_len <= 0 || o->kind != BENCH_DS_RANDOM ||
        random_longest(o, o->input_len, o->output_len) <= max_model_len)
        return 0;
    double g = 1 + o->range_ratio;
    int room = max_model_len - o->prefix_len; /* for input and output */
    int in = o->input_len, out = o->output_len;
    if (ceil(out * g) > room / 2) /* the output alone takes more than half: halve it */
        out = (int)floor(room / 2 / g);
    out = out > 1 ? out : 1;
    in = (int)floor((room - ceil(out * g)) / g);
    while (in > 1 && random_longest(o, in, out) > max_model_len)
        in--;
    in = in > 1 ? in : 1;
    int n = snprintf(note, size,
                     "the server's max_model_len is %d tokens (prompt + output): "
                     "--random-input-len %d -> %d",
                     max_model_len, o->input_len, in);
    if (out != o->output_len && n >= 0 && (size_t)n < size)
        snprintf(note + n, size - (size_t)n, ", --random-output-len %d -> %d", o->output_len, out);
    o->input_len = in;
    o->output_len = out;
    return 1;
}
