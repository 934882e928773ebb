/* config.c - reading settings into a Config: one key from text (cfg_set), a YAML file
 * (cfg_load_file, libyaml's event parser), command-line flags (cfg_parse_flag), the checks
 * across keys (cfg_validate), --help lines and a YAML dump. The keys themselves are the
 * table in config_keys.c.
 *
 * Messages come in three shapes depending on where a value came from, built by fail():
 *   key 'port' = 70000 is out of range [1, 65535]              (cfg_set, cfg_validate)
 *   config.yaml:5: key 'port' = 70000 is out of range [1, 65535]
 *   --port: 70000 is out of range [1, 65535]                     */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <yaml.h>

#include "config.h"

/* Why a value was refused: the text, and whether it starts with the value ("7 is not one
 * of ...", shown as "key 'x' = 7 is ...") or with a verb ("must be an integer, ..."). */
typedef struct {
    char text[512];
    int value_first;
} Why;

static Status why_set(Why *w, int value_first, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static Status why_set(Why *w, int value_first, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->text, sizeof w->text, fmt, ap);
    va_end(ap);
    w->value_first = value_first;
    return PL_ERR_INVALID;
}

/* Record the error for key `key` refused because of `w`, shaped by origin (see top). */
static Status fail(const char *origin, const char *key, const Why *w) {
    const char *sep = w->value_first ? " = " : " ";
    if (!origin)
        return pl_error_set(PL_ERR_INVALID, "key '%s'%s%s", key, sep, w->text);
    if (origin[0] == '-')
        return pl_error_set(PL_ERR_INVALID, "%s: %s", origin, w->text);
    return pl_error_set(PL_ERR_INVALID, "%s: key '%s'%s%s", origin, key, sep, w->text);
}

static Status unknown_key(const char *origin, const char *name) {
    const char *near = cfg_suggest_key(name);
    char hint[128] = "";
    if (near)
        snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
    if (!origin)
        return pl_error_set(PL_ERR_INVALID, "unknown key '%.100s'%s", name, hint);
    return pl_error_set(PL_ERR_INVALID, "%s: unknown key '%.100s'%s", origin, name, hint);
}

/* ---- one value ------------------------------------------------------------------------ */

/* "[1, 65535]", "(0, 1]" or "(must be >= 1)" for a numeric key. */
static void range_text(const CfgKey *k, char *buf, size_t size) {
    int no_max = isinf(k->max) || (k->type == CFG_INT && k->max >= (double)INT_MAX);
    if (no_max)
        snprintf(buf, size, "(must be %s %g)", k->min_open ? ">" : ">=", k->min);
    else
        snprintf(buf, size, "%c%g, %g]", k->min_open ? '(' : '[', k->min, k->max);
}

static int is_bool_word(const char *v, int *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no",
                                                                                "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i]))
            return *out = 1, 1;
        if (!strcasecmp(v, no[i]))
            return *out = 0, 1;
    }
    return 0;
}

static void list_values(const CfgKey *k, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    if (k->type == CFG_INT) {
        for (const int *v = k->choices; *v && n < size; v++)
            n += (size_t)snprintf(buf + n, size - n, "%s%d", v == k->choices ? "" : ", ", *v);
    } else {
        for (const CfgEnumValue *v = k->values; v->name && n < size; v++)
            n += (size_t)snprintf(buf + n, size - n, "%s%s", v == k->values ? "" : ", ", v->name);
    }
}

/* A list value: a JSON list of strings, or text split at commas (spaces around items
 * dropped); every item non-empty. */
static Status parse_list(const char *v, char ***out, Why *w) {
    json_t *arr = NULL;
    if (v[0] == '[') {
        json_error_t je;
        if (!(arr = json_loads(v, 0, &je)) || !json_is_array(arr)) {
            json_decref(arr);
            return why_set(w, 0, "must be a list, got '%.64s' (%s)", v, je.text);
        }
    } else {
        arr = json_array();
        for (const char *p = v;; p++) {
            size_t n = strcspn(p, ","), a = 0;
            while (a < n && isspace((unsigned char)p[a]))
                a++;
            while (n > a && isspace((unsigned char)p[n - 1]))
                n--;
            json_array_append_new(arr, json_stringn(p + a, n - a));
            p += strcspn(p, ",");
            if (!*p)
                break;
        }
    }
    size_t n = json_array_size(arr), i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        if (!json_is_string(e) || !json_string_length(e) ||
            strlen(json_string_value(e)) != json_string_length(e)) {
            json_decref(arr);
            return why_set(w, 0, "must be a list of non-empty strings, got '%.64s'", v);
        }
    }
    cfg_list_free(out);
    *out = pl_xcalloc(n + 1, sizeof **out);
    json_array_foreach(arr, i, e)(*out)[i] = pl_xstrdup(json_string_value(e));
    json_decref(arr);
    return PL_OK;
}

