/* test_jinja.c - the Jinja engine (include/jinja.h): one case per language feature with its
 * expected output worked out by hand, then every template of tests/data/chat_templates/ with
 * every conversation of conversations.json compared byte for byte with Python's jinja2
 * (tests/jinja_reference.py renders the expected outputs into a temporary folder; that test is
 * skipped, saying why, when python3-jinja2 is not installed). Run from the repository root.
 *
 *   build/tests/test_jinja                                   the tests (cmocka)
 *   build/tests/test_jinja --render TEMPLATE [CONTEXT.json]  print one rendering */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>

#include "jinja.h"

#define TD  "tests/data/chat_templates/"
#define NOW 1722004205 /* 2024-07-26 14:30:05 UTC, as in conversations.json */

/* A case: template, context (JSON text or NULL), and the expected output; or, when `raise` is
 * set, the exact raise_exception message; or, when `fail` is set, a part of the error. */
typedef struct {
    const char *name, *tmpl, *ctx, *want;
    int raise, fail;
} Case;

#define OK(n, t, c, w)                                                                             \
    { n, t, c, w, 0, 0 }
#define RAISES(n, t, c, msg)                                                                       \
    { n, t, c, msg, 1, 0 }
#define FAILS(n, t, c, part)                                                                       \
    { n, t, c, part, 0, 1 }

static void print_escaped(const char *label, const char *s, size_t n) {
    fprintf(stderr, "    %s \"", label);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c == '\t')
            fputs("\\t", stderr);
        else if (c == '"' || c == '\\')
            fprintf(stderr, "\\%c", c);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

/* Print where got and want first differ, with some context. */
static void print_diff(const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "    first difference at byte %zu (want %zu bytes, got %zu)\n", i, wn, gn);
    print_escaped("want:", want + from, (wn - from) < 100 ? wn - from : 100);
    print_escaped("got: ", got + from, (gn - from) < 100 ? gn - from : 100);
}

static int run_case(const Case *c) {
    char err[512];
    JinjaTemplate *t = jinja_parse(c->tmpl, strlen(c->tmpl), err, sizeof err);
    if (!t) {
        if (c->fail && strstr(err, c->want))
            return 0;
        fprintf(stderr, "[ CASE FAIL ] %s: parse error: %s\n", c->name, err);
        return 1;
    }
    json_t *ctx = NULL;
    if (c->ctx) {
        json_error_t je;
        ctx = json_loads(c->ctx, 0, &je);
        if (!ctx) {
            fprintf(stderr, "[ CASE FAIL ] %s: bad context JSON: %s\n", c->name, je.text);
            jinja_free(t);
            return 1;
        }
    }
    JinjaRenderOptions opts = {.now = NOW};
    size_t len = 0;
    int raised = 0, bad = 0;
    char *out = jinja_render_opts(t, ctx, &opts, &len, &raised, err, sizeof err);
    if (c->raise || c->fail) {
        if (out) {
            fprintf(stderr, "[ CASE FAIL ] %s: expected an error, rendered:\n", c->name);
            print_escaped("got:", out, len);
            bad = 1;
        } else if (c->raise && (!raised || strcmp(err, c->want))) {
            fprintf(stderr, "[ CASE FAIL ] %s: expected raise_exception(\"%s\"), got %s\"%s\"\n",
                    c->name, c->want, raised ? "raised " : "error ", err);
            bad = 1;
        } else if (c->fail && !strstr(err, c->want)) {
            fprintf(stderr, "[ CASE FAIL ] %s: expected an error with \"%s\", got \"%s\"\n",
                    c->name, c->want, err);
            bad = 1;
        }
    } else if (!out) {
        fprintf(stderr, "[ CASE FAIL ] %s: render error: %s\n", c->name, err);
        bad = 1;
    } else if (len != strlen(c->want) || memcmp(out, c->want, len)) {
        fprintf(stderr, "[ CASE FAIL ] %s\n", c->name);
        print_diff(c->want, strlen(c->want), out, len);
        bad = 1;
    }
    free(out);
    json_decref(ctx);
    jinja_free(t);
    return bad;
}

static void run_table(const Case *cases, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += run_case(&cases[i]);
    if (bad)
        fail_msg("%d of %zu cases failed (above)", bad, n);
}

#define RUN(table) run_table(table, sizeof table / sizeof table[0])

/* ---- the language, feature by feature ---- */

static void test_whitespace(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("plain text", "Hello, world", NULL, "Hello, world"),
        OK("one trailing newline dropped", "a\n\n", NULL, "a\n"),
        OK("CRLF normalized", "a\r\nb\rc", NULL, "a\nb\nc"),
        OK("trim_blocks eats the newline after %}", "{% if true %}\nx\n{% endif %}\ny", NULL,
           "x\ny"),
        OK("lstrip_blocks eats indentation before {%", "  {% if true %}x{% endif %}", NULL, "x"),
        OK("lstrip_blocks leaves {{ alone", "  {{ 'x' }}", NULL, "  x"),
        OK("lstrip only when the line holds only whitespace", "a {% if true %}b{% endif %}", NULL,
           "a b"),
        OK("{%- strips before, -%} after", "a  \n {%- if true -%}  \n b {%- endif %}", NULL, "ab"),
        OK("{{- and -}}", "a  {{- 'b' -}}  c", NULL, "abc"),
        OK("{%+ keeps indentation, +%} keeps the newline", "  {%+ if true +%}\nx{% endif %}", NULL,
           "  \nx"),
        OK("comments vanish with trim and lstrip", "a\n  {# note #}\nb", NULL, "a\nb"),
        OK("{#- -#} strips", "a  {#- note -#}  b", NULL, "ab"),
        OK("raw block", "{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}"),
        OK("nested indentation of real templates",
           "{%- for m in ['a', 'b'] %}\n    {{- m }}\n{%- endfor %}\n", NULL, "ab"),
        OK("text after a block tag keeps its spaces", "{% if true %} x {% endif %}", NULL, " x "),
    };
    RUN(cases);
}

