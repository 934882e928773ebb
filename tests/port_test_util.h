/* port_test_util.h - (test-only) a loopback TCP port that is free right now, for the tests
 * that start `pagellm serve` (the kernel picks it: no collisions between concurrent tests). */
#ifndef PAGELLM_TESTS_PORT_TEST_UTIL_H
#define PAGELLM_TESTS_PORT_TEST_UTIL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* A port no socket is bound to at the time of the call, or -1 if none could be had. */
static inline int test_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             getsockname(fd, (struct sockaddr *)&a, &len) == 0;
    close(fd);
    return ok ? ntohs(a.sin_port) : -1;
}

#endif
