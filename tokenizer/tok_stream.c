/* tok_stream.c - incremental detokenization for streaming completions.
 *
 * The stream keeps a short window of the latest ids (special tokens are dropped up front
 * unless the stream keeps them) and how many bytes of decode(window) it has already returned.
 * Each push decodes only the window, returns the new bytes, and holds back a truncated UTF-8
 * character until it completes. The window always starts with a token whose text was already
 * returned, so context rules that act at the start of a text (Strip's leading space, Metaspace's
 * first token) fall on text that was already sent: pieces are then exactly
 * decode(prompt + generated)[len(decode(prompt)):], as vLLM's prefix/read offsets give.
 * Once the text is complete the window is cut back to its last token, so a push costs
 * O(a few tokens), not O(sequence). Byte-fallback runs are converted per character here (HF
 * turns a whole run that is not valid UTF-8 into U+FFFDs): the two differ only for ill-formed
 * byte sequences, where text already sent cannot be taken back. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

enum { WINDOW_MAX = 4 }; /* cut the window back once it holds this many ids */

struct TokStream {
    const Tokenizer *t;
    int32_t *ids; /* window */
    int n, cap;
    int skip_special; /* drop special tokens (HF's skip_special_tokens) */
    size_t sent;      /* bytes of decode(window) returned so far */
    TBuf text, piece;
    DecCtx dc;
};

static int skipped(const TokStream *s, int32_t id) {
    const Tokenizer *t = s->t;
    return id < 0 || id >= t->vocab_size || !t->toks[id] ||
           (s->skip_special && (t->tok_flags[id] & TOKF_SPECIAL));
}

static void append(TokStream *s, int32_t id) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->ids = pl_xrealloc(s->ids, (size_t)s->cap * sizeof *s->ids);
    }
    s->ids[s->n++] = id;
}

/* Decode the window; returns the held-back byte count. */
static size_t decode_window(TokStream *s, int mode) {
    return tok_decode_into(s->t, s->ids, s->n, s->skip_special, mode, &s->dc, &s->text);
}

/* Keep only the last id once everything decoded so far has been returned. */
static void shrink(TokStream *s) {
    if (s->n <= 1)
        return;
    s->ids[0] = s->ids[s->n - 1];
    s->n = 1;
    decode_window(s, DECODE_STREAM);
    s->sent = s->text.n;
}

/* Does the token's text begin in the middle of a UTF-8 character (a <0x80>..<0xBF> byte
 * token, or a byte-level token whose first byte is a continuation byte)? */
static int dec_has(const Decoder *d, DecType type) {
    if (!d)
        return 0;
    if (d->type == type)
        return 1;
    for (int i = 0; i < d->nkids; i++)
        if (dec_has(d->kids[i], type))
            return 1;
    return 0;
}

static int starts_mid_char(const Tokenizer *t, int32_t id) {
    const char *s = t->toks[id];
    size_t n = t->tok_len[id];
    int b = -1;
    if (n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>')
        b = (int)strtol(s + 3, NULL, 16);
    else if (n && dec_has(t->dec, DEC_BYTELEVEL)) {
        int32_t cp;
        tok_utf8_next((const unsigned char *)s, n, &cp);
        b = tok_cp_to_byte(cp);
    }
    return b >= 0x80 && b <= 0xbf;
}

TokStream *tok_stream_create(const Tokenizer *t, const int32_t *prompt, int n, int skip_special) {
    if (!t)
        return NULL;
    TokStream *s = pl_xcalloc(1, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    /* The last non-special prompt id is enough context (see the banner), plus the ids before
     * it while it continues a character, so a character cut at the end of the prompt can
     * complete. */
    int32_t back[8];
    int nb = 0;
    for (int i = n - 1; i >= 0 && nb < 8; i--) {
        if (skipped(s, prompt[i]))
            continue;
        back[nb++] = prompt[i];
        if (!starts_mid_char(t, prompt[i]))
            break;
    }
    while (nb > 0)
        append(s, back[--nb]);
    decode_window(s, DECODE_STREAM);
    s->sent = s->text.n; /* a truncated character at the end of the prompt is sent when done */
    tok_buf_put(&s->piece, "", 0);
    return s;
}

/* Set the piece to text[sent..] (from a character boundary) and advance sent. */
static void emit(TokStream *s) {
    s->piece.n = 0;
    size_t from = s->sent;
    if (from > s->text.n) /* the window text shrank (cannot happen with HF's decoders) */
        from = s->text.n;
    while (from < s->text.n && ((unsigned char)s->text.p[from] & 0xc0) == 0x80)
        from++;
    tok_buf_put(&s->piece, s->text.p + from, s->text.n - from);
    if (s->text.n > s->sent)
        s->sent = s->text.n;
}

const char *tok_stream_push(TokStream *s, int32_t id, size_t *len) {
    if (skipped(s, id)) {
        s->piece.n = 0;
        s->piece.p[0] = 0;
    } else {
        append(s, id);
        size_t held = decode_window(s, DECODE_STREAM);
        emit(s);
        if (!held && s->n >= WINDOW_MAX)
            shrink(s); /* it reuses the text buffer, not the piece */
    }
    if (len)
        *len = s->piece.n;
    return s->piece.p;
}

const char *tok_stream_finish(TokStream *s, size_t *len) {
    decode_window(s, DECODE_STREAM_FINAL);
    emit(s);
    if (len)
        *len = s->piece.n;
    return s->piece.p;
}

void tok_stream_destroy(TokStream *s) {
    if (!s)
        return;
    free(s->ids);
    tok_buf_free(&s->text);
    tok_buf_free(&s->piece);
    tok_decctx_free(&s->dc);
    free(s);
}