static void test_literals(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("strings and escapes",
           "{{ 'a\\'b' }}|{{ \"c\\\"d\" }}|{{ 'x\\ny\\tz' }}|{{ '\\u00e9\\x41' }}", NULL,
           "a'b|c\"d|x\ny\tz|\xc3\xa9"
           "A"),
        OK("unknown escape kept", "{{ '\\d' }}", NULL, "\\d"),
        OK("adjacent strings join", "{{ 'a' 'b' }}", NULL, "ab"),
        OK("integers", "{{ 42 }} {{ 1_000 }} {{ 0x1f }} {{ -3 }}", NULL, "42 1000 31 -3"),
        OK("floats print as Python repr",
           "{{ 1.5 }} {{ 2.0 }} {{ 1e3 }} {{ 1e16 }} {{ 0.0001 }} {{ 1e-05 }} {{ 0.1 + 0.2 }}",
           NULL, "1.5 2.0 1000.0 1e+16 0.0001 1e-05 0.30000000000000004"),
        OK("booleans and none, both spellings", "{{ true }} {{ False }} {{ none }} {{ None }}",
           NULL, "True False None None"),
        OK("list", "{{ [1, 'a', none, true, 1.5] }}", NULL, "[1, 'a', None, True, 1.5]"),
        OK("dict", "{{ {'a': 1, \"b\": [2]} }}", NULL, "{'a': 1, 'b': [2]}"),
        OK("tuples", "{{ (1, 2) }} {{ (1,) }} {{ () }}", NULL, "(1, 2) (1,) ()"),
        OK("repr quotes like Python", "{{ [\"it's\", 'say \"hi\"', 'a\\nb'] }}", NULL,
           "[\"it's\", 'say \"hi\"', 'a\\nb']"),
        OK("trailing commas", "{{ [1, 2,] }} {{ {'a': 1,} }}", NULL, "[1, 2] {'a': 1}"),
    };
    RUN(cases);
}

static void test_operators(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 }}", NULL, "7 9 8"),
        OK("division", "{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}", NULL,
           "3.5 3 -4 1 2"),
        OK("int and float mix", "{{ 1 + 1.5 }} {{ 4 / 2 }} {{ 3 * 1.0 }}", NULL, "2.5 2.0 3.0"),
        OK("~ concatenates str() of anything", "{{ 'a' ~ 1 ~ none ~ [1] ~ undefined_name }}", NULL,
           "a1None[1]"),
        OK("+ on strings and lists", "{{ 'ab' + 'cd' }} {{ [1] + [2, 3] }}", NULL,
           "abcd [1, 2, 3]"),
        OK("* repeats", "{{ 'ab' * 3 }} {{ [0] * 2 }}", NULL, "ababab [0, 0]"),
        OK("comparisons", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}", NULL,
           "True False True True"),
        OK("chained comparison", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }}", NULL, "True False"),
        OK("equality across types",
           "{{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' == 'a' }} {{ [1] == [1] }}", NULL,
           "True True True True"),
        OK("in and not in",
           "{{ 'ell' in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} "
           "{{ 3 not in [1, 2] }}",
           NULL, "True True True True"),
        OK("and / or return operands", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|", NULL,
           "x b |"),
        OK("not", "{{ not [] }} {{ not 'x' }}", NULL, "True False"),
        OK("conditional expression",
           "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}]", NULL, "y n []"),
        OK("unary minus and plus", "{{ -(2 + 3) }} {{ +4 }} {{ --1 }}", NULL, "-5 4 1"),
        OK("filter binds tighter than +", "{{ '  a ' | trim + 'b' }}", NULL, "ab"),
        FAILS("str + int is a TypeError", "{{ 'a' + 1 }}", NULL,
              "line 1: can only concatenate str"),
        FAILS("division by zero", "{{ 1 // 0 }}", NULL, "division or modulo by zero"),
        OK("printf-style %", "{{ '%s=%d' % ('x', 3) }}", NULL, "x=3"),
    };
    RUN(cases);
}

