/* safetensors.c - mmapped, fully validated reader for Hugging Face safetensors checkpoints.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping each
 * tensor name to {dtype, shape, data_offsets: [begin, end]} (plus an optional __metadata__
 * object), then the data region; offsets are relative to the start of the data region.
 * Every file is mapped read-only and its header checked completely at open, so that a
 * truncated or inconsistent checkpoint is a one-line error naming the file and tensor, and
 * no later read can fall outside the mapping. A sharded checkpoint
 * (model.safetensors.index.json) opens each shard it names once and checks that every tensor
 * of its weight_map is in the shard named for it. Names are found through an
 * open-addressing hash table. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header sizes above this are refused as absurd (the reference implementation's limit). */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
#define ST_MAX_DIMS   8

typedef struct {
    char *path;
    const unsigned char *map; /* whole file, read-only */
    size_t size;
} StFile;

struct StCheckpoint {
    StFile *files;
    int num_files;
    StTensor *tensors; /* names are owned (strdup'd); dtype_name points into dtype_table */
    int num_tensors, cap_tensors;
    int *slots; /* hash table: tensor index + 1, 0 = empty; size is a power of two */
    size_t num_slots;
};

/* Every dtype the safetensors format defines. Only F32/F16/BF16 and (fp8 weights) F8_E4M3
 * are computed with; the others are recorded as DT_OTHER so a checkpoint holding e.g. an I64
 * buffer still opens. */
static const struct {
    const char *name;
    DType dtype;
    int bits; /* per element */
} dtype_table[] = {
    {"F32", DT_F32, 32},      {"F16", DT_F16, 16},       {"BF16", DT_BF16, 16},
    {"F64", DT_OTHER, 64},    {"I64", DT_OTHER, 64},     {"U64", DT_OTHER, 64},
    {"I32", DT_OTHER, 32},    {"U32", DT_OTHER, 32},     {"I16", DT_OTHER, 16},
    {"U16", DT_OTHER, 16},    {"I8", DT_OTHER, 8},       {"U8", DT_OTHER, 8},
    {"BOOL", DT_OTHER, 8},    {"F8_E4M3", DT_F8E4M3, 8}, {"F8_E5M2", DT_OTHER, 8},
    {"F8_E8M0", DT_OTHER, 8}, {"E8M0", DT_OTHER, 8},     {"C64", DT_OTHER, 64},
    {"F6_E2M3", DT_OTHER, 6}, {"F6_E3M2", DT_OTHER, 6},  {"F4", DT_OTHER, 4},
};

