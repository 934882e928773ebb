/* deadline.c - request-timeout as a deadline for receiving a whole request (slowloris).
 *
 * libmicrohttpd's MHD_OPTION_CONNECTION_TIMEOUT closes a connection only after that many
 * idle seconds, so a client that drips one header byte a second would hold its connection
 * for ever. Here every connection carries a clock that starts when a request begins to
 * arrive (the connection opened, or the previous answer was sent) and stops once the
 * request is complete (headers and body: the server then owes the answer). One watchdog
 * thread sleeps until the earliest running clock's deadline and shuts the socket of each
 * connection past it down (shutdown(2), not close: the fd stays libmicrohttpd's, which sees
 * the end of the stream and closes the connection in its own thread). A clock is removed
 * under the mutex before libmicrohttpd closes its fd, so the watchdog never touches a fd
 * that was reused. */
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "server_internal.h"

struct ConnClock {
    ConnClock *prev, *next;
    int fd;
    double since;  /* CLOCK_MONOTONIC seconds the current request began to arrive */
    int receiving; /* the clock runs */
    int cut;       /* the watchdog shut the socket down */
};

struct Deadlines {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    ConnClock list; /* sentinel of a circular list */
    double seconds;
    int stop;
    int sleeping_forever; /* the watchdog waits with no deadline: a new clock must wake it */
    pthread_t thread;
};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *watchdog(void *arg) {
    Deadlines *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        double now = mono_now(), next = 0;
        for (ConnClock *c = d->list.next; c != &d->list; c = c->next) {
            if (!c->receiving || c->cut)
                continue;
            double due = c->since + d->seconds;
            if (due <= now) {
                shutdown(c->fd, SHUT_RDWR);
                c->cut = 1;
            } else if (next == 0 || due < next) {
                next = due;
            }
        }
        d->sleeping_forever = next == 0;
        if (next == 0) {
            pthread_cond_wait(&d->wake, &d->mu);
        } else {
            struct timespec ts;
            double whole = (double)(time_t)next;
            ts.tv_sec = (time_t)next;
            ts.tv_nsec = (long)((next - whole) * 1e9);
            pthread_cond_timedwait(&d->wake, &d->mu, &ts);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

Deadlines *dl_create(double seconds) {
    if (!(seconds > 0))
        return NULL;
    Deadlines *d = pl_xcalloc(1, sizeof *d);
    d->seconds = seconds;
    d->list.next = d->list.prev = &d->list;
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&d->thread, NULL, watchdog, d) != 0)
        pl_fatal(__FILE__, __LINE__, "cannot start the request-timeout watchdog thread");
    return d;
}

void dl_destroy(Deadlines *d) {
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    while (d->list.next != &d->list) { /* connections libmicrohttpd never reported closed */
        ConnClock *c = d->list.next;
        d->list.next = c->next;
        free(c);
    }
    pthread_cond_destroy(&d->wake);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

ConnClock *dl_open(Deadlines *d, int fd) {
    if (!d)
        return NULL;
    ConnClock *c = pl_xcalloc(1, sizeof *c);
    c->fd = fd;
    c->since = mono_now();
    c->receiving = 1;
    pthread_mutex_lock(&d->mu);
    c->next = d->list.next;
    c->prev = &d->list;
    c->next->prev = c;
    d->list.next = c;
    if (d->sleeping_forever) {
        d->sleeping_forever = 0;
        pthread_cond_signal(&d->wake);
    }
    pthread_mutex_unlock(&d->mu);
    return c;
}

void dl_close(Deadlines *d, ConnClock *c) {
    if (!d || !c)
        return;
    pthread_mutex_lock(&d->mu);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    pthread_mutex_unlock(&d->mu);
    free(c);
}

void dl_set_receiving(Deadlines *d, ConnClock *c, int receiving) {
    if (!d || !c)
        return;
    pthread_mutex_lock(&d->mu);
    c->receiving = receiving;
    if (receiving) {
        c->since = mono_now();
        if (d->sleeping_forever) {
            d->sleeping_forever = 0;
            pthread_cond_signal(&d->wake);
        }
    }
    pthread_mutex_unlock(&d->mu);
}
