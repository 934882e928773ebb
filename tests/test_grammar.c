/* test_grammar.c - the grammar library (include/grammar.h): each construct of GBNF, regex,
 * choice and JSON schema accepting and refusing strings; the error messages (unsupported
 * schema keywords named, GBNF errors with line and column); a matcher over a small vocabulary
 * (tokens spanning elements, characters split across tokens, EOS, rollback, copies); masks
 * equal to a token-by-token check on real vocabularies; and random constrained generation
 * with the GPT-2 and TinyLlama vocabularies (tests/data/tokenizers), 100 seeds per constraint,
 * every output checked by an independent judge: JSON parsed with jansson and validated
 * against the schema (validator below, and Python's jsonschema through
 * tests/grammar_validate.py when python3-jsonschema is installed), regexes matched with PCRE2,
 * choices compared. Run from the repository root. */
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
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "grammar.h"
#include "support/hf_vocab.h"

#define TOK "tests/data/tokenizers/"

/* ---- helpers --------------------------------------------------------------------------- */

/* text compiled as a GBNF grammar ('g'), a regex ('r') or a JSON schema ('s'); NULL with the
 * message in err. */
static GrCompiled *compile(char kind, const char *text, char *err, size_t errlen) {
    if (kind == 'g')
        return gr_compile_gbnf(text, strlen(text), err, errlen);
    if (kind == 'r')
        return gr_compile_regex(text, strlen(text), err, errlen);
    json_error_t je;
    json_t *s = json_loads(text, 0, &je);
    if (!s)
        fail_msg("schema %s: %s", text, je.text);
    GrCompiled *c = gr_compile_json_schema(s, err, errlen);
    json_decref(s);
    return c;
}

static GrCompiled *must(char kind, const char *text) {
    char err[512];
    GrCompiled *c = compile(kind, text, err, sizeof err);
    if (!c)
        fail_msg("%s: %s", text, err);
    return c;
}

/* Each string of yes (NULL-terminated) accepted, each of no refused; frees c. */
static void check(GrCompiled *c, const char *what, const char *const *yes, const char *const *no) {
    for (; *yes; yes++)
        if (!gr_compiled_accepts(c, *yes, strlen(*yes)))
            fail_msg("%s: should accept '%s'", what, *yes);
    for (; *no; no++)
        if (gr_compiled_accepts(c, *no, strlen(*no)))
            fail_msg("%s: should refuse '%s'", what, *no);
    gr_compiled_free(c);
}

#define S(...)                    ((const char *const[]){__VA_ARGS__, NULL})
#define CHECK_GBNF(src, yes, no)  check(must('g', src), src, yes, no)
#define CHECK_REGEX(re, yes, no)  check(must('r', re), re, yes, no)
#define CHECK_SCHEMA(js, yes, no) check(must('s', js), js, yes, no)

/* The error compiling a GBNF grammar, a regex or a schema (which must fail). */
static const char *error_of(char kind, const char *text) {
    static char err[512];
    if (compile(kind, text, err, sizeof err))
        fail_msg("'%s' should not compile", text);
    return err;
}

#define ASSERT_ERROR(kind, text, expected) assert_string_equal(error_of(kind, text), expected)

/* ---- acceptance per construct ---------------------------------------------------------- */

static void test_gbnf_constructs(void **state) {
    (void)state;
    CHECK_GBNF("root ::= \"ab\" \"c\"", S("abc"), S("ab", "abcc", ""));
    CHECK_GBNF("root ::= \"a\" | \"b\" | \"\"", S("a", "b", ""), S("ab"));
    CHECK_GBNF("root ::= (\"a\" \"b\")* \"c\"", S("c", "abc", "ababc"), S("ac", "abab"));
    CHECK_GBNF("root ::= \"x\"+ \"y\"?", S("x", "xxy"), S("", "y", "xyy"));
    CHECK_GBNF("root ::= [a-c]{2} [0-9]{1,} \"-\"{0,2} \"z\"{0,}", S("ab1", "cc123--", "aa0zz"),
               S("a1", "ab", "ab1---"));
    CHECK_GBNF("root ::= [^a-z\\n]+", S("ABC", "1-2", "é"), S("a", "A\n", ""));
    CHECK_GBNF("root ::= . .", S("ab", "éx", "日本"), S("a", "abc"));
    CHECK_GBNF("root ::= \"\\x41\\u00e9\\U0001F600\\t\\\"\\\\\"", S("Aé😀\t\"\\"), S("A"));
    CHECK_GBNF("root ::= [\\x30-\\x32\\]\\-]", S("0", "2", "]", "-"), S("3", "\\"));
    CHECK_GBNF("# leading comment\nroot ::= item (\",\" item)* # trailing\n"
               "item ::= (\n  \"a\" |\n  \"b\"\n)\n\nother ::= \"unused\"",
               S("a", "a,b,a"), S("a,", ",a"));
    CHECK_GBNF("root ::= \"(\" expr \")\"\nexpr ::= term (\"+\" term)*\n"
               "term ::= [0-9] | \"(\" expr \")\"",
               S("(1)", "(1+(2+3))", "((1))"), S("(1+)", "((1)"));
    CHECK_GBNF("root ::= \"é\"{2} [α-ω]", S("ééβ"), S("éé", "éa"));
}

