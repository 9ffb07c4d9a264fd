/* Benchmark upstream: one thread, one epoll loop, so it stays out of the proxy's way.
 *
 * GET /stream            HTTP/1.1 200 text/event-stream, chunked; one 200-byte `data:` frame
 *                        every INTERVAL_MS (argv[2], default 50 = 20 tok/s) in a random phase,
 *                        the CLOCK_MONOTONIC send time (ns) embedded, until the client leaves.
 * GET /bulk/SIZE         SIZE bytes with Content-Length (keep-alive unless `Connection: close`).
 *
 * Usage: upstream PORT [INTERVAL_MS]; prints "ready PORT" once listening.
 * Method from shared/reference/performance-anchors.md: the embedded send time lets the client
 * compute latency = arrival - send on the same system-wide monotonic clock.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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

#define FRAME 200
#define MAX_OUT (4 << 20)

typedef struct conn {
    int fd;
    char in[8192];
    size_t inlen;
    char *out;
    size_t outlen, outoff, outcap;
    int streaming;
    uint64_t next_ns, seq;
    int heap_idx;
    uint64_t bulk_left;
    int close_after;
    int want_out;
} conn;

static uint64_t interval_ns = 50000000ull;
static conn **heap;
static int heap_n, heap_cap;
static int ep;
static char zeros[65536];

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void heap_swap(int a, int b) {
    conn *t = heap[a];
    heap[a] = heap[b];
    heap[b] = t;
    heap[a]->heap_idx = a;
    heap[b]->heap_idx = b;
}
static void heap_up(int i) {
    while (i > 0) {
        int p = (i - 1) / 2;
        if (heap[p]->next_ns <= heap[i]->next_ns) break;
        heap_swap(i, p);
        i = p;
    }
}
static void heap_down(int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_n && heap[l]->next_ns < heap[m]->next_ns) m = l;
        if (r < heap_n && heap[r]->next_ns < heap[m]->next_ns) m = r;
        if (m == i) break;
        heap_swap(i, m);
        i = m;
    }
}
static void heap_push(conn *c) {
    if (heap_n == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 1024;
        heap = realloc(heap, sizeof(conn *) * heap_cap);
    }
    heap[heap_n] = c;
    c->heap_idx = heap_n++;
    heap_up(c->heap_idx);
}
static void heap_remove(conn *c) {
    int i = c->heap_idx;
    if (i < 0) return;
    heap_n--;
    if (i != heap_n) {
        heap[i] = heap[heap_n];
        heap[i]->heap_idx = i;
        heap_down(i);
        heap_up(heap[i]->heap_idx);
    }
    c->heap_idx = -1;
}

static void set_events(conn *c, int want_out) {
    if (c->want_out == want_out) return;
    c->want_out = want_out;
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void close_conn(conn *c) {
    heap_remove(c);
    close(c->fd);
    free(c->out);
    free(c);
}

/* Queue bytes behind what is already waiting, then try to write. Returns -1 when closed. */
static int flush_out(conn *c);
static int queue_out(conn *c, const char *data, size_t len) {
    if (c->outlen - c->outoff + len > MAX_OUT) return -1;
    if (c->outoff == c->outlen) c->outoff = c->outlen = 0;
    if (c->outlen + len > c->outcap) {
        if (c->outoff) {
            memmove(c->out, c->out + c->outoff, c->outlen - c->outoff);
            c->outlen -= c->outoff;
            c->outoff = 0;
        }
        while (c->outlen + len > c->outcap) c->outcap = c->outcap ? c->outcap * 2 : 4096;
        c->out = realloc(c->out, c->outcap);
    }
    memcpy(c->out + c->outlen, data, len);
    c->outlen += len;
    return flush_out(c);
}

static int handle_requests(conn *c);

static int flush_out(conn *c) {
    while (c->outoff < c->outlen) {
        ssize_t n = send(c->fd, c->out + c->outoff, c->outlen - c->outoff, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN) {
                set_events(c, 1);
                return 0;
            }
            return -1;
        }
        c->outoff += (size_t)n;
    }
    while (c->bulk_left) {
        size_t want = c->bulk_left < sizeof zeros ? c->bulk_left : sizeof zeros;
        ssize_t n = send(c->fd, zeros, want, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN) {
                set_events(c, 1);
                return 0;
            }
            return -1;
        }
        c->bulk_left -= (uint64_t)n;
    }
    set_events(c, 0);
    if (!c->streaming) {
        if (c->close_after) return -1;
        return handle_requests(c);
    }
    return 0;
}

