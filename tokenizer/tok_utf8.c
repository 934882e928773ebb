/* tok_utf8.c - UTF-8 for the tokenizer: well-formedness by Unicode's table (Table 3-7), lossy
 * conversion with Rust's String::from_utf8_lossy rule (one U+FFFD per maximal ill-formed
 * subpart, which is what HF's decode returns), and GPT-2's byte <-> unicode map (ByteLevel). */
#include "tok_internal.h"

/* ---- UTF-8 ------------------------------------------------------------------------------ */
int tok_utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef) {
        need = 2;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 3;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n)
            return 0; /* truncated at the end of input */
        unsigned b = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
        if (b < l || b > h)
            return -k;
    }
    return need + 1;
}

int tok_utf8_next(const unsigned char *s, size_t n, int32_t *cp) {
    int k = tok_utf8_seq(s, n);
    if (k <= 0) {
        *cp = -1;
        return 1;
    }
    unsigned c = s[0];
    if (k == 1)
        *cp = (int32_t)c;
    else if (k == 2)
        *cp = (int32_t)(((c & 0x1f) << 6) | (s[1] & 0x3f));
    else if (k == 3)
        *cp = (int32_t)(((c & 0x0f) << 12) | ((s[1] & 0x3f) << 6) | (s[2] & 0x3f));
    else
        *cp = (int32_t)(((c & 0x07) << 18) | ((s[1] & 0x3f) << 12) | ((s[2] & 0x3f) << 6) |
                        (s[3] & 0x3f));
    return k;
}

int tok_utf8_encode(uint32_t cp, char *o) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

void tok_utf8_lossy(TBuf *out, const char *s, size_t n, size_t *hold) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of pending valid bytes */
    if (hold)
        *hold = 0;
    tok_buf_reserve(out, n);
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        int k = tok_utf8_seq(u + i, n - i);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        tok_buf_put(out, s + run, i - run);
        if (k == 0 && hold) {
            *hold = n - i;
            return;
        }
        tok_buf_put(out, "\xef\xbf\xbd", 3);
        i += k == 0 ? n - i : (size_t)(-k);
        run = i;
    }
    tok_buf_put(out, s + run, i - run);
}

int tok_utf8_is_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int k = tok_utf8_seq(u + i, n - i);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

/* ---- GPT-2 bytes_to_unicode ------------------------------------------------------------- */
#define R(a) a, a + 1, a + 2, a + 3, a + 4, a + 5, a + 6, a + 7
const uint16_t tok_byte_to_cp[256] = {
    /* 0x00-0x20 -> U+0100..U+0120 */
    R(256), R(264), R(272), R(280), 288,
    /* 0x21-0x7E printable ASCII maps to itself */
    33, 34, 35, 36, 37, 38, 39, R(40), R(48), R(56), R(64), R(72), R(80), R(88), R(96), R(104),
    R(112), 120, 121, 122, 123, 124, 125, 126,
    /* 0x7F-0xA0 -> U+0121..U+0142 */
    289, R(290), R(298), R(306), R(314), 322,
    /* 0xA1-0xAC itself */
    161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172,
    /* 0xAD -> U+0143 */
    323,
    /* 0xAE-0xFF itself */
    174, 175, R(176), R(184), R(192), R(200), R(208), R(216), R(224), R(232), R(240), R(248)};
#undef R

/* inverse of tok_byte_to_cp: U+0000..U+0143 -> byte, or -1 */
static const int16_t cp_to_byte[324] = {
    -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,
    -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  33,  34,  35,
    36,  37,  38,  39,  40,  41,  42,  43,  44,  45,  46,  47,  48,  49,  50,  51,  52,  53,
    54,  55,  56,  57,  58,  59,  60,  61,  62,  63,  64,  65,  66,  67,  68,  69,  70,  71,
    72,  73,  74,  75,  76,  77,  78,  79,  80,  81,  82,  83,  84,  85,  86,  87,  88,  89,
    90,  91,  92,  93,  94,  95,  96,  97,  98,  99,  100, 101, 102, 103, 104, 105, 106, 107,
    108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125,
    126, -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,
    -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  -1,  161,
    162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, -1,  174, 175, 176, 177, 178, 179,
    180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197,
    198, 199, 200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215,
    216, 217, 218, 219, 220, 221, 222, 223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233,
    234, 235, 236, 237, 238, 239, 240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251,
    252, 253, 254, 255, 0,   1,   2,   3,   4,   5,   6,   7,   8,   9,   10,  11,  12,  13,
    14,  15,  16,  17,  18,  19,  20,  21,  22,  23,  24,  25,  26,  27,  28,  29,  30,  31,
    32,  127, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140, 141, 142, 143,
    144, 145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 173,
};

int tok_cp_to_byte(int32_t cp) {
    return cp >= 0 && cp < 324 ? cp_to_byte[cp] : -1;
}