static void test_gbnf_errors(void **state) {
    (void)state;
    ASSERT_ERROR('g', "root ::= \"a\"\nfoo ::= [b",
                 "line 2 column 9: unterminated character class");
    ASSERT_ERROR('g', "root ::= \"a\n", "line 1 column 10: unterminated string literal");
    ASSERT_ERROR('g', "root \"a\"", "line 1 column 6: expected '::='");
    ASSERT_ERROR('g', "root ::= (\"a\"", "line 1 column 10: unclosed '('");
    ASSERT_ERROR('g', "root ::= a\n", "line 1 column 10: undefined rule 'a'");
    ASSERT_ERROR('g', "root ::= \"a\"{3,1}",
                 "line 1 column 13: expected {m}, {m,} or {m,n} "
                 "with m <= n < 100000");
    ASSERT_ERROR('g', "root ::= \"\\q\"", "line 1 column 11: unknown escape");
    ASSERT_ERROR('g', "root ::= \"a\"{1,",
                 "line 1 column 13: expected {m}, {m,} or {m,n} "
                 "with m <= n < 100000");
    ASSERT_ERROR('g', "root ::= \"a\" )", "line 1 column 14: unexpected character");
    ASSERT_ERROR('g', "a ::= \"x\"\na ::= \"y\"", "line 2 column 1: rule defined twice");
    ASSERT_ERROR('g', "item ::= \"x\"", "the grammar has no 'root' rule");
    char deep[512] = "root ::= ";
    memset(deep + 9, '(', 201);
    assert_string_equal(error_of('g', deep), "line 1 column 210: parentheses nested too deeply");
    assert_string_equal(error_of('r', deep + 9), "regex: groups nested too deeply at offset 201");
    ASSERT_ERROR('g', "root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"",
                 "rule 'expr' is left-recursive");
    ASSERT_ERROR('g', "root ::= a \"x\"\na ::= b?\nb ::= root", "rule 'root' is left-recursive");
}

static void test_regex_constructs(void **state) {
    (void)state;
    CHECK_REGEX("^abc$", S("abc"), S("ab", "abcd"));
    CHECK_REGEX("a|bc|", S("a", "bc", ""), S("b"));
    CHECK_REGEX("(?:ab)+c?", S("ab", "ababc"), S("", "abcc"));
    CHECK_REGEX("\\d{3}-\\w+\\s\\S", S("123-a_Z9 x"), S("12-a x", "123- x", "123-a  "));
    CHECK_REGEX("[^\\d\\s]{2,3}", S("ab", "é!?"), S("a1", "a b", "abcd"));
    CHECK_REGEX("\\D\\W", S("a!"), S("1!", "ab"));
    CHECK_REGEX(".+", S("x", "é日"), S("", "a\nb"));
    CHECK_REGEX("\\x41\\u00e9\\.\\*\\n", S("Aé.*\n"), S("Aéx*\n"));
    CHECK_REGEX("(a|b){2,}?c{0,1}d*?", S("ab", "babcddd"), S("a", "abcc"));
    CHECK_REGEX("(?P<year>[0-9]{4})-(?<m>[01][0-9])", S("2024-12"), S("2024-1"));
    CHECK_REGEX("[a-]x{2}[]]", S("axx]", "-xx]"), S("ax]", "axx", "bxx]"));
    CHECK_REGEX("a{,2}", S("a{,2}"), S("aa"));
    ASSERT_ERROR('r', "(a)\\1", "regex: backreferences are not supported at offset 5");
    ASSERT_ERROR('r', "a(?=b)", "regex: lookaround and inline flags are not supported at offset 2");
    ASSERT_ERROR('r', "\\bword",
                 "regex: \\b and \\B (word boundaries) are not supported at offset 2");
    ASSERT_ERROR('r', "a^b",
                 "regex: ^ and $ are supported only at the ends of the pattern at "
                 "offset 1");
    ASSERT_ERROR('r', "(ab", "regex: missing ')' at offset 3");
    ASSERT_ERROR('r', "(?<", "regex: lookaround and inline flags are not supported at offset 1");
    ASSERT_ERROR('r', "ab)", "regex: unmatched ')' at offset 2");
    ASSERT_ERROR('r', "*a", "regex: nothing to repeat at offset 0");
    ASSERT_ERROR('r', "[b-a]", "regex: character range out of order at offset 4");
    ASSERT_ERROR('r', "[a-\\", "regex: the pattern ends inside an escape or a range at offset 4");
}

static void test_choice(void **state) {
    (void)state;
    const char *const choices[] = {"yes", "no", "maybe so", "no way"};
    const size_t lens[] = {3, 2, 8, 6};
    char err[256];
    GrCompiled *c = gr_compile_choice(choices, lens, 4, err, sizeof err);
    assert_non_null(c);
    check(c, "choice", S("yes", "no", "maybe so", "no way"), S("ye", "yes ", "maybe", "nope"));
    assert_null(gr_compile_choice(choices, lens, 0, err, sizeof err));
    assert_string_equal(err, "a choice needs at least one string");
}