/* Parse `v` for key k and store it in c, or explain why not in *w. */
static Status parse_value(Config *c, const CfgKey *k, const char *v, Why *w) {
    char *field = (char *)c + k->offset;
    char *end;
    char list[256], range[64];
    switch (k->type) {
        case CFG_INT: {
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (end == v || *end)
                return why_set(w, 0, "must be an integer, got '%.64s'", v);
            if (k->choices) {
                int ok = 0;
                for (const int *ch = k->choices; *ch; ch++)
                    ok |= errno == 0 && x == *ch;
                if (!ok) {
                    list_values(k, list, sizeof list);
                    return why_set(w, 1, "%.64s is not one of %s", v, list);
                }
            }
            if (errno == ERANGE || x < k->min || x > k->max) {
                range_text(k, range, sizeof range);
                return why_set(w, 1, "%.64s is out of range %s", v, range);
            }
            *(int *)field = (int)x;
            return PL_OK;
        }
        case CFG_UINT64: {
            const char *p = v;
            while (isspace((unsigned char)*p))
                p++;
            errno = 0;
            unsigned long long x = strtoull(p, &end, 10);
            if (end == p || *end || *p == '-')
                return why_set(w, 0, "must be a non-negative integer, got '%.64s'", v);
            if (errno == ERANGE)
                return why_set(w, 1, "%.64s is out of range [0, %llu]", v,
                               (unsigned long long)UINT64_MAX);
            *(uint64_t *)field = (uint64_t)x;
            return PL_OK;
        }
        case CFG_DOUBLE: {
            double x = strtod(v, &end);
            if (end == v || *end || !isfinite(x))
                return why_set(w, 0, "must be a number, got '%.64s'", v);
            if (x < k->min || (k->min_open && x <= k->min) || x > k->max) {
                range_text(k, range, sizeof range);
                return why_set(w, 1, "%.64s is out of range %s", v, range);
            }
            *(double *)field = x;
            return PL_OK;
        }
        case CFG_BOOL: {
            int b;
            if (!is_bool_word(v, &b))
                return why_set(w, 0, "must be true or false, got '%.64s'", v);
            *(int *)field = b;
            return PL_OK;
        }
        case CFG_STRING: {
            if (!*v)
                return why_set(w, 0, "must not be empty");
            char **p = (char **)field;
            free(*p);
            *p = pl_xstrdup(v);
            return PL_OK;
        }
        case CFG_LIST:
            return parse_list(v, (char ***)field, w);
        case CFG_ENUM:
            for (const CfgEnumValue *e = k->values; e->name; e++) {
                if (strcasecmp(v, e->name))
                    continue;
                if (k->enum_as_string)
                    *(const char **)field = e->name;
                else
                    *(int *)field = e->code;
                return PL_OK;
            }
            list_values(k, list, sizeof list);
            return why_set(w, 0, "must be one of %s, got '%.64s'", list, v);
    }
    return why_set(w, 0, "has an unknown type");
}

/* Set one known key; engine.model_dir follows `model`. */
static Status set_key(Config *c, const CfgKey *k, const char *value, const char *origin) {
    Why w;
    if (parse_value(c, k, value, &w) != PL_OK)
        return fail(origin, k->name, &w);
    c->engine.model_dir = c->model;
    return PL_OK;
}

Status cfg_set(Config *c, const char *key, const char *value, const char *origin) {
    const CfgKey *k = cfg_find_key(key);
    if (!k)
        return unknown_key(origin, key);
    return set_key(c, k, value, origin);
}

/* ---- the YAML file -------------------------------------------------------------------- */

/* Next parser event, or the parser's error as "path:line: YAML error: problem". */
static Status next_event(yaml_parser_t *p, yaml_event_t *ev, const char *path) {
    if (yaml_parser_parse(p, ev))
        return PL_OK;
    const char *problem = p->problem ? p->problem : "malformed YAML";
    if (p->context)
        return pl_error_set(PL_ERR_INVALID, "%s:%zu: YAML error: %s (%s)", path,
                            p->problem_mark.line + 1, problem, p->context);
    return pl_error_set(PL_ERR_INVALID, "%s:%zu: YAML error: %s", path, p->problem_mark.line + 1,
                        problem);
}

static int is_null_scalar(const yaml_event_t *ev) {
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *v = (const char *)ev->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL");
}

