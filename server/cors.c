/* cors.c - Cross-Origin Resource Sharing as vLLM does it (Starlette's CORSMiddleware), from
 * the keys allowed-origins (none: no CORS headers at all), allowed-methods, allowed-headers
 * and allow-credentials.
 *
 * A preflight (OPTIONS with Origin and Access-Control-Request-Method, on any path, never
 * asking for the API key) answers 204 with Access-Control-Allow-Methods / -Headers / -Max-Age
 * and, for an allowed Origin, Access-Control-Allow-Origin; a disallowed origin, method or
 * header answers 400 "Disallowed CORS origin, method, headers" (as Starlette). Any other
 * response to a request with an Origin carries Access-Control-Allow-Origin: "*" when every
 * origin is allowed (the origin itself when the request has cookies), else the origin when it
 * is listed, with Vary: Origin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server_internal.h"

/* Starlette's ALL_METHODS and SAFELISTED_HEADERS. */
static char *const ALL_METHODS[] = {"DELETE", "GET",  "HEAD", "OPTIONS",
                                    "PATCH",  "POST", "PUT",  NULL};
static const char *const SAFELISTED[] = {"Accept", "Accept-Language", "Content-Language",
                                         "Content-Type"};

static int listed(char *const *list, const char *s, int ignore_case) {
    for (; list && *list; list++)
        if (ignore_case ? !strcasecmp(*list, s) : !strcmp(*list, s))
            return 1;
    return 0;
}

static int enabled(const Server *s) {
    return s->cfg->allowed_origins != NULL;
}

static int origin_allowed(const Server *s, const char *origin) {
    return listed(s->cfg->allowed_origins, "*", 0) || listed(s->cfg->allowed_origins, origin, 0);
}

static const char *header(struct MHD_Connection *conn, const char *name) {
    return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

void cors_add_headers(const Server *s, struct MHD_Connection *conn, struct MHD_Response *r) {
    const char *origin = header(conn, "Origin");
    if (!enabled(s) || !origin)
        return;
    int any = listed(s->cfg->allowed_origins, "*", 0);
    if (s->cfg->allow_credentials)
        MHD_add_response_header(r, "Access-Control-Allow-Credentials", "true");
    if ((any && header(conn, "Cookie")) || (!any && origin_allowed(s, origin))) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    } else if (any) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    }
}

int cors_is_preflight(const Server *s, struct MHD_Connection *conn, const char *method) {
    return enabled(s) && !strcmp(method, "OPTIONS") && header(conn, "Origin") &&
           header(conn, "Access-Control-Request-Method");
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Starlette's Access-Control-Allow-Headers: the safelisted and the configured headers, sorted,
 * each once. */
static void allowed_headers_text(const Server *s, char *out, size_t size) {
    const char *names[64];
    size_t n = 0, used = 0;
    for (size_t i = 0; i < sizeof SAFELISTED / sizeof *SAFELISTED; i++)
        names[n++] = SAFELISTED[i];
    for (char **h = s->cfg->allowed_headers; h && *h && n < 64; h++) {
        size_t k = 0;
        while (k < n && strcmp(names[k], *h))
            k++;
        if (k == n)
            names[n++] = *h;
    }
    qsort(names, n, sizeof *names, by_name);
    out[0] = 0;
    for (size_t i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s", i ? ", " : "", names[i]);
}

/* 1 when every header of the comma-separated request list is allowed. */
static int headers_allowed(const Server *s, const char *requested) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", requested);
    for (char *save, *h = strtok_r(buf, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
        h += strspn(h, " \t");
        size_t n = strlen(h);
        while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
            h[--n] = 0;
        int safe = 0;
        for (size_t i = 0; i < sizeof SAFELISTED / sizeof *SAFELISTED; i++)
            safe |= !strcasecmp(SAFELISTED[i], h);
        if (!safe && !listed(s->cfg->allowed_headers, h, 1))
            return 0;
    }
    return 1;
}

enum MHD_Result cors_preflight(Server *s, struct MHD_Connection *conn) {
    const char *origin = header(conn, "Origin");
    const char *method = header(conn, "Access-Control-Request-Method");
    const char *asked = header(conn, "Access-Control-Request-Headers");
    const Config *cfg = s->cfg;
    int any_origin = listed(cfg->allowed_origins, "*", 0);
    char *const *methods =
        listed(cfg->allowed_methods, "*", 0) ? ALL_METHODS : cfg->allowed_methods;
    int any_header = listed(cfg->allowed_headers, "*", 0);
    char failures[64] = "", text[1024];
    if (!origin_allowed(s, origin))
        strcat(failures, ", origin");
    if (!listed(methods, method, 0))
        strcat(failures, ", method");
    if (asked && !any_header && !headers_allowed(s, asked))
        strcat(failures, ", headers");
    char *body = pl_xmalloc(128);
    snprintf(body, 128, failures[0] ? "Disallowed CORS %s" : "", failures + 2);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
    if (any_origin && !cfg->allow_credentials) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    } else {
        MHD_add_response_header(r, "Vary", "Origin");
        if (origin_allowed(s, origin))
            MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    }
    text[0] = 0;
    for (char *const *m = methods; m && *m; m++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "%s%s", m == methods ? "" : ", ",
                 *m);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", text);
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    if (!any_header) {
        allowed_headers_text(s, text, sizeof text);
        MHD_add_response_header(r, "Access-Control-Allow-Headers", text);
    } else if (asked) {
        MHD_add_response_header(r, "Access-Control-Allow-Headers", asked);
    }
    if (cfg->allow_credentials)
        MHD_add_response_header(r, "Access-Control-Allow-Credentials", "true");
    int status = failures[0] ? 400 : 204;
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    met_http_request(s->metrics, status);
    return ret;
}
