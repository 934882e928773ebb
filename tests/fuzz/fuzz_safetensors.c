/* fuzz_safetensors.c - libFuzzer target: the safetensors reader (st_open_file) on arbitrary
 * file contents.
 *
 * The input is the whole file: written to a scratch file (st_open_file takes a path and
 * mmaps it), opened, and on success every tensor is walked: st_tensor/st_find agree, the
 * shape and dtype account for nbytes exactly, and every byte of the tensor's data is read
 * and compared with the input at the offset the header names. The mapping is not seen by
 * AddressSanitizer, so the bounds are checked here explicitly: data must lie inside the data
 * region of the input, never in the header or past the end. A failure must leave *out NULL
 * and an error message set. */
#include <jansson.h>

#include "fuzz_common.h"
#include "safetensors.h"

static int dtype_bits(const char *name) {
    static const struct {
        const char *name;
        int bits;
    } t[] = {{"F32", 32},    {"F16", 16}, {"BF16", 16}, {"F64", 64},    {"I64", 64},
             {"U64", 64},    {"I32", 32}, {"U32", 32},  {"I16", 16},    {"U16", 16},
             {"I8", 8},      {"U8", 8},   {"BOOL", 8},  {"F8_E4M3", 8}, {"F8_E5M2", 8},
             {"F8_E8M0", 8}, {"E8M0", 8}, {"C64", 64},  {"F6_E2M3", 6}, {"F6_E3M2", 6},
             {"F4", 4}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(name, t[i].name))
            return t[i].bits;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write_file("model.safetensors", data, size);
    StCheckpoint *ck = (StCheckpoint *)0x1;
    Status s = st_open_file(path, &ck);
    if (s != PL_OK) {
        FUZZ_CHECK(ck == NULL, "failure left *out = %p", (void *)ck);
        FUZZ_CHECK(pl_error()[0], "failure (status %d) without a message", (int)s);
        return 0;
    }
    FUZZ_CHECK(ck != NULL, "success with *out NULL");
    FUZZ_CHECK(size >= 8, "opened a %zu-byte file", size);

    /* The header as this target reads it, to cross-check offsets. */
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--)
        hn = (hn << 8) | data[i];
    FUZZ_CHECK(hn <= size - 8, "header length %llu past the %zu-byte file", (unsigned long long)hn,
               size);
    size_t data_start = 8 + (size_t)hn;
    json_t *hdr = json_loadb((const char *)data + 8, (size_t)hn, 0, NULL);
    FUZZ_CHECK(json_is_object(hdr), "opened a file whose header is not a JSON object");

    int n = st_count(ck);
    FUZZ_CHECK(n >= 0 && (size_t)n <= json_object_size(hdr), "%d tensors from %zu header keys", n,
               json_object_size(hdr));
    volatile unsigned sink = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *t = st_tensor(ck, i);
        FUZZ_CHECK(t && t->name && t->file && t->dtype_name, "tensor %d incomplete", i);
        FUZZ_CHECK(st_find(ck, t->name) == t, "st_find('%s') is not tensor %d", t->name, i);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= 8, "'%s': ndim %d", t->name, t->ndim);
        int bits = dtype_bits(t->dtype_name);
        FUZZ_CHECK(bits > 0, "'%s': dtype '%s'", t->name, t->dtype_name);
        FUZZ_CHECK(t->dtype == DT_OTHER || pl_dtype_size(t->dtype) * 8 == (size_t)bits,
                   "'%s': dtype %d for '%s'", t->name, (int)t->dtype, t->dtype_name);
        unsigned __int128 elems = 1;
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->shape[d] >= 0, "'%s': shape[%d] = %lld", t->name, d,
                       (long long)t->shape[d]);
            elems *= (unsigned __int128)t->shape[d];
            if (elems > ((unsigned __int128)1 << 80))
                elems = (unsigned __int128)1 << 80; /* nbytes <= file size anyway */
        }
        unsigned __int128 want = (elems * (unsigned)bits + 7) / 8;
        FUZZ_CHECK(want == t->nbytes, "'%s': nbytes %zu, shape and dtype say %llu", t->name,
                   t->nbytes, (unsigned long long)want);

        json_t *e = json_object_get(hdr, t->name);
        json_t *off = json_object_get(e, "data_offsets");
        FUZZ_CHECK(json_is_integer(json_array_get(off, 0)), "'%s': no data_offsets in the header",
                   t->name);
        uint64_t begin = (uint64_t)json_integer_value(json_array_get(off, 0));
        FUZZ_CHECK(begin <= size - data_start && t->nbytes <= size - data_start - begin,
                   "'%s': [%llu, +%zu) reaches past the %zu bytes of data", t->name,
                   (unsigned long long)begin, t->nbytes, size - data_start);
        /* Read every byte through the tensor's pointer and compare with the input. */
        const unsigned char *p = t->data;
        for (size_t b = 0; b < t->nbytes; b++) {
            sink += p[b];
            FUZZ_CHECK(p[b] == data[data_start + begin + b], "'%s': byte %zu differs from the file",
                       t->name, b);
        }
    }
    (void)sink;
    json_decref(hdr);
    st_close(ck);
    return 0;
}