static void test_schema_scalars(void **state) {
    (void)state;
    CHECK_SCHEMA("{\"type\":\"string\"}",
                 S("\"\"", "\"a b\"", "\"\\\"\\\\\\n\\u00e9\"", "\"日本\""),
                 S("\"a", "\"\\x\"", "\"a\nb\"", "abc", "\"\\u12\""));
    CHECK_SCHEMA("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
                 S("\"ab\"", "\"abc\"", "\"é\\n\""), S("\"a\"", "\"abcd\""));
    CHECK_SCHEMA("{\"type\":\"string\",\"pattern\":\"^[a-z]+@[a-z]+\\\\.com$\"}",
                 S("\"ab@cd.com\""), S("\"ab@cd.org\"", "\"@cd.com\""));
    CHECK_SCHEMA("{\"type\":\"string\",\"pattern\":\"a\\\"b.\"}", S("\"a\\\"bc\""),
                 S("\"a\"bc\"", "\"a\\\"b\"\"", "\"a\\\"b\\\\\""));
    CHECK_SCHEMA("{\"type\":\"string\",\"format\":\"date\"}", S("\"2024-02-29\""),
                 S("\"2024-13-01\"", "\"24-01-01\""));
    CHECK_SCHEMA("{\"type\":\"string\",\"format\":\"date-time\"}",
                 S("\"2024-02-29T23:59:59Z\"", "\"2024-02-29T10:00:00.5+01:00\""),
                 S("\"2024-02-29 10:00:00Z\""));
    CHECK_SCHEMA("{\"format\":\"time\"}", S("\"12:30:00Z\""), S("\"25:00:00Z\""));
    CHECK_SCHEMA("{\"type\":\"string\",\"format\":\"uuid\"}",
                 S("\"123e4567-e89b-12d3-a456-426614174000\""), S("\"123e4567\""));
    CHECK_SCHEMA("{\"type\":\"integer\"}", S("0", "-12", "1234567890123456"),
                 S("01", "1.5", "-", "12345678901234567", "+1"));
    CHECK_SCHEMA("{\"type\":\"number\"}", S("0", "-1.25", "3e10", "2.5E-3"),
                 S("1.", ".5", "1e", "00.1"));
    CHECK_SCHEMA("{\"type\":\"integer\",\"minimum\":-15,\"maximum\":250}",
                 S("-15", "-9", "0", "7", "99", "100", "199", "250"),
                 S("-16", "251", "300", "1000", "-100"));
    CHECK_SCHEMA("{\"type\":\"integer\",\"exclusiveMinimum\":9}", S("10", "99999"),
                 S("9", "0", "-1"));
    CHECK_SCHEMA("{\"type\":\"integer\",\"maximum\":-3}", S("-3", "-40"), S("-2", "0", "5"));
    CHECK_SCHEMA("{\"type\":\"integer\",\"minimum\":120,\"exclusiveMaximum\":1000}",
                 S("120", "505", "999"), S("119", "1000", "12"));
    CHECK_SCHEMA("{\"type\":\"boolean\"}", S("true", "false"), S("1", "True"));
    CHECK_SCHEMA("{\"type\":\"null\"}", S("null"), S("nul", "\"null\""));
    CHECK_SCHEMA("{\"type\":[\"string\",\"null\"]}", S("null", "\"x\""), S("1"));
    CHECK_SCHEMA("{\"enum\":[\"red\",1,null,{\"a\":[true]}]}",
                 S("\"red\"", "1", "null", "{\"a\":[true]}"), S("\"blue\"", "2"));
    CHECK_SCHEMA("{\"const\":\"x\"}", S("\"x\""), S("\"y\""));
    CHECK_SCHEMA("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"boolean\"}]}", S("1", "true"),
                 S("\"1\""));
    CHECK_SCHEMA("{\"oneOf\":[{\"const\":1},{\"const\":2}],\"title\":\"t\"}", S("1", "2"), S("3"));
    CHECK_SCHEMA("{\"allOf\":[{\"type\":\"null\"}]}", S("null"), S("1"));
    CHECK_SCHEMA("{}", S("1", "\"a\"", "[1,{\"x\":null}]", "{}"), S("", "[1,]"));
}

/* Whitespace is bounded: one space, or a newline and up to 20 blanks, between tokens. */
static void test_json_whitespace(void **state) {
    (void)state;
    char yes[64], no[64];
    snprintf(yes, sizeof yes, "[\n%20s1,\n\t2 ]", "");
    snprintf(no, sizeof no, "[\n%21s1]", "");
    CHECK_SCHEMA("{\"type\":\"array\"}", S("[1, 2]", "[ 1 ,2 ]", yes),
                 S("[1,  2]", "[1,\n\n2]", "[ \n1]", "[1]\n", " [1]", no));
}

static void test_schema_objects_arrays(void **state) {
    (void)state;
    const char *person = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                         "\"age\":{\"type\":\"integer\"},\"email\":{\"type\":\"string\"}},"
                         "\"required\":[\"name\",\"email\"]}";
    CHECK_SCHEMA(person,
                 S("{\"name\":\"a\",\"email\":\"b\"}", "{\"name\":\"a\",\"age\":3,\"email\":\"b\"}",
                   "{ \"name\": \"a\",\n  \"age\" : 3 ,\n\t\"email\":\"b\"}"),
                 S("{\"name\":\"a\"}", "{\"email\":\"b\",\"name\":\"a\"}",
                   "{\"name\":\"a\",\"email\":\"b\",\"x\":1}", "{\"name\":\"a\",,\"email\":\"b\"}",
                   "{\"name\":\"a\",\"email\":\"b\"}  ", "{   \"name\":\"a\",\"email\":\"b\"}"));
    CHECK_SCHEMA("{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}}}",
                 S("{}", "{\"a\":1}", "{\"b\":2}", "{\"a\":1,\"b\":2}"),
                 S("{,\"b\":2}", "{\"a\":1,}", "{\"b\":2,\"a\":1}"));
    CHECK_SCHEMA("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                 "\"additionalProperties\":{\"type\":\"boolean\"}}",
                 S("{\"a\":1,\"x\":true}", "{\"y\":false,\"z\":true}", "{}"),
                 S("{\"x\":1}", "{\"x\":true,\"a\":1}"));
    CHECK_SCHEMA("{\"type\":\"object\"}", S("{}", "{\"k\":[1,{\"j\":null}]}"), S("[]"));
    CHECK_SCHEMA("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,"
                 "\"maxItems\":3}",
                 S("[1]", "[1, 2,3]", "[ 1 ]"), S("[]", "[1,2,3,4]", "[1,]", "[\"a\"]"));
    CHECK_SCHEMA("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}",
                 S("[]", "[true]", "[true,false]"), S("[true,true,true]"));
    CHECK_SCHEMA("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},"
                 "{\"type\":\"integer\"}],\"items\":{\"type\":\"null\"},\"maxItems\":3}",
                 S("[\"a\",1]", "[\"a\",1,null]"),
                 S("[\"a\"]", "[1,\"a\"]", "[\"a\",1,null,null]"));
    CHECK_SCHEMA("{\"type\":\"array\"}", S("[]", "[1,\"a\",[]]"), S("[1"));
    CHECK_SCHEMA("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":"
                 "\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":"
                 "\"null\"}]}},\"required\":[\"v\",\"next\"]}},\"$ref\":\"#/$defs/node\"}",
                 S("{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}"),
                 S("{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}"));
    CHECK_SCHEMA("{\"definitions\":{\"p\":{\"type\":\"integer\"}},\"type\":\"array\","
                 "\"items\":{\"$ref\":\"#/definitions/p\"}}",
                 S("[1,2]"), S("[\"1\"]"));
}