static void test_access(void **state) {
    (void)state;
    static const char ctx[] =
        "{\"d\": {\"a\": 1, \"items\": \"key\"}, \"l\": [10, 20, 30], \"s\": \"h\\u00e9llo\", "
        "\"m\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
    static const Case cases[] = {
        OK("attribute and item of a dict", "{{ d.a }} {{ d['a'] }}", ctx, "1 1"),
        OK("d.items is the method, d['items'] the key", "{{ d['items'] }} {{ d.items()|length }}",
           ctx, "key 2"),
        OK("list index, negative index", "{{ l[0] }} {{ l[-1] }} {{ l.1 }}", ctx, "10 30 20"),
        OK("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[5:] }}", ctx,
           "[20, 30] [10, 20] [30, 20, 10] [10, 30] []"),
        OK("string index and slices count characters", "{{ s[1] }} {{ s[::-1] }} {{ s[-3:] }}", ctx,
           "\xc3\xa9 oll\xc3\xa9h llo"),
        OK("nested", "{{ m[0].role }} {{ m[-1]['content'] }}", ctx, "user hi"),
        OK("missing key, index and attribute are undefined", "[{{ d.zz }}{{ d['zz'] }}{{ l[9] }}]",
           ctx, "[]"),
        FAILS("attribute of an undefined value fails", "{{ nothing.attr }}", NULL,
              "'nothing' is undefined"),
        FAILS("attribute of a missing key fails", "{{ d.zz.y }}", ctx,
              "'dict object' has no attribute 'zz'"),
    };
    RUN(cases);
}

static void test_statements(void **state) {
    (void)state;
    static const char ctx[] =
        "{\"msgs\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": "
        "\"U\"}, {\"role\": \"assistant\", \"content\": \"A\"}], \"d\": {\"x\": 1, \"y\": 2}}";
    static const Case cases[] = {
        OK("if / elif / else",
           "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif "
           "%} "
           "{% endfor %}",
           NULL, "one two many "),
        OK("loop variables",
           "{% for m in msgs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
           "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
           ctx, "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"),
        OK("previtem / nextitem / cycle",
           "{% for x in 'ab' %}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }}|"
           "{% endfor %}",
           NULL, "bo|ae|"),
        OK("for else", "{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty"),
        OK("inline if filter; loop counts the kept items",
           "{% for m in msgs if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}"
           "{{ m.content }} {% endfor %}",
           ctx, "1/2U 2/2A "),
        OK("unpacking items()", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx,
           "x=1;y=2;"),
        OK("iterating a dict gives keys; a string gives characters",
           "{% for k in d %}{{ k }}{% endfor %} {% for c in 'h\xc3\xa9' %}[{{ c }}]{% endfor %}",
           ctx, "xy [h][\xc3\xa9]"),
        OK("break and continue",
           "{% for i in range(10) %}{% if i == 4 %}{% break %}{% endif %}"
           "{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
           NULL, "02"),
        OK("set, and tuple set", "{% set a = 1 %}{% set b, c = 2, 3 %}{{ a }}{{ b }}{{ c }}", NULL,
           "123"),
        OK("set in a loop does not leak",
           "{% set x = 0 %}{% for i in [1, 2] %}{% set x = i %}"
           "{% endfor %}{{ x }}",
           NULL, "0"),
        OK("set in a loop is gone at the next iteration",
           "{% set x = 'out' %}{% for i in [1, 2] %}{{ x }}{% set x = i %}{{ x }} {% endfor %}",
           NULL, "out1 out2 "),
        OK("set in if leaks (no scope)", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}", NULL,
           "5"),
        OK("namespace crosses loops",
           "{% set ns = namespace(n=0, seen=false) %}{% for m in msgs %}{% set ns.n = ns.n + 1 %}"
           "{% if m.role == 'user' %}{% set ns.seen = true %}{% endif %}{% endfor %}"
           "{{ ns.n }} {{ ns.seen }}",
           ctx, "3 True"),
        OK("namespace() empty then set", "{% set ns = namespace() %}{% set ns.i = 7 %}{{ ns.i }}",
           NULL, "7"),
        OK("block set with filter", "{% set b | upper %} x{{ 1 }} {% endset %}[{{ b }}]", NULL,
           "[ X1 ]"),
        OK("filter block", "{% filter trim %}  padded  {% endfilter %}|", NULL, "padded|"),
        OK("with", "{% with a = 2 %}{{ a * 2 }}{% endwith %}[{{ a }}]", NULL, "4[]"),
        OK("generation tag renders its body", "{% generation %}x{{ 1 }}{% endgeneration %}", NULL,
           "x1"),
        OK("reassigning messages", "{% set msgs = msgs[1:] %}{{ msgs|length }}", ctx, "2"),
    };
    RUN(cases);
}

static void test_macros(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("arguments and defaults",
           "{% macro m(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}"
           "{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(b=5, a=4) }}",
           NULL, "[1|B|None][1|2|None][1|B|3][4|5|None]"),
        OK("a default may use an earlier argument",
           "{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }}", NULL, "3,6"),
        OK("missing argument is undefined", "{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}",
           NULL, "[]"),
        OK("result is a string", "{% macro m() %}ab{% endmacro %}{{ m() + 'c' }} {{ m()|length }}",
           NULL, "abc 2"),
        OK("recursion",
           "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
           NULL, "321"),
        OK("call block and caller(args)",
           "{% macro wrap(x) %}<{{ caller(x * 2) }}>{% endmacro %}"
           "{% call(y) wrap(4) %}got {{ y }}{% endcall %}",
           NULL, "<got 8>"),
        OK("varargs and kwargs",
           "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}"
           "{{ m(1, 2, 3, k='v') }}",
           NULL, "1(2, 3){'k': 'v'}"),
        OK("macros see variables set later at the top level",
           "{% macro m() %}{{ late }}{% endmacro %}{% set late = 'L' %}{{ m() }}", NULL, "L"),
        FAILS("too many arguments", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL,
              "takes not more than 1 argument"),
    };
    RUN(cases);
}