static size_t line_of(const yaml_event_t *ev) {
    return ev->start_mark.line + 1;
}

/* A YAML list of scalars for list key k, after its SEQUENCE_START: set as its JSON text. */
static Status load_list(Config *c, const CfgKey *k, yaml_parser_t *p, const char *path,
                        const char *origin) {
    json_t *arr = json_array();
    yaml_event_t ev;
    Status s;
    while ((s = next_event(p, &ev, path)) == PL_OK && ev.type == YAML_SCALAR_EVENT) {
        json_array_append_new(arr, json_string((const char *)ev.data.scalar.value));
        yaml_event_delete(&ev);
    }
    if (s == PL_OK && ev.type != YAML_SEQUENCE_END_EVENT) {
        Why w;
        why_set(&w, 0, "must be a list of strings");
        s = fail(origin, k->name, &w);
    }
    if (s == PL_OK) {
        char *text = json_dumps(arr, JSON_COMPACT);
        s = set_key(c, k, text, origin);
        free(text);
    }
    yaml_event_delete(&ev); /* a failed parse left it zeroed */
    json_decref(arr);
    return s;
}

/* The key/value pairs of the top-level mapping, after its MAPPING_START. */
static Status load_pairs(Config *c, yaml_parser_t *p, const char *path) {
    int n;
    const CfgKey *table = cfg_keys(&n);
    size_t *seen = pl_xcalloc((size_t)n, sizeof *seen); /* line where each key was set */
    char origin[4200];
    yaml_event_t ev;
    Status s;
    for (;;) {
        if ((s = next_event(p, &ev, path)) != PL_OK)
            break;
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        size_t line = line_of(&ev);
        snprintf(origin, sizeof origin, "%s:%zu", path, line);
        if (ev.type != YAML_SCALAR_EVENT) {
            s = pl_error_set(PL_ERR_INVALID, "%s: keys must be plain names", origin);
            yaml_event_delete(&ev);
            break;
        }
        const char *name = (const char *)ev.data.scalar.value;
        const CfgKey *k = cfg_find_key(name);
        if (!k) {
            s = unknown_key(origin, name);
            yaml_event_delete(&ev);
            break;
        }
        yaml_event_delete(&ev);
        size_t idx = (size_t)(k - table);
        if (seen[idx]) {
            s = pl_error_set(PL_ERR_INVALID, "%s: key '%s' is given twice (first on line %zu)",
                             origin, k->name, seen[idx]);
            break;
        }
        seen[idx] = line;

        if ((s = next_event(p, &ev, path)) != PL_OK)
            break;
        snprintf(origin, sizeof origin, "%s:%zu", path, line_of(&ev));
        if (ev.type == YAML_SCALAR_EVENT && !is_null_scalar(&ev)) {
            s = set_key(c, k, (const char *)ev.data.scalar.value, origin);
        } else if (ev.type == YAML_SEQUENCE_START_EVENT && k->type == CFG_LIST) {
            s = load_list(c, k, p, path, origin);
        } else {
            Why w = {.value_first = 0};
            if (ev.type == YAML_SCALAR_EVENT)
                why_set(&w, 0, "needs a value");
            else if (ev.type == YAML_SEQUENCE_START_EVENT)
                why_set(&w, 0, "must be a single value, got a list");
            else if (ev.type == YAML_MAPPING_START_EVENT)
                why_set(&w, 0, "must be a single value, got a mapping");
            else
                why_set(&w, 0, "must be a single value, got an alias (unsupported)");
            s = fail(origin, k->name, &w);
        }
        yaml_event_delete(&ev);
        if (s != PL_OK)
            break;
    }
    free(seen);
    return s;
}

Status cfg_load_file(Config *c, const char *path) {
    char *data;
    size_t len;
    Status s = pl_read_file(path, &data, &len);
    if (s != PL_OK)
        return s; /* "path: No such file or directory" */
    yaml_parser_t p;
    yaml_event_t ev;
    if (!yaml_parser_initialize(&p))
        pl_fatal(__FILE__, __LINE__, "yaml_parser_initialize failed");
    yaml_parser_set_input_string(&p, (const unsigned char *)data, len);

    /* stream-start, then at most one document */
    int docs = 0;
    for (;;) {
        if ((s = next_event(&p, &ev, path)) != PL_OK)
            break;
        yaml_event_type_t type = ev.type;
        size_t line = line_of(&ev);
        int null_root = type == YAML_SCALAR_EVENT && is_null_scalar(&ev);
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT)
            break;
        if (type == YAML_STREAM_START_EVENT || type == YAML_DOCUMENT_END_EVENT || null_root)
            continue; /* an empty document ("---" alone) sets nothing */
        if (type == YAML_DOCUMENT_START_EVENT) {
            if (docs++) {
                s = pl_error_set(PL_ERR_INVALID, "%s:%zu: only one YAML document is allowed", path,
                                 line);
                break;
            }
            continue;
        }
        if (type != YAML_MAPPING_START_EVENT) {
            s = pl_error_set(PL_ERR_INVALID,
                             "%s:%zu: the file must be a mapping of keys to values (key: value)",
                             path, line);
            break;
        }
        if ((s = load_pairs(c, &p, path)) != PL_OK)
            break;
    }
    yaml_parser_delete(&p);
    free(data);
    return s;
}