static void test_schema_errors(void **state) {
    (void)state;
    ASSERT_ERROR('s', "{\"type\":\"number\",\"minimum\":0,\"multipleOf\":2}",
                 "unsupported JSON schema keyword(s): multipleOf, minimum");
    ASSERT_ERROR('s', "{\"type\":\"array\",\"uniqueItems\":true,\"items\":{\"not\":{}}}",
                 "unsupported JSON schema keyword(s): uniqueItems, not");
    ASSERT_ERROR('s',
                 "{\"type\":\"object\",\"patternProperties\":{},\"properties\":{\"a\":"
                 "{\"type\":\"string\",\"format\":\"email\"}}}",
                 "unsupported JSON schema keyword(s): patternProperties, format=email");
    ASSERT_ERROR('s', "{\"\":1,\"not\":{},\"items\":{\"not\":{},\"\":2,\"nots\":3}}",
                 "unsupported JSON schema keyword(s): \"\", not, nots");
    ASSERT_ERROR('s', "{\"allOf\":[{\"type\":\"string\"},{\"minLength\":1}]}",
                 "unsupported JSON schema keyword(s): allOf");
    ASSERT_ERROR('s', "{\"$ref\":\"#/$defs/missing\"}",
                 "$ref '#/$defs/missing' does not name a schema in $defs or definitions");
    ASSERT_ERROR('s', "{\"type\":\"strin\"}", "unknown type 'strin'");
    ASSERT_ERROR('s', "{\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
                 "required property b is not in properties");
    ASSERT_ERROR('s', "{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}",
                 "minimum 5 is above maximum 1");
    char deep[2048] = "";
    for (int i = 0; i < 101; i++)
        strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 101; i++)
        strcat(deep, "}");
    ASSERT_ERROR('s', deep, "the schema nests deeper than 100 levels");
    ASSERT_ERROR('s', "{\"type\":\"string\",\"pattern\":\"(a\"}", "regex: missing ')' at offset 2");
}

/* ---- matchers over a small vocabulary -------------------------------------------------- */

static int allowed(const uint32_t *mask, int tok) {
    return mask[tok >> 5] >> (tok & 31) & 1;
}