static void test_filters(void **state) {
    (void)state;
    static const char users[] =
        "{\"users\": [{\"name\": \"ann\", \"role\": \"admin\", \"on\": true}, "
        "{\"name\": \"bob\", \"role\": \"user\", \"on\": false}, "
        "{\"name\": \"cy\", \"role\": \"user\", \"on\": true}]}";
    static const Case cases[] = {
        OK("trim", "[{{ '  a b \\n'|trim }}] [{{ 'xxaxx'|trim('x') }}]", NULL, "[a b] [a]"),
        OK("length and count", "{{ [1, 2]|length }} {{ 'h\xc3\xa9'|length }} {{ {'a': 1}|count }}",
           NULL, "2 2 1"),
        OK("upper lower capitalize title",
           "{{ 'ab\xc3\xa9'|upper }} {{ 'AB'|lower }} {{ 'hELLO wORLD'|capitalize }} "
           "{{ 'hello-world (x) o\\'neil'|title }}",
           NULL, "AB\xc3\x89 ab Hello world Hello-World (X) O'neil"),
        OK("replace", "{{ 'a b a'|replace('a', 'c') }} {{ 'aaa'|replace('a', 'b', 2) }}", NULL,
           "c b c bba"),
        OK("join", "{{ [1, 'x', none]|join(', ') }} {{ users|join('/', attribute='name') }}", users,
           "1, x, None ann/bob/cy"),
        OK("first last",
           "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|last }} "
           "[{{ []|first }}]",
           NULL, "1 3 c []"),
        OK("default",
           "{{ nope|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} "
           "{{ 0|d('z', boolean=true) }} {{ 'v'|default('d') }}",
           NULL, "d None d z v"),
        OK("items", "{{ {'a': 1, 'b': 2}|items|list }} {{ nope|items|list }}", NULL,
           "[('a', 1), ('b', 2)] []"),
        OK("selectattr / rejectattr",
           "{{ users|selectattr('on')|map(attribute='name')|join(',') }} "
           "{{ users|rejectattr('on')|map(attribute='name')|join(',') }} "
           "{{ users|selectattr('role', 'equalto', 'user')|list|length }} "
           "{{ users|selectattr('missing', 'defined')|list|length }}",
           users, "ann,cy bob 2 0"),
        OK("select / reject with a test",
           "{{ [1, 2, 3, 4]|select('odd')|list }} "
           "{{ [1, 2, 3, 4]|reject('divisibleby', 2)|list }}",
           NULL, "[1, 3] [1, 3]"),
        OK("map attribute with default, and map of a filter",
           "{{ users|map(attribute='age', default=0)|list }} {{ ['a', 'b']|map('upper')|list }}",
           users, "[0, 0, 0] ['A', 'B']"),
        OK("string int float list",
           "{{ 5|string ~ 'x' }} {{ '42'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int(-1) }} "
           "{{ '2.5'|float }} {{ 7|float }} {{ 'ab'|list }}",
           NULL, "5x 43 3 -1 2.5 7.0 ['a', 'b']"),
        OK("safe", "{{ '<b>'|safe }}", NULL, "<b>"),
        OK("unique (case-insensitive) and reverse",
           "{{ ['a', 'A', 'b', 'a']|unique|list }} {{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse "
           "}}",
           NULL, "['a', 'b'] [3, 2, 1] cba"),
        OK("indent",
           "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|"
           "{{ 'a\\n\\nb'|indent('> ', blank=true) }}",
           NULL, "a\n  b\n\n  c|  a\n  b|a\n> \n> b"),
        OK("dictsort",
           "{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} "
           "{{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}",
           NULL, "[('A', 2), ('b', 1), ('c', 0)] [('a', 2), ('b', 1)]"),
        OK("sort min max sum abs round",
           "{{ [3, 1, 2]|sort }} {{ users|sort(attribute='name', "
           "reverse=true)|map(attribute='name')"
           "|join }} {{ [4, 9, 2]|max }} {{ [4, 9, 2]|min }} {{ [1, 2, 3]|sum }} {{ -3|abs }} "
           "{{ 2.675|round(2) }} {{ 2.5|round }}",
           users, "[1, 2, 3] cybobann 9 2 6 3 2.67 2.0"),
        OK("wordcount truncate center batch",
           "{{ 'one two  three'|wordcount }} {{ 'hello world foo'|truncate(9, leeway=0) }} "
           "[{{ 'ab'|center(6) }}] {{ [1, 2, 3]|batch(2)|list }}",
           NULL, "3 hello... [  ab  ] [[1, 2], [3]]"),
        OK("format", "{{ '%s-%s'|format('a', 1) }}", NULL, "a-1"),
        FAILS("unknown filter fails at parse time", "{{ x|nosuchfilter }}", NULL,
              "line 1 column 6: No filter named 'nosuchfilter'."),
    };
    RUN(cases);
}

