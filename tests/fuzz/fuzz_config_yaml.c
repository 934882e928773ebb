/* fuzz_config_yaml.c - libFuzzer target: the YAML config file (cfg_load_file, libyaml's
 * event parser) on arbitrary contents, then cfg_validate, and for a file that loads, the
 * round trip config.h promises: cfg_write_yaml writes "a file that cfg_load_file reads
 * back to the same Config", so dump -> load -> dump must give the same text.
 *
 * Input: the file's bytes (written to a scratch file: cfg_load_file takes a path).
 * Invariants: every failure sets a message; a loaded Config dumps to YAML that loads again
 * and dumps identically; cfg_free releases everything (leak checker). */
#include "config.h"
#include "fuzz_common.h"

/* cfg_write_yaml into a malloc'd string. */
static char *dump(const Config *c, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    FUZZ_CHECK(f != NULL, "open_memstream");
    cfg_write_yaml(f, c);
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write_file("config.yaml", data, size);
    Config c;
    cfg_init(&c);
    Status s = cfg_load_file(&c, path);
    if (s != PL_OK) {
        FUZZ_CHECK(s == PL_ERR_INVALID || s == PL_ERR_IO, "cfg_load_file status %d", (int)s);
        FUZZ_CHECK(pl_error()[0], "cfg_load_file failed without a message");
        cfg_free(&c);
        return 0;
    }
    if (cfg_validate(&c) != PL_OK)
        FUZZ_CHECK(pl_error()[0], "cfg_validate failed without a message");

    size_t n1, n2;
    char *y1 = dump(&c, &n1);
    const char *path2 = fz_write_file("roundtrip.yaml", y1, n1);
    Config c2;
    cfg_init(&c2);
    s = cfg_load_file(&c2, path2);
    FUZZ_CHECK(s == PL_OK,
               "cfg_write_yaml output does not load back: %s\n--- input\n%.*s\n--- dump\n%s",
               pl_error(), (int)size, (const char *)data, y1);
    char *y2 = dump(&c2, &n2);
    FUZZ_CHECK(n1 == n2 && memcmp(y1, y2, n1) == 0,
               "dump -> load -> dump changed the config\n--- first dump\n%s\n--- second dump\n%s",
               y1, y2);
    free(y1);
    free(y2);
    cfg_free(&c2);
    cfg_free(&c);
    cfg_free(&c); /* documented safe twice */
    return 0;
}
