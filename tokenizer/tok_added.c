/* tok_added.c - added tokens (special or not) cut out of the text before the model runs.
 *
 * As HF's AddedVocabulary: tokens with normalized=false are matched in the raw input, those with
 * normalized=true in each normalized piece (their content normalized the same way at load).
 * Matching is leftmost-longest over a byte trie; single_word, lstrip and rstrip are honoured
 * with Unicode \w / \s as in added_vocabulary.rs. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

void tok_trie_init(Trie *tr) {
    memset(tr, 0, sizeof *tr);
    tr->cap = 16;
    tr->term = pl_xmalloc((size_t)tr->cap * sizeof *tr->term);
    tr->term[0] = -1;
    tr->nodes = 1;
    tok_u64map_init(&tr->edges, 16);
}

void tok_trie_add(Trie *tr, const char *s, size_t n, int32_t idx) {
    if (!n)
        return;
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (uint64_t)node << 8 | (unsigned char)s[i], child;
        if (tok_u64map_get(&tr->edges, key, &child)) {
            node = (uint32_t)child;
            continue;
        }
        if (tr->nodes == tr->cap) {
            tr->cap *= 2;
            tr->term = pl_xrealloc(tr->term, (size_t)tr->cap * sizeof *tr->term);
        }
        tr->term[tr->nodes] = -1;
        tok_u64map_put(&tr->edges, key, (uint64_t)tr->nodes);
        node = (uint32_t)tr->nodes++;
    }
    tr->term[node] = idx;
    tr->first[(unsigned char)s[0]] = 1;
}

void tok_trie_free(Trie *tr) {
    free(tr->term);
    tok_u64map_free(&tr->edges);
    tr->term = NULL;
}

/* Longest token starting at s[i]: returns its AddedTok index and end, or -1. */
static int32_t tok_trie_longest(const Trie *tr, const char *s, size_t n, size_t i, size_t *end) {
    uint32_t node = 0;
    int32_t best = -1;
    for (size_t j = i; j < n; j++) {
        uint64_t child;
        if (!tok_u64map_get(&tr->edges, (uint64_t)node << 8 | (unsigned char)s[j], &child))
            break;
        node = (uint32_t)child;
        if (tr->term[node] >= 0) {
            best = tr->term[node];
            *end = j + 1;
        }
    }
    return best;
}

static size_t last_char_start(const char *s, size_t end) {
    size_t c = end - 1;
    while (c > 0 && end - c < 4 && ((unsigned char)s[c] & 0xc0) == 0x80)
        c--;
    return c;
}

void tok_split_added(const Tokenizer *t, const Trie *tr, const char *s, size_t n, uint32_t flags,
                     PieceList *out, TokCtx *cx) {
    size_t start_offset = 0;
    if (tr->nodes > 1) {
        size_t i = 0;
        while (i < n) {
            if (!tr->first[(unsigned char)s[i]]) {
                i++;
                continue;
            }
            size_t stop = i;
            int32_t k = tok_trie_longest(tr, s, n, i, &stop);
            if (k < 0) {
                i++;
                continue;
            }
            const AddedTok *at = &t->added[k];
            size_t start = i;
            size_t resume = stop;
            if (at->single_word) {
                int start_space = start == 0 || !tok_pattern_match_char(
                                                    &t->re_word, s + last_char_start(s, start),
                                                    start - last_char_start(s, start), cx->md);
                int stop_space =
                    stop == n || !tok_pattern_match_char(&t->re_word, s + stop, n - stop, cx->md);
                if (!start_space || !stop_space) {
                    i = resume; /* the matcher moves past a discarded match, as aho-corasick */
                    continue;
                }
            }
            if (at->lstrip) {
                size_t a = start;
                while (a > start_offset) {
                    size_t c = last_char_start(s, a);
                    if (!tok_pattern_match_char(&t->re_space, s + c, a - c, cx->md))
                        break;
                    a = c;
                }
                start = a;
            }
            if (at->rstrip) {
                while (stop < n &&
                       tok_pattern_match_char(&t->re_space, s + stop, n - stop, cx->md)) {
                    int32_t cp;
                    stop += (size_t)tok_utf8_next((const unsigned char *)s + stop, n - stop, &cp);
                }
            }
            if (start_offset < start)
                tok_pieces_push_text(out, s + start_offset, start - start_offset,
                                     start_offset == 0 ? flags : 0);
            tok_pieces_push_id(out, at->id);
            start_offset = stop;
            i = stop > resume ? stop : resume;
        }
    }
    if (start_offset < n)
        tok_pieces_push_text(out, s + start_offset, n - start_offset,
                             start_offset == 0 ? flags : 0);
}
