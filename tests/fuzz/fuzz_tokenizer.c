/* fuzz_tokenizer.c - libFuzzer target: tok_encode, tok_decode and the incremental decoder
 * (TokStream) on arbitrary bytes, with two real tokenizers loaded once per process: the
 * bundled models/stories260K (SentencePiece style: Prepend/Replace normalizer, byte
 * fallback, Strip decoder) and tests/data/tokenizers/gpt2 (byte-level BPE, PCRE2 regex).
 *
 * Input layout:
 *   byte 0   flags: bit 0 tokenizer (0 stories260K, 1 gpt2); bit 1 mode (0 text, 1 raw ids);
 *            bit 2 add_special for tok_encode
 *   byte 1   where the ids are cut into "prompt" and "generated" for the stream: k = b*n/256
 *   rest     text mode: the bytes to encode (any bytes, invalid UTF-8 included);
 *            ids mode: little-endian uint16 pairs, id = v % (vocab + 4) - 2 (so a few are
 *            negative or past the vocabulary, which decode and the stream must skip)
 *
 * Invariants checked (each a documented promise of include/tokenizer.h):
 *   - tok_encode succeeds on any bytes; every id is inside the vocabulary
 *   - round trip: gpt2 decode(encode(x)) == from_utf8_lossy(x); stories260K
 *     decode(encode(x), skip_special) == x when x is valid UTF-8 with no special-token text
 *     and no U+2581 (which decodes to " ")
 *   - every decode and every streamed piece is well-formed UTF-8
 *   - streaming: concatenating the pieces (and tok_stream_finish) gives
 *     decode(all)[len(decode(prompt)):] when decode(all) holds no U+FFFD (where bytes are
 *     ill-formed the stream may legitimately differ, see tokenizer/tok_stream.c) and
 *     decode(prompt) is a prefix of it; when the prompt ends inside a character, a tail of
 *     decode(all) that starts where the prompt's text ends
 *   - tok_token_to_id / tok_id_to_token agree on the input taken as a token string */
#include "fuzz_common.h"
#include "tokenizer.h"

typedef struct {
    const char *name;
    Tokenizer *t;
    int vocab;
    unsigned char *has_nul;      /* [vocab]: the id's text holds a NUL byte (C strings cut it) */
    const char *const *specials; /* special-token texts, NULL-terminated */
} Tok;

static const char *const STORIES_SPECIALS[] = {"<unk>", "<s>", "</s>", NULL};
static const char *const GPT2_SPECIALS[] = {"<|endoftext|>", NULL};
static Tok toks[2];

