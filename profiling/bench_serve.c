/* make bench-serve: a load generator for `cacheprune serve` (streaming
 * /v1/completions over loopback, one connection per request, C clients).
 *
 *   bench_serve --port P --key K --clients C --requests N --max-tokens T [--words W]
 *       requests/s, output tokens/s (usage.completion_tokens), TTFT and
 *       inter-token latency p50 / p95, all measured at the client: TTFT from
 *       sending the request to its first non-empty text chunk, inter-token
 *       from one text chunk to the next (a chunk carries the text one token
 *       made final; tokens that end inside a UTF-8 character add theirs to
 *       the next chunk).
 *   bench_serve ... --steady [--arrivals WORDS]
 *       C clients each send one request of T tokens; inter-token latency
 *       counts only chunks between the moment all C streams have their first
 *       token and the moment the first one ends — decoding alone, the batch
 *       full.  With --arrivals, one more client sends new prompts of WORDS
 *       words (max_tokens 1) back to back through that window, so its steps
 *       also carry their prefill chunks: the ratio of the two runs' p95 is what
 *       --step-tokens is for.
 * The prompts differ from request to request (no cache hit helps): request
 * i's prompt is the same at every concurrency, so a run at C = 1 and one at
 * C = 16 with the same --requests serve the same work.  Each line says what
 * the phase held (requests, prompt and output tokens summed from the usage
 * chunks) and, with an operator key (the server's /metrics), where the
 * engine thread's time went over the phase: forward steps (their prefill
 * and decode tokens), the rest of the steps (retrieve, sample, store,
 * stream), taking jobs (render, tokenize, detect), and the remainder of the
 * wall time (idle: the engine waited for HTTP, clients, the network). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_clock.h"

typedef struct opts {
    int port, clients, requests, max_tokens, steady, arrivals, words;
    const char *key;
} opts;

/* One request's client-side timeline. */
typedef struct timeline {
    double t_send, t_end;
    double *chunks; /* arrival time of each non-empty text chunk */
    int n_chunks, cap;
    int tokens, prompt_tokens, ok;
} timeline;

typedef struct shared {
    opts o;
    atomic_int next;      /* the next request index */
    timeline *tl;         /* [requests] */
    atomic_int started;   /* steady: streams that have their first token */
    atomic_int ended;     /* steady: streams done */
    double t_all_started, t_first_end; /* steady window (set once) */
    pthread_mutex_t mu;
    atomic_int arrivals_done;
} shared;

static void die(const char *what)
{
    fprintf(stderr, "bench_serve: %s\n", what);
    exit(1);
}

static int connect_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) die("cannot connect to the server");
    return fd;
}

static void push_chunk(timeline *t, double at)
{
    if (t->n_chunks == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->chunks = realloc(t->chunks, (size_t)t->cap * sizeof *t->chunks);
        if (!t->chunks) die("out of memory");
    }
    t->chunks[t->n_chunks++] = at;
}

/* A prompt of `words` words that no other request shares (request i). */
static void prompt_of(int i, int words, char *out, size_t cap)
{
    static const char *w[] = { "harbour", "mill", "ferry", "lantern", "orchard", "bridge", "market", "tower", "meadow", "river" };
    size_t n = (size_t)snprintf(out, cap, "Request %d: tell me about", i);
    for (int k = 0; k < words && n + 16 < cap; k++) n += (size_t)snprintf(out + n, cap - n, " the %s of %d", w[(i + k) % 10], i * 7 + k);
}

/* One streaming request; the timeline of its chunks (t may be NULL: arrivals). */
static void one_request(shared *s, int i, int words, int max_tokens, timeline *t, int steady)
{
    char prompt[8192], body[9000], req[10000];
    prompt_of(i, words, prompt, sizeof prompt);
    int bl = snprintf(body, sizeof body,
                      "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}",
                      prompt, max_tokens);
    int rl = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                      s->o.key, bl, body);
    int fd = connect_port(s->o.port);
    double t0 = now_s();
    if (t) t->t_send = t0;
    if (write(fd, req, (size_t)rl) != rl) die("short write");
    size_t cap = 1 << 16, n = 0, scan = 0;
    char *buf = malloc(cap);
    if (!buf) die("out of memory");
    int first = 0;
    for (;;) {
        if (n + 4096 > cap && !(buf = realloc(buf, cap *= 2))) die("out of memory");
        ssize_t k = read(fd, buf + n, cap - n - 1);
        if (k <= 0) break;
        n += (size_t)k;
        buf[n] = 0;
        double at = now_s();
        /* complete events since the last read: each text chunk's "text":"x..." */
        for (char *e; (e = strstr(buf + scan, "\n\n")); scan = (size_t)(e - buf) + 2) {
            char save = e[0];
            e[0] = 0;
            char *p = strstr(buf + scan, "\"text\":\"");
            int text = p && p[8] != '"';
            char *u = strstr(buf + scan, "\"completion_tokens\":");
            if (u && t) t->tokens = atoi(u + 20);
            char *pt = strstr(buf + scan, "\"prompt_tokens\":");
            if (pt && t) t->prompt_tokens = atoi(pt + 16);
            if (strstr(buf + scan, "[DONE]") && t) t->ok = 1;
            e[0] = save;
            if (!text) continue;
            if (t) push_chunk(t, at);
            if (!first && steady && t) {
                first = 1;
                if (atomic_fetch_add(&s->started, 1) + 1 == s->o.clients) {
                    pthread_mutex_lock(&s->mu);
                    s->t_all_started = at;
                    pthread_mutex_unlock(&s->mu);
                }
            }
        }
    }
    close(fd);
    free(buf);
    if (t) t->t_end = now_s();
    if (steady && t && atomic_fetch_add(&s->ended, 1) == 0) {
        pthread_mutex_lock(&s->mu);
        s->t_first_end = t->t_end;
        pthread_mutex_unlock(&s->mu);
    }
}

