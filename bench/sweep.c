/* sweep.c - the end of a --sweep-rates run: a table of each rate's achieved throughput and
 * latencies on stdout, the same as a tab-separated data file, and a PNG drawn by gnuplot
 * (through popen): one panel per metric (TTFT, TPOT, ITL, E2EL), the median and each
 * --metric-percentiles line against achieved output throughput, points labelled with the
 * configured rate. Without gnuplot the data files stay and the message says what to install. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_internal.h"

static const char *const names[BENCH_NUM_METRICS] = {"TTFT", "TPOT", "ITL", "E2EL"};

static int have_program(const char *name) {
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char *copy = pl_xstrdup(path), *save = NULL;
    int found = 0;
    for (char *d = strtok_r(copy, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", *d ? d : ".", name);
        found = access(full, X_OK) == 0;
    }
    free(copy);
    return found;
}

static void print_table(const BenchSweepPoint *p, int n, const BenchServeOptions *o) {
    char r[64];
    printf("%s\n", "================== Sweep Summary =================");
    printf("%-10s %9s %9s %11s", "rate", "ok/failed", "req/s", "out tok/s");
    for (int k = 0; k < BENCH_NUM_METRICS; k++)
        printf(" %12s", names[k]);
    printf("   (median ms)\n");
    for (int i = 0; i < n; i++) {
        char okf[32];
        snprintf(okf, sizeof okf, "%d/%d", p[i].completed, p[i].failed);
        printf("%-10s %9s %9.2f %11.2f", bench_pyfloat(p[i].rate, r, sizeof r), okf,
               p[i].request_throughput, p[i].output_throughput);
        for (int k = 0; k < BENCH_NUM_METRICS; k++)
            printf(" %12.2f", p[i].dist[k].median);
        printf("\n");
    }
    printf("%s\n", "==================================================");
    (void)o;
}

/* Column of metric k's statistic s (0 = median, 1.. = percentile s-1) in the data file. */
static int column(const BenchServeOptions *o, int k, int s) {
    return 6 + k * (1 + o->num_percentiles) + s;
}

static int write_tsv(const BenchSweepPoint *p, int n, const BenchServeOptions *o,
                     const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "pagellm bench serve: cannot write %s\n", path);
        return 0;
    }
    char r[64], pw[32];
    fprintf(f, "# rate\tcompleted\tfailed\trequest_throughput\toutput_throughput");
    for (int k = 0; k < BENCH_NUM_METRICS; k++) {
        fprintf(f, "\tmedian_%s_ms", bench_metric_key(k));
        for (int i = 0; i < o->num_percentiles; i++)
            fprintf(f, "\tp%s_%s_ms", bench_pword(o->percentiles[i], pw, sizeof pw),
                    bench_metric_key(k));
    }
    fprintf(f, "\n");
    for (int j = 0; j < n; j++) {
        fprintf(f, "%s\t%d\t%d\t%.6f\t%.6f", bench_pyfloat(p[j].rate, r, sizeof r), p[j].completed,
                p[j].failed, p[j].request_throughput, p[j].output_throughput);
        for (int k = 0; k < BENCH_NUM_METRICS; k++) {
            fprintf(f, "\t%.6f", p[j].dist[k].median);
            for (int i = 0; i < o->num_percentiles; i++)
                fprintf(f, "\t%.6f", p[j].dist[k].pct[i]);
        }
        fprintf(f, "\n");
    }
    return fclose(f) == 0;
}

