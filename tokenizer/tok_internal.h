/* tok_internal.h - private structures shared by the tokenizer's source files (tokenizer/).
 *
 * The pipeline mirrors Hugging Face `tokenizers`: added tokens are cut out of the raw input,
 * the rest is normalized, pre-tokenized into pieces, and each piece is run through the BPE
 * model; a post-processor adds BOS/EOS. Decoding runs the decoder chain over token strings.
 * Everything here is built once by tok_load and read-only afterwards (thread safe); per-call
 * scratch lives in TokCtx / DecCtx. */
#ifndef PAGELLM_TOK_INTERNAL_H
#define PAGELLM_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer.h"

/* ---- growable byte buffer (always NUL-terminated after tok_buf_* calls) ---------------- */
typedef struct {
    char *p;
    size_t n, cap;
} TBuf;

void tok_buf_reserve(TBuf *b, size_t extra);
void tok_buf_put(TBuf *b, const void *s, size_t n);
void tok_buf_free(TBuf *b);
static inline void tok_buf_putc(TBuf *b, char c) {
    if (b->n + 2 > b->cap)
        tok_buf_reserve(b, 1);
    b->p[b->n++] = c;
    b->p[b->n] = 0;
}

/* ---- arena for strings that live as long as the tokenizer ----------------------------- */
typedef struct ArenaBlock ArenaBlock;
typedef struct {
    ArenaBlock *head;
} Arena;
/* NUL-terminated copy, preceded by its length as a uint32 (see tok_arena_len) */
char *tok_arena_strndup(Arena *a, const char *s, size_t n);
static inline uint32_t tok_arena_len(const char *p) {
    uint32_t n;
    memcpy(&n, p - 4, 4);
    return n;
}
void tok_arena_free(Arena *a);
/* Zeroed memory; >= 1 MiB comes pre-faulted from mmap. Free with the same size. */
void *tok_big_alloc(size_t n);
void tok_big_free(void *p, size_t n);

/* ---- string -> int32 open-addressing hash; keys are arena strings (length-prefixed) ---- */
typedef struct {
    const char *key;
    uint32_t hash;
    int32_t val;
} StrSlot;
typedef struct {
    StrSlot *slots;
    uint32_t mask, count;
} StrMap;
uint32_t tok_hash_bytes(const void *p, size_t n);
void tok_strmap_init(StrMap *m, size_t expected);
/* key from tok_arena_strndup; replaces */
void tok_strmap_put(StrMap *m, const char *key, int32_t val);
int32_t tok_strmap_get(const StrMap *m, const char *key, size_t len); /* -1 if absent */
void tok_strmap_free(StrMap *m);

/* ---- uint64 -> uint64 open-addressing hash (key UINT64_MAX is reserved) --------------- */
typedef struct {
    uint64_t *keys, *vals;
    uint32_t mask, count;
} U64Map;
void tok_u64map_init(U64Map *m, size_t expected);
void tok_u64map_put(U64Map *m, uint64_t key, uint64_t val); /* replaces */
int tok_u64map_get(const U64Map *m, uint64_t key, uint64_t *val);
void tok_u64map_free(U64Map *m);

/* ---- UTF-8 ---------------------------------------------------------------------------- */
/* Length of the well-formed sequence at s (n bytes left): >0 valid, else -k where k >= 1
 * bytes form an ill-formed maximal subpart, or 0 when s is a truncated but valid prefix
 * running to the end of the input. */
int tok_utf8_seq(const unsigned char *s, size_t n);
/* Next char for splitting: returns its byte length (1 for an invalid byte; *cp = -1). */
int tok_utf8_next(const unsigned char *s, size_t n, int32_t *cp);
int tok_utf8_encode(uint32_t cp, char *out); /* returns 1..4 */
/* Append the lossy conversion (U+FFFD per maximal ill-formed subpart, as Rust's
 * String::from_utf8_lossy). With hold != NULL a truncated sequence at the very end is not
 * converted and its length is stored in *hold. */