/* The engine's figures off /metrics (an operator key): fills v[] in the order of names[]; 0 when absent. */
/* each at a line's start (a # HELP line names them too) */
static const char *metric_names[] = { "\ncacheprune_batch_steps_total ", "\ncacheprune_batch_tokens_total{kind=\"prefill\"} ",
                                      "\ncacheprune_batch_tokens_total{kind=\"decode\"} ",
                                      "\ncacheprune_engine_seconds_total{phase=\"forward\"} ",
                                      "\ncacheprune_engine_seconds_total{phase=\"step_other\"} ",
                                      "\ncacheprune_engine_seconds_total{phase=\"admit\"} ",
                                      "\ncacheprune_batch_prefill_steps_total ", "\ncacheprune_batch_prefill_step_seconds_total " };
#define N_METRICS (sizeof metric_names / sizeof *metric_names)

static int engine_figures(const opts *o, double v[N_METRICS])
{
    char req[512];
    int rl = snprintf(req, sizeof req, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n",
                      o->key);
    int fd = connect_port(o->port);
    if (write(fd, req, (size_t)rl) != rl) die("short write");
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) die("out of memory");
    for (ssize_t k; (k = read(fd, buf + n, cap - n - 1)) > 0;)
        if ((n += (size_t)k) + 4096 > cap && !(buf = realloc(buf, cap *= 2))) die("out of memory");
    close(fd);
    buf[n] = 0;
    int found = strstr(buf, " 200 ") != NULL;
    for (size_t i = 0; i < N_METRICS; i++) {
        char *p = found ? strstr(buf, metric_names[i]) : NULL;
        v[i] = p ? atof(p + strlen(metric_names[i])) : 0;
    }
    free(buf);
    return found;
}

static void *client(void *arg)
{
    shared *s = arg;
    for (int i; (i = atomic_fetch_add(&s->next, 1)) < s->o.requests;) one_request(s, i, s->o.words, s->o.max_tokens, &s->tl[i], s->o.steady);
    return NULL;
}

/* New prompts, back to back, from the moment every stream decodes (so they
 * land in the window, never ahead of a stream's own prefill) to its end. */
static void *arriver(void *arg)
{
    shared *s = arg;
    while (atomic_load(&s->started) < s->o.clients && atomic_load(&s->ended) == 0) usleep(1000);
    for (int i = 1000000; atomic_load(&s->ended) == 0; i++) {
        one_request(s, i, s->o.arrivals, 1, NULL, 0);
        atomic_fetch_add(&s->arrivals_done, 1);
    }
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp);
    int k = (int)(p * (n - 1) + 0.5);
    return v[k];
}