static void load(Tok *k, const char *name, const char *dir, const char *const *specials) {
    char j[1024], c[1024];
    snprintf(j, sizeof j, "%s/%s/tokenizer.json", fz_root(), dir);
    snprintf(c, sizeof c, "%s/%s/tokenizer_config.json", fz_root(), dir);
    if (tok_load_files(j, c, &k->t) != PL_OK) {
        fprintf(stderr,
                "fuzz_tokenizer: cannot load %s: %s\n(set PAGELLM_ROOT to the repository)\n", j,
                pl_error());
        exit(1);
    }
    k->name = name;
    k->vocab = tok_vocab_size(k->t);
    k->specials = specials;
    k->has_nul = calloc((size_t)k->vocab, 1);
    for (int id = 0; id < k->vocab; id++) {
        const char *s = tok_id_to_token(k->t, id);
        /* byte 0 is "<0x00>" under byte fallback, U+0100 ("\xc4\x80") under byte-level */
        k->has_nul[id] = s && (!strcmp(s, "<0x00>") || strstr(s, "\xc4\x80"));
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    load(&toks[0], "stories260K", "models/stories260K", STORIES_SPECIALS);
    load(&toks[1], "gpt2", "tests/data/tokenizers/gpt2", GPT2_SPECIALS);
    return 0;
}

static void check_utf8(const char *s, const char *what, const Tok *k) {
    size_t n = strlen(s);
    size_t bad = fz_utf8_bad_at(s, n);
    FUZZ_CHECK(bad == n, "%s: %s is not valid UTF-8 at byte %zu of %zu", k->name, what, bad, n);
}

/* Decode, stream-decode and compare. `clean` is 0 when NUL bytes make C-string comparisons
 * meaningless. */
static void check_stream(const Tok *k, const int32_t *ids, int n, int cut, int clean) {
    char *P = tok_decode(k->t, ids, cut, 1, NULL);
    char *W = tok_decode(k->t, ids, n, 1, NULL);
    char *W0 = tok_decode(k->t, ids, n, 0, NULL);
    FUZZ_CHECK(P && W && W0, "%s: tok_decode returned NULL", k->name);
    check_utf8(P, "decode(prompt)", k);
    check_utf8(W, "decode(all)", k);
    check_utf8(W0, "decode(all, keep special)", k);

    TokStream *s = tok_stream_create(k->t, ids, cut, 1);
    FUZZ_CHECK(s != NULL, "%s: tok_stream_create returned NULL", k->name);
    size_t cap = 256, len = 0;
    char *S = malloc(cap);
    S[0] = 0;
    for (int i = cut; i <= n; i++) {
        const char *piece = i < n ? tok_stream_push(s, ids[i], NULL) : tok_stream_finish(s, NULL);
        FUZZ_CHECK(piece != NULL, "%s: stream piece %d is NULL", k->name, i);
        check_utf8(piece, i < n ? "a streamed piece" : "tok_stream_finish", k);
        size_t pl = strlen(piece);
        if (len + pl + 1 > cap) {
            cap = (len + pl + 1) * 2;
            S = realloc(S, cap);
        }
        memcpy(S + len, piece, pl + 1);
        len += pl;
    }
    tok_stream_destroy(s);

    size_t wl = strlen(W);
    if (clean && !fz_contains(W, wl, "\xef\xbf\xbd")) {
        size_t c = 0, pn = strlen(P);
        while (c < pn && c < wl && P[c] == W[c])
            c++;
        if (c == pn) { /* decode(prompt) is a prefix of decode(all): the exact promise */
            FUZZ_CHECK(len == wl - pn && memcmp(S, W + pn, len) == 0,
                       "%s: streamed text != decode(all)[len(decode(prompt)):]\n"
                       "  prompt ids %d of %d\n  decode(prompt) = \"%s\"\n"
                       "  decode(all)    = \"%s\"\n  streamed       = \"%s\"",
                       k->name, cut, n, P, W, S);
        } else {
            /* A character cut at the end of the prompt: decode(prompt) ends in U+FFFDs (one
             * per byte of the whole byte-fallback run, or per maximal subpart), so the
             * formula is undefined there. The stream must still give a tail of decode(all)
             * that starts no earlier than where the prompt's text stops matching, and no
             * later than the bytes those U+FFFDs can stand for (at most 4 each). */
            while (c > 0 && c < wl && ((unsigned char)W[c] & 0xc0) == 0x80)
                c--;
            size_t k_fffd = 0, r = c;
            while (r + 3 <= pn && !memcmp(P + r, "\xef\xbf\xbd", 3))
                r += 3, k_fffd++;
            size_t q = wl - len; /* where the streamed text starts in decode(all) */
            FUZZ_CHECK(len <= wl && memcmp(S, W + q, len) == 0 && q >= c &&
                           (r != pn || q <= c + 4 * k_fffd),
                       "%s: streamed text is not the tail of decode(all) after the prompt\n"
                       "  prompt ids %d of %d\n  decode(prompt) = \"%s\"\n"
                       "  decode(all)    = \"%s\"\n  streamed       = \"%s\"",
                       k->name, cut, n, P, W, S);
        }
    }
    free(S);
    free(P);
    free(W);
    free(W0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    const Tok *k = &toks[data[0] & 1];
    int ids_mode = (data[0] >> 1) & 1;
    int add_special = (data[0] >> 2) & 1;
    unsigned cut_frac = data[1];
    const char *text = (const char *)data + 2;
    size_t len = size - 2;

    int32_t *ids = NULL;
    int n = 0;
    int clean = 1;
    if (!ids_mode) {
        Status st = tok_encode(k->t, text, len, add_special, &ids, &n);
        FUZZ_CHECK(st == PL_OK, "%s: tok_encode failed on %zu bytes: %s", k->name, len, pl_error());
        FUZZ_CHECK(n >= 0 && (n == 0 || ids), "%s: tok_encode gave n=%d", k->name, n);
        for (int i = 0; i < n; i++)
            FUZZ_CHECK(ids[i] >= 0 && ids[i] < k->vocab, "%s: id %d = %d outside [0, %d)", k->name,
                       i, ids[i], k->vocab);
        clean = memchr(text, 0, len) == NULL;

        /* Round trip against from_utf8_lossy. */
        size_t ll;
        char *lossy = fz_utf8_lossy(text, len, &ll);
        int has_special = 0;
        for (const char *const *sp = k->specials; *sp; sp++)
            has_special |= fz_contains(lossy, ll, *sp);
        int gpt2 = k == &toks[1];
        /* stories260K: HF's ByteFallback decoder turns a whole run of byte tokens that is not
         * valid UTF-8 into one U+FFFD per byte (not from_utf8_lossy), so only valid text is
         * compared there. */
        int sp_ok =
            fz_utf8_valid(text, len) && !has_special && !fz_contains(lossy, ll, "\xe2\x96\x81");
        if (gpt2 || sp_ok) {
            char *d = tok_decode(k->t, ids, n, gpt2 ? 0 : 1, NULL);
            FUZZ_CHECK(d != NULL, "%s: tok_decode returned NULL", k->name);
            size_t dl = strlen(d), want = strlen(lossy); /* up to the first NUL byte */
            FUZZ_CHECK(dl == want && memcmp(d, lossy, dl) == 0,
                       "%s: decode(encode(x)) != from_utf8_lossy(x)\n  x      = \"%s\"\n"
                       "  lossy  = \"%s\"\n  decode = \"%s\"",
                       k->name, fz_cstr((const uint8_t *)text, len), lossy, d);
            free(d);
        }
        free(lossy);

        /* The input as one token string. */
        char *c = fz_cstr((const uint8_t *)text, len);
        int id = tok_token_to_id(k->t, c);
        if (id >= 0) {
            FUZZ_CHECK(id < k->vocab, "%s: tok_token_to_id gave %d", k->name, id);
            const char *back = tok_id_to_token(k->t, id);
            FUZZ_CHECK(back && !strcmp(back, c), "%s: tok_id_to_token(tok_token_to_id(\"%s\"))",
                       k->name, c);
        }
        free(c);
    } else {
        n = (int)(len / 2);
        ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
        for (int i = 0; i < n; i++) {
            unsigned v = (unsigned)data[2 + 2 * i] | (unsigned)data[3 + 2 * i] << 8;
            int id = (int)(v % (unsigned)(k->vocab + 4)) - 2;
            if (id >= 0 && id < k->vocab && k->has_nul[id])
                id = id + 1 < k->vocab ? id + 1 : 1; /* keep NUL bytes out of C strings */
            ids[i] = id;
        }
    }

    int cut = (int)((unsigned long)cut_frac * (unsigned long)n / 256u);
    check_stream(k, ids, n, cut, clean);
    free(ids);
    return 0;
}