/* ---- name lookup ---------------------------------------------------------------------- */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Slot holding `name`, or the empty slot where it would go. */
static size_t find_slot(const StCheckpoint *ck, const char *name) {
    size_t mask = ck->num_slots - 1;
    size_t i = (size_t)hash_name(name) & mask;
    while (ck->slots[i] && strcmp(ck->tensors[ck->slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

static void rehash(StCheckpoint *ck, size_t num_slots) {
    free(ck->slots);
    ck->num_slots = num_slots;
    ck->slots = pl_xcalloc(num_slots, sizeof *ck->slots);
    for (int t = 0; t < ck->num_tensors; t++)
        ck->slots[find_slot(ck, ck->tensors[t].name)] = t + 1;
}

/* Append a tensor (taking ownership of nothing: the name is copied). Fails on a name that
 * is already present, naming both files. */
static Status add_tensor(StCheckpoint *ck, const StTensor *t) {
    if ((size_t)(ck->num_tensors + 1) * 2 > ck->num_slots)
        rehash(ck, ck->num_slots ? ck->num_slots * 2 : 64);
    size_t slot = find_slot(ck, t->name);
    if (ck->slots[slot]) {
        const StTensor *old = &ck->tensors[ck->slots[slot] - 1];
        if (strcmp(old->file, t->file) == 0)
            return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s' appears twice", t->file, t->name);
        return pl_error_set(PL_ERR_FORMAT, "tensor '%s' appears in both %s and %s", t->name,
                            old->file, t->file);
    }
    if (ck->num_tensors == ck->cap_tensors) {
        ck->cap_tensors = ck->cap_tensors ? ck->cap_tensors * 2 : 64;
        ck->tensors = pl_xrealloc(ck->tensors, (size_t)ck->cap_tensors * sizeof *ck->tensors);
    }
    StTensor *dst = &ck->tensors[ck->num_tensors];
    *dst = *t;
    dst->name = pl_xstrdup(t->name);
    ck->slots[slot] = ++ck->num_tensors;
    return PL_OK;
}

/* ---- one file ------------------------------------------------------------------------- */

typedef struct {
    uint64_t begin, end;
    const char *name;
} Span;

static int span_cmp(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* A JSON integer >= 0 (jansson keeps integers as long long). */
static int json_nonneg(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* Validate one tensor entry of the header of `f` and fill t (name and file set by caller). */
static Status parse_entry(const StFile *f, const char *name, json_t *entry, size_t data_len,
                          StTensor *t) {
    const char *p = f->path;
    if (!json_is_object(entry))
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", p,
                            name);
    json_t *jd = json_object_get(entry, "dtype");
    json_t *js = json_object_get(entry, "shape");
    json_t *jo = json_object_get(entry, "data_offsets");
    if (!jd || !js || !jo)
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': missing '%s'", p, name,
                            !jd   ? "dtype"
                            : !js ? "shape"
                                  : "data_offsets");
    if (!json_is_string(jd))
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': dtype is not a string", p, name);
    const char *dname = json_string_value(jd);
    int bits = 0;
    for (size_t i = 0; i < sizeof dtype_table / sizeof dtype_table[0]; i++) {
        if (strcmp(dname, dtype_table[i].name) == 0) {
            t->dtype = dtype_table[i].dtype;
            t->dtype_name = dtype_table[i].name;
            bits = dtype_table[i].bits;
            break;
        }
    }
    if (!bits)
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", p, name, dname);

    if (!json_is_array(js))
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': shape is not an array", p, name);
    size_t ndim = json_array_size(js);
    if (ndim > ST_MAX_DIMS)
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", p, name,
                            ndim, ST_MAX_DIMS);
    t->ndim = (int)ndim;
    uint64_t nelem = 1;
    int overflow = 0;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        if (!json_nonneg(json_array_get(js, i), &d))
            return pl_error_set(PL_ERR_FORMAT,
                                "%s: tensor '%s': shape has a dimension that is not a "
                                "non-negative integer",
                                p, name);
        t->shape[i] = (int64_t)d;
        overflow |= __builtin_mul_overflow(nelem, d, &nelem);
    }
    uint64_t nbits;
    overflow |= __builtin_mul_overflow(nelem, (uint64_t)bits, &nbits);
    if (overflow)
        return pl_error_set(PL_ERR_FORMAT, "%s: tensor '%s': shape is too large", p, name);
    uint64_t want = (nbits + 7) / 8;

    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_nonneg(json_array_get(jo, 0), &begin) || !json_nonneg(json_array_get(jo, 1), &end))
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets must be [begin, end] with "
                            "non-negative integers",
                            p, name);
    if (begin > end)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] end before begin", p, name,
                            (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] reach past the %zu bytes "
                            "of data in the file (truncated file?)",
                            p, name, (unsigned long long)begin, (unsigned long long)end, data_len);
    if (end - begin != want)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but "
                            "%s of this shape needs %llu",
                            p, name, (unsigned long long)begin, (unsigned long long)end,
                            (unsigned long long)(end - begin), t->dtype_name,
                            (unsigned long long)want);
    t->nbytes = (size_t)(end - begin);
    return PL_OK;
}