/* ---- flags ---------------------------------------------------------------------------- */

const char *cfg_find_config_flag(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config"))
            return i + 1 < argc ? argv[i + 1] : NULL;
        if (!strncmp(argv[i], "--config=", 9))
            return argv[i] + 9;
    }
    return NULL;
}

static int flag_error(void) {
    fprintf(stderr, "pagellm: %s\n", pl_error());
    return -1;
}

int cfg_parse_flag(Config *c, int argc, char **argv, int *i) {
    const char *arg = argv[*i];
    if (strncmp(arg, "--", 2) || !arg[2])
        return 0;
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    char flag[128]; /* "--name" as typed, without "=value" */
    if (len >= sizeof flag)
        return 0;
    memcpy(flag, arg, len);
    flag[len] = '\0';
    const char *name = flag + 2;

    if (!strcmp(name, "config")) { /* loaded before the flags by cfg_find_config_flag */
        if (eq)
            return 1;
        if (*i + 1 >= argc) {
            pl_error_set(PL_ERR_INVALID, "--config: needs a file");
            return flag_error();
        }
        (*i)++;
        return 1;
    }

    const CfgKey *k = cfg_find_key(name);
    if (!k && (!strncmp(name, "no-", 3) || !strncmp(name, "no_", 3))) {
        k = cfg_find_key(name + 3);
        if (!k || k->type != CFG_BOOL)
            return 0;
        if (eq) {
            pl_error_set(PL_ERR_INVALID, "%s: takes no value", flag);
            return flag_error();
        }
        return set_key(c, k, "false", flag) == PL_OK ? 1 : flag_error();
    }
    if (!k)
        return 0;

    const char *value;
    int b;
    if (eq) {
        value = eq + 1;
    } else if (k->type == CFG_BOOL) {
        /* `--flag` alone means true; an explicit bool word after it is taken */
        value = *i + 1 < argc && is_bool_word(argv[*i + 1], &b) ? argv[++*i] : "true";
    } else {
        if (*i + 1 >= argc || !strncmp(argv[*i + 1], "--", 2)) {
            pl_error_set(PL_ERR_INVALID, "%s: needs a value (%s)", flag, k->metavar);
            return flag_error();
        }
        value = argv[++*i];
    }
    return set_key(c, k, value, flag) == PL_OK ? 1 : flag_error();
}

/* ---- checks across keys --------------------------------------------------------------- */

/* The key's field is a pointer (NULL when unset). */
static int holds_pointer(const CfgKey *k) {
    return k->type == CFG_STRING || k->type == CFG_LIST ||
           (k->type == CFG_ENUM && k->enum_as_string);
}

Status cfg_validate(const Config *c) {
    int n;
    const CfgKey *table = cfg_keys(&n);
    char buf[512];
    /* Every key's value once more through its parser (a Config may be filled by hand). */
    for (int i = 0; i < n; i++) {
        const CfgKey *k = &table[i];
        const char *field = (const char *)c + k->offset;
        if (holds_pointer(k) && !*(const char *const *)field) {
            if (k->unset)
                continue;
            return pl_error_set(PL_ERR_INVALID, "key '%s' needs a value", k->name);
        }
        if (k->type == CFG_INT && k->unset && *(const int *)field == 0)
            continue; /* 0 = the documented automatic value */
        const char *text = cfg_format_value(c, k, buf, sizeof buf);
        Config scratch;
        memset(&scratch, 0, sizeof scratch);
        Why w;
        Status s = parse_value(&scratch, k, text, &w);
        cfg_free(&scratch);
        if (s != PL_OK)
            return fail(NULL, k->name, &w);
    }
    const EngineConfig *e = &c->engine;
    if (!e->enable_chunked_prefill && e->max_num_batched_tokens &&
        e->max_model_len > e->max_num_batched_tokens)
        return pl_error_set(PL_ERR_INVALID,
                            "max-model-len (%d) is larger than max-num-batched-tokens (%d) "
                            "while enable-chunked-prefill is off: a prompt that long could "
                            "never be scheduled; raise max-num-batched-tokens or enable "
                            "chunked prefill",
                            e->max_model_len, e->max_num_batched_tokens);
    if (c->enable_auto_tool_choice && !c->tool_call_parser)
        return pl_error_set(PL_ERR_INVALID, "enable-auto-tool-choice needs tool-call-parser "
                                            "(hermes, llama3_json or mistral)");
    /* the cpu backend's ranks are MPI processes only (a launcher sets these variables) */
    int launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_SIZE");
    if (c->engine.tensor_parallel_size > 1 && e->device && !strcmp(e->device, "cpu") && !launched)
        return pl_error_set(PL_ERR_INVALID,
                            "tensor-parallel-size %d with device cpu runs as %d MPI processes "
                            "(mpirun -np %d pagellm ...); in one process it needs device cuda",
                            c->engine.tensor_parallel_size, c->engine.tensor_parallel_size,
                            c->engine.tensor_parallel_size);
    return PL_OK;
}

