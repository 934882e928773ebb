/* stats.c - mean, standard deviation, median and percentiles exactly as numpy computes
 * them (np.percentile's default linear interpolation), so that pagellm's numbers and
 * vLLM's agree on the same data; and Python's float repr for the lines vLLM prints raw. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_internal.h"

double bst_mean(const double *x, int n) {
    if (n <= 0)
        return 0;
    double s = 0;
    for (int i = 0; i < n; i++)
        s += x[i];
    return s / n;
}

double bst_std(const double *x, int n) {
    if (n <= 0)
        return 0;
    double m = bst_mean(x, n), s = 0;
    for (int i = 0; i < n; i++)
        s += (x[i] - m) * (x[i] - m);
    return sqrt(s / n);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bst_percentile(const double *x, int n, double p) {
    if (n <= 0)
        return 0;
    double *s = pl_xmalloc((size_t)n * sizeof *s);
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double h = (n - 1) * (p / 100.0);
    int lo = (int)floor(h);
    if (lo < 0)
        lo = 0;
    if (lo > n - 1)
        lo = n - 1;
    int hi = lo + 1 < n ? lo + 1 : lo;
    double v = s[lo] + (h - lo) * (s[hi] - s[lo]);
    free(s);
    return v;
}

double bst_median(const double *x, int n) {
    return bst_percentile(x, n, 50);
}

const char *bench_pyfloat(double v, char *buf, size_t size) {
    if (isinf(v)) {
        snprintf(buf, size, v > 0 ? "inf" : "-inf");
        return buf;
    }
    if (isnan(v)) {
        snprintf(buf, size, "nan");
        return buf;
    }
    int prec = 1;
    for (; prec < 17; prec++) { /* the shortest that reads back to the same double */
        snprintf(buf, size, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    snprintf(buf, size, "%.*g", prec, v);
    int exp10 = v == 0 ? 0 : (int)floor(log10(fabs(v)));
    if (strchr(buf, 'e') && exp10 >= -4 && exp10 < 16) /* Python writes these positionally */
        snprintf(buf, size, "%.*f", prec - 1 - exp10 > 0 ? prec - 1 - exp10 : 0, v);
    if (!strpbrk(buf, ".en")) /* "3" -> "3.0" */
        strncat(buf, ".0", size - strlen(buf) - 1);
    return buf;
}
