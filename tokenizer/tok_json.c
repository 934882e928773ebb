/* tok_json.c - reading tokenizer.json fast: model.vocab and model.merges bypass jansson.
 *
 * jansson allocates every value separately; on a 9 MB Llama-3 file (128k vocab entries, 280k
 * merges) that alone costs most of a second. So the file is mapped, a small scanner walks the
 * top level and notes where those two values are, jansson parses the remainder (with "{}" and
 * "[]" in their place, newlines kept so its line numbers stay right), and the builder then
 * reads the two values straight from the mapped text into its hash tables. If the scanner meets
 * anything unexpected, the whole file goes to jansson and vocab/merges come from its tree
 * (same result, slower). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tok_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const char *p, *end;
    TBuf str; /* decoded string scratch */
} Scan;

enum { MAX_DEPTH = 512 };

static void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static int hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return 0;
        *v = *v * 16 + (uint32_t)d;
    }
    return 1;
}

/* Parse a string at s->p (on the opening quote). On success (*out, *len) point either into the
 * input (no escapes) or into s->str. */
static int string(Scan *s, const char **out, size_t *len) {
    if (s->p >= s->end || *s->p != '"')
        return 0;
    const char *start = ++s->p, *q = start;
    while (q < s->end && *q != '"' && *q != '\\') {
        if ((unsigned char)*q < 0x20)
            return 0;
        q++;
    }
    if (q < s->end && *q == '"') {
        *out = start;
        *len = (size_t)(q - start);
        s->p = q + 1;
        return 1;
    }
    s->str.n = 0;
    tok_buf_put(&s->str, start, (size_t)(q - start));
    while (q < s->end && *q != '"') {
        unsigned char c = (unsigned char)*q;
        if (c < 0x20)
            return 0;
        if (c != '\\') {
            tok_buf_putc(&s->str, (char)c);
            q++;
            continue;
        }
        if (q + 1 >= s->end)
            return 0;
        char e = q[1];
        q += 2;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            tok_buf_putc(&s->str, map[simple - "\"\\/bfnrt"]);
            continue;
        }
        if (e != 'u' || s->end - q < 4)
            return 0;
        uint32_t cp, lo;
        if (!hex4(q, &cp))
            return 0;
        q += 4;
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (s->end - q < 6 || q[0] != '\\' || q[1] != 'u' || !hex4(q + 2, &lo) || lo < 0xdc00 ||
                lo > 0xdfff)
                return 0;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            q += 6;
        } else if (cp >= 0xdc00 && cp <= 0xdfff)
            return 0;
        char enc[4];
        tok_buf_put(&s->str, enc, (size_t)tok_utf8_encode(cp, enc));
    }
    if (q >= s->end)
        return 0;
    s->p = q + 1;
    *out = s->str.p;
    *len = s->str.n;
    return 1;
}

static int skip_value(Scan *s, int depth) {
    ws(s);
    if (s->p >= s->end || depth > MAX_DEPTH)
        return 0;
    char c = *s->p;
    const char *str;
    size_t len;
    if (c == '"')
        return string(s, &str, &len);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return 1;
        }
        for (;;) {
            if (c == '{') {
                ws(s);
                if (!string(s, &str, &len))
                    return 0;
                ws(s);
                if (s->p >= s->end || *s->p++ != ':')
                    return 0;
            }
            if (!skip_value(s, depth + 1))
                return 0;
            ws(s);
            if (s->p >= s->end)
                return 0;
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p++ != close)
                return 0;
            return 1;
        }
    }
    /* number or literal: consume its characters (jansson validates the remainder) */
    const char *st = s->p;
    while (s->p < s->end && ((*s->p && strchr("+-.eE", *s->p)) || (*s->p >= '0' && *s->p <= '9') ||
                             (*s->p >= 'a' && *s->p <= 'z')))
        s->p++;
    return s->p > st;
}

/* ---- locating model.vocab / model.merges -------------------------------------------------- */
static int scan_model(Scan *s, TokJson *tj) {
    ws(s);
    if (s->p >= s->end || *s->p != '{')
        return skip_value(s, 1); /* not an object: jansson will complain */
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 1;
    }
    for (;;) {
        const char *k;
        size_t kl;
        ws(s);
        if (!string(s, &k, &kl))
            return 0;
        int is_vocab = kl == 5 && !memcmp(k, "vocab", 5);
        int is_merges = kl == 6 && !memcmp(k, "merges", 6);
        ws(s);
        if (s->p >= s->end || *s->p++ != ':')
            return 0;
        ws(s);
        const char *start = s->p;
        if (!skip_value(s, 2))
            return 0;
        if (is_vocab && *start == '{') {
            tj->span[0] = start;
            tj->span[1] = s->p;
        } else if (is_merges && *start == '[') {
            tj->span[2] = start;
            tj->span[3] = s->p;
        }
        ws(s);
        if (s->p >= s->end)
            return 0;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        return *s->p++ == '}';
    }
}

