/* engine_run_util.h - (test-only) one request through the engine's step loop, for engines
 * whose folders have no tokenizer (eng_generate wants one): each of its events goes to a
 * callback, until it finishes. Included after cmocka.h and engine.h. */
#ifndef PAGELLM_TESTS_ENGINE_RUN_UTIL_H
#define PAGELLM_TESTS_ENGINE_RUN_UTIL_H

typedef void (*RunEventFn)(void *ctx, const EngEvent *ev);

static inline void run_request(Engine *e, const EngRequest *req, RunEventFn on_event, void *ctx) {
    uint64_t id;
    assert_int_equal(eng_add_request(e, req, &id), PL_OK);
    for (int done = 0, steps = 0; !done; steps++) {
        assert_true(steps < 1000);
        const EngEvent *ev;
        int count = eng_step(e, &ev);
        for (int i = 0; i < count; i++) {
            if (ev[i].request_id != id)
                continue;
            on_event(ctx, &ev[i]);
            done |= ev[i].finish != FINISH_NONE;
        }
    }
}

#endif
