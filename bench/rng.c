/* rng.c - the benchmarks' seeded random numbers: xoshiro256** (seeded through splitmix64),
 * uniform integers without modulo bias, normals (Box-Muller) and gamma variates
 * (Marsaglia-Tsang) for the inter-arrival times of --burstiness. The same seed gives the
 * same workload on every machine. */
#include <math.h>

#include "bench_internal.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void brng_seed(BenchRng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

uint64_t brng_next(BenchRng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double brng_uniform(BenchRng *r) {
    return (double)(brng_next(r) >> 11) * 0x1.0p-53;
}

int64_t brng_int(BenchRng *r, int64_t lo, int64_t hi) {
    if (hi <= lo)
        return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1, limit = span ? UINT64_MAX - UINT64_MAX % span : 0;
    uint64_t x;
    do /* reject the top sliver so every value is equally likely */
        x = brng_next(r);
    while (span && x >= limit);
    return lo + (int64_t)(span ? x % span : x);
}

double brng_normal(BenchRng *r) {
    double u = 1.0 - brng_uniform(r), v = brng_uniform(r); /* u in (0, 1] */
    return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

double brng_gamma(BenchRng *r, double shape, double scale) {
    if (shape < 1.0) { /* boost: G(a) = G(a + 1) * U^(1/a) */
        double u = 1.0 - brng_uniform(r);
        return brng_gamma(r, shape + 1.0, scale) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = brng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = 1.0 - brng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v * scale;
    }
}

void brng_shuffle_int(BenchRng *r, int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)brng_int(r, 0, i), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}