void tok_utf8_lossy(TBuf *out, const char *s, size_t n, size_t *hold);
int tok_utf8_is_valid(const char *s, size_t n);

/* ---- GPT-2 byte <-> unicode map --------------------------------------------------------- */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(int32_t cp); /* -1 if cp is not a byte-level char */

/* ---- patterns: literal string or PCRE2 regex (UTF + UCP + MATCH_INVALID_UTF) ---------- */
typedef struct {
    char *lit; /* literal bytes (String pattern) or NULL */
    size_t lit_len;
    pcre2_code *re; /* regex, or NULL */
} Pattern;

Status tok_pattern_compile_regex(Pattern *p, const char *src, size_t len, const char *path,
                                 const char *what);
void tok_pattern_set_literal(Pattern *p, const char *s, size_t n);
void tok_pattern_free(Pattern *p);
/* Next match starting at or after `from`; 1 with [*ms, *me) or 0. md may be NULL for
 * literals. Empty matches are reported (callers decide). */
int tok_pattern_find(const Pattern *p, const char *s, size_t n, size_t from, pcre2_match_data *md,
                     size_t *ms, size_t *me);
/* All non-overlapping matches as HF's find_iter does (empty matches right after a previous
 * match are skipped). Appends [start,end) pairs to *v (size_t pairs, count in *nv). */
typedef struct {
    size_t *v; /* pairs */
    int n, cap;
} MatchVec;
void tok_pattern_find_all(const Pattern *p, const char *s, size_t n, pcre2_match_data *md,
                          MatchVec *out);
/* Does the (single) char at s match? (anchored) */
int tok_pattern_match_char(const Pattern *p, const char *s, size_t n, pcre2_match_data *md);

/* ---- JSON helpers --------------------------------------------------------------------- */
const char *tok_jstr(const json_t *obj, const char *key); /* string value or NULL */
int tok_jbool(const json_t *obj, const char *key, int dflt);
/* Parse HF's {"String": s} / {"Regex": r} pattern object. */
Status tok_jpattern(const json_t *obj, Pattern *out, const char *path, const char *what);

/* ---- pieces: the text being tokenized, split into parts -------------------------------- */
enum { PIECE_AT_START = 1 }; /* piece begins at original offset 0 (Metaspace "first") */
typedef struct {
    uint32_t off, len; /* into PieceList.text */
    int32_t id;        /* >= 0: an added token, already final */
    uint32_t flags;
} Piece;
typedef struct {
    TBuf text;
    Piece *v;
    int n, cap;
} PieceList;
void tok_pieces_reset(PieceList *l);
void tok_pieces_free(PieceList *l);
void tok_pieces_push_text(PieceList *l, const char *s, size_t n, uint32_t flags); /* skips empty */
void tok_pieces_push_id(PieceList *l, int32_t id);
/* Push s mapped through the GPT-2 byte map (ByteLevel). */
void tok_pieces_push_bytelevel(PieceList *l, const char *s, size_t n, uint32_t flags);

/* per-encode scratch */
typedef struct {
    pcre2_match_data *md;
    MatchVec mv;
    TBuf tmp, tmp2;
    int32_t *segs; /* [start, end, is_match] triples for split behaviours */
    int nsegs, capsegs;
    /* BPE */
    void *sym;
    int cap_sym;
    void *heap;
    int cap_heap;
} TokCtx;

/* ---- components ------------------------------------------------------------------------ */
typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREV,
    SPLIT_MERGED_NEXT,
    SPLIT_CONTIGUOUS
} SplitBehavior;

typedef enum {
    NORM_SEQUENCE,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_LOWERCASE,
    NORM_STRIP,
    NORM_NFC
} NormType;
typedef struct Normalizer {
    NormType type;
    struct Normalizer **kids;
    int nkids;
    char *str; /* Prepend text / Replace content */
    size_t str_len;
    Pattern pat;
    int left, right; /* Strip */
} Normalizer;

