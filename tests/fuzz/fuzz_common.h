/* fuzz_common.h - helpers shared by the libFuzzer targets in tests/fuzz/: a loud invariant
 * check, strict UTF-8 validation, Rust's from_utf8_lossy, a per-process scratch file for the
 * APIs that only take a path, and where the repository is (for bundled data files).
 *
 * Header-only (every function static) so that each fuzz_<target>.c builds on its own. */
#ifndef PAGELLM_FUZZ_COMMON_H
#define PAGELLM_FUZZ_COMMON_H

#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An invariant that must hold for every input: print what broke and abort, so libFuzzer
 * records the input as a crash (with the stack). */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "\nFUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Length of the well-formed UTF-8 character at s (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF), 0 when s[0..avail) does not start with one. */
static inline size_t fz_utf8_char(const unsigned char *s, size_t avail) {
    if (avail == 0)
        return 0;
    unsigned char b = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (b < 0x80)
        return 1;
    else if (b >= 0xc2 && b <= 0xdf)
        n = 2;
    else if (b == 0xe0)
        n = 3, lo = 0xa0;
    else if (b == 0xed)
        n = 3, hi = 0x9f;
    else if (b >= 0xe1 && b <= 0xef)
        n = 3;
    else if (b == 0xf0)
        n = 4, lo = 0x90;
    else if (b >= 0xf1 && b <= 0xf3)
        n = 4;
    else if (b == 0xf4)
        n = 4, hi = 0x8f;
    else
        return 0;
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

/* Offset of the first byte that is not part of well-formed UTF-8, or len when all is. */
static inline size_t fz_utf8_bad_at(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t k = fz_utf8_char(u + i, len - i);
        if (!k)
            return i;
        i += k;
    }
    return len;
}

static inline int fz_utf8_valid(const char *s, size_t len) {
    return fz_utf8_bad_at(s, len) == len;
}

/* Rust's String::from_utf8_lossy: each maximal subpart of an ill-formed sequence becomes one
 * U+FFFD (Unicode's "substitution of maximal subparts"). Returns a malloc'd, NUL-terminated
 * string; *out_len gets its length (it may hold NUL bytes). */
static inline char *fz_utf8_lossy(const char *s, size_t len, size_t *out_len) {
    const unsigned char *u = (const unsigned char *)s;
    char *out = malloc(len * 3 + 1), *o = out;
    size_t i = 0;
    while (i < len) {
        size_t k = fz_utf8_char(u + i, len - i);
        if (k) {
            memcpy(o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        /* Ill-formed: skip the longest prefix of a well-formed sequence that is here. */
        unsigned char b = u[i];
        size_t n = 0;
        unsigned char lo = 0x80, hi = 0xbf;
        if (b >= 0xc2 && b <= 0xdf)
            n = 2;
        else if (b == 0xe0)
            n = 3, lo = 0xa0;
        else if (b == 0xed)
            n = 3, hi = 0x9f;
        else if (b >= 0xe1 && b <= 0xef)
            n = 3;
        else if (b == 0xf0)
            n = 4, lo = 0x90;
        else if (b >= 0xf1 && b <= 0xf3)
            n = 4;
        else if (b == 0xf4)
            n = 4, hi = 0x8f;
        size_t j = i + 1;
        if (n && j < len && u[j] >= lo && u[j] <= hi) {
            j++;
            while (j < i + n && j < len && u[j] >= 0x80 && u[j] <= 0xbf)
                j++;
        }
        memcpy(o, "\xef\xbf\xbd", 3);
        o += 3;
        i = j;
    }
    *o = '\0';
    *out_len = (size_t)(o - out);
    return out;
}

/* Does `hay` (length n) contain the bytes of `needle`? */
static inline int fz_contains(const char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k == 0)
        return 1;
    for (size_t i = 0; i + k <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, k) == 0)
            return 1;
    return 0;
}

/* ---- a scratch file, one per process (libFuzzer -jobs/-fork run separate processes) ---- */

static char fz_scratch_dir[256];

static void fz_scratch_cleanup(void) {
    if (!fz_scratch_dir[0])
        return;
    char cmd[300];
    /* The folder holds only the files fz_write_file made. */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fz_scratch_dir);
    if (system(cmd) != 0) {
        /* nothing to do: a leftover folder under $TMPDIR */
    }
}

/* A private folder under $TMPDIR (else /dev/shm, else /tmp), made once. */
static inline const char *fz_scratch(void) {
    if (fz_scratch_dir[0])
        return fz_scratch_dir;
    const char *base = getenv("TMPDIR");
    struct stat st;
    if (!base || !*base)
        base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(fz_scratch_dir, sizeof fz_scratch_dir, "%s/pagellm-fuzz-XXXXXX", base);
    if (!mkdtemp(fz_scratch_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fz_scratch_cleanup);
    return fz_scratch_dir;
}

/* Write data to <scratch>/<name> (replacing it); returns the path (static per name slot:
 * valid until the next call with the same name). */
static inline const char *fz_write_file(const char *name, const void *data, size_t len) {
    static char paths[4][512];
    static const char *names[4];
    int slot = -1;
    for (int i = 0; i < 4; i++) {
        if (names[i] && strcmp(names[i], name) == 0) {
            slot = i;
            break;
        }
        if (!names[i]) {
            names[i] = name;
            snprintf(paths[i], sizeof paths[i], "%s/%s", fz_scratch(), name);
            slot = i;
            break;
        }
    }
    if (slot < 0) {
        fprintf(stderr, "fuzz: too many scratch file names\n");
        abort();
    }
    int fd = open(paths[slot], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(paths[slot]);
        abort();
    }
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w <= 0) {
            perror(paths[slot]);
            abort();
        }
        p += w;
        left -= (size_t)w;
    }
    close(fd);
    return paths[slot];
}

/* The repository root: $PAGELLM_ROOT, else the folder tools/fuzz.sh compiled in. */
#ifndef FUZZ_ROOT
#define FUZZ_ROOT "."
#endif
static inline const char *fz_root(void) {
    const char *r = getenv("PAGELLM_ROOT");
    return r && *r ? r : FUZZ_ROOT;
}

/* A NUL-terminated malloc'd copy of the input. */
static inline char *fz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

#endif
