/* sampling.h - the per-request sampling parameters (a value type shared by every layer).
 *
 * Semantics follow vLLM's SamplingParams: temperature 0 means greedy; top_k <= 0 and
 * top_p = 1 and min_p = 0 disable those filters; repetition_penalty applies to prompt and
 * output tokens, presence/frequency penalties to output tokens only. The random draw for
 * output position i depends only on (seed, i), so batch composition and preemption never
 * change a seeded result. */
#ifndef PAGELLM_SAMPLING_H
#define PAGELLM_SAMPLING_H

#include <stdint.h>

typedef struct {
    float temperature;        /* 0 = greedy (argmax) */
    float top_p;              /* (0, 1]; 1 = off */
    int top_k;                /* <= 0 = off */
    float min_p;              /* [0, 1]; 0 = off */
    float repetition_penalty; /* 1 = off; > 1 discourages tokens seen in prompt or output */
    float presence_penalty;   /* 0 = off; subtracted once per distinct output token */
    float frequency_penalty;  /* 0 = off; subtracted per occurrence in the output */
    uint64_t seed;            /* random stream of this request */
} SamplingParams;

/* Greedy defaults: temperature 0, every filter and penalty off, seed 0. */
SamplingParams sampling_params_default(void);

/* 1 when the row is greedy: a temperature below 1e-5 (or NaN) takes the argmax. */
int sampling_greedy(const SamplingParams *p);

/* 1 when a row of `vocab` logits samples by temperature alone: not greedy, and no top-k (or
 * one of vocab or more), top-p or min-p cut (the samplers' one-pass exponential race). */
int sampling_temperature_only(const SamplingParams *p, int vocab);

#endif