int main(int argc, char **argv)
{
    shared s = { .o = { .clients = 1, .requests = 8, .max_tokens = 32, .words = 4 } };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--steady")) s.o.steady = 1;
        else if (!v) die("an option without its value");
        else if (!strcmp(a, "--port")) s.o.port = atoi(v), i++;
        else if (!strcmp(a, "--key")) s.o.key = v, i++;
        else if (!strcmp(a, "--clients")) s.o.clients = atoi(v), i++;
        else if (!strcmp(a, "--requests")) s.o.requests = atoi(v), i++;
        else if (!strcmp(a, "--max-tokens")) s.o.max_tokens = atoi(v), i++;
        else if (!strcmp(a, "--arrivals")) s.o.arrivals = atoi(v), i++;
        else if (!strcmp(a, "--words")) s.o.words = atoi(v), i++;
        else die("unknown option (see the comment at the top of profiling/bench_serve.c)");
    }
    if (!s.o.port || !s.o.key || s.o.clients < 1 || s.o.clients > 256 || s.o.requests < 1 || s.o.words < 0 || s.o.words > 300)
        die("--port, --key, --clients 1..256, --requests >= 1, --words 0..300");
    if (s.o.steady) s.o.requests = s.o.clients;
    if (!(s.tl = calloc((size_t)s.o.requests, sizeof *s.tl))) die("out of memory");
    pthread_mutex_init(&s.mu, NULL);
    pthread_t th[257];
    double m0[N_METRICS], m1[N_METRICS];
    int have_metrics = engine_figures(&s.o, m0);
    double t0 = now_s();
    for (int c = 0; c < s.o.clients; c++)
        if (pthread_create(&th[c], NULL, client, &s)) die("cannot start a client thread");
    int arr = s.o.steady && s.o.arrivals > 0;
    if (arr && pthread_create(&th[s.o.clients], NULL, arriver, &s)) die("cannot start the arrivals thread");
    for (int c = 0; c < s.o.clients + arr; c++) pthread_join(th[c], NULL);
    double secs = now_s() - t0;
    have_metrics = have_metrics && engine_figures(&s.o, m1);
    long tokens = 0, prompt_tokens = 0;
    int ok = 0, n_itl = 0, n_ttft = 0;
    double *itl = NULL, *ttft = malloc((size_t)s.o.requests * sizeof *ttft);
    size_t cap_itl = 0;
    for (int i = 0; i < s.o.requests; i++) {
        timeline *t = &s.tl[i];
        ok += t->ok, tokens += t->tokens, prompt_tokens += t->prompt_tokens;
        if (t->n_chunks) ttft[n_ttft++] = t->chunks[0] - t->t_send;
        for (int k = 1; k < t->n_chunks; k++) {
            if (s.o.steady && (t->chunks[k - 1] < s.t_all_started || t->chunks[k] > s.t_first_end)) continue;
            if ((size_t)n_itl == cap_itl && !(itl = realloc(itl, (cap_itl = cap_itl * 2 + 256) * sizeof *itl))) die("out of memory");
            itl[n_itl++] = t->chunks[k] - t->chunks[k - 1];
        }
    }
    if (ok < s.o.requests) fprintf(stderr, "bench_serve: %d of %d requests did not end with [DONE]\n", s.o.requests - ok, s.o.requests);
    double t50 = pct(ttft, n_ttft, .5), t95 = pct(ttft, n_ttft, .95), i50 = pct(itl, n_itl, .5), i95 = pct(itl, n_itl, .95);
    if (s.o.steady)
        printf("steady clients=%d arrivals=%d: itl_p50_ms=%.1f itl_p95_ms=%.1f (%d gaps in the window of %.2f s, %d arrivals served)\n",
               s.o.clients, s.o.arrivals, i50 * 1e3, i95 * 1e3, n_itl, s.t_first_end - s.t_all_started, atomic_load(&s.arrivals_done));
    else
        printf("clients=%d requests=%d: req_per_s=%.2f out_tok_per_s=%.1f ttft_p50_ms=%.0f ttft_p95_ms=%.0f itl_p50_ms=%.1f "
               "itl_p95_ms=%.1f (%ld tokens in %.2f s)\n",
               s.o.clients, s.o.requests, ok / secs, tokens / secs, t50 * 1e3, t95 * 1e3, i50 * 1e3, i95 * 1e3, tokens, secs);
    if (!s.o.steady)
        printf("  phase held %d requests: %ld prompt tokens, %ld output tokens (at most %d each)\n", s.o.requests, prompt_tokens, tokens,
               s.o.max_tokens);
    if (have_metrics) {
        double d[N_METRICS];
        for (size_t i = 0; i < N_METRICS; i++) d[i] = m1[i] - m0[i];
        double idle = secs - d[3] - d[4] - d[5];
        printf("  engine over the phase (%.2f s): %.0f steps (%.0f prefill + %.0f decode tokens, %.1f a step); forward %.2f s (%.0f %%: "
               "%.0f steps with prefill %.2f s, %.0f decode-only %.2f s), rest of the steps %.2f s (%.0f %%), taking jobs %.2f s (%.0f %%), "
               "idle / HTTP %.2f s (%.0f %%)\n",
               secs, d[0], d[1], d[2], d[0] > 0 ? (d[1] + d[2]) / d[0] : 0, d[3], 100 * d[3] / secs, d[6], d[7], d[0] - d[6], d[3] - d[7],
               d[4], 100 * d[4] / secs, d[5], 100 * d[5] / secs, idle, 100 * idle / secs);
    }
    free(itl), free(ttft);
    for (int i = 0; i < s.o.requests; i++) free(s.tl[i].chunks);
    free(s.tl);
    return ok == s.o.requests ? 0 : 1;
}