static int scan_top(Scan *s, TokJson *tj) {
    ws(s);
    if (s->p >= s->end || *s->p++ != '{')
        return 0;
    ws(s);
    if (s->p < s->end && *s->p == '}')
        return 1;
    for (;;) {
        const char *k;
        size_t kl;
        ws(s);
        if (!string(s, &k, &kl))
            return 0;
        int is_model = kl == 5 && !memcmp(k, "model", 5);
        ws(s);
        if (s->p >= s->end || *s->p++ != ':')
            return 0;
        if (!(is_model ? scan_model(s, tj) : skip_value(s, 1)))
            return 0;
        ws(s);
        if (s->p >= s->end)
            return 0;
        if (*s->p == ',') {
            s->p++;
            continue;
        }
        if (*s->p++ != '}')
            return 0;
        ws(s);
        return s->p == s->end;
    }
}

/* The text with the two spans replaced by "{}" / "[]" and their newlines. */
static void json_remainder(const TokJson *tj, TBuf *out) {
    const char *cut[2][2];
    int nc = 0;
    for (int i = 0; i < 4; i += 2)
        if (tj->span[i]) {
            cut[nc][0] = tj->span[i];
            cut[nc][1] = tj->span[i + 1];
            nc++;
        }
    if (nc == 2 && cut[0][0] > cut[1][0]) {
        const char *a = cut[0][0], *b = cut[0][1];
        cut[0][0] = cut[1][0];
        cut[0][1] = cut[1][1];
        cut[1][0] = a;
        cut[1][1] = b;
    }
    const char *pos = tj->data;
    for (int i = 0; i < nc; i++) {
        tok_buf_put(out, pos, (size_t)(cut[i][0] - pos));
        tok_buf_put(out, *cut[i][0] == '{' ? "{}" : "[]", 2);
        for (const char *q = cut[i][0]; q < cut[i][1]; q++)
            if (*q == '\n')
                tok_buf_putc(out, '\n');
        pos = cut[i][1];
    }
    tok_buf_put(out, pos, (size_t)(tj->data + tj->len - pos));
}

Status tok_json_open(const char *path, TokJson *tj) {
    memset(tj, 0, sizeof *tj);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return pl_error_set(PL_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
        if (m != MAP_FAILED) {
            tj->data = m;
            tj->len = (size_t)st.st_size;
            tj->mapped = 1;
        }
    }
    close(fd);
    if (!tj->mapped) {
        char *d;
        Status s = pl_read_file(path, &d, &tj->len);
        if (s)
            return s;
        tj->data = d;
    }
    Scan s = {tj->data, tj->data + tj->len, {0}};
    int fast = scan_top(&s, tj);
    tok_buf_free(&s.str);
    json_error_t err;
    if (fast) {
        TBuf rest = {0};
        json_remainder(tj, &rest);
        tj->root = json_loadb(rest.p, rest.n, JSON_ALLOW_NUL, &err);
        tok_buf_free(&rest);
    } else {
        tj->span[0] = tj->span[1] = tj->span[2] = tj->span[3] = NULL;
        tj->root = json_loadb(tj->data, tj->len, JSON_ALLOW_NUL, &err);
    }
    if (!tj->root)
        return pl_error_set(PL_ERR_FORMAT, "%s:%d:%d: invalid JSON: %s", path, err.line, err.column,
                            err.text);
    if (!json_is_object(tj->root))
        return pl_error_set(PL_ERR_FORMAT, "%s: top level is not a JSON object", path);
    return PL_OK;
}

void tok_json_close(TokJson *tj) {
    json_decref(tj->root);
    if (tj->mapped)
        munmap((void *)tj->data, tj->len);
    else
        free((void *)tj->data);
    memset(tj, 0, sizeof *tj);
}

/* ---- reading vocab and merges into the tokenizer ------------------------------------------ */
/* Entries in a span: its commas + 1, an upper bound (commas inside strings are rare). */
static size_t count_entries(const char *a, const char *b) {
    size_t n = 1;
    for (const char *q = a; q < b && (q = memchr(q, ',', (size_t)(b - q))); q++)
        n++;
    return n;
}

static Status span_error(const TokJson *tj, const Scan *s, const char *what, const char *path) {
    return pl_error_set(PL_ERR_FORMAT, "%s: malformed %s near byte %zu", path, what,
                        (size_t)(s->p - tj->data));
}