static void test_matcher(void **state) {
    (void)state;
    /* 0 "{", 1 "\"", 2 "a", 3 "\":", 4 " 1", 5 "}", 6 "\xC3" (half of é), 7 "\xA9", 8 NULL
     * (special), 9 EOS, 10 "é\"", 11 "2}" */
    const char *toks[] = {"{",    "\"",   "a",  "\":",   " 1",  "}",
                          "\xC3", "\xA9", NULL, "<eos>", "é\"", "2}"};
    size_t lens[12];
    for (int i = 0; i < 12; i++)
        lens[i] = toks[i] ? strlen(toks[i]) : 0;
    int eos = 9;
    char err[256];
    GrVocab *v = gr_vocab_new(toks, lens, 12, &eos, 1, err, sizeof err);
    assert_non_null(v);
    assert_int_equal(gr_vocab_mask_words(v), 1);
    GrCompiled *c = must('s', "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                              "\"é\":{\"type\":\"integer\"}}}");
    GrMatcher *m = gr_matcher_new(c, v);
    uint32_t mask[1];
    assert_int_equal(gr_matcher_fill_mask(m, mask), 0);
    assert_int_equal(mask[0], 1u << 0);
    assert_int_equal(gr_matcher_accept(m, 2), -1);
    assert_string_equal(gr_matcher_error(m), "token 2 is not allowed by the constraint here");
    assert_int_equal(gr_matcher_accept(m, 0), 0);
    gr_matcher_fill_mask(m, mask);
    assert_int_equal(mask[0], 1u << 1 | 1u << 5); /* "\"" or "}" */
    assert_int_equal(gr_matcher_accept(m, 1), 0);
    gr_matcher_fill_mask(m, mask); /* "a", the first byte of é, or "é\"" */
    assert_int_equal(mask[0], 1u << 2 | 1u << 6 | 1u << 10);
    GrMatcher *fork = gr_matcher_copy(m);
    assert_int_equal(gr_matcher_accept(fork, 6), 0); /* half a character */
    gr_matcher_fill_mask(fork, mask);
    assert_int_equal(mask[0], 1u << 7);
    assert_int_equal(gr_matcher_accept(fork, 7), 0);
    assert_int_equal(gr_matcher_accept(fork, 3), 0); /* "\":" ends the key, spans elements */
    assert_int_equal(gr_matcher_accept(fork, 4), 0);
    gr_matcher_fill_mask(fork, mask);
    assert_true(allowed(mask, 5) && allowed(mask, 11) && !allowed(mask, eos));
    assert_int_equal(gr_matcher_accept(fork, 11), 0); /* "2}" ends the number and the object */
    assert_true(gr_matcher_can_end(fork));
    assert_true(gr_matcher_is_finished(fork));
    gr_matcher_fill_mask(fork, mask);
    assert_int_equal(mask[0], 1u << eos);
    assert_int_equal(gr_matcher_accept(fork, eos), 0);
    gr_matcher_fill_mask(fork, mask);
    assert_int_equal(mask[0], 0);
    assert_int_equal(gr_matcher_accept(fork, 5), -1);
    assert_int_equal(gr_matcher_num_accepted(fork), 8);
    assert_int_equal(gr_matcher_rollback(fork, 3), 0); /* back to after "\":" */
    assert_false(gr_matcher_can_end(fork));
    assert_int_equal(gr_matcher_accept(fork, 4), 0);
    assert_int_equal(gr_matcher_accept(fork, 5), 0);
    assert_true(gr_matcher_is_finished(fork));
    assert_int_equal(gr_matcher_rollback(fork, 9), -1);
    /* the original is where it was: after "{\"" */
    assert_int_equal(gr_matcher_accept(m, 2), 0);
    assert_int_equal(gr_matcher_accept(m, 3), 0);
    assert_int_equal(gr_matcher_accept_bytes(m, " 12}", 4), 0);
    assert_true(gr_matcher_is_finished(m));
    gr_matcher_reset(m);
    assert_int_equal(gr_matcher_num_accepted(m), 0);
    assert_false(gr_matcher_can_end(m));
    assert_int_equal(gr_matcher_accept(m, 8), -1); /* a special token, never allowed */
    gr_matcher_free(m);
    gr_matcher_free(fork);
    gr_compiled_free(c);
    gr_vocab_free(v);
    assert_null(gr_vocab_new(toks, lens, 12, (int[]){12}, 1, err, sizeof err));
    assert_string_equal(err, "EOS id 12 is outside the vocabulary of 12");
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The automaton's limits fail the call that meets them, with a message. */
static void test_limits(void **state) {
    (void)state;
    const char *one[] = {"x"};
    size_t len1 = 1;
    char err[256], *text = malloc(200001);
    GrVocab *v = gr_vocab_new(one, &len1, 1, NULL, 0, err, sizeof err);
    GrCompiled *c = must('g', "root ::= \"(\" root \")\" | \"x\"");
    GrMatcher *m = gr_matcher_new(c, v);
    memset(text, '(', 1000);
    assert_int_equal(gr_matcher_accept_bytes(m, text, 1000), 0);
    assert_int_equal(gr_matcher_accept_bytes(m, "(", 1), -1);
    assert_string_equal(gr_matcher_error(m), "the constraint nests deeper than 1000 rules");
    gr_matcher_free(m);
    gr_compiled_free(c);
    c = must('g', "root ::= d\nd ::= [0-9] d{0,3}"); /* 3^n parses of n digits */
    m = gr_matcher_new(c, v);
    int rc = 0;
    for (int i = 0; i < 40 && !rc; i++)
        rc = gr_matcher_accept_bytes(m, "7", 1);
    assert_int_equal(rc, -1);
    assert_string_equal(gr_matcher_error(m),
                        "the constraint is too ambiguous (over 20000 parses at once)");
    gr_matcher_free(m);
    gr_compiled_free(c);
    c = must('r', "[ab]*a[ab]{16}"); /* a DFA of 2^17 states */
    uint64_t seed = 5;
    for (int i = 0; i < 200000; i++)
        text[i] = "ab"[rng_next(&seed) & 1];
    m = gr_matcher_new(c, v);
    rc = 0;
    for (int i = 0; i < 200000 && !rc; i += 1000)
        rc = gr_matcher_accept_bytes(m, text + i, 1000);
    assert_int_equal(rc, -1);
    assert_string_equal(gr_matcher_error(m),
                        "the constraint needs more than 65536 automaton states");
    uint32_t mask[1];
    assert_int_equal(gr_matcher_fill_mask(m, mask), 0); /* the state before is still there */
    for (int i = 0; i < 100; i++) /* and the states past the limit stay refused */
        assert_int_equal(gr_matcher_accept_bytes(m, text + 1000 * (i % 5), 1000), -1);
    gr_matcher_free(m);
    gr_compiled_free(c);
    gr_vocab_free(v);
    free(text);
}

/* ---- real vocabularies ----------------------------------------------------------------- */

typedef struct {
    HfVocab hf;
    GrVocab *v;
    uint8_t *closing; /* [n] the token holds one of " ] } */
} Vocab;

static Vocab *load_vocab(const char *name) {
    char path[256];
    snprintf(path, sizeof path, TOK "%s/tokenizer.json", name);
    Vocab *vc = calloc(1, sizeof *vc);
    if (hf_vocab_load(path, &vc->hf))
        fail_msg("cannot load %s", path);
    assert_true(vc->hf.eos >= 0);
    char err[256];
    vc->v = gr_vocab_new((const char *const *)vc->hf.bytes, vc->hf.lens, vc->hf.n, &vc->hf.eos, 1,
                         err, sizeof err);
    if (!vc->v)
        fail_msg("%s: %s", name, err);
    vc->closing = calloc(vc->hf.n, 1);
    for (int t = 0; t < vc->hf.n; t++)
        for (size_t i = 0; i < vc->hf.lens[t]; i++)
            vc->closing[t] |= vc->hf.bytes[t][i] && strchr("\"]}", vc->hf.bytes[t][i]);
    return vc;
}

static void free_vocab(Vocab *vc) {
    gr_vocab_free(vc->v);
    hf_vocab_free(&vc->hf);
    free(vc->closing);
    free(vc);
}

/* Generate with random allowed tokens until EOS: EOS half the time it is allowed, else a
 * quarter of the time a random allowed token holding one of " ] } (so that strings and
 * containers end: unbounded strings of random tokens would close only every few hundred
 * tokens), else any allowed token. The output
 * goes into out (NUL-terminated). Masks must allow exactly the tokens the matcher accepts:
 * every pick is accepted, and a random refused token is refused. */
static int gen(GrCompiled *c, Vocab *vc, uint64_t seed0, char *out, size_t cap, size_t *len,
               char *why, size_t whylen) {
    uint64_t seed = seed0;
    const HfVocab *hf = &vc->hf;
    size_t words = gr_vocab_mask_words(vc->v), n = 0;
    uint32_t *mask = malloc(words * sizeof *mask);
    int *ids = malloc(2 * hf->n * sizeof *ids), *closing = ids + hf->n;
    GrMatcher *m = gr_matcher_new(c, vc->v);
    int step = 0, pick = -1;
    for (; pick != hf->eos && step <= 5000 && n < cap; step++) {
        out[n] = 0;
        int k = 0, nc = 0;
        if (gr_matcher_fill_mask(m, mask))
            break;
        for (size_t w = 0; w < words; w++)
            for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
                int t = (int)(32 * w) + __builtin_ctz(bits);
                ids[k++] = t;
                if (vc->closing[t])
                    closing[nc++] = t;
            }
        if (!k)
            break;
        pick = ids[rng_next(&seed) % k];
        if (nc && rng_next(&seed) % 4 == 0)
            pick = closing[rng_next(&seed) % nc];
        if (allowed(mask, hf->eos) && rng_next(&seed) % 2)
            pick = hf->eos;
        int refused = (int)(rng_next(&seed) % hf->n);
        if ((!allowed(mask, refused) && !gr_matcher_accept(m, refused)) ||
            gr_matcher_accept(m, pick))
            break;
        if (pick != hf->eos && n + hf->lens[pick] < cap) {
            memcpy(out + n, hf->bytes[pick], hf->lens[pick]);
            n += hf->lens[pick];
        }
    }
    out[n < cap ? n : cap - 1] = 0;
    *len = n;
    int ok = pick == hf->eos && gr_matcher_is_finished(m);
    if (!ok)
        snprintf(why, whylen, "seed %llu: stopped at step %d (%s) after '%.300s'",
                 (unsigned long long)seed0, step, gr_matcher_error(m), out);
    gr_matcher_free(m);
    free(ids);
    free(mask);
    return ok ? 0 : -1;
}