typedef enum {
    PT_SEQUENCE,
    PT_BYTELEVEL,
    PT_SPLIT,
    PT_DIGITS,
    PT_PUNCT,
    PT_METASPACE,
    PT_WHITESPACE,
    PT_WSPLIT,
    PT_BERT,
    PT_CHARDELIM
} PreTokType;
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct PreTok {
    PreTokType type;
    struct PreTok **kids;
    int nkids;
    Pattern pat, pat2;
    SplitBehavior behavior;
    int invert;
    int add_prefix_space, use_regex;     /* ByteLevel */
    char repl[8];                        /* Metaspace replacement (UTF-8) */
    int repl_len, prepend_scheme, split; /* Metaspace */
} PreTok;

typedef enum {
    DEC_SEQUENCE,
    DEC_REPLACE,
    DEC_BYTEFALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_BYTELEVEL,
    DEC_METASPACE,
    DEC_BPE_SUFFIX
} DecType;
typedef struct Decoder {
    DecType type;
    struct Decoder **kids;
    int nkids;
    Pattern pat;
    char *str; /* Replace content / BPEDecoder suffix */
    size_t str_len;
    char strip_ch[8]; /* Strip content char (UTF-8) */
    int strip_ch_len, start, stop;
    char repl[8]; /* Metaspace */
    int repl_len, prepend_scheme;
} Decoder;

/* Post-processor flattened to one template: ids, with -1 marking the sequence. */
typedef struct {
    int32_t *tmpl;
    int ntmpl;
    int present, is_template; /* is_template: TemplateProcessing (add_bos_token may override) */
} PostProc;

typedef struct {
    char *content;
    uint32_t len;
    int32_t id;
    uint8_t special, single_word, lstrip, rstrip, normalized;
} AddedTok;

/* Byte trie over added-token contents for leftmost-longest matching. */
typedef struct {
    int32_t *term; /* [nodes] AddedTok index ending here or -1 */
    int nodes, cap;
    U64Map edges; /* (node << 8 | byte) -> child */
    uint8_t first[256];
} Trie;

struct Tokenizer {
    Arena arena;
    int vocab_size;      /* highest id + 1 */
    const char **toks;   /* [vocab_size] token string per id (NUL-terminated) or NULL */
    int tok_cap;         /* allocated entries of toks / tok_len / tok_flags */
    uint32_t merge_rank; /* merges read so far */
    uint32_t *tok_len;   /* [vocab_size] */
    uint8_t *tok_flags;  /* [vocab_size] TOKF_* */
    StrMap vocab;        /* model vocab */
    StrMap added_map;    /* added-token content -> id */

    /* BPE model */
    U64Map merges; /* (a << 32 | b) -> (rank << 32 | new id) */
    int32_t unk_id;
    int byte_fallback, fuse_unk, ignore_merges;
    int split_metaspace; /* merges never join a char to a following U+2581 (tok_bpe.c) */
    char *cont_prefix, *eow_suffix;
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_ids[256]; /* <0xNN> ids or -1 */

    AddedTok *added;
    int nadded;
    Trie trie_raw, trie_norm; /* non-normalized / normalized added tokens */

    Normalizer *norm;
    PreTok *pretok;
    Decoder *dec;
    PostProc post;
    int cfg_add_bos, cfg_add_eos; /* -1: not in tokenizer_config.json */
    int32_t bos_id, eos_id;

    Pattern re_space, re_word; /* one-char classes for added-token flags */
};

enum { TOKF_SPECIAL = 1, TOKF_ADDED = 2 };

/* ---- entry points between files --------------------------------------------------------- */
Status tok_parse_normalizer(const json_t *j, Normalizer **out, const char *path);
void tok_free_normalizer(Normalizer *n);
/* Normalize s[0..n) into out (cleared first). */
void tok_normalize(const Normalizer *nz, const char *s, size_t n, TBuf *out, TokCtx *cx);
void tok_nfc(const char *s, size_t n, TBuf *out); /* appends NFC(s) */