static void test_tojson(void **state) {
    (void)state;
    static const char ctx[] =
        "{\"t\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
        "{\"type\": \"number\", \"enum\": [1.5, 2, 1e-07]}}, \"required\": [\"x\"]}}, "
        "\"u\": \"caf\\u00e9 \\\"q\\\" \\\\ \\n \\u0001 \\ud83d\\ude80\", \"e\": {}, \"l\": []}";
    static const Case cases[] = {
        OK("compact", "{{ t|tojson }}", ctx,
           "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
           "{\"type\": \"number\", \"enum\": [1.5, 2, 1e-07]}}, \"required\": [\"x\"]}}"),
        OK("indent=4", "{{ t.parameters|tojson(indent=4) }}", ctx,
           "{\n    \"type\": \"object\",\n    \"properties\": {\n        \"x\": {\n"
           "            \"type\": \"number\",\n            \"enum\": [\n                1.5,\n"
           "                2,\n                1e-07\n            ]\n        }\n    },\n"
           "    \"required\": [\n        \"x\"\n    ]\n}"),
        OK("strings: non-ASCII kept, controls escaped", "{{ u|tojson }}", ctx,
           "\"caf\xc3\xa9 \\\"q\\\" \\\\ \\n \\u0001 \xf0\x9f\x9a\x80\""),
        OK("ensure_ascii=true", "{{ u|tojson(ensure_ascii=true) }}", ctx,
           "\"caf\\u00e9 \\\"q\\\" \\\\ \\n \\u0001 \\ud83d\\ude80\""),
        OK("sort_keys and separators",
           "{{ {'b': 1, 'a': [true, none]}|tojson(sort_keys=true) }} "
           "{{ {'a': 1, 'b': 2}|tojson(separators=(',', ':')) }}",
           NULL, "{\"a\": [true, null], \"b\": 1} {\"a\":1,\"b\":2}"),
        OK("empty containers with indent", "{{ e|tojson(indent=2) }} {{ l|tojson(indent=2) }}", ctx,
           "{} []"),
        OK("non-string keys become strings", "{{ {1: 'a', true: 'b', none: 'c'}|tojson }}", NULL,
           "{\"1\": \"b\", \"null\": \"c\"}"),
        FAILS("undefined is not JSON", "{{ nope|tojson }}", NULL, "not JSON serializable"),
    };
    RUN(cases);
}

static void test_tests(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("defined undefined none",
           "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ none is none }} "
           "{{ x is not none }}",
           "{\"x\": 1}", "True False True True True"),
        OK("types",
           "{{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ 1 is integer }} "
           "{{ 1.0 is integer }} {{ 1.0 is float }} {{ {} is mapping }} {{ [] is mapping }} "
           "{{ true is boolean }} {{ 1 is boolean }}",
           NULL, "True True True True False True True False True False"),
        OK("iterable and sequence",
           "{{ [] is iterable }} {{ 'a' is iterable }} {{ {} is iterable }} {{ 1 is iterable }} "
           "{{ 'a' is sequence }} {{ 3 is sequence }}",
           NULL, "True True True False True False"),
        OK("true false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }}",
           NULL, "True False True False"),
        OK("odd even divisibleby",
           "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} "
           "{{ 9 is divisibleby(2) }}",
           NULL, "True True True False"),
        OK("comparisons as tests",
           "{{ 2 is equalto 2 }} {{ 2 is eq 3 }} {{ 1 is lt 2 }} "
           "{{ 'a' is in 'cat' }} {{ 2 is ne 2 }}",
           NULL, "True False True True False"),
        OK("lower upper", "{{ 'ab' is lower }} {{ 'Ab' is upper }} {{ 'AB' is upper }}", NULL,
           "True False True"),
    };
    RUN(cases);
}

static void test_methods(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("startswith endswith",
           "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} "
           "{{ 'Hello'.startswith('lo', 3) }}",
           NULL, "True True True"),
        OK("strip lstrip rstrip",
           "[{{ '  a  '.strip() }}][{{ 'xxaxx'.lstrip('x') }}]"
           "[{{ 'xxaxx'.rstrip('x') }}][{{ ' \\t\\na'.lstrip() }}]",
           NULL, "[a][axx][xxa][a]"),
        OK("split rsplit",
           "{{ ' a  b c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a-b-c'.split('-', 1) }} "
           "{{ 'a-b-c'.rsplit('-', 1) }} {{ '</think>x'.split('</think>')[-1] }}",
           NULL, "['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b-c'] ['a-b', 'c'] x"),
        OK("upper lower title capitalize",
           "{{ 'aB'.upper() }} {{ 'aB'.lower() }} "
           "{{ \"they're bill's\".title() }} {{ 'hELLO'.capitalize() }}",
           NULL, "AB ab They'Re Bill'S Hello"),
        OK("replace find count join",
           "{{ 'aXbX'.replace('X', '-') }} {{ 'hello'.find('l') }} "
           "{{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} "
           "{{ '+'.join(['a', 'b']) }}",
           NULL, "a-b- 2 3 2 a+b"),
        OK("format",
           "{{ '{} and {}'.format('a', 1) }} {{ '{0}{0}'.format('x') }} "
           "{{ '{n}!'.format(n='hi') }} {{ '{:>4}|{:.2f}'.format('a', 3.14159) }}",
           NULL, "a and 1 xx hi!    a|3.14"),
        OK("splitlines and is*",
           "{{ 'a\\nb\\r\\nc'.splitlines() }} {{ '12'.isdigit() }} "
           "{{ 'ab'.isalpha() }} {{ ' '.isspace() }}",
           NULL, "['a', 'b', 'c'] True True True"),
        OK("dict methods",
           "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} "
           "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }}",
           "{\"d\": {\"a\": 1, \"b\": 2}}", "['a', 'b'] [1, 2] [('a', 1), ('b', 2)] 1 None 0"),
        OK("list methods", "{{ [1, 2, 2].count(2) }} {{ ['a', 'b'].index('b') }}", NULL, "2 1"),
        OK("mutating methods are undefined in the sandbox", "[{{ [1].append }}]", NULL, "[]"),
        FAILS("calling one fails", "{{ [1].append(2) }}", NULL,
              "access to attribute 'append' of 'list' object is unsafe."),
    };
    RUN(cases);
}

