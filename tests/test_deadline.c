/* test_deadline.c - server/deadline.c: the request-timeout deadline for receiving a request.
 *
 * Socket pairs stand in for connections: the watchdog must shut down the server end of a
 * connection whose clock ran past the deadline (the client end then reads end of stream),
 * leave alone one whose clock stopped (request complete), and restart a clock on the next
 * request. Waiting uses poll() on the client end, with a bound, so nothing sleeps blindly. */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "server_internal.h"

#define DEADLINE 0.2 /* seconds */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds until the peer of `fd` sees end of stream, or -1 when it does not within `limit`. */
static double seconds_to_eof(int fd, double limit) {
    double t0 = now();
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, (int)(limit * 1000)) <= 0)
        return -1;
    char c;
    return read(fd, &c, 1) == 0 ? now() - t0 : -1;
}

static void test_cut_after_deadline(void **state) {
    (void)state;
    Deadlines *d = dl_create(DEADLINE);
    assert_non_null(d);
    int slow[2], done[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, slow), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, done), 0);
    ConnClock *cs = dl_open(d, slow[0]);
    ConnClock *cd = dl_open(d, done[0]);
    dl_set_receiving(d, cd, 0); /* its request is complete: the answer may take its time */

    double t = seconds_to_eof(slow[1], 5);
    assert_true(t >= DEADLINE - 0.05);
    assert_true(t < DEADLINE + 1.0);
    assert_true(seconds_to_eof(done[1], 3 * DEADLINE) < 0); /* still open */

    /* The answer sent, the next request may arrive: its clock runs again from now. */
    dl_set_receiving(d, cd, 1);
    t = seconds_to_eof(done[1], 5);
    assert_true(t >= DEADLINE - 0.05 && t < DEADLINE + 1.0);

    dl_close(d, cs);
    dl_close(d, cd);
    dl_destroy(d);
    for (int i = 0; i < 2; i++) {
        close(slow[i]);
        close(done[i]);
    }
}

static void test_no_deadline(void **state) {
    (void)state;
    assert_null(dl_create(0)); /* request-timeout 0: no watchdog at all */
    assert_null(dl_open(NULL, 3));
    dl_set_receiving(NULL, NULL, 1);
    dl_close(NULL, NULL);
    dl_destroy(NULL);
    /* A watchdog with connections left open at the end frees them. */
    Deadlines *d = dl_create(60);
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    dl_open(d, sp[0]);
    dl_destroy(d);
    close(sp[0]);
    close(sp[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cut_after_deadline),
        cmocka_unit_test(test_no_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