static void plot_script(FILE *g, const BenchServeOptions *o, const char *model, const char *tsv,
                        const char *png) {
    char pw[32];
    fprintf(g, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1400,1000 font ',10'\n"
               "} else {\n"
               "  set terminal png size 1400,1000\n"
               "}\n");
    fprintf(g, "set output '%s'\n", png);
    fprintf(g, "set datafile separator '\\t'\n");
    char title[256];
    snprintf(title, sizeof title, "%s", model);
    for (char *c = title; *c; c++)
        if (*c == '\'' || *c == '\\')
            *c = '_'; /* inside a gnuplot '...' string */
    fprintf(g,
            "set multiplot layout 2,2 title 'pagellm bench serve: %s, latency against "
            "achieved output throughput (labels: request rate)'\n",
            title);
    fprintf(g, "set grid\nset key top left\nset xlabel 'output throughput (tok/s)'\n"
               "set ylabel 'ms'\n");
    for (int k = 0; k < BENCH_NUM_METRICS; k++) {
        fprintf(g, "set title '%s'\n", names[k]);
        fprintf(g, "plot '%s' using 5:%d with linespoints title 'median', \\\n", tsv,
                column(o, k, 0));
        fprintf(g, "  '' using 5:%d:(stringcolumn(1)) with labels offset 0,1 notitle",
                column(o, k, 0));
        for (int i = 0; i < o->num_percentiles; i++)
            if (o->percentiles[i] != 50) /* the median already */
                fprintf(g, ", \\\n  '' using 5:%d with linespoints title 'P%s'",
                        column(o, k, 1 + i), bench_pword(o->percentiles[i], pw, sizeof pw));
        fprintf(g, "\n");
    }
    fprintf(g, "unset multiplot\n");
}

int bench_sweep_report(const BenchSweepPoint *p, int n, const BenchServeOptions *o,
                       const char *model, const char *dir, const char *stem) {
    print_table(p, n, o);
    char tsv[4096], gp[4096], tsv_name[1024], png_name[1024];
    snprintf(tsv, sizeof tsv, "%s%s%s.tsv", dir ? dir : "", dir ? "/" : "", stem);
    snprintf(gp, sizeof gp, "%s%s%s.gp", dir ? dir : "", dir ? "/" : "", stem);
    snprintf(tsv_name, sizeof tsv_name, "%s.tsv", stem);
    snprintf(png_name, sizeof png_name, "%s.png", stem);
    if (!write_tsv(p, n, o, tsv))
        return 0;
    printf("Saved the sweep data to %s\n", tsv);
    /* The plot script names its files relative to its folder, so the data can be plotted
     * later on any machine with gnuplot: cd DIR && gnuplot STEM.gp */
    FILE *g = fopen(gp, "w");
    if (!g) {
        fprintf(stderr, "pagellm bench serve: cannot write %s\n", gp);
        return 0;
    }
    plot_script(g, o, model, tsv_name, png_name);
    fclose(g);
    if (!have_program("gnuplot")) {
        fprintf(stderr,
                "pagellm bench serve: gnuplot not found, so no plot; the data (%s) and its plot "
                "script (%s) are written: run `gnuplot %s.gp` in that folder where gnuplot is "
                "installed (apt-get install gnuplot-nox)\n",
                tsv, gp, stem);
        return 0;
    }
    if (strchr(dir ? dir : ".", '\'') || strchr(stem, '\'')) {
        fprintf(stderr, "pagellm bench serve: a quote in %s: plot it with gnuplot by hand\n", gp);
        return 0;
    }
    g = popen("gnuplot", "w"); /* no shell: gnuplot changes folder and loads the script */
    if (!g) {
        fprintf(stderr, "pagellm bench serve: cannot start gnuplot\n");
        return 0;
    }
    fprintf(g, "cd '%s'\nload '%s.gp'\n", dir ? dir : ".", stem);
    int st = pclose(g);
    char png[4096];
    snprintf(png, sizeof png, "%s%s%s.png", dir ? dir : "", dir ? "/" : "", stem);
    if (st != 0 || access(png, R_OK) != 0) {
        fprintf(stderr, "pagellm bench serve: gnuplot failed (status %d); the data is in %s\n", st,
                tsv);
        return 0;
    }
    printf("Saved the sweep plot to %s\n", png);
    return 1;
}
