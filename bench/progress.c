/* progress.c - the progress bar on stderr: on a terminal one line redrawn in place
 * ("[#####.....]  12/16 requests, 0 failed, 1.2 s"); elsewhere (logs, CI) a plain line at
 * each quarter, so a log shows progress without a wall of carriage returns. */
#include <stdio.h>
#include <unistd.h>

#include "bench_internal.h"

static void draw(BenchProgress *p) {
    const int width = 30;
    int fill = p->total ? (int)((long)p->done * width / p->total) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    p->last_draw = pl_now();
    fprintf(stderr, "\r[%s] %d/%d %s, %d failed, %.1f s", bar, p->done, p->total, p->what,
            p->failed, p->last_draw - p->t0);
    fflush(stderr);
}

void bench_progress_tick(BenchProgress *p) {
    if (!p->disabled && p->tty && pl_now() - p->last_draw >= 0.25)
        draw(p); /* the clock moves while long requests run */
}

void bench_progress_start(BenchProgress *p, int total, const char *what, int disabled) {
    *p = (BenchProgress){.total = total, .what = what, .disabled = disabled, .t0 = pl_now()};
    p->tty = isatty(STDERR_FILENO);
    if (!p->disabled && p->tty)
        draw(p);
}

void bench_progress_step(BenchProgress *p, int ok) {
    p->done++;
    p->failed += !ok;
    if (p->disabled)
        return;
    if (p->tty) {
        draw(p);
        return;
    }
    int quarter = p->total ? (int)((long)p->done * 4 / p->total) : 4;
    if (quarter > p->last_quarter) {
        p->last_quarter = quarter;
        fprintf(stderr, "pagellm bench: %d/%d %s done, %d failed, %.1f s\n", p->done, p->total,
                p->what, p->failed, pl_now() - p->t0);
    }
}

void bench_progress_end(BenchProgress *p) {
    if (!p->disabled && p->tty)
        fputc('\n', stderr);
}