Status tok_parse_pretok(const json_t *j, PreTok **out, const char *path);
void tok_free_pretok(PreTok *p);
/* Pre-tokenize the pieces of *in; the result is in *in afterwards (*spare is scratch). */
void tok_pretokenize(const PreTok *pt, PieceList *in, PieceList *spare, TokCtx *cx);

Status tok_parse_decoder(const json_t *j, Decoder **out, const char *path);
void tok_free_decoder(Decoder *d);

/* tokenizer.json, mapped; vocab and merges are read from the text (tok_json.c) */
typedef struct {
    const char *data;
    size_t len;
    int mapped;
    json_t *root;        /* everything, with model.vocab / model.merges emptied when span[] set */
    const char *span[4]; /* [vocab begin, end), [merges begin, end) in data, or NULL */
} TokJson;
Status tok_json_open(const char *path, TokJson *tj);
Status tok_json_vocab(Tokenizer *t, const TokJson *tj, const char *path);
Status tok_json_merges(Tokenizer *t, const TokJson *tj, const char *path);
void tok_json_close(TokJson *tj);

/* BPE model building (tok_bpe.c), fed by tok_json.c */
void tok_reserve_ids(Tokenizer *t, int n); /* grow the per-id arrays to n entries */
void tok_bpe_vocab_init(Tokenizer *t, size_t expected);
Status tok_bpe_vocab_add(Tokenizer *t, const char *s, size_t n, long id, const char *path);
Status tok_bpe_options(Tokenizer *t, const json_t *model, const char *path); /* after the vocab */
void tok_bpe_merges_init(Tokenizer *t, size_t expected);
/* bl < 0: a is an "x y" line split on its one ASCII space */
Status tok_bpe_merge_add(Tokenizer *t, const char *a, size_t al, const char *b, long bl,
                         const char *path);
/* Encode one pre-token with the BPE model, appending ids to *ids (count *n, capacity *cap). */
void tok_bpe_word(const Tokenizer *t, const char *w, size_t n, TokCtx *cx, int32_t **ids, int *nids,
                  int *cap);

void tok_trie_init(Trie *tr);
void tok_trie_add(Trie *tr, const char *s, size_t n, int32_t idx);
void tok_trie_free(Trie *tr);
/* Cut added tokens out of s: pushes text pieces and id pieces to out (HF find_matches). */
void tok_split_added(const Tokenizer *t, const Trie *tr, const char *s, size_t n, uint32_t flags,
                     PieceList *out, TokCtx *cx);

void tok_ctx_init(TokCtx *cx);
void tok_ctx_free(TokCtx *cx);

/* Decode modes: HF exactness, or streaming (a truncated UTF-8 tail is held back, and byte
 * fallback runs are converted per character so earlier text never changes), or one token's
 * exact bytes inside a text (DECODE_TOKEN: no lossy UTF-8 conversion, nothing stripped or
 * dropped that only the start or the end of a text loses). */
enum { DECODE_HF = 0, DECODE_STREAM = 1, DECODE_STREAM_FINAL = 2, DECODE_TOKEN = 3 };
typedef struct {
    TBuf text;
    uint32_t *o; /* [n] (offset, length) pairs into text */
    int n, cap;
} TList;
typedef struct {
    TList a, b; /* token strings, ping-pong between decoder steps */
    TBuf bytes;
    pcre2_match_data *md;
    size_t held;
} DecCtx;
void tok_decctx_free(DecCtx *dc);
/* Decode ids into out (cleared). Returns the number of bytes held back (DECODE_STREAM). */
size_t tok_decode_into(const Tokenizer *t, const int32_t *ids, int n, int skip_special, int mode,
                       DecCtx *dc, TBuf *out);

#endif