static size_t generate(GrCompiled *c, Vocab *vc, uint64_t seed, char *out, size_t cap) {
    char why[512];
    size_t n;
    if (gen(c, vc, seed, out, cap, &n, why, sizeof why))
        fail_msg("%s", why);
    return n;
}

/* ---- a JSON schema validator for the keywords the library supports --------------------- */

static int re_match(const char *pattern, const char *s, size_t len, int whole) {
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | (whole ? PCRE2_ANCHORED | PCRE2_ENDANCHORED : 0),
                                   &code, &off, NULL);
    if (!re)
        fail_msg("pcre2 cannot compile %s", pattern);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static int valid(json_t *x, json_t *s, json_t *root);

static int valid_type(json_t *x, const char *t) {
    return !strcmp(t, "object")    ? json_is_object(x)
           : !strcmp(t, "array")   ? json_is_array(x)
           : !strcmp(t, "string")  ? json_is_string(x)
           : !strcmp(t, "integer") ? json_is_integer(x)
           : !strcmp(t, "number")  ? json_is_number(x)
           : !strcmp(t, "boolean") ? json_is_boolean(x)
                                   : json_is_null(x);
}

static int valid_object(json_t *x, json_t *s, json_t *root) {
    json_t *props = json_object_get(s, "properties"),
           *addl = json_object_get(s, "additionalProperties");
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(s, "required"), i,
                       r) if (!json_object_get(x, json_string_value(r))) return 0;
    const char *key;
    json_t *v;
    json_object_foreach(x, key, v) {
        json_t *ps = json_object_get(props, key);
        if (ps ? !valid(v, ps, root) : addl && !valid(v, addl, root))
            return 0;
    }
    return 1;
}

static int valid_array(json_t *x, json_t *s, json_t *root) {
    json_t *prefix = json_object_get(s, "prefixItems"), *items = json_object_get(s, "items");
    json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
    size_t n = json_array_size(x), i;
    json_t *v;
    if ((lo && (json_int_t)n < json_integer_value(lo)) ||
        (hi && (json_int_t)n > json_integer_value(hi)))
        return 0;
    json_array_foreach(x, i, v) {
        json_t *is = i < json_array_size(prefix) ? json_array_get(prefix, i) : items;
        if (is && !valid(v, is, root))
            return 0;
    }
    return 1;
}

static int valid_string(json_t *x, json_t *s) {
    const char *str = json_string_value(x), *f = json_string_value(json_object_get(s, "format"));
    json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
    json_t *pattern = json_object_get(s, "pattern");
    json_int_t chars = 0;
    for (const char *p = str; *p; p++)
        chars += (*p & 0xC0) != 0x80;
    if ((lo && chars < json_integer_value(lo)) || (hi && chars > json_integer_value(hi)))
        return 0;
    if (pattern && !re_match(json_string_value(pattern), str, strlen(str), 0))
        return 0;
    if (f && !strcmp(f, "date"))
        return re_match("\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])", str, strlen(str), 1);
    if (f && !strcmp(f, "uuid"))
        return re_match("[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", str, strlen(str), 1);
    return 1;
}

static int valid_number(json_t *x, json_t *s) {
    double d = json_number_value(x);
    json_t *b;
    return !((b = json_object_get(s, "minimum")) && d < json_number_value(b)) &&
           !((b = json_object_get(s, "maximum")) && d > json_number_value(b)) &&
           !((b = json_object_get(s, "exclusiveMinimum")) && d <= json_number_value(b)) &&
           !((b = json_object_get(s, "exclusiveMaximum")) && d >= json_number_value(b));
}

