/* fuzz_grammar.c - libFuzzer target: the grammar library (include/grammar.h) on arbitrary
 * constraints, then a constrained walk over a small vocabulary built to stress it (JSON
 * punctuation, tokens spanning several elements, split UTF-8 characters, a NUL byte, EOS).
 *
 * Input layout:
 *   byte 0   kind: value % 4 = 0 GBNF, 1 regex, 2 JSON schema, 3 choices (one per line), so
 *            the seeds are text files starting with the digit
 *   rest     the constraint's text; its hash seeds the walk's choices
 *
 * Invariants checked (each a promise of include/grammar.h):
 *   - compiling succeeds or fails with a non-empty message, never both
 *   - each step's mask allows exactly the tokens a copy of the matcher accepts
 *   - EOS is allowed exactly when gr_matcher_can_end; a finished matcher allows only EOS
 *   - the bytes accepted so far are a whole match (gr_compiled_accepts) exactly when the
 *     matcher can end; rollback of every token gets back to the start state's mask */
#include <jansson.h>

#include "fuzz_common.h"
#include "grammar.h"

static const char *const TOKENS[] = {"{",
                                     "}",
                                     "[",
                                     "]",
                                     "\"",
                                     ",",
                                     ":",
                                     " ",
                                     "\n",
                                     "\t",
                                     "\\",
                                     "\\\"",
                                     "\": ",
                                     "\"}",
                                     "\"]",
                                     "{\"",
                                     "[\"",
                                     "a",
                                     "b",
                                     "z",
                                     "A",
                                     "0",
                                     "1",
                                     "9",
                                     "-",
                                     ".",
                                     "e",
                                     "+",
                                     "12",
                                     "3.5",
                                     "true",
                                     "false",
                                     "null",
                                     "nul",
                                     "ab",
                                     " a",
                                     "\xc3",
                                     "\xa9",
                                     "\xc3\xa9",
                                     "\xe6\x97",
                                     "\xa5",
                                     "\xe6\x97\xa5",
                                     "\xf0\x9f\x98\x80",
                                     "\xff",
                                     "x\"",
                                     "\"x",
                                     "(",
                                     ")",
                                     "+1",
                                     "*",
                                     "?",
                                     "|",
                                     "@",
                                     "_",
                                     "#",
                                     "\\n",
                                     "\\u00",
                                     "00e9",
                                     "2024-",
                                     "01",
                                     "T",
                                     "Z",
                                     "<eos>",
                                     NULL};
enum { NTOK = sizeof TOKENS / sizeof *TOKENS, EOS = NTOK - 2 };

static GrVocab *vocab(void) {
    static GrVocab *v;
    if (!v) {
        size_t lens[NTOK];
        const char *bytes[NTOK];
        for (int i = 0; i < NTOK; i++) {
            bytes[i] = TOKENS[i];
            lens[i] = TOKENS[i] ? strlen(TOKENS[i]) : 0;
        }
        bytes[NTOK - 1] = "\0";
        lens[NTOK - 1] = 1; /* a token of one NUL byte */
        int eos = EOS;
        char err[256];
        v = gr_vocab_new(bytes, lens, NTOK, &eos, 1, err, sizeof err);
        FUZZ_CHECK(v, "%s", err);
    }
    return v;
}

static GrCompiled *compile(int kind, const char *text, size_t n, char *err, size_t errlen) {
    if (kind == 0)
        return gr_compile_gbnf(text, n, err, errlen);
    if (kind == 1)
        return gr_compile_regex(text, n, err, errlen);
    if (kind == 2) {
        json_t *s = json_loadb(text, n, 0, NULL);
        GrCompiled *c = s ? gr_compile_json_schema(s, err, errlen) : NULL;
        if (!s)
            snprintf(err, errlen, "not JSON");
        json_decref(s);
        return c;
    }
    const char *choices[64];
    size_t lens[64];
    int k = 0;
    for (size_t i = 0, start = 0; i <= n && k < 64; i++)
        if (i == n || text[i] == '\n') {
            choices[k] = text + start;
            lens[k++] = i - start;
            start = i + 1;
        }
    return gr_compile_choice(choices, lens, k, err, errlen);
}

static int bit(const uint32_t *mask, int t) {
    return mask[t >> 5] >> (t & 31) & 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    char err[512] = "";
    GrCompiled *c = compile(data[0] % 4, (const char *)data + 1, size - 1, err, sizeof err);
    FUZZ_CHECK(c ? 1 : err[0] != 0, "failed without a message");
    if (!c)
        return 0;
    GrVocab *v = vocab();
    GrMatcher *m = gr_matcher_new(c, v);
    uint32_t mask[4], first[4];
    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 1099511628211ull;
    char text[256];
    size_t n = 0;
    for (int step = 0; step < 40; step++) {
        if (gr_matcher_fill_mask(m, mask))
            break; /* a limit: the message says which */
        if (!step)
            memcpy(first, mask, sizeof mask);
        int allowed[NTOK], k = 0;
        for (int t = 0; t < NTOK; t++) {
            GrMatcher *probe = gr_matcher_copy(m);
            int ok = gr_matcher_accept(probe, t) == 0;
            gr_matcher_free(probe);
            FUZZ_CHECK(ok == bit(mask, t), "step %d token %d: mask %d, accept %d", step, t,
                       bit(mask, t), ok);
            if (ok)
                allowed[k++] = t;
        }
        FUZZ_CHECK(bit(mask, EOS) == gr_matcher_can_end(m), "step %d: EOS and can_end", step);
        FUZZ_CHECK(gr_matcher_can_end(m) == gr_compiled_accepts(c, text, n),
                   "step %d: can_end and gr_compiled_accepts of the text so far", step);
        FUZZ_CHECK(!gr_matcher_is_finished(m) || k == 1, "finished, yet %d tokens allowed", k);
        if (!k)
            break;
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int t = allowed[(seed >> 33) % k];
        FUZZ_CHECK(gr_matcher_accept(m, t) == 0, "token %d refused", t);
        if (t == EOS || n + 8 > sizeof text)
            break;
        size_t len = t == NTOK - 1 ? 1 : strlen(TOKENS[t]);
        memcpy(text + n, t == NTOK - 1 ? "" : TOKENS[t], len);
        n += len;
    }
    FUZZ_CHECK(gr_matcher_rollback(m, gr_matcher_num_accepted(m)) == 0, "rollback");
    FUZZ_CHECK(gr_matcher_fill_mask(m, mask) == 0 && !memcmp(mask, first, sizeof mask),
               "the start state's mask after rollback");
    gr_matcher_free(m);
    gr_compiled_free(c);
    return 0;
}