static void test_globals(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("range", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }}",
           NULL, "[0, 1, 2] [1, 3, 5] [3, 2, 1]"),
        OK("namespace from a dict and keywords",
           "{% set ns = namespace({'a': 1}, b=2) %}"
           "{{ ns.a }}{{ ns.b }}",
           NULL, "12"),
        OK("dict()", "{{ dict(a=1, b='x') }}", NULL, "{'a': 1, 'b': 'x'}"),
        OK("strftime_now at the fixed time",
           "{{ strftime_now('%d %b %Y %H:%M:%S') }} "
           "{{ strftime_now('%Y-%m-%d') }}",
           NULL, "26 Jul 2024 14:30:05 2024-07-26"),
        OK("strftime_now is defined", "{{ strftime_now is defined }}", NULL, "True"),
        RAISES("raise_exception gives its message exactly",
               "line 1\n{% if true %}{{ raise_exception('Conversation roles must alternate "
               "user/assistant/user/assistant/...') }}{% endif %}",
               NULL, "Conversation roles must alternate user/assistant/user/assistant/..."),
        RAISES("raise_exception with a built message", "{{ raise_exception('bad id ' ~ 7) }}", NULL,
               "bad id 7"),
        FAILS("range is bounded", "{{ range(1000000)|length }}", NULL, "Range too big"),
    };
    RUN(cases);
}

static void test_undefined(void **state) {
    (void)state;
    static const Case cases[] = {
        OK("prints as empty and is falsy", "[{{ nope }}]{% if nope %}t{% else %}f{% endif %}", NULL,
           "[]f"),
        OK("iterates as empty, has length 0", "{% for x in nope %}x{% endfor %}{{ nope|length }}",
           NULL, "0"),
        OK("equal only to undefined", "{{ nope == none }} {{ nope == other }}", NULL, "False True"),
        OK("'in' an undefined is False", "{{ 'a' in nope }}", NULL, "False"),
        OK("context values shadow nothing else",
           "{{ messages|length }} {{ add_generation_prompt }}",
           "{\"messages\": [1, 2], \"add_generation_prompt\": false}", "2 False"),
        FAILS("arithmetic fails", "{{ nope + 1 }}", NULL, "line 1: 'nope' is undefined"),
        FAILS("item access fails", "{{ nope['x'] }}", NULL, "'nope' is undefined"),
        FAILS("comparison fails", "{{ nope < 1 }}", NULL, "'nope' is undefined"),
    };
    RUN(cases);
}

static void test_parse_errors(void **state) {
    (void)state;
    static const Case cases[] = {
        FAILS("unclosed block", "a\n{% if x %}b", NULL,
              "line 2 column 12: Unexpected end of template. Jinja was looking for the following "
              "tags: 'elif', 'else' or 'endif'. The innermost block that needs to be closed is "
              "'if'."),
        FAILS("unknown tag", "{% frobnicate %}", NULL, "line 1 column 4: Encountered unknown tag"),
        FAILS("stray end tag", "x\n  {% endfor %}", NULL,
              "line 2 column 6: Encountered unknown tag 'endfor'"),
        FAILS("unbalanced bracket", "{{ (1 + 2 }}", NULL, "line 1"),
        FAILS("bad token", "{{ 1 $ 2 }}", NULL, "line 1 column 6: unexpected character $"),
        FAILS("unterminated string", "{{ 'abc }}", NULL,
              "line 1 column 4: unexpected end of string"),
        FAILS("unclosed comment", "ok\n{# never closed", NULL,
              "line 2 column 1: Missing end of comment tag"),
        FAILS("break outside a loop", "{% break %}", NULL, "'break' outside of a loop"),
        FAILS("unknown test", "{{ 1 is frob }}", NULL, "No test named 'frob'."),
        OK("an unknown filter inside {% if %} fails only when it runs",
           "{% if false %}{{ x|frob }}{% endif %}ok", NULL, "ok"),
        FAILS("... and it does when it runs", "{% if true %}{{ x|frob }}{% endif %}", NULL,
              "line 1: No filter named 'frob' found."),
        FAILS("a loop body inside {% if %} is checked at parse time",
              "{% if false %}{% for i in [1] %}{{ i|frob }}{% endfor %}{% endif %}", NULL,
              "line 1 column 38: No filter named 'frob'."),
    };
    RUN(cases);
}