Status tok_json_vocab(Tokenizer *t, const TokJson *tj, const char *path) {
    json_t *vocab = json_object_get(json_object_get(tj->root, "model"), "vocab");
    if (!tj->span[0]) {
        if (!json_is_object(vocab))
            return pl_error_set(PL_ERR_FORMAT, "%s: model.vocab is missing or not an object", path);
        tok_bpe_vocab_init(t, json_object_size(vocab));
        for (void *it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
            json_t *v = json_object_iter_value(it);
            json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
            Status st = tok_bpe_vocab_add(t, json_object_iter_key(it), json_object_iter_key_len(it),
                                          id < 0 || id > (1 << 30) ? -1 : (long)id, path);
            if (st)
                return st;
        }
        return PL_OK;
    }
    Scan s = {tj->span[0] + 1, tj->span[1], {0}};
    tok_bpe_vocab_init(t, count_entries(tj->span[0], tj->span[1]));
    Status st = PL_OK;
    ws(&s);
    if (s.p < s.end && *s.p == '}')
        s.p = s.end;
    while (s.p < s.end) {
        const char *k;
        size_t kl;
        ws(&s);
        if (!string(&s, &k, &kl)) {
            st = span_error(tj, &s, "model.vocab", path);
            break;
        }
        ws(&s);
        s.p++; /* ':' (checked by the scan) */
        ws(&s);
        long id = 0;
        const char *d = s.p;
        while (s.p < s.end && *s.p >= '0' && *s.p <= '9' && id <= (1 << 30))
            id = id * 10 + (*s.p++ - '0');
        ws(&s);
        if (s.p == d || s.p >= s.end || (*s.p != ',' && *s.p != '}')) {
            st = pl_error_set(PL_ERR_FORMAT, "%s: model.vocab[\"%.*s\"] is not a valid id", path,
                              (int)(kl > 100 ? 100 : kl), k);
            break;
        }
        if ((st = tok_bpe_vocab_add(t, k, kl, id, path)))
            break;
        s.p++;
    }
    tok_buf_free(&s.str);
    return st;
}

Status tok_json_merges(Tokenizer *t, const TokJson *tj, const char *path) {
    json_t *merges = json_object_get(json_object_get(tj->root, "model"), "merges");
    Status st = PL_OK;
    if (!tj->span[2]) {
        if (merges && !json_is_null(merges) && !json_is_array(merges))
            return pl_error_set(PL_ERR_FORMAT, "%s: model.merges is not an array", path);
        tok_bpe_merges_init(t, json_array_size(merges));
        for (size_t i = 0; !st && i < json_array_size(merges); i++) {
            json_t *m = json_array_get(merges, i), *a = json_array_get(m, 0),
                   *b = json_array_get(m, 1);
            if (json_is_string(m))
                st = tok_bpe_merge_add(t, json_string_value(m), json_string_length(m), NULL, -1,
                                       path);
            else if (json_array_size(m) == 2 && json_is_string(a) && json_is_string(b))
                st = tok_bpe_merge_add(t, json_string_value(a), json_string_length(a),
                                       json_string_value(b), (long)json_string_length(b), path);
            else
                st = pl_error_set(PL_ERR_FORMAT,
                                  "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
        return st;
    }
    Scan s = {tj->span[2] + 1, tj->span[3], {0}};
    TBuf first = {0};
    ws(&s);
    size_t commas = count_entries(tj->span[2], tj->span[3]);
    tok_bpe_merges_init(t, *s.p == '[' ? commas / 2 + 1 : commas); /* pairs have 2 commas each */
    if (s.p < s.end && *s.p == ']')
        s.p = s.end;
    while (!st && s.p < s.end) {
        const char *a, *b;
        size_t al, bl;
        ws(&s);
        if (*s.p == '"') {
            if (!string(&s, &a, &al))
                st = span_error(tj, &s, "model.merges", path);
            else
                st = tok_bpe_merge_add(t, a, al, NULL, -1, path);
        } else if (*s.p == '[') {
            s.p++;
            ws(&s);
            int ok = string(&s, &a, &al);
            if (ok) {
                first.n = 0;
                tok_buf_put(&first, a, al); /* s.str is reused by the next string */
                ws(&s);
                ok = s.p < s.end && *s.p++ == ',';
            }
            if (ok) {
                ws(&s);
                ok = string(&s, &b, &bl);
            }
            if (ok) {
                ws(&s);
                ok = s.p < s.end && *s.p++ == ']';
            }
            st = ok ? tok_bpe_merge_add(t, first.p, first.n, b, (long)bl, path)
                    : span_error(tj, &s, "model.merges", path);
        } else
            st = span_error(tj, &s, "model.merges (a merge is \"a b\" or [\"a\", \"b\"])", path);
        ws(&s);
        if (s.p < s.end)
            s.p++; /* ',' or the closing ']' */
    }
    tok_buf_free(&first);
    tok_buf_free(&s.str);
    return st;
}