static int valid(json_t *x, json_t *s, json_t *root) {
    json_t *k, *v;
    size_t i;
    if (json_is_true(s))
        return 1;
    if ((k = json_object_get(s, "$ref"))) {
        const char *ref = json_string_value(k);
        json_t *defs =
            json_object_get(root, !strncmp(ref, "#/$defs/", 8) ? "$defs" : "definitions");
        return valid(x, json_object_get(defs, strrchr(ref, '/') + 1), root);
    }
    if ((k = json_object_get(s, "const")) && !json_equal(x, k))
        return 0;
    if ((k = json_object_get(s, "enum"))) {
        int any = 0;
        json_array_foreach(k, i, v) any |= json_equal(x, v);
        if (!any)
            return 0;
    }
    if ((k = json_object_get(s, "anyOf")) || (k = json_object_get(s, "oneOf"))) {
        int count = 0;
        json_array_foreach(k, i, v) count += valid(x, v, root);
        if (!count || (json_object_get(s, "oneOf") && count > 1))
            return 0;
    }
    if ((k = json_object_get(s, "type"))) {
        int any = json_is_string(k) && valid_type(x, json_string_value(k));
        json_array_foreach(k, i, v) any |= valid_type(x, json_string_value(v));
        if (!any)
            return 0;
    }
    return json_is_object(x)   ? valid_object(x, s, root)
           : json_is_array(x)  ? valid_array(x, s, root)
           : json_is_string(x) ? valid_string(x, s)
           : json_is_number(x) ? valid_number(x, s)
                               : 1;
}

/* ---- random generation ----------------------------------------------------------------- */

static const char *const SCHEMAS[] = {
    /* nested objects, required and optional fields, enums, numbers, bounded arrays */
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
    "\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":4}"
    ","
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"},\"country\":{\"const\":\"NL\"}},"
    "\"required\":[\"zip\"]},"
    "\"active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"address\"]}",
    /* arrays of objects, anyOf, nullable types, formats, prefixItems */
    "{\"type\":\"array\",\"minItems\":1,\"maxItems\":3,\"items\":{\"type\":\"object\","
    "\"properties\":{\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
    "\"when\":{\"type\":[\"string\",\"null\"],\"format\":\"date\"},"
    "\"value\":{\"anyOf\":[{\"type\":\"integer\",\"exclusiveMaximum\":0},{\"type\":\"null\"},"
    "{\"enum\":[1.5,\"x\",true]}]},"
    "\"pair\":{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"minLength\":1,"
    "\"maxLength\":3},{\"type\":\"integer\"}]}},"
    "\"required\":[\"id\",\"value\",\"pair\"],\"additionalProperties\":false}}",
    /* recursion through $defs, additionalProperties with a schema */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"label\":{\"type\":\"string\","
    "\"maxLength\":5},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"},"
    "\"maxItems\":2}},\"required\":[\"label\"],\"additionalProperties\":{\"type\":\"integer\"}}},"
    "\"$ref\":\"#/$defs/node\"}",
};

/* Every output with its schema, for tests/grammar_validate.py. */
static json_t *cases;

static void random_schemas(const char *vocab_name) {
    Vocab *vc = load_vocab(vocab_name);
    char *out = malloc(1 << 20);
    for (size_t k = 0; k < sizeof SCHEMAS / sizeof *SCHEMAS; k++) {
        json_t *s = json_loads(SCHEMAS[k], 0, NULL);
        GrCompiled *c = must('s', SCHEMAS[k]);
        for (uint64_t seed = 1; seed <= 100; seed++) {
            generate(c, vc, seed * 1000 + k, out, 1 << 20);
            json_error_t je;
            json_t *x = json_loads(out, 0, &je);
            if (!x)
                fail_msg("%s schema %zu seed %llu: not JSON (%s): %s", vocab_name, k,
                         (unsigned long long)seed, je.text, out);
            if (!valid(x, s, s))
                fail_msg("%s schema %zu seed %llu: invalid: %s", vocab_name, k,
                         (unsigned long long)seed, out);
            json_array_append_new(cases, json_pack("{s:O, s:s}", "schema", s, "output", out));
            json_decref(x);
        }
        gr_compiled_free(c);
        json_decref(s);
    }
    char err[256];
    GrCompiled *c = gr_compile_json_object(err, sizeof err);
    for (uint64_t seed = 1; seed <= 100; seed++) {
        generate(c, vc, seed, out, 1 << 20);
        json_t *x = json_loads(out, 0, NULL);
        if (!json_is_object(x))
            fail_msg("%s json_object seed %llu: not an object: %s", vocab_name,
                     (unsigned long long)seed, out);
        json_decref(x);
    }
    gr_compiled_free(c);
    free(out);
    free_vocab(vc);
}

static void test_random_schemas_gpt2(void **state) {
    (void)state;
    random_schemas("gpt2");
}

static void test_random_schemas_tinyllama(void **state) {
    (void)state;
    random_schemas("tinyllama-1.1b-chat-v1.0");
}

/* The outputs of the two tests above validated by Python's jsonschema as well (skipped,
 * saying why, without python3-jsonschema). */