/* Map `path` and append its tensors to ck. */
static Status open_one(StCheckpoint *ck, const char *path) {
    ck->files = pl_xrealloc(ck->files, (size_t)(ck->num_files + 1) * sizeof *ck->files);
    StFile *f = &ck->files[ck->num_files++];
    memset(f, 0, sizeof *f);
    f->path = pl_xstrdup(path);

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pl_error_set(PL_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pl_error_set(PL_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pl_error_set(PL_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: file of %lld bytes is too short for a safetensors header "
                            "(truncated file?)",
                            path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return pl_error_set(PL_ERR_IO, "%s: mmap: %s", path, strerror(e));
    f->map = m;
    f->size = (size_t)st.st_size;

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | f->map[i];
    if (n > ST_MAX_HEADER)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: header length %llu is absurd (more than %u bytes): not a "
                            "safetensors file?",
                            path, (unsigned long long)n, ST_MAX_HEADER);
    if (n > f->size - 8)
        return pl_error_set(PL_ERR_FORMAT,
                            "%s: header length %llu is larger than the file (%zu bytes; "
                            "truncated file?)",
                            path, (unsigned long long)n, f->size);
    size_t data_start = 8 + (size_t)n;
    size_t data_len = f->size - data_start;

    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return pl_error_set(PL_ERR_FORMAT, "%s: header is not valid JSON: %s (at byte %d)", path,
                            jerr.text, jerr.position);
    Status s = PL_OK;
    Span *spans = NULL;
    size_t num_spans = 0;
    if (!json_is_object(root)) {
        s = pl_error_set(PL_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    spans = pl_xmalloc((json_object_size(root) + 1) * sizeof *spans);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        StTensor t;
        memset(&t, 0, sizeof t);
        t.name = key;
        t.file = f->path;
        if ((s = parse_entry(f, key, val, data_len, &t)) != PL_OK)
            goto done;
        uint64_t begin =
            (uint64_t)json_integer_value(json_array_get(json_object_get(val, "data_offsets"), 0));
        t.data = f->map + data_start + begin;
        spans[num_spans].begin = begin;
        spans[num_spans].end = begin + t.nbytes;
        spans[num_spans].name = NULL; /* set below, once the name is owned */
        num_spans++;
        if ((s = add_tensor(ck, &t)) != PL_OK)
            goto done;
        spans[num_spans - 1].name = ck->tensors[ck->num_tensors - 1].name;
    }
    /* No two tensors may share bytes (empty tensors share nothing). */
    qsort(spans, num_spans, sizeof *spans, span_cmp);
    const Span *prev = NULL;
    for (size_t i = 0; i < num_spans; i++) {
        if (spans[i].begin == spans[i].end)
            continue;
        if (prev && spans[i].begin < prev->end) {
            s = pl_error_set(PL_ERR_FORMAT,
                             "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", path,
                             prev->name, (unsigned long long)prev->begin,
                             (unsigned long long)prev->end, spans[i].name,
                             (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end);
            goto done;
        }
        prev = &spans[i];
    }
done:
    free(spans);
    json_decref(root);
    return s;
}

static StCheckpoint *ck_new(void) {
    return pl_xcalloc(1, sizeof(StCheckpoint));
}

Status st_open_file(const char *path, StCheckpoint **out) {
    *out = NULL;
    StCheckpoint *ck = ck_new();
    Status s = open_one(ck, path);
    if (s != PL_OK) {
        st_close(ck);
        return s;
    }
    *out = ck;
    return PL_OK;
}

/* ---- sharded checkpoints -------------------------------------------------------------- */

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = pl_xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static Status open_index(StCheckpoint *ck, const char *dir, const char *index_path) {
    char *text = NULL;
    size_t len = 0;
    Status s = pl_read_file(index_path, &text, &len);
    if (s != PL_OK)
        return s;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return pl_error_set(PL_ERR_FORMAT, "%s: invalid JSON: %s (line %d)", index_path, jerr.text,
                            jerr.line);
    const char **shards = NULL;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(map)) {
        s = pl_error_set(PL_ERR_FORMAT, "%s: missing object 'weight_map'", index_path);
        goto done;
    }
    /* Distinct shard names, opened in sorted order (model-00001-of-N first). */
    size_t num = 0;
    shards = pl_xmalloc((json_object_size(map) + 1) * sizeof *shards);
    const char *name;
    json_t *val;
    json_object_foreach(map, name, val) {
        const char *shard = json_string_value(val);
        if (!shard || !*shard || strchr(shard, '/')) {
            s = pl_error_set(PL_ERR_FORMAT,
                             "%s: weight_map['%s'] must be the file name of a shard in %s",
                             index_path, name, dir);
            goto done;
        }
        shards[num++] = shard;
    }
    qsort(shards, num, sizeof *shards, str_cmp);
    for (size_t i = 0; i < num; i++) {
        if (i > 0 && strcmp(shards[i], shards[i - 1]) == 0)
            continue;
        char *path = join_path(dir, shards[i]);
        s = open_one(ck, path);
        free(path);
        if (s == PL_ERR_IO) { /* say where the missing or unreadable shard was named */
            char *msg = pl_xstrdup(pl_error());
            pl_error_set(s, "%s (named in %s)", msg, index_path);
            free(msg);
        }
        if (s != PL_OK)
            goto done;
    }
    /* Each listed tensor must be in the shard the index names. */
    json_object_foreach(map, name, val) {
        const char *shard = json_string_value(val);
        const StTensor *t = st_find(ck, name);
        const char *base = t ? strrchr(t->file, '/') : NULL;
        base = base ? base + 1 : t ? t->file : NULL;
        if (!t || strcmp(base, shard) != 0) {
            char *path = join_path(dir, shard);
            s = pl_error_set(PL_ERR_FORMAT,
                             "%s: tensor '%s' is missing (%s lists it in this shard%s%s)", path,
                             name, index_path, t ? "; it is in " : "", t ? t->file : "");
            free(path);
            goto done;
        }
    }
done:
    free(shards);
    json_decref(root);
    return s;
}

Status st_open(const char *dir, StCheckpoint **out) {
    *out = NULL;
    char *single = join_path(dir, "model.safetensors");
    char *index = join_path(dir, "model.safetensors.index.json");
    StCheckpoint *ck = ck_new();
    Status s;
    if (access(single, F_OK) == 0)
        s = open_one(ck, single);
    else if (access(index, F_OK) == 0)
        s = open_index(ck, dir, index);
    else
        s = pl_error_set(PL_ERR_IO, "no model.safetensors or model.safetensors.index.json in %s",
                         dir);
    free(single);
    free(index);
    if (s != PL_OK) {
        st_close(ck);
        return s;
    }
    *out = ck;
    return PL_OK;
}

/* ---- queries -------------------------------------------------------------------------- */

const StTensor *st_find(const StCheckpoint *ck, const char *name) {
    if (!ck || !ck->num_slots)
        return NULL;
    size_t slot = find_slot(ck, name);
    return ck->slots[slot] ? &ck->tensors[ck->slots[slot] - 1] : NULL;
}

int st_count(const StCheckpoint *ck) {
    return ck ? ck->num_tensors : 0;
}

const StTensor *st_tensor(const StCheckpoint *ck, int i) {
    PL_CHECK(ck && i >= 0 && i < ck->num_tensors);
    return &ck->tensors[i];
}

void st_close(StCheckpoint *ck) {
    if (!ck)
        return;
    for (int i = 0; i < ck->num_tensors; i++)
        free((char *)ck->tensors[i].name);
    for (int i = 0; i < ck->num_files; i++) {
        if (ck->files[i].map)
            munmap((void *)ck->files[i].map, ck->files[i].size);
        free(ck->files[i].path);
    }
    free(ck->tensors);
    free(ck->slots);
    free(ck->files);
    free(ck);
}
