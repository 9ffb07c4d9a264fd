/* Benchmark load client: one thread, one epoll loop, so the harness costs a fraction of a core.
 *
 * loadc stream  HOST PORT N RAMP_PER_S WARMUP_S MEASURE_S
 *     N streams (GET /stream); latency of every frame = arrival - the CLOCK_MONOTONIC send time
 *     the upstream embedded (same clock, same machine). Prints "measure_start" when the window
 *     opens (so the harness samples CPU and RSS then), then one JSON line of results.
 * loadc bulk    HOST PORT CONNS SIZE DURATION_S MAX_REQUESTS
 *     CONNS keep-alive connections fetching /bulk/SIZE back to back; body MB/s.
 * loadc connect HOST PORT CONCURRENCY DURATION_S MAX_CONNS
 *     new connection per request (`Connection: close`, /bulk/0); completed connections per second.
 * Every mode stops by itself: bounded in time and in count.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* 1 us buckets up to 100 ms, then 1 ms buckets up to 100 s. */
#define FINE 100000
#define COARSE 100000
static uint32_t hist[FINE + COARSE + 1];
static uint64_t hist_n, hist_sum_ns, hist_max_ns;

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void record(uint64_t ns) {
    uint64_t us = ns / 1000;
    uint64_t b = us < FINE ? us : FINE + (us - FINE) / 1000;
    if (b > FINE + COARSE) b = FINE + COARSE;
    hist[b]++;
    hist_n++;
    hist_sum_ns += ns;
    if (ns > hist_max_ns) hist_max_ns = ns;
}

/* The bucket's upper edge in ms, so a percentile never reads lower than the truth. */
static double percentile(double p) {
    if (!hist_n) return -1;
    uint64_t rank = (uint64_t)(p * (double)hist_n);
    if (rank >= hist_n) rank = hist_n - 1;
    uint64_t seen = 0;
    for (uint64_t b = 0; b <= FINE + COARSE; b++) {
        seen += hist[b];
        if (seen > rank) return b < FINE ? (double)(b + 1) / 1000.0 : (double)(FINE + (b - FINE + 1) * 1000) / 1000.0;
    }
    return (double)hist_max_ns / 1e6;
}

static void print_latency(void) {
    printf("\"frames\": %llu, \"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, \"p999_ms\": %.3f, "
           "\"mean_ms\": %.4f, \"max_ms\": %.3f",
           (unsigned long long)hist_n, percentile(0.5), percentile(0.9), percentile(0.99),
           percentile(0.999), hist_n ? (double)hist_sum_ns / (double)hist_n / 1e6 : -1.0,
           (double)hist_max_ns / 1e6);
}

typedef struct conn {
    int fd;
    int connected;
    int state;  /* stream: bytes of "data: " matched, 6 = reading digits */
    uint64_t num;
    uint64_t started_ns;
    /* bulk */
    char head[1024];
    size_t headlen;
    uint64_t body_left;
    int in_body;
} conn;

static struct sockaddr_in target;
static int ep;
static int one = 1;

static conn *open_conn(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return NULL;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&target, sizeof target) < 0 && errno != EINPROGRESS) {
        close(fd);
        return NULL;
    }
    conn *c = calloc(1, sizeof *c);
    c->fd = fd;
    c->started_ns = mono_ns();
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return c;
}

static void close_conn(conn *c) {
    close(c->fd);
    free(c);
}

static void drop(conn *c, int *errors, int *live) {
    (*errors)++;
    (*live)--;
    close_conn(c);
}