static int send_frame(conn *c) {
    char buf[FRAME + 16];
    int head = snprintf(buf, sizeof buf, "%x\r\n", FRAME);
    char *f = buf + head;
    int n = snprintf(f, FRAME + 1, "data: %019llu %010llu ", (unsigned long long)mono_ns(),
                     (unsigned long long)c->seq++);
    memset(f + n, 'x', FRAME - n - 2);
    f[FRAME - 2] = '\n';
    f[FRAME - 1] = '\n';
    memcpy(f + FRAME, "\r\n", 2);
    return queue_out(c, buf, (size_t)head + FRAME + 2);
}

/* Parse and answer every complete request head in the input buffer. */
static int handle_requests(conn *c) {
    while (!c->streaming && c->outoff == c->outlen && !c->bulk_left) {
        char *end = memmem(c->in, c->inlen, "\r\n\r\n", 4);
        if (!end) return 0;
        size_t used = (size_t)(end - c->in) + 4;
        c->close_after = memmem(c->in, used, "Connection: close", 17) != NULL;
        char head[256];
        int hl;
        if (memcmp(c->in, "GET /stream", 11) == 0) {
            c->streaming = 1;
            hl = snprintf(head, sizeof head,
                          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
            c->next_ns = mono_ns() + (uint64_t)(drand48() * (double)interval_ns);
            heap_push(c);
        } else if (memcmp(c->in, "GET /bulk/", 10) == 0) {
            c->bulk_left = strtoull(c->in + 10, NULL, 10);
            hl = snprintf(head, sizeof head,
                          "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                          "Content-Length: %llu\r\n%s\r\n",
                          (unsigned long long)c->bulk_left,
                          c->close_after ? "Connection: close\r\n" : "");
        } else {
            c->close_after = 1;
            hl = snprintf(head, sizeof head,
                          "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
        memmove(c->in, c->in + used, c->inlen - used);
        c->inlen -= used;
        if (queue_out(c, head, (size_t)hl) < 0) return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: upstream PORT [INTERVAL_MS]\n");
        return 2;
    }
    if (argc > 2) interval_ns = (uint64_t)(atof(argv[2]) * 1e6);
    signal(SIGPIPE, SIG_IGN);
    srand48((long)mono_ns());
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(ls, 4096) < 0) {
        perror("listen");
        return 1;
    }
    socklen_t al = sizeof addr;
    getsockname(ls, (struct sockaddr *)&addr, &al);
    printf("ready %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event evs[512];
    char buf[65536];
    for (;;) {
        uint64_t now = mono_ns();
        while (heap_n && heap[0]->next_ns <= now) {
            conn *c = heap[0];
            c->next_ns += interval_ns;
            /* Never burst to catch up more than one frame behind: a late upstream stays late. */
            if (c->next_ns + interval_ns < now) c->next_ns = now;
            heap_down(0);
            if (send_frame(c) < 0) close_conn(c);
        }
        int timeout = -1;
        if (heap_n) {
            now = mono_ns();
            timeout = heap[0]->next_ns > now ? (int)((heap[0]->next_ns - now + 999999) / 1000000) : 0;
        }
        int n = epoll_wait(ep, evs, 512, timeout);
        for (int i = 0; i < n; i++) {
            conn *c = evs[i].data.ptr;
            if (!c) {
                for (;;) {
                    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) break;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    nc->heap_idx = -1;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            int dead = 0;
            if (evs[i].events & EPOLLOUT) dead = flush_out(c) < 0;
            if (!dead && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                ssize_t r = recv(c->fd, buf, sizeof buf, 0);
                if (r == 0 || (r < 0 && errno != EAGAIN)) {
                    dead = 1;
                } else if (r > 0 && !c->streaming) {
                    size_t room = sizeof c->in - c->inlen;
                    size_t take = (size_t)r < room ? (size_t)r : room;
                    memcpy(c->in + c->inlen, buf, take);
                    c->inlen += take;
                    dead = handle_requests(c) < 0;
                }
            }
            if (dead) close_conn(c);
        }
    }
}