/* ---- API edges ---- */

static void test_api(void **state) {
    (void)state;
    char err[256];
    const char *src;
    jinja_free(NULL);
    JinjaTemplate *t = jinja_parse("{{ a }}\0tail", 12, err, sizeof err);
    assert_non_null(t);
    size_t len = 99;
    char *out = jinja_render(t, NULL, &len, err, sizeof err); /* NUL byte in data is kept */
    assert_non_null(out);
    assert_int_equal(len, 5);
    assert_memory_equal(out, "\0tail", 5);
    free(out);
    json_t *bad = json_array();
    out = jinja_render(t, bad, &len, err, sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "must be a JSON object"));
    json_decref(bad);
    jinja_free(t);

    /* deep nesting is an error, not a stack overflow */
    char deep[3100] = "{{ ";
    memset(deep + 3, '-', 3000);
    strcpy(deep + 3003, "1 }}");
    t = jinja_parse(deep, strlen(deep), err, sizeof err);
    assert_null(t);
    assert_non_null(strstr(err, "nested too deeply"));

    /* output limit */
    src = "{% for i in range(100) %}0123456789{% endfor %}";
    t = jinja_parse(src, strlen(src), err, sizeof err);
    assert_non_null(t);
    JinjaRenderOptions opts = {.max_output = 500};
    out = jinja_render_opts(t, NULL, &opts, &len, NULL, err, sizeof err);
    assert_null(out);
    assert_non_null(strstr(err, "larger than 500 bytes"));
    jinja_free(t);

    /* a context of many messages renders in linear-ish time and memory */
    json_t *msgs = json_array();
    for (int i = 0; i < 5000; i++)
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", i % 2 ? "assistant" : "user",
                                              "content", "some words of a message"));
    json_t *ctx = json_pack("{s:o}", "messages", msgs);
    src = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}";
    t = jinja_parse(src, strlen(src), err, sizeof err);
    out = jinja_render(t, ctx, &len, err, sizeof err);
    assert_non_null(out);
    assert_int_equal(len, 2500 * (6 + 11 + 23 * 2));
    free(out);
    jinja_free(t);
    json_decref(ctx);
}

typedef struct {
    const JinjaTemplate *t;
    json_t *ctx;
    const char *want;
    int bad;
} ThreadJob;

static void *render_thread(void *arg) {
    ThreadJob *job = arg;
    for (int i = 0; i < 200; i++) {
        char err[256];
        char *out = jinja_render(job->t, job->ctx, NULL, err, sizeof err);
        if (!out || strcmp(out, job->want))
            job->bad++;
        free(out);
    }
    return NULL;
}