static void test_random_schemas_jsonschema(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    char path[512], cmd[700];
    snprintf(path, sizeof path, "%s/pagellm-grammar.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_true(json_array_size(cases) >= 600);
    json_t *root = json_pack("{s:O}", "cases", cases);
    assert_int_equal(json_dump_file(root, path, 0), 0);
    json_decref(root);
    /* the python3 on PATH, else Debian's, where python3-jsonschema installs */
    int code = 127;
    static const char *const pythons[] = {"python3", "/usr/bin/python3"};
    for (size_t p = 0; p < 2 && (code == 77 || code == 127); p++) {
        snprintf(cmd, sizeof cmd, "%s tests/grammar_validate.py '%s'", pythons[p], path);
        fflush(stdout);
        int st = system(cmd);
        code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    unlink(path);
    if (code == 77 || code == 127) {
        if (code == 127)
            printf("test_random_schemas_jsonschema: SKIPPED: python3 is not installed\n");
        skip();
    }
    assert_int_equal(code, 0);
}

static void test_random_regex_and_choice(void **state) {
    (void)state;
    static const char *const patterns[] = {
        "[a-z]{1,8}@[a-z]{2,6}\\.(com|org)", "\\d{3}-\\d{4}", "(yes|no)( maybe)?",
        "[A-Z][a-z]*( [A-Z][a-z]*){0,3}",    "é+[^a-z]{2}",   "(\\w{1,10}\\s?){1,4}\\."};
    const char *const choices[] = {"positive", "negative", "neutral", "neg"};
    const size_t lens[] = {8, 8, 7, 3};
    char out[1 << 14], err[256];
    for (int v = 0; v < 2; v++) {
        Vocab *vc = load_vocab(v ? "tinyllama-1.1b-chat-v1.0" : "gpt2");
        for (size_t k = 0; k < sizeof patterns / sizeof *patterns; k++) {
            GrCompiled *c = must('r', patterns[k]);
            for (uint64_t seed = 1; seed <= 100; seed++) {
                size_t n = generate(c, vc, seed, out, sizeof out);
                if (!re_match(patterns[k], out, n, 1))
                    fail_msg("regex %s seed %llu: '%s' does not match", patterns[k],
                             (unsigned long long)seed, out);
            }
            gr_compiled_free(c);
        }
        GrCompiled *c = gr_compile_choice(choices, lens, 4, err, sizeof err);
        for (uint64_t seed = 1; seed <= 100; seed++) {
            generate(c, vc, seed, out, sizeof out);
            int found = 0;
            for (int i = 0; i < 4; i++)
                found |= !strcmp(out, choices[i]);
            if (!found)
                fail_msg("choice seed %llu: '%s'", (unsigned long long)seed, out);
        }
        gr_compiled_free(c);
        free_vocab(vc);
    }
}

/* Masks equal the tokens the matcher accepts one by one, along a document. */
static void test_mask_equals_token_check(void **state) {
    (void)state;
    Vocab *vc = load_vocab("smollm-135m");
    GrCompiled *c = must('s', SCHEMAS[0]);
    const char *doc = "{\"name\": \"Zoë\", \"age\": 42,\n \"tags\": [\"red\"], "
                      "\"address\": {\"zip\": \"12345\"}}";
    size_t words = gr_vocab_mask_words(vc->v);
    uint32_t *mask = malloc(words * sizeof *mask);
    GrMatcher *m = gr_matcher_new(c, vc->v);
    for (size_t pos = 0; pos <= strlen(doc); pos += 3) {
        if (gr_matcher_fill_mask(m, mask))
            fail_msg("%s", gr_matcher_error(m));
        for (int t = 0; t < vc->hf.n; t++) {
            GrMatcher *probe = gr_matcher_copy(m);
            int ok = gr_matcher_accept(probe, t) == 0;
            gr_matcher_free(probe);
            if (ok != allowed(mask, t))
                fail_msg("after '%.*s': token %d mask %d, accept %d", (int)pos, doc, t,
                         allowed(mask, t), ok);
        }
        size_t step = strlen(doc) - pos < 3 ? strlen(doc) - pos : 3;
        if (step)
            assert_int_equal(gr_matcher_accept_bytes(m, doc + pos, step), 0);
        else
            break;
    }
    assert_true(gr_matcher_can_end(m));
    gr_matcher_free(m);
    gr_compiled_free(c);
    free(mask);
    free_vocab(vc);
}

/* Threads sharing one GrCompiled and GrVocab produce what one thread does alone. */
typedef struct {
    GrCompiled *c;
    Vocab *vc;
    int first, rc;
    char out[8][4096];
} Job;

static void *job_run(void *arg) {
    Job *j = arg;
    char why[512];
    size_t n;
    for (int i = 0; i < 8 && !j->rc; i++)
        j->rc = gen(j->c, j->vc, (uint64_t)(j->first + i), j->out[i], sizeof j->out[i], &n, why,
                    sizeof why);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    Vocab *vc = load_vocab("gpt2");
    GrCompiled *shared = must('s', SCHEMAS[0]), *alone = must('s', SCHEMAS[0]);
    Job *jobs = calloc(4, sizeof *jobs);
    pthread_t th[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (Job){.c = shared, .vc = vc, .first = 8 * t};
        assert_int_equal(pthread_create(&th[t], NULL, job_run, &jobs[t]), 0);
    }
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    char out[4096];
    for (int t = 0; t < 4; t++) {
        assert_int_equal(jobs[t].rc, 0);
        for (int i = 0; i < 8; i++) {
            generate(alone, vc, (uint64_t)(8 * t + i), out, sizeof out);
            assert_string_equal(jobs[t].out[i], out);
        }
    }
    free(jobs);
    gr_compiled_free(shared);
    gr_compiled_free(alone);
    free_vocab(vc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_constructs),
        cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_regex_constructs),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_schema_scalars),
        cmocka_unit_test(test_json_whitespace),
        cmocka_unit_test(test_schema_objects_arrays),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_matcher),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_mask_equals_token_check),
        cmocka_unit_test(test_random_schemas_gpt2),
        cmocka_unit_test(test_random_schemas_tinyllama),
        cmocka_unit_test(test_random_schemas_jsonschema),
        cmocka_unit_test(test_random_regex_and_choice),
        cmocka_unit_test(test_threads),
    };
    cases = json_array();
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    json_decref(cases);
    return failed;
}