/* ---- help and dump -------------------------------------------------------------------- */

static void flag_words(const CfgKey *k, char *buf, size_t size) {
    if (k->type == CFG_BOOL)
        snprintf(buf, size, "--[no-]%s", k->name);
    else
        snprintf(buf, size, "--%s %s", k->name, k->metavar);
}

void cfg_print_help(FILE *f) {
    int n;
    const CfgKey *table = cfg_keys(&n);
    Config def;
    cfg_init(&def);
    char words[128], value[256];
    int width = (int)strlen("--config FILE");
    for (int i = 0; i < n; i++) {
        flag_words(&table[i], words, sizeof words);
        if ((int)strlen(words) > width)
            width = (int)strlen(words);
    }
    fprintf(f, "  %-*s  YAML file of these keys (flags override it)\n", width, "--config FILE");
    for (int i = 0; i < n; i++) {
        const CfgKey *k = &table[i];
        flag_words(k, words, sizeof words);
        const char *d = cfg_format_value(&def, k, value, sizeof value);
        fprintf(f, "  %-*s  %s (default %s)\n", width, words, k->help, *d ? d : "none");
    }
    cfg_free(&def);
}

/* Length of the UTF-8 sequence at p and its code point (-1 when malformed). */
static int utf8_next(const unsigned char *p, long *cp) {
    int n = *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : *p >= 0xC0 ? 2 : 0;
    if (n == 0 || *p > 0xF4) {
        *cp = -1;
        return 1;
    }
    long v = *p & (0x3F >> (n - 1));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (p[i] & 0x3F);
    }
    *cp = v;
    return n;
}

/* A YAML double-quoted scalar that reads back to the same string: quotes, backslashes,
 * characters outside YAML's printable set (C0 and C1 controls, DEL, U+FFFE/U+FFFF) and the
 * line breaks YAML 1.1 adds (U+2028, U+2029; NEL is a C1 control), which a scalar would fold,
 * are escaped; a byte that is not UTF-8 (only possible from a command-line flag) becomes
 * U+FFFD, since YAML text is UTF-8. */
static void write_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        if (*p == '"' || *p == '\\') {
            fprintf(f, "\\%c", *p++);
            continue;
        }
        if (*p < 0x80) {
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\x%02x", *p);
            else
                fputc(*p, f);
            p++;
            continue;
        }
        long cp;
        int n = utf8_next(p, &cp);
        if (cp < 0)
            fputs("\\uFFFD", f);
        else if ((cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 || cp == 0xFFFE ||
                 cp == 0xFFFF)
            fprintf(f, "\\u%04lX", cp);
        else
            fwrite(p, 1, (size_t)n, f);
        p += n;
    }
    fputc('"', f);
}

void cfg_write_yaml(FILE *f, const Config *c) {
    int n;
    const CfgKey *table = cfg_keys(&n);
    char buf[512];
    for (int i = 0; i < n; i++) {
        const CfgKey *k = &table[i];
        const char *field = (const char *)c + k->offset;
        if ((holds_pointer(k) && !*(const char *const *)field) ||
            (k->type == CFG_INT && k->min > 0 && *(const int *)field == 0)) {
            fprintf(f, "# %s: (%s)\n", k->name, k->unset ? k->unset : "unset");
            continue;
        }
        fprintf(f, "%s: ", k->name);
        if (k->type == CFG_STRING)
            write_quoted(f, *(const char *const *)field);
        else
            fputs(cfg_format_value(c, k, buf, sizeof buf), f);
        fputc('\n', f);
    }
}