/* One template rendered from 8 threads at once: templates are read-only once parsed. */
static void test_threads(void **state) {
    (void)state;
    const char *src =
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ m.content|upper }}{% endfor %}{{ ns.n }}";
    char err[256];
    JinjaTemplate *t = jinja_parse(src, strlen(src), err, sizeof err);
    assert_non_null(t);
    json_error_t je;
    json_t *ctx =
        json_loads("{\"messages\": [{\"content\": \"a\"}, {\"content\": \"b\"}]}", 0, &je);
    pthread_t th[8];
    ThreadJob jobs[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (ThreadJob){t, ctx, "AB2", 0};
        pthread_create(&th[i], NULL, render_thread, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    assert_int_equal(bad, 0);
    json_decref(ctx);
    jinja_free(t);
}

/* ---- real templates against Python's jinja2 ---- */

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

typedef struct {
    const char *name;
    JinjaTemplate *t;
    int total, equal, raised, failed;
} TemplateStats;

static void test_reference_templates(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    char dir[512], cmd[1200], path[600];
    snprintf(dir, sizeof dir, "%s/pagellm-jinja.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        fail_msg("mkdtemp %s failed", dir);
    /* the python3 on PATH, else Debian's, where python3-jinja2 installs (a python3 of a
     * version manager ahead on PATH does not see Debian's packages) */
    static const char *const pythons[] = {"python3", "/usr/bin/python3"};
    int code = 127;
    for (size_t p = 0; p < sizeof pythons / sizeof *pythons && (code == 77 || code == 127); p++) {
        snprintf(cmd, sizeof cmd, "%s tests/jinja_reference.py --out '%s'", pythons[p], dir);
        fflush(stdout);
        int st = system(cmd);
        code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    snprintf(path, sizeof path, "%s/expected.json", dir);
    if (code == 77 || code == 127) { /* 77: the script said why (no jinja2) */
        rmdir(dir);
        if (code == 127)
            printf("test_reference_templates: SKIPPED: python3 is not installed\n");
        skip();
    }
    if (code != 0) {
        rmdir(dir);
        fail_msg("`%s` failed (exit status %d)", cmd, code);
    }
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    unlink(path);
    rmdir(dir);
    if (!root)
        fail_msg("%s: %s", path, je.text);
    json_t *cases = json_object_get(root, "cases");
    int64_t now = json_integer_value(json_object_get(root, "now"));
    TemplateStats stats[64];
    int nstats = 0, mismatches = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "template"));
        TemplateStats *s = NULL;
        for (int k = 0; k < nstats; k++)
            if (!strcmp(stats[k].name, name))
                s = &stats[k];
        if (!s) {
            assert_true(nstats < 64);
            s = &stats[nstats++];
            memset(s, 0, sizeof *s);
            s->name = name;
            char file[600], err[512];
            size_t n;
            snprintf(file, sizeof file, TD "%s.jinja", name);
            char *src = slurp(file, &n);
            if (!src)
                fail_msg("cannot read %s", file);
            s->t = jinja_parse(src, n, err, sizeof err);
            free(src);
            if (!s->t)
                fprintf(stderr, "%s: parse error: %s\n", file, err);
        }
        s->total++;
        json_t *want = json_object_get(c, "output");
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        int agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        char err[512] = "no template";
        size_t len = 0;
        int raised = 0;
        JinjaRenderOptions opts = {.now = now};
        char *out = s->t ? jinja_render_opts(s->t, json_object_get(c, "context"), &opts, &len,
                                             &raised, err, sizeof err)
                         : NULL;
        int ok;
        if (want) {
            size_t wn = json_string_length(want);
            ok = out && len == wn && !memcmp(out, json_string_value(want), wn);
            if (!ok && mismatches < 10) {
                fprintf(stderr, "[ MISMATCH ] %s / %s (add_generation_prompt=%s)\n", name, conv,
                        agp ? "true" : "false");
                if (out)
                    print_diff(json_string_value(want), wn, out, len);
                else
                    fprintf(stderr, "    jinja2 rendered it; the C engine failed: %s\n", err);
            }
        } else {
            const char *msg = json_string_value(json_object_get(c, "error"));
            int want_raise = json_is_true(json_object_get(c, "raised"));
            ok = !out && (!want_raise || (raised && !strcmp(err, msg)));
            if (ok && want_raise)
                s->raised++;
            else if (ok)
                s->failed++;
            if (!ok && mismatches < 10) {
                fprintf(stderr, "[ MISMATCH ] %s / %s (add_generation_prompt=%s)\n", name, conv,
                        agp ? "true" : "false");
                fprintf(stderr, "    jinja2: %s%s\n    C:      %s\n",
                        want_raise ? "raise_exception: " : "", msg,
                        out ? "rendered without an error" : err);
            }
        }
        s->equal += ok;
        mismatches += !ok;
        free(out);
    }
    printf("[          ] jinja2 %s vs the C engine, %zu renders:\n",
           json_string_value(json_object_get(root, "jinja2")), json_array_size(cases));
    int total = 0, equal = 0;
    for (int k = 0; k < nstats; k++) {
        printf("[          ]   %-40s %3d/%3d equal (%d raise_exception, %d errors, as jinja2)\n",
               stats[k].name, stats[k].equal, stats[k].total, stats[k].raised, stats[k].failed);
        total += stats[k].total;
        equal += stats[k].equal;
        jinja_free(stats[k].t);
    }
    printf("[          ]   %d templates, %d/%d byte-equal or failing alike\n", nstats, equal,
           total);
    json_decref(root);
    if (mismatches)
        fail_msg("%d renders differ from jinja2 (the first are above)", mismatches);
}

/* build/tests/test_jinja --render TEMPLATE [CONTEXT.json]: print one rendering. */
static int render_cli(int argc, char **argv) {
    size_t n;
    char *src = argc > 2 ? slurp(argv[2], &n) : NULL;
    if (!src) {
        fprintf(stderr, "usage: test_jinja --render TEMPLATE [CONTEXT.json]\n");
        return 2;
    }
    char err[512];
    JinjaTemplate *t = jinja_parse(src, n, err, sizeof err);
    free(src);
    if (!t) {
        fprintf(stderr, "%s: %s\n", argv[2], err);
        return 1;
    }
    json_t *ctx = NULL;
    if (argc > 3) {
        json_error_t je;
        ctx = json_load_file(argv[3], 0, &je);
        if (!ctx) {
            fprintf(stderr, "%s: %s\n", argv[3], je.text);
            jinja_free(t);
            return 1;
        }
    }
    size_t len;
    int raised;
    char *out = jinja_render_opts(t, ctx, NULL, &len, &raised, err, sizeof err);
    int status = 0;
    if (out) {
        fwrite(out, 1, len, stdout);
    } else {
        fprintf(stderr, "%s%s\n", raised ? "raise_exception: " : "", err);
        status = 1;
    }
    free(out);
    json_decref(ctx);
    jinja_free(t);
    return status;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--render"))
        return render_cli(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace),   cmocka_unit_test(test_literals),
        cmocka_unit_test(test_operators),    cmocka_unit_test(test_access),
        cmocka_unit_test(test_statements),   cmocka_unit_test(test_macros),
        cmocka_unit_test(test_filters),      cmocka_unit_test(test_tojson),
        cmocka_unit_test(test_tests),        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_globals),      cmocka_unit_test(test_undefined),
        cmocka_unit_test(test_parse_errors), cmocka_unit_test(test_api),
        cmocka_unit_test(test_threads),      cmocka_unit_test(test_reference_templates),
    };
    return cmocka_run_group_tests_name("jinja", tests, NULL, NULL);
}