static int finish_connect(conn *c, const char *request) {
    int err = 0;
    socklen_t l = sizeof err;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) return -1;
    c->connected = 1;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    size_t len = strlen(request);
    return send(c->fd, request, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* Scan relayed bytes for `data: <send ns>`; chunk framing and splits anywhere are fine. */
static void scan_frames(conn *c, const char *p, ssize_t n, uint64_t now, int measuring) {
    static const char pat[] = "data: ";
    for (ssize_t i = 0; i < n; i++) {
        char ch = p[i];
        if (c->state < 6) {
            c->state = ch == pat[c->state] ? c->state + 1 : (ch == 'd' ? 1 : 0);
            if (c->state == 6) c->num = 0;
        } else if (ch >= '0' && ch <= '9') {
            c->num = c->num * 10 + (uint64_t)(ch - '0');
        } else {
            if (measuring) record(now > c->num ? now - c->num : 0);
            c->state = 0;
        }
    }
}

static int mode_stream(int n, double ramp, double warmup, double measure) {
    const char *req = "GET /stream HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n";
    conn **conns = calloc((size_t)n, sizeof *conns);
    int opened = 0, connect_errors = 0, closed = 0;
    uint64_t t0 = mono_ns(), all_open_ns = 0, m_start = 0, m_end = 0;
    uint64_t hard_end = t0 + (uint64_t)((n / ramp + warmup + measure + 30) * 1e9);
    int measuring = 0;
    struct epoll_event evs[512];
    static char buf[65536];
    for (;;) {
        uint64_t now = mono_ns();
        if (now > hard_end) break;
        int due = (int)((double)(now - t0) / 1e9 * ramp) + 1;
        while (opened < n && opened < due) {
            conns[opened] = open_conn();
            if (!conns[opened]) connect_errors++;
            opened++;
        }
        if (opened == n && !all_open_ns) {
            all_open_ns = now;
            m_start = now + (uint64_t)(warmup * 1e9);
            m_end = m_start + (uint64_t)(measure * 1e9);
        }
        if (m_start && !measuring && now >= m_start) {
            measuring = 1;
            printf("measure_start\n");
            fflush(stdout);
        }
        if (measuring && now >= m_end) break;
        int k = epoll_wait(ep, evs, 512, 1);
        now = mono_ns();
        int in_window = measuring && now < m_end;
        for (int i = 0; i < k; i++) {
            conn *c = evs[i].data.ptr;
            if (!c->connected) {
                if (finish_connect(c, req) < 0) {
                    connect_errors++;
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    close(c->fd);
                    c->fd = -1;
                }
                continue;
            }
            ssize_t r = recv(c->fd, buf, sizeof buf, 0);
            if (r > 0) {
                scan_frames(c, buf, r, now, in_window);
            } else if (r == 0 || errno != EAGAIN) {
                closed++;
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                c->fd = -1;
            }
        }
    }
    double window = m_end && m_start ? (double)(m_end - m_start) / 1e9 : 0;
    printf("{\"mode\": \"stream\", \"streams\": %d, \"connect_errors\": %d, \"closed_early\": %d, "
           "\"window_s\": %.3f, \"frames_per_s\": %.1f, ",
           n, connect_errors, closed, window, window > 0 ? (double)hist_n / window : 0.0);
    print_latency();
    printf("}\n");
    fflush(stdout);
    /* Abortive close (RST): thousands of TIME_WAITs per run would exhaust the ephemeral ports. */
    struct linger lg = {1, 0};
    for (int i = 0; i < opened; i++) {
        if (conns[i] && conns[i]->fd >= 0) {
            setsockopt(conns[i]->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            close(conns[i]->fd);
        }
        free(conns[i]);
    }
    free(conns);
    return 0;
}

/* Parse a response head; returns the Content-Length, or -1 while the head is incomplete. */
static long long head_done(conn *c) {
    char *end = memmem(c->head, c->headlen, "\r\n\r\n", 4);
    if (!end) return -1;
    char *cl = memmem(c->head, (size_t)(end - c->head), "Content-Length: ", 16);
    return cl ? strtoll(cl + 16, NULL, 10) : 0;
}

/* Feed bytes of a keep-alive response stream; returns completed responses. */
static int feed_response(conn *c, const char *p, size_t n, uint64_t *body_bytes) {
    int done = 0;
    while (n) {
        if (!c->in_body) {
            size_t take = n < sizeof c->head - c->headlen ? n : sizeof c->head - c->headlen;
            memcpy(c->head + c->headlen, p, take);
            c->headlen += take;
            long long len = head_done(c);
            if (len < 0) {
                if (c->headlen == sizeof c->head) return -1;
                p += take;
                n -= take;
                continue;
            }
            size_t head = (size_t)((char *)memmem(c->head, c->headlen, "\r\n\r\n", 4) - c->head) + 4;
            size_t extra = c->headlen - head; /* bytes past the head that were in this read */
            size_t consumed = take - extra;
            p += consumed;
            n -= consumed;
            c->headlen = 0;
            c->in_body = 1;
            c->body_left = (uint64_t)len;
        }
        size_t take = n < c->body_left ? n : (size_t)c->body_left;
        c->body_left -= take;
        *body_bytes += take;
        p += take;
        n -= take;
        if (!c->body_left) {
            c->in_body = 0;
            done++;
        }
    }
    return done;
}

static int mode_bulk(int conns_n, unsigned long long size, double duration, long long max_req) {
    char req[128];
    snprintf(req, sizeof req, "GET /bulk/%llu HTTP/1.1\r\nHost: bench\r\n\r\n", size);
    static char buf[1 << 18];
    uint64_t t0 = mono_ns(), end = t0 + (uint64_t)(duration * 1e9), bytes = 0;
    long long requests = 0, sent = 0;
    int errors = 0, live = 0;
    for (int i = 0; i < conns_n; i++) {
        if (open_conn()) live++;
        else errors++;
    }
    sent = live;
    struct epoll_event evs[64];
    uint64_t now = t0;
    while (live && (now = mono_ns()) < end && (!max_req || requests < max_req)) {
        int k = epoll_wait(ep, evs, 64, 10);
        for (int i = 0; i < k; i++) {
            conn *c = evs[i].data.ptr;
            if (!c->connected) {
                if (finish_connect(c, req) < 0) drop(c, &errors, &live);
                continue;
            }
            for (int reads = 0; reads < 16; reads++) {
                ssize_t r = recv(c->fd, buf, sizeof buf, 0);
                if (r <= 0) {
                    if (r < 0 && errno == EAGAIN) break;
                    drop(c, &errors, &live);
                    break;
                }
                int done = feed_response(c, buf, (size_t)r, &bytes);
                if (done < 0) {
                    drop(c, &errors, &live);
                    break;
                }
                requests += done;
                if (done && (!max_req || sent < max_req)) {
                    sent++;
                    send(c->fd, req, strlen(req), MSG_NOSIGNAL);
                }
            }
        }
    }
    double secs = (double)(mono_ns() - t0) / 1e9;
    printf("{\"mode\": \"bulk\", \"connections\": %d, \"size\": %llu, \"requests\": %lld, "
           "\"bytes\": %llu, \"seconds\": %.4f, \"mb_per_s\": %.1f, \"errors\": %d}\n",
           conns_n, size, requests, (unsigned long long)bytes, secs, (double)bytes / secs / 1e6,
           errors);
    return 0;
}

static int mode_connect(int concurrency, double duration, long long max_conns) {
    const char *req = "GET /bulk/0 HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n";
    static char buf[4096];
    uint64_t t0 = mono_ns(), end = t0 + (uint64_t)(duration * 1e9);
    long long started = 0, completed = 0;
    int errors = 0, live = 0;
    struct epoll_event evs[256];
    for (;;) {
        uint64_t now = mono_ns();
        while (now < end && live < concurrency && (!max_conns || started < max_conns)) {
            started++;
            if (open_conn()) live++;
            else errors++;
        }
        if (!live || now >= end + 2000000000ull) break;
        int k = epoll_wait(ep, evs, 256, 10);
        now = mono_ns();
        for (int i = 0; i < k; i++) {
            conn *c = evs[i].data.ptr;
            if (!c->connected) {
                if (finish_connect(c, req) < 0) drop(c, &errors, &live);
                continue;
            }
            ssize_t r = recv(c->fd, buf, sizeof buf, 0);
            if (r > 0) {
                c->headlen += (size_t)r;
                continue;
            }
            if (r < 0 && errno == EAGAIN) continue;
            if (r == 0 && c->headlen > 0) {
                completed++;
                record(now - c->started_ns);
            } else {
                errors++;
            }
            live--;
            close_conn(c);
        }
    }
    double secs = (double)(mono_ns() - t0) / 1e9;
    printf("{\"mode\": \"connect\", \"concurrency\": %d, \"completed\": %lld, \"errors\": %d, "
           "\"seconds\": %.4f, \"per_s\": %.1f, ",
           concurrency, completed, errors, secs, (double)completed / secs);
    print_latency();
    printf("}\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: see the comment at the top of loadc.c\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    target.sin_family = AF_INET;
    target.sin_port = htons((uint16_t)atoi(argv[3]));
    inet_pton(AF_INET, argv[2], &target.sin_addr);
    ep = epoll_create1(0);
    if (!strcmp(argv[1], "stream") && argc == 8)
        return mode_stream(atoi(argv[4]), atof(argv[5]), atof(argv[6]), atof(argv[7]));
    if (!strcmp(argv[1], "bulk") && argc == 8)
        return mode_bulk(atoi(argv[4]), strtoull(argv[5], NULL, 10), atof(argv[6]), atoll(argv[7]));
    if (!strcmp(argv[1], "connect") && argc == 7)
        return mode_connect(atoi(argv[4]), atof(argv[5]), atoll(argv[6]));
    fprintf(stderr, "bad arguments\n");
    return 2;
}
