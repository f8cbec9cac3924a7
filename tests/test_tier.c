/* The shared segment tier (pool/tier.h): its URL and password parsing, the
 * value's checks, and two replicas (two engines in one test process, each
 * with its own pool and tier client, and two `run` processes) on one Redis
 * the tests start on a free loopback port and stop.  Without redis-server
 * the Redis tests skip, saying so. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../engine/request.h"
#include "../kernels/sha256.h"
#include "../pool/tier.h"
#include "helpers.h"

/* ---- parsing ------------------------------------------------------------------------- */

/* the key the test's replicas share, and one no replica has */
#define TIER_TEST_KEY "tier-test-key-0123456789abcdef-0123456789"
#define TIER_OTHER_KEY "another-key-0123456789abcdef-0123456789ab"

Test(tier, url_parse_is_strict)
{
    cp_tier_url u;
    cp_error err = { 0 };
    cr_assert_eq(cp_tier_url_parse("redis://127.0.0.1:6379", &u, &err), CP_OK, "%s", err.msg);
    cr_assert_str_eq(u.host, "127.0.0.1");
    cr_assert_eq(u.port, 6379);
    cr_assert_eq(u.db, 0);
    cr_assert_eq(cp_tier_url_parse("redis://cache-1.internal:7000/3", &u, &err), CP_OK, "%s", err.msg);
    cr_assert_str_eq(u.host, "cache-1.internal");
    cr_assert_eq(u.port, 7000);
    cr_assert_eq(u.db, 3);
    const char *bad[] = { "redis://localhost",        "redis://:6379",          "redis://h:0",          "redis://h:65536",
                          "redis://h:06379",          "redis://h:+6379",        "redis://h:6379/",      "redis://h:6379/x",
                          "redis://h:6379/1?a=b",     "redis://user:pw@h:6379", "rediss://h:6379",      "http://h:6379",
                          "REDIS://h:6379",           "redis://h :6379",        "redis://[::1]:6379",   "redis://h:6379/1/2",
                          "redis://-h:6379",          "redis://h:6379 ",        "redis://h:99999999999", "" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_neq(cp_tier_url_parse(bad[i], &u, &err), CP_OK, "'%s' was accepted", bad[i]);
}

Test(tier, password_file_is_read_exactly)
{
    char dir[512], path[600], pw[CP_TIER_PASSWORD_MAX + 1];
    size_t n;
    cp_error err = { 0 };
    test_tmpdir(dir, sizeof dir, "tier_pw");
    snprintf(path, sizeof path, "%s/pw", dir);
    cr_assert(write_bytes(path, "s3cret\r\n", 8));
    cr_assert_eq(cp_tier_password_read(path, pw, &n, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(n, 6);
    cr_assert_eq(memcmp(pw, "s3cret", 6), 0);
    cr_assert(write_bytes(path, " spaced pw ", 11)); /* spaces are the password's own */
    cr_assert_eq(cp_tier_password_read(path, pw, &n, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(n, 11);
    const struct { const char *bytes; size_t n; } bad[] = { { "\n", 1 }, { "", 0 }, { "a\nb", 3 }, { "a\0b", 3 }, { "a\rb\n", 4 } };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert(write_bytes(path, bad[i].bytes, bad[i].n));
        cr_assert_neq(cp_tier_password_read(path, pw, &n, &err), CP_OK, "bad password file %zu accepted", i);
    }
    char big[CP_TIER_PASSWORD_MAX + 2];
    memset(big, 'x', sizeof big);
    cr_assert(write_bytes(path, big, CP_TIER_PASSWORD_MAX));
    cr_assert_eq(cp_tier_password_read(path, pw, &n, &err), CP_OK, "%s", err.msg);
    cr_assert(write_bytes(path, big, CP_TIER_PASSWORD_MAX + 1));
    cr_assert_neq(cp_tier_password_read(path, pw, &n, &err), CP_OK);
    /* the value key: the same rules, and at least 32 bytes (a short key is refused, not stretched) */
    cr_assert(write_bytes(path, big, CP_TIER_VALUE_KEY_MIN - 1));
    cr_assert_eq(cp_tier_key_read(path, pw, &n, &err), CP_EINVAL);
    cr_assert(strstr(err.msg, "--tier-key-file"), "%s", err.msg);
    cr_assert(write_bytes(path, TIER_TEST_KEY "\n", strlen(TIER_TEST_KEY) + 1));
    cr_assert_eq(cp_tier_key_read(path, pw, &n, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(n, strlen(TIER_TEST_KEY));
    cr_assert_eq(memcmp(pw, TIER_TEST_KEY, n), 0);
}

/* ---- the value ----------------------------------------------------------------------- */


static cp_tier_check check_for(const char *name, const char *key, uint32_t vocab, uint32_t max_pos)
{
    return (cp_tier_check){ .key = (const uint8_t *)key, .key_len = strlen(key), .name = name, .name_len = strlen(name),
                            .max_len = 1 << 20, .vocab = vocab, .max_pos = max_pos, .kv_bound = CP_TIER_KV_BOUND };
}

static cp_kv_layout small_layout(uint8_t fp)
{
    cp_kv_layout l = { .n_layers = 2, .n_kv_heads = 1, .head_dim = 4, .dtype = CP_F32, .block_tokens = 16 };
    memset(l.fingerprint, fp, sizeof l.fingerprint);
    return l;
}

/* a 20-token segment's value (malloc'd, *n bytes) */
static uint8_t *small_value(const cp_kv_layout *l, size_t *n, int32_t *tokens, float *kv)
{
    uint8_t rec[3] = { 0x05, 0, 0x08 }; /* tokens 0, 2 and 19 */
    for (int i = 0; i < 20; i++) tokens[i] = 1000 + 7 * i;
    for (int i = 0; i < 2 * 2 * 20 * 4; i++) kv[i] = (float)i * 0.25f - 3;
    cp_tier_seg s = { .shared = 0, .len = 20, .start_pos = 5, .tokens = tokens, .recompute = rec, .kv = (const uint8_t *)kv };
    memset(s.owner, 0xab, sizeof s.owner);
    cp_tier_segment_sha(l, tokens, 20, s.sha);
    *n = cp_tier_value_bytes(l, 20);
    uint8_t *buf = malloc(*n);
    cr_assert(buf);
    cp_tier_check k = check_for("v", TIER_TEST_KEY, 2000, 64);
    cr_assert_eq(cp_tier_value_encode(l, &k, &s, buf, NULL), CP_OK);
    return buf;
}

Test(tier, value_round_trip_and_every_check)
{
    cp_kv_layout l = small_layout(7);
    int32_t tokens[20];
    float kv[2 * 2 * 20 * 4];
    size_t n;
    uint8_t *buf = small_value(&l, &n, tokens, kv);
    cp_tier_check k = check_for("v", TIER_TEST_KEY, 2000, 64), k19 = k;
    k19.max_len = 19;
    /* the size from first principles: header 152, 20 ids, 3 flag bytes, 2 layers x K,V x 20 x 4 floats */
    cr_assert_eq(n, 152 + 80 + 3 + 2 * 2 * 20 * 4 * 4);
    cp_tier_seg s;
    cp_error err = { 0 };
    cr_assert_eq(cp_tier_value_decode(&l, &k, buf, n, &s, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(s.len, 20);
    cr_assert_eq(s.start_pos, 5);
    cr_assert_eq(s.shared, 0);
    cr_assert_eq(s.owner[0], 0xab);
    cr_assert_eq(memcmp(s.tokens, tokens, sizeof tokens), 0);
    cr_assert_eq(s.recompute[0], 0x05);
    cr_assert_eq(s.recompute[2], 0x08);
    cr_assert_eq(memcmp(s.kv, kv, sizeof kv), 0);
    /* length: one byte short or long, the header alone, a length field past max_len */
    cr_assert_eq(cp_tier_value_decode(&l, &k, buf, n - 1, &s, &err), CP_EFORMAT);
    /* one byte longer: the length check comes before the MAC is even computed */
    uint8_t *longer = calloc(n + 1, 1);
    memcpy(longer, buf, n);
    cr_assert_eq(cp_tier_value_decode(&l, &k, longer, n + 1, &s, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "implies"), "%s", err.msg);
    free(longer);
    cr_assert_eq(cp_tier_value_decode(&l, &k, buf, 100, &s, &err), CP_EFORMAT);
    cr_assert_eq(cp_tier_value_decode(&l, &k19, buf, n, &s, &err), CP_EFORMAT);
    /* one flipped bit anywhere (header, epoch, ids, flags, K/V): refused */
    size_t at[] = { 0, 4, 8, 12, 28, 32, 36, 40, 56, 88, 120, 152, 152 + 79, 152 + 81, n - 1 };
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        buf[at[i]] ^= 0x10;
        cr_assert_neq(cp_tier_value_decode(&l, &k, buf, n, &s, &err), CP_OK, "a flipped bit at byte %zu was accepted", at[i]);
        buf[at[i]] ^= 0x10;
    }
    /* the same bytes under another key, or read from another key name: not authentic */
    cp_tier_check other_key = check_for("v", TIER_OTHER_KEY, 2000, 64), other_name = check_for("w", TIER_TEST_KEY, 2000, 64);
    cr_assert_eq(cp_tier_value_decode(&l, &other_key, buf, n, &s, &err), CP_EPERM, "%s", err.msg);
    cr_assert_eq(cp_tier_value_decode(&l, &other_name, buf, n, &s, &err), CP_EPERM, "%s", err.msg);
    /* another model, another layout: refused even with a valid checksum */
    cp_kv_layout other = small_layout(8), wide = l;
    wide.head_dim = 8;
    cr_assert_eq(cp_tier_value_decode(&other, &k, buf, n, &s, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "fingerprint"), "%s", err.msg);
    cr_assert_eq(cp_tier_value_decode(&wide, &k, buf, n, &s, &err), CP_EFORMAT);
    free(buf);
    /* token ids that are not the segment its SHA names (checksum recomputed: a writer's bug, not a flipped bit) */
    int32_t t2[20];
    float kv2[2 * 2 * 20 * 4];
    buf = small_value(&l, &n, t2, kv2);
    cp_tier_seg good;
    cr_assert_eq(cp_tier_value_decode(&l, &k, buf, n, &good, &err), CP_OK);
    uint8_t sha[32];
    memcpy(sha, good.sha, 32);
    t2[3] = 42;
    cp_tier_seg bad = { .len = 20, .start_pos = 5, .tokens = t2, .recompute = good.recompute, .kv = (const uint8_t *)kv2 };
    memcpy(bad.sha, sha, 32);
    uint8_t *buf2 = malloc(n);
    cr_assert_eq(cp_tier_value_encode(&l, &k, &bad, buf2, NULL), CP_OK);
    cr_assert_eq(cp_tier_value_decode(&l, &k, buf2, n, &s, &err), CP_EFORMAT);
    cr_assert(strstr(err.msg, "SHA"), "%s", err.msg);
    free(buf), free(buf2);
}

/* ---- a Redis of the test's own ------------------------------------------------------- */

typedef struct redis_proc {
    int port;
    pid_t pid;
    char dir[512];
    const char *requirepass; /* NULL: no AUTH */
} redis_proc;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *redis_connect(int port)
{
    struct timeval tv = { 1, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) redisFree(c), c = NULL;
    return c;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* started as this test's child, killed with it if the test dies */
static void redis_start(redis_proc *r, const char *name)
{
    if (test_sh("command -v redis-server > /dev/null 2>&1") != 0)
        cr_skip_test("redis-server is not installed (.ci/deps installs it): the tier's Redis tests are skipped");
    if (!r->dir[0]) test_tmpdir(r->dir, sizeof r->dir, name);
    if (!r->port) r->port = free_port();
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (chdir(r->dir) != 0) _exit(127);
        if (r->requirepass)
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--maxmemory-policy", "volatile-lru", "--logfile", "redis.log", "--requirepass", r->requirepass, (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--maxmemory-policy", "volatile-lru", "--logfile", "redis.log", (char *)NULL);
        _exit(127);
    }
    r->pid = pid;
    for (int i = 0; i < 300; i++) {
        redisContext *c = redis_connect(r->port);
        if (c) {
            redisFree(c);
            return;
        }
        sleep_ms(10);
    }
    cr_assert_fail("redis-server did not come up on port %d", r->port);
}

static void redis_stop(redis_proc *r)
{
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = 0;
}

/* every key matching pattern: how many */
static size_t redis_count(int port, const char *pattern)
{
    redisContext *c = redis_connect(port);
    cr_assert(c);
    size_t n = 0;
    char cursor[32] = "0";
    do {
        redisReply *r = redisCommand(c, "SCAN %s MATCH %s COUNT 1000", cursor, pattern);
        cr_assert(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
        snprintf(cursor, sizeof cursor, "%s", r->element[0]->str);
        n += r->element[1]->elements;
        freeReplyObject(r);
    } while (strcmp(cursor, "0") != 0);
    redisFree(c);
    return n;
}

/* a tier on port with password pw (NULL: none): whether a purge (a SCAN) reaches Redis */
static long purge_with(int port, const char *pw)
{
    cp_kv_layout l = small_layout(3);
    cp_tier_opts o;
    cp_tier_opts_default(&o);
    snprintf(o.url.host, sizeof o.url.host, "127.0.0.1");
    o.url.port = port;
    o.password = pw, o.password_len = pw ? strlen(pw) : 0;
    o.key = TIER_TEST_KEY, o.key_len = strlen(TIER_TEST_KEY), o.vocab = 2000, o.max_pos = 64;
    cp_backend *be = NULL;
    cp_tier *t;
    cp_error err = { 0 };
    cr_assert_eq(cp_tier_create(&o, &l, be, &t, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_tier_bind_tenant(t, 0, "alice", 5, &err), CP_OK);
    long r = cp_tier_purge(t, 0, 3.0);
    cp_tier_free(t);
    return r;
}

Test(tier, auth_with_the_password_and_only_with_it, .timeout = TEST_TIMEOUT(30))
{
    redis_proc rp = { .requirepass = "tier-test-pass-1" };
    redis_start(&rp, "tier_auth");
    cr_assert_eq(purge_with(rp.port, "tier-test-pass-1"), 0, "the right password did not reach Redis");
    cr_assert_eq(purge_with(rp.port, "wrong"), -1, "a wrong password reached Redis");
    cr_assert_eq(purge_with(rp.port, NULL), -1, "no password reached a Redis that wants one");
    redis_stop(&rp);
}

/* ---- two replicas in one process ----------------------------------------------------- */

typedef struct replica {
    cp_pool *pool;
    cp_engine *e;
    cp_tier *tier;
} replica;

typedef struct world {
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    cp_detect_chain chain;
    replica r[2];
    redis_proc redis;
    uint32_t quota_segments; /* the tier's cross-replica quota per tenant (0: none) */
} world;

static void replica_open(world *w, replica *r)
{
    cp_error err = { 0 };
    cp_kv_layout l;
    cp_engine_kv_layout(w->m, &l);
    cp_pool_opts po;
    cp_pool_opts_default(&po);
    po.budget_bytes = (size_t)128 << 20;
    cr_assert_eq(cp_pool_create(&l, w->be, &po, &r->pool, &err), CP_OK, "%s", err.msg);
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    cr_assert_eq(cp_engine_create(w->m, w->tok, r->pool, &w->chain, &o, &r->e, &err), CP_OK, "%s", err.msg);
    cp_tier_opts to;
    cp_tier_opts_default(&to);
    snprintf(to.url.host, sizeof to.url.host, "127.0.0.1");
    to.url.port = w->redis.port;
    to.cooldown_s = 0.2;
    to.quota_segments = w->quota_segments;
    to.key = TIER_TEST_KEY, to.key_len = strlen(TIER_TEST_KEY);
    to.vocab = (uint32_t)w->m->cfg.vocab, to.max_pos = (uint32_t)w->m->cfg.max_pos;
    /* windows are wall-clock aligned (floor(now / window)), so a 60 s window
     * started a new one mid-test about once in ten runs on a loaded machine,
     * and alice's second replica stored into it: one window for the whole test */
    to.quota_window_s = 1e9;
    cr_assert_eq(cp_tier_create(&to, &l, w->be, &r->tier, &err), CP_OK, "%s", err.msg);
    cp_engine_set_tier(r->e, r->tier);
}

/* tenant numbers differ between the replicas on purpose: the tier keys by the id bytes */
static void bind_name(replica *r, uint32_t id, const char *name)
{
    cp_error err = { 0 };
    cr_assert_eq(cp_tier_bind_tenant(r->tier, id, name, strlen(name), &err), CP_OK, "%s", err.msg);
}

static void make_world_q(world *w, const char *name, uint32_t quota_segments)
{
    memset(w, 0, sizeof *w);
    w->quota_segments = quota_segments;
    redis_start(&w->redis, name);
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    w->m = load_model_or_die(dir, &w->be);
    w->tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_detector *d;
    cp_error err = { 0 };
    cp_chain_init(&w->chain);
    cr_assert_eq(cp_detector_builtin(&d, &err), CP_OK);
    cr_assert_eq(cp_chain_add(&w->chain, d, &err), CP_OK);
    for (int i = 0; i < 2; i++) replica_open(w, &w->r[i]);
    bind_name(&w->r[0], 0, "alice"), bind_name(&w->r[0], 1, "bob");
    bind_name(&w->r[1], 0, "bob"), bind_name(&w->r[1], 1, "alice");
}

static void make_world(world *w, const char *name) { make_world_q(w, name, 0); }

static void drop_world(world *w)
{
    for (int i = 0; i < 2; i++) {
        cp_engine_free(w->r[i].e);
        cp_tier_free(w->r[i].tier);
        cp_pool_free(w->r[i].pool);
    }
    cp_chain_free(&w->chain);
    cp_tokenizer_free(w->tok);
    cp_model_free(w->m);
    cp_backend_destroy(w->be);
    redis_stop(&w->redis);
}

/* a document and a question; the question wholly sensitive when secret */
static cp_response ask_full(world *w, int rep, uint32_t tenant, const char *doc, const char *q, int secret, int no_store, float *logits)
{
    cp_request_msg msgs[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 }, { CP_ROLE_USER, q, strlen(q), secret, NULL, 0 } };
    cp_request r = { .tenant = tenant, .msgs = msgs, .n_msgs = 2, .max_tokens = 4, .sampling = { .top_p = 1 }, .no_store = no_store };
    cp_response resp;
    cp_error err = { 0 };
    cr_assert_eq(cp_engine_run(w->r[rep].e, &r, &resp, &err), CP_OK, "%s", err.msg);
    if (logits) memcpy(logits, cp_engine_last_logits(w->r[rep].e), (size_t)w->m->cfg.vocab * sizeof *logits);
    return resp;
}

static cp_response ask(world *w, int rep, uint32_t tenant, const char *doc, const char *q, int secret, float *logits)
{
    return ask_full(w, rep, tenant, doc, q, secret, 0, logits);
}

static char *doc_of(int which) { return test_passage(which, 700, 3, 1201); }

/* what the world's replicas check a value under key name `name` against */
static cp_tier_check world_check(const world *w, const char *name)
{
    return check_for(name, TIER_TEST_KEY, (uint32_t)w->m->cfg.vocab, (uint32_t)w->m->cfg.max_pos);
}

static cp_tier_stats stats_of(replica *r)
{
    cp_tier_stats s;
    cp_tier_stats_get(r->tier, &s);
    return s;
}

Test(tier, a_second_replica_hits_what_the_first_stored_and_gets_a_local_hits_logits, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world(&w, "tier_share");
    char *doc = doc_of(0);
    int V = w.m->cfg.vocab;
    float *local = malloc((size_t)V * sizeof *local), *remote = malloc((size_t)V * sizeof *remote);
    cp_response a = ask(&w, 0, 0, doc, "Who is speaking here?", 0, NULL);
    cr_assert_eq(a.segments_hit, 0);
    cr_assert_gt(a.segments_stored, 0);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    cr_assert_gt(stats_of(&w.r[0]).writes, 0);
    /* a local hit on replica 0 and a tier hit on replica 1, same tenant (alice: 0 there, 1 here) */
    cp_response l = ask(&w, 0, 0, doc, "Who is speaking here?", 0, local);
    cp_response r = ask(&w, 1, 1, doc, "Who is speaking here?", 0, remote);
    cr_assert_gt(l.private_hit_tokens, 0);
    cr_assert_eq(r.private_hit_tokens, l.private_hit_tokens, "tier %d vs local %d private hit tokens", r.private_hit_tokens,
                 l.private_hit_tokens);
    cr_assert_eq(r.reused, l.reused);
    cr_assert_eq(max_abs_diff(local, remote, (size_t)V), 0.0f, "the tier hit's logits differ from the local hit's");
    cr_assert_eq(r.n_ids, l.n_ids);
    cr_assert_eq(memcmp(r.ids, l.ids, r.n_ids * sizeof *r.ids), 0);
    cr_assert_gt(stats_of(&w.r[1]).hits, 0);
    /* bob through replica 1: the shared document, never alice's private segment */
    cp_response b = ask(&w, 1, 0, doc, "Who is speaking here?", 0, NULL);
    cr_assert_eq(b.private_hit_tokens, 0, "bob was given %d tokens of alice's private segments", b.private_hit_tokens);
    cr_assert_gt(b.shared_hit_tokens, 0);
    cp_response_free(&a), cp_response_free(&l), cp_response_free(&r), cp_response_free(&b);
    free(local), free(remote), free(doc);
    drop_world(&w);
}

/* every value in Redis, decoded and checked against the prompt it came from */
static size_t scan_values(world *w, const cp_response *resp, const uint8_t *alice_key, size_t *priv)
{
    cp_kv_layout l;
    cp_engine_kv_layout(w->m, &l);
    redisContext *c = redis_connect(w->redis.port);
    cr_assert(c);
    redisReply *keys = redisCommand(c, "KEYS *:v:*");
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY);
    *priv = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *v = redisCommand(c, "GET %s", keys->element[i]->str);
        cr_assert(v && v->type == REDIS_REPLY_STRING);
        cp_tier_seg s;
        cp_error err = { 0 };
        cp_tier_check k = world_check(w, keys->element[i]->str);
        cr_assert_eq(cp_tier_value_decode(&l, &k, (const uint8_t *)v->str, v->len, &s, &err), CP_OK, "%s", err.msg);
        if (!s.shared) {
            (*priv)++;
            cr_assert_eq(memcmp(s.owner, alice_key, CP_TIER_KEY_BYTES), 0);
        }
        /* in-context segments: request tokens [start_pos, start_pos + len) */
        cr_assert_leq((size_t)s.start_pos + s.len, (size_t)resp->prompt_tokens);
        for (uint32_t t = 0; t < s.len; t++) {
            cr_assert_eq(s.tokens[t], resp->prompt_ids[s.start_pos + t]);
            cr_assert_eq(resp->sensitive[s.start_pos + t], 0, "Redis holds the K/V of sensitive prompt token %u", s.start_pos + t);
        }
        freeReplyObject(v);
    }
    size_t n = keys->elements;
    freeReplyObject(keys);
    redisFree(c);
    return n;
}

Test(tier, no_sensitive_row_reaches_redis_and_purge_removes_the_tenants_keys, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world(&w, "tier_canary");
    char *doc = doc_of(1);
    cp_response a = ask(&w, 0, 0, doc, "My card is 4111 1111 1111 1111, the canary; call me.", 1, NULL);
    cr_assert_gt(a.sensitive_tokens, 0);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    uint8_t ak[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key("alice", 5, ak);
    size_t priv, n = scan_values(&w, &a, ak, &priv);
    cr_assert_gt(n, 0, "nothing was written through");
    cr_assert_eq(priv, 0, "a private segment holding the sensitive question reached Redis");
    cr_assert_geq(stats_of(&w.r[0]).kept_local, 1);
    /* a private segment without a sensitive token does reach it (the canary scan is not vacuous there) */
    cp_response a2 = ask(&w, 0, 0, doc, "What does the passage describe?", 0, NULL);
    cp_response b = ask(&w, 0, 1, doc, "Tell me more about it.", 0, NULL);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    char hexk[2 * CP_TIER_KEY_BYTES + 1], pat[128];
    for (int i = 0; i < CP_TIER_KEY_BYTES; i++) snprintf(hexk + 2 * i, 3, "%02x", ak[i]);
    snprintf(pat, sizeof pat, "cacheprune:p:%s:*", hexk);
    cr_assert_gt(redis_count(w.redis.port, pat), 0);
    size_t shared_before = redis_count(w.redis.port, "cacheprune:s:*"), all_before = redis_count(w.redis.port, "*");
    /* purge alice through replica 1 (where she is tenant 1): her keys go, bob's and the shared ones stay */
    size_t segs, adm;
    cp_engine_purge_tenant(w.r[1].e, 1, &segs, &adm, NULL);
    cr_assert_eq(redis_count(w.redis.port, pat), 0, "alice's keys survived her purge");
    cr_assert_eq(redis_count(w.redis.port, "cacheprune:s:*"), shared_before);
    cr_assert_gt(redis_count(w.redis.port, "cacheprune:p:*"), 0, "bob's private keys went too");
    cr_assert_lt(redis_count(w.redis.port, "*"), all_before);
    cp_response_free(&a), cp_response_free(&a2), cp_response_free(&b);
    free(doc);
    drop_world(&w);
}

Test(tier, redis_killed_mid_run_every_request_answered_then_used_again, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world(&w, "tier_fault");
    char *d1 = doc_of(0), *d2 = doc_of(1);
    cp_response a = ask(&w, 0, 0, d1, "Who is speaking here?", 0, NULL);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    redis_stop(&w.redis);
    /* down: replica 1 answers from scratch, replica 0 keeps storing locally */
    cp_response b = ask(&w, 1, 1, d1, "Who is speaking here?", 0, NULL);
    cr_assert_eq(b.segments_hit, 0);
    cr_assert_eq(b.computed, b.prompt_tokens);
    cp_response c = ask(&w, 0, 0, d2, "And then?", 0, NULL);
    cr_assert_gt(c.segments_stored, 0);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    cr_assert_geq(stats_of(&w.r[1]).breaker_opens, 1);
    /* back (empty: no persistence), past the breaker's cooldown: written and hit again */
    redis_start(&w.redis, "tier_fault");
    sleep_ms(300);
    char *d3 = doc_of(2);
    cp_response g = ask(&w, 0, 0, d3, "Another?", 0, NULL);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    cr_assert_gt(redis_count(w.redis.port, "*:v:*"), 0, "nothing was written after Redis came back");
    cp_response h = ask(&w, 1, 1, d3, "Another?", 0, NULL);
    cr_assert_gt(h.segments_hit, 0, "the tier was not used again after Redis came back");
    cr_assert_geq(stats_of(&w.r[1]).reconnects, 1);
    cp_response_free(&a), cp_response_free(&b), cp_response_free(&c), cp_response_free(&g), cp_response_free(&h);
    free(d1), free(d2), free(d3);
    drop_world(&w);
}

Test(tier, a_corrupted_value_is_rejected_and_the_request_recomputes, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world(&w, "tier_corrupt");
    char *doc = doc_of(0);
    int V = w.m->cfg.vocab;
    float *ref = malloc((size_t)V * sizeof *ref), *got = malloc((size_t)V * sizeof *got);
    cp_response a = ask(&w, 0, 0, doc, "Who is speaking here?", 0, ref);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    redisContext *c = redis_connect(w.redis.port);
    cr_assert(c);
    redisReply *keys = redisCommand(c, "KEYS *:v:*");
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements > 0);
    size_t n = keys->elements;
    for (size_t i = 0; i < n; i++) { /* one byte of K/V in each: only the checksum can tell */
        redisReply *r = redisCommand(c, "SETRANGE %s 400 %b", keys->element[i]->str, "\x7f", (size_t)1);
        cr_assert(r && r->type == REDIS_REPLY_INTEGER);
        freeReplyObject(r);
    }
    freeReplyObject(keys);
    /* no-store: replica 1 writes nothing, so what Redis holds after it is what the rejection left */
    cp_response b = ask_full(&w, 1, 1, doc, "Who is speaking here?", 0, 1, got);
    cr_assert_eq(b.segments_hit, 0, "a corrupted value was used");
    cr_assert_eq(b.computed, b.prompt_tokens);
    cr_assert_eq(max_abs_diff(ref, got, (size_t)V), 0.0f, "recomputing gave other logits than the first computation");
    cr_assert_geq(stats_of(&w.r[1]).bad_values, 1);
    /* the rejected values were dropped */
    cr_assert(cp_tier_drain(w.r[1].tier, 5));
    cr_assert_eq(stats_of(&w.r[1]).writes, 0, "a no-store request was written through");
    cp_kv_layout l;
    cp_engine_kv_layout(w.m, &l);
    keys = redisCommand(c, "KEYS *:v:*");
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *v = redisCommand(c, "GET %s", keys->element[i]->str);
        cp_tier_seg s;
        cp_error err = { 0 };
        cr_assert(v && v->type == REDIS_REPLY_STRING);
        cp_tier_check k = world_check(&w, keys->element[i]->str);
        cr_assert_eq(cp_tier_value_decode(&l, &k, (const uint8_t *)v->str, v->len, &s, &err), CP_OK, "a rejected value stayed: %s",
                     err.msg);
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    redisFree(c);
    cp_response_free(&a), cp_response_free(&b);
    free(ref), free(got), free(doc);
    drop_world(&w);
}

Test(tier, a_tenants_quota_holds_across_replicas, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world_q(&w, "tier_quota", 2);
    char *d1 = doc_of(0), *d2 = doc_of(1);
    cp_response a = ask(&w, 0, 0, d1, "Who is speaking here?", 0, NULL);
    cr_assert_gt(a.segments_stored, 0);
    cr_assert_leq(a.segments_stored, 2, "alice stored %d segments under a quota of 2", a.segments_stored);
    /* her window is spent on replica 0: replica 1 stores nothing more of hers, bob still stores */
    cp_response a2 = ask(&w, 1, 1, d2, "And then?", 0, NULL);
    cr_assert_eq(a.segments_stored + a2.segments_stored, 2, "alice stored %d + %d segments across two replicas under a quota of 2",
                 a.segments_stored, a2.segments_stored);
    cr_assert_gt(stats_of(&w.r[1]).quota_refusals, 0);
    cp_response b = ask(&w, 1, 0, d2, "And then?", 0, NULL);
    cr_assert_gt(b.segments_stored, 0, "bob's quota was spent by alice");
    cp_response_free(&a), cp_response_free(&a2), cp_response_free(&b);
    free(d1), free(d2);
    drop_world(&w);
}

Test(tier, a_dangling_index_entry_is_a_miss_and_is_cleaned_up, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world(&w, "tier_dangling");
    char *doc = doc_of(0);
    cp_response a = ask(&w, 0, 0, doc, "Who is speaking here?", 0, NULL);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    size_t idx = redis_count(w.redis.port, "*:i:*");
    cr_assert_gt(idx, 0);
    /* the values go (as volatile-lru or their TTL would take them), the index entries stay */
    redisContext *c = redis_connect(w.redis.port);
    cr_assert(c);
    redisReply *keys = redisCommand(c, "KEYS *:v:*");
    cr_assert(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements > 0);
    for (size_t i = 0; i < keys->elements; i++) freeReplyObject(redisCommand(c, "DEL %s", keys->element[i]->str));
    freeReplyObject(keys);
    redisFree(c);
    cp_response b = ask_full(&w, 1, 1, doc, "Who is speaking here?", 0, 1, NULL);
    cr_assert_eq(b.segments_hit, 0);
    cr_assert_eq(b.computed, b.prompt_tokens);
    cr_assert_geq(stats_of(&w.r[1]).dangling, 1);
    cr_assert_lt(redis_count(w.redis.port, "*:i:*"), idx, "the dangling index entries were not deleted");
    cp_response_free(&a), cp_response_free(&b);
    free(doc);
    drop_world(&w);
}

Test(tier, a_hung_redis_costs_a_timeout_not_a_request, .timeout = TEST_TIMEOUT(60))
{
    world w;
    make_world(&w, "tier_hung");
    char *doc = doc_of(1);
    cp_response a = ask(&w, 0, 0, doc, "Who is speaking here?", 0, NULL);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    kill(w.redis.pid, SIGSTOP); /* accepts nothing, answers nothing */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cp_response b = ask(&w, 1, 1, doc, "Who is speaking here?", 0, NULL);
    cp_response b2 = ask(&w, 1, 1, doc, "Who is speaking now?", 0, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kill(w.redis.pid, SIGCONT);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    cr_assert_eq(b.computed, b.prompt_tokens, "nothing could come from a hung Redis");
    cr_assert_geq(stats_of(&w.r[1]).breaker_opens, 1);
    /* one 0.25 s timeout, then the open breaker answers at once (the requests' own compute on top) */
    cr_assert_lt(s, 5.0, "two requests took %.2f s against a hung Redis", s);
    cp_response_free(&a), cp_response_free(&b), cp_response_free(&b2);
    free(doc);
    drop_world(&w);
}

/* ---- forged values -------------------------------------------------------------------- */

/* the first key matching pattern (malloc'd), or NULL */
static char *first_key(redisContext *c, const char *pattern)
{
    redisReply *r = redisCommand(c, "KEYS %s", pattern);
    cr_assert(r && r->type == REDIS_REPLY_ARRAY);
    char *k = r->elements ? strdup(r->element[0]->str) : NULL;
    freeReplyObject(r);
    return k;
}

static int key_exists(redisContext *c, const char *key)
{
    redisReply *r = redisCommand(c, "EXISTS %s", key);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER);
    int e = r->integer != 0;
    freeReplyObject(r);
    return e;
}

static void set_value(redisContext *c, const char *key, const uint8_t *v, size_t n)
{
    redisReply *r = redisCommand(c, "SET %s %b", key, v, n);
    cr_assert(r && r->type == REDIS_REPLY_STATUS);
    freeReplyObject(r);
}

/* the value of key, decoded under the world's checks (malloc'd bytes in *buf) */
static cp_tier_seg read_value(world *w, redisContext *c, const char *key, uint8_t **buf, size_t *n)
{
    redisReply *r = redisCommand(c, "GET %s", key);
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    *buf = malloc(r->len), *n = r->len;
    memcpy(*buf, r->str, r->len);
    freeReplyObject(r);
    cp_kv_layout l;
    cp_engine_kv_layout(w->m, &l);
    cp_tier_check k = world_check(w, key);
    cp_tier_seg s;
    cp_error err = { 0 };
    cr_assert_eq(cp_tier_value_decode(&l, &k, *buf, *n, &s, &err), CP_OK, "%s", err.msg);
    return s;
}

/* s (pointing into a value read back) with tokens/kv copied so they can be
 * changed, re-encoded under key name `name` sealed with `key`: the bytes (malloc'd) */
static uint8_t *reseal(world *w, const cp_tier_seg *s, const char *name, const char *key, size_t *n)
{
    cp_kv_layout l;
    cp_engine_kv_layout(w->m, &l);
    *n = cp_tier_value_bytes(&l, s->len);
    uint8_t *out = malloc(*n);
    cp_tier_check k = check_for(name, key, (uint32_t)w->m->cfg.vocab, (uint32_t)w->m->cfg.max_pos);
    cr_assert_eq(cp_tier_value_encode(&l, &k, s, out, NULL), CP_OK);
    return out;
}

/* bob (tenant 0 of replica 1) asks doc without storing: the tier's figures before and after */
static cp_response bob_reads(world *w, const char *doc, cp_tier_stats *before, cp_tier_stats *after)
{
    *before = stats_of(&w->r[1]);
    cp_response b = ask_full(w, 1, 0, doc, "Who is speaking here?", 0, 1, NULL);
    *after = stats_of(&w->r[1]);
    return b;
}

static void flushall(world *w)
{
    redisContext *c = redis_connect(w->redis.port);
    cr_assert(c);
    freeReplyObject(redisCommand(c, "FLUSHALL"));
    redisFree(c);
}

/* alice (tenant 0 of replica 0) stores doc; her values drained into Redis */
static void alice_stores(world *w, const char *doc)
{
    flushall(w);
    cp_response a = ask(w, 0, 0, doc, "Who is speaking here?", 0, NULL);
    cr_assert_gt(a.segments_stored, 0);
    cr_assert(cp_tier_drain(w->r[0].tier, 5));
    cp_response_free(&a);
}

Test(tier, forged_values_are_rejected_counted_and_deleted, .timeout = TEST_TIMEOUT(120))
{
    world w;
    make_world(&w, "tier_forged");
    redisContext *c = redis_connect(w.redis.port);
    cr_assert(c);
    cp_tier_stats s0, s1;
    uint8_t *buf, *forged;
    size_t n, fn;

    /* 1. a shared value re-checksummed with SHA-256 (what anyone who can write Redis can compute) after a K/V change */
    char *d = doc_of(0);
    alice_stores(&w, d);
    char *vk = first_key(c, "cacheprune:s:*:v:*");
    cr_assert(vk);
    cp_tier_seg sg = read_value(&w, c, vk, &buf, &n);
    (void)sg;
    buf[n - 1] ^= 0x01;
    memset(buf + 120, 0, 32);
    const void *part[1] = { buf };
    size_t plen[1] = { n };
    uint8_t sum[32];
    cp_sha256(part, plen, 1, sum);
    memcpy(buf + 120, sum, 32);
    set_value(c, vk, buf, n);
    cp_response b = bob_reads(&w, d, &s0, &s1);
    cr_assert_eq(s1.bad_auth, s0.bad_auth + 1, "a re-checksummed value was not rejected as unauthentic (%llu -> %llu)",
                 (unsigned long long)s0.bad_auth, (unsigned long long)s1.bad_auth);
    cr_assert_geq(s1.bad_values, s0.bad_values + 1);
    cr_assert_not(key_exists(c, vk), "the forged value stayed in Redis");
    cp_response_free(&b), free(buf), free(vk), free(d);

    /* 2. alice's private value moved into bob's key space, owner changed, sealed without the replicas' key */
    d = doc_of(1);
    alice_stores(&w, d);
    cp_response a2 = ask(&w, 0, 0, d, "What does the passage describe?", 0, NULL);
    cp_response_free(&a2);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    uint8_t ak[CP_TIER_KEY_BYTES], bk[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key("alice", 5, ak), cp_tier_tenant_key("bob", 3, bk);
    char ah[2 * CP_TIER_KEY_BYTES + 1], bh[2 * CP_TIER_KEY_BYTES + 1], pat[128];
    for (int i = 0; i < CP_TIER_KEY_BYTES; i++) snprintf(ah + 2 * i, 3, "%02x", ak[i]), snprintf(bh + 2 * i, 3, "%02x", bk[i]);
    snprintf(pat, sizeof pat, "cacheprune:p:%s:*:v:*", ah);
    vk = first_key(c, pat);
    cr_assert(vk, "alice stored no private value to move");
    sg = read_value(&w, c, vk, &buf, &n);
    memcpy(sg.owner, bk, CP_TIER_KEY_BYTES);
    char moved[256];
    snprintf(moved, sizeof moved, "cacheprune:p:%s%s", bh, vk + strlen("cacheprune:p:") + 2 * CP_TIER_KEY_BYTES);
    forged = reseal(&w, &sg, moved, TIER_OTHER_KEY, &fn);
    set_value(c, moved, forged, fn);
    /* her index entries too, into bob's space */
    snprintf(pat, sizeof pat, "cacheprune:p:%s:*:i:*", ah);
    redisReply *ik = redisCommand(c, "KEYS %s", pat);
    cr_assert(ik && ik->type == REDIS_REPLY_ARRAY && ik->elements > 0);
    for (size_t i = 0; i < ik->elements; i++) {
        char to[256];
        snprintf(to, sizeof to, "cacheprune:p:%s%s", bh, ik->element[i]->str + strlen("cacheprune:p:") + 2 * CP_TIER_KEY_BYTES);
        freeReplyObject(redisCommand(c, "COPY %s %s", ik->element[i]->str, to));
    }
    freeReplyObject(ik);
    cp_tier_stats t0 = stats_of(&w.r[1]);
    cp_response bm = ask_full(&w, 1, 0, d, "What does the passage describe?", 0, 1, NULL);
    cp_tier_stats t1 = stats_of(&w.r[1]);
    cr_assert_eq(bm.private_hit_tokens, 0, "bob was given %d tokens of alice's moved value", bm.private_hit_tokens);
    cr_assert_geq(t1.bad_auth, t0.bad_auth + 1, "a moved value was not rejected as unauthentic");
    cr_assert_not(key_exists(c, moved), "the moved value stayed in Redis");
    cp_response_free(&bm), free(buf), free(forged), free(vk), free(d);

    /* 3-5. authentic (sealed with the replicas' key: a replica's bug or a key holder) but out of range */
    for (int variant = 0; variant < 3; variant++) {
        d = doc_of(2 + variant);
        alice_stores(&w, d);
        vk = first_key(c, "cacheprune:s:*:v:*");
        cr_assert(vk);
        sg = read_value(&w, c, vk, &buf, &n);
        cp_kv_layout l;
        cp_engine_kv_layout(w.m, &l);
        size_t kvn = (size_t)l.n_layers * 2 * sg.len * cp_kv_row(&l);
        float *kv = malloc(kvn * sizeof *kv);
        int32_t *tok = malloc(sg.len * sizeof *tok);
        memcpy(kv, sg.kv, kvn * sizeof *kv), memcpy(tok, sg.tokens, sg.len * sizeof *tok);
        char target[256];
        snprintf(target, sizeof target, "%s", vk);
        const char *what = variant == 0 ? "NaN K/V" : variant == 1 ? "an out-of-vocabulary token id" : "an INT_MAX start position";
        if (variant == 0) {
            kv[kvn / 2] = __builtin_nanf("");
        } else if (variant == 1) {
            /* the window the index names stays; the last token is not a token of this model: a new SHA, key and index field */
            tok[sg.len - 1] = w.m->cfg.vocab + 5;
            cp_tier_segment_sha(&l, tok, sg.len, sg.sha);
            char sha[65];
            for (int i = 0; i < 32; i++) snprintf(sha + 2 * i, 3, "%02x", sg.sha[i]);
            snprintf(target, sizeof target, "%.*s%s", (int)(strlen(vk) - 64), vk, sha);
            /* the index entries that named the real value now name only the forged one */
            redisReply *keys = redisCommand(c, "KEYS cacheprune:s:*:i:*");
            cr_assert(keys && keys->type == REDIS_REPLY_ARRAY);
            for (size_t i = 0; i < keys->elements; i++) {
                redisReply *h = redisCommand(c, "HGET %s %s", keys->element[i]->str, vk + strlen(vk) - 64);
                if (h && h->type == REDIS_REPLY_STRING) {
                    freeReplyObject(redisCommand(c, "HDEL %s %s", keys->element[i]->str, vk + strlen(vk) - 64));
                    freeReplyObject(redisCommand(c, "HSET %s %s %s", keys->element[i]->str, sha, h->str));
                }
                if (h) freeReplyObject(h);
            }
            freeReplyObject(keys);
        } else {
            sg.start_pos = 0x7fffffff;
        }
        sg.tokens = tok, sg.kv = (const uint8_t *)kv;
        forged = reseal(&w, &sg, target, TIER_TEST_KEY, &fn);
        set_value(c, target, forged, fn);
        b = bob_reads(&w, d, &s0, &s1);
        cr_assert_eq(s1.bad_range, s0.bad_range + 1, "a value with %s was not rejected as out of range", what);
        cr_assert_geq(s1.bad_values, s0.bad_values + 1);
        cr_assert_eq(s1.bad_auth, s0.bad_auth, "a value with %s sealed with the right key failed authentication", what);
        cr_assert_not(key_exists(c, target), "the value with %s stayed in Redis", what);
        cr_assert_gt(b.n_ids, 0, "bob's answer is empty after a value with %s", what);
        cp_response_free(&b), free(buf), free(forged), free(vk), free(d), free(kv), free(tok);
    }
    redisFree(c);
    drop_world(&w);
}

/* ---- purge across replicas -------------------------------------------------------------- */

/* her private keys in Redis */
static size_t alice_keys(world *w)
{
    uint8_t ak[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key("alice", 5, ak);
    char pat[128] = "cacheprune:p:";
    for (int i = 0; i < CP_TIER_KEY_BYTES; i++) snprintf(pat + 13 + 2 * i, 3, "%02x", ak[i]);
    strcat(pat, ":*");
    return redis_count(w->redis.port, pat);
}

Test(tier, a_purge_through_one_replica_reaches_the_others_local_pools, .timeout = TEST_TIMEOUT(90))
{
    world w;
    make_world(&w, "tier_purge_all");
    char *doc = doc_of(3);
    const char *q = "What does the passage describe?";
    /* alice (0 on replica 0, 1 on replica 1) served on both; replica 1 then hits its own local pool */
    cp_response a = ask(&w, 0, 0, doc, q, 0, NULL);
    cr_assert(cp_tier_drain(w.r[0].tier, 5));
    cp_response r = ask(&w, 1, 1, doc, q, 0, NULL);
    cp_response r2 = ask(&w, 1, 1, doc, q, 0, NULL);
    cr_assert_gt(r2.private_hit_tokens, 0, "replica 1 holds nothing of alice's to purge");
    cr_assert(cp_tier_drain(w.r[1].tier, 5));
    /* her keys from before the purge, kept to come back as writes in flight then would */
    redisContext *c = redis_connect(w.redis.port);
    cr_assert(c);
    uint8_t ak[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key("alice", 5, ak);
    char pat[128] = "cacheprune:p:";
    for (int i = 0; i < CP_TIER_KEY_BYTES; i++) snprintf(pat + 13 + 2 * i, 3, "%02x", ak[i]);
    strcat(pat, ":*");
    redisReply *old_keys = redisCommand(c, "KEYS %s", pat);
    cr_assert(old_keys && old_keys->type == REDIS_REPLY_ARRAY && old_keys->elements > 0);
    redisReply **old = calloc(old_keys->elements, sizeof *old);
    char *old_key = NULL; /* one of her values */
    for (size_t i = 0; i < old_keys->elements; i++) {
        old[i] = redisCommand(c, "DUMP %s", old_keys->element[i]->str);
        cr_assert(old[i] && old[i]->type == REDIS_REPLY_STRING);
        if (strstr(old_keys->element[i]->str, ":v:")) old_key = old_keys->element[i]->str;
    }
    cr_assert(old_key);
    /* the purge, through replica 0: its pool, the tier's values, and the epoch */
    size_t segs, adm;
    long tier = -5;
    cp_engine_purge_tenant(w.r[0].e, 0, &segs, &adm, &tier);
    cr_assert_gt(segs, 0);
    cr_assert_gt(tier, 0, "the purge dropped %ld of alice's values from the tier", tier);
    cr_assert_eq(alice_keys(&w), 0, "alice's keys survived her purge");
    /* replica 1 reuses nothing of hers from then on */
    cp_response p1 = ask(&w, 1, 1, doc, q, 0, NULL);
    cr_assert_eq(p1.private_hit_tokens, 0, "replica 1 reused %d tokens of alice's after her purge through replica 0",
                 p1.private_hit_tokens);
    cr_assert_geq(stats_of(&w.r[1]).epoch_purges, 1);
    cp_response_free(&p1);
    /* a value written before the purge and landing after it is never used */
    cr_assert(cp_tier_drain(w.r[1].tier, 5));
    size_t segs1, adm1;
    cp_engine_purge_tenant(w.r[1].e, 1, &segs1, &adm1, NULL); /* replica 1's own copies of what p1 stored */
    for (size_t i = 0; i < old_keys->elements; i++)
        freeReplyObject(redisCommand(c, "RESTORE %s 0 %b REPLACE", old_keys->element[i]->str, old[i]->str, old[i]->len));
    cr_assert(key_exists(c, old_key));
    cp_tier_stats st0 = stats_of(&w.r[0]);
    cp_response p0 = ask_full(&w, 0, 0, doc, q, 0, 1, NULL);
    cr_assert_eq(p0.private_hit_tokens, 0, "a value from before alice's purge was used (%d tokens)", p0.private_hit_tokens);
    cr_assert_geq(stats_of(&w.r[0]).stale, st0.stale + 1, "the stale value was not counted");
    cr_assert_not(key_exists(c, old_key), "the stale value stayed in Redis");
    /* a replica that cannot read the epoch keeps nothing of hers it could have missed a purge of */
    cp_response k1 = ask(&w, 1, 1, doc, q, 0, NULL);
    cp_response k2 = ask(&w, 1, 1, doc, q, 0, NULL);
    cr_assert_gt(k2.private_hit_tokens, 0);
    kill(w.redis.pid, SIGSTOP);
    cp_response k3 = ask(&w, 1, 1, doc, q, 0, NULL);
    kill(w.redis.pid, SIGCONT);
    cr_assert_eq(k3.private_hit_tokens, 0, "replica 1 reused %d tokens of alice's while it could not read her purge epoch",
                 k3.private_hit_tokens);
    for (size_t i = 0; i < old_keys->elements; i++) freeReplyObject(old[i]);
    free(old), freeReplyObject(old_keys);
    redisFree(c);
    cp_response_free(&a), cp_response_free(&r), cp_response_free(&r2), cp_response_free(&p0);
    cp_response_free(&k1), cp_response_free(&k2), cp_response_free(&k3);
    free(doc);
    drop_world(&w);
}

/* ---- two `run` processes ------------------------------------------------------------- */

static void write_requests(const char *path, const char *tenant, const char *doc, int copies)
{
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < copies; i++) {
        fprintf(f, "{\"tenant\":\"%s\",\"max_tokens\":6,\"messages\":[{\"role\":\"document\",\"content\":\"", tenant);
        for (const char *p = doc; *p; p++)
            if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
            else if ((unsigned char)*p < 0x20) fputc(' ', f);
            else fputc(*p, f);
        fprintf(f, "\"},{\"role\":\"user\",\"content\":\"What happens?\"}]}\n");
    }
    fclose(f);
}

/* dir/tier.key: the key the test's processes share (mode 0600); its path in path */
static void write_key_file(char *path, size_t cap, const char *dir)
{
    snprintf(path, cap, "%s/tier.key", dir);
    cr_assert(write_bytes(path, TIER_TEST_KEY "\n", strlen(TIER_TEST_KEY) + 1));
    chmod(path, 0600);
}

/* the figure "key": N of line `line` (1-based) of a result file */
static long result_field(const char *path, int line, const char *key, char *text, size_t cap)
{
    size_t len;
    char *s = read_text(path, &len);
    cr_assert(s, "no %s", path);
    char *p = s;
    for (int i = 1; i < line && p; i++) p = strchr(p, '\n'), p = p ? p + 1 : NULL;
    cr_assert(p, "%s has no line %d", path, line);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    char *k = strstr(p, pat);
    cr_assert(k, "no %s in %s", key, path);
    long v = strtol(k + strlen(pat), NULL, 10);
    if (text) {
        char *t = strstr(p, "\"text\":");
        char *nl = strchr(p, '\n');
        size_t n = t ? (size_t)((nl ? nl : s + len) - t) : 0;
        snprintf(text, cap, "%.*s", (int)(n < cap ? n : cap - 1), t ? t : "");
        char *cut = strstr(text, "\"ttft_ms\"");
        if (cut) *cut = 0;
    }
    free(s);
    return v;
}

Test(tier, two_run_processes_share_one_redis, .timeout = TEST_TIMEOUT(90))
{
    require_kit();
    redis_proc rp = { 0 };
    redis_start(&rp, "tier_run");
    char dir[512], a[600], b[600], ab[600], oa[600], ob[600], oab[600], model[512];
    test_tmpdir(dir, sizeof dir, "tier_run_files");
    shared_path(model, sizeof model, "models/cp-books-6m");
    char *doc = doc_of(1);
    snprintf(a, sizeof a, "%s/a.jsonl", dir), snprintf(b, sizeof b, "%s/b.jsonl", dir), snprintf(ab, sizeof ab, "%s/ab.jsonl", dir);
    snprintf(oa, sizeof oa, "%s/oa.jsonl", dir), snprintf(ob, sizeof ob, "%s/ob.jsonl", dir), snprintf(oab, sizeof oab, "%s/oab.jsonl", dir);
    write_requests(a, "alice", doc, 1);
    write_requests(b, "bob", doc, 1);
    cr_assert_eq(test_sh("cat %s %s > %s", a, b, ab), 0);
    const char *bin = getenv("CP_BIN") ? getenv("CP_BIN") : "build/cacheprune";
    char key[600];
    write_key_file(key, sizeof key, dir);
    /* without the shared key, --tier is refused (not run with a key of its own) */
    cr_assert_neq(test_sh("%s run --quiet-progress --model %s --requests %s --out %s --tier redis://127.0.0.1:%d > %s/log0 2>&1", bin,
                          model, a, oa, rp.port, dir), 0, "--tier ran without --tier-key-file");
    cr_assert_eq(test_sh("grep -q -- '--tier needs --tier-key-file' %s/log0", dir), 0, "the refusal does not name --tier-key-file");
    cr_assert_eq(test_sh("%s run --quiet-progress --report-reuse --model %s --requests %s --out %s --tier redis://127.0.0.1:%d "
                         "--tier-key-file %s > %s/log1 2>&1", bin, model, a, oa, rp.port, key, dir), 0);
    cr_assert_gt(redis_count(rp.port, "cacheprune:s:*:v:*"), 0, "the first run's shared segments are not in Redis");
    cr_assert_eq(test_sh("%s run --quiet-progress --report-reuse --model %s --requests %s --out %s --tier redis://127.0.0.1:%d "
                         "--tier-key-file %s > %s/log2 2>&1", bin, model, b, ob, rp.port, key, dir), 0);
    /* the same two requests in one process without the tier: bob's hit is local there */
    cr_assert_eq(test_sh("%s run --quiet-progress --report-reuse --model %s --requests %s --out %s > %s/log3 2>&1", bin, model, ab,
                         oab, dir), 0);
    char t_remote[512], t_local[512];
    long reused_remote = result_field(ob, 1, "reused", t_remote, sizeof t_remote);
    long reused_local = result_field(oab, 2, "reused", t_local, sizeof t_local);
    cr_assert_gt(reused_remote, 0, "the second process did not hit the first one's segments");
    /* the same hits and the same text; not the same split between reused and recomputed: a
     * segment filled from the tier carries no chain context (the tier's value has no field for
     * it), so the second process proves less of it exact and recomputes some of what the single
     * process reuses as proved exact */
    long rec_remote = result_field(ob, 1, "recomputed", NULL, 0), rec_local = result_field(oab, 2, "recomputed", NULL, 0);
    cr_assert_eq(reused_remote + rec_remote, reused_local + rec_local, "the two processes hit different tokens");
    cr_assert_leq(reused_remote, reused_local);
    cr_assert_str_eq(t_remote, t_local);
    redis_stop(&rp);
    free(doc);
}

/* ---- two `serve` replicas ------------------------------------------------------------ */

#define SK_ALICE "sk-alice-tier-0123456789abcdef"
#define SK_BOB "sk-bob-tier-0123456789abcdefgh"
#define SK_OPS "sk-ops-tier-0123456789abcdefgh"

typedef struct replica_proc {
    pid_t pid;
    int port;
} replica_proc;

static void serve_start_opt(replica_proc *s, const char *dir, const char *keys, int redis_port, int idx, int report_reuse)
{
    char model[512], url[64], errlog[700], key[600];
    write_key_file(key, sizeof key, dir);
    shared_path(model, sizeof model, "models/cp-books-6m");
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis_port);
    snprintf(errlog, sizeof errlog, "%s/serve%d.stderr", dir, idx);
    const char *bin = getenv("CP_BIN") ? getenv("CP_BIN") : "build/cacheprune";
    int p[2];
    cr_assert_eq(pipe(p), 0);
    s->pid = fork();
    cr_assert_geq(s->pid, 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], 1);
        FILE *e = fopen(errlog, "w");
        if (e) dup2(fileno(e), 2);
        close(p[0]);
        setenv("OMP_WAIT_POLICY", "passive", 1);
        if (report_reuse)
            execl(bin, bin, "serve", "--model", model, "--keys", keys, "--port", "0", "--report-reuse", "--tier", url, "--tier-key-file",
                  key, (char *)NULL);
        else
            execl(bin, bin, "serve", "--model", model, "--keys", keys, "--port", "0", "--tier", url, "--tier-key-file", key, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[256];
    size_t len = 0;
    while (len + 1 < sizeof line && read(p[0], line + len, 1) == 1)
        if (line[len++] == '\n') break;
    line[len] = 0;
    close(p[0]);
    cr_assert_eq(sscanf(line, "listening on 127.0.0.1:%d", &s->port), 1, "serve %d did not start (see %s)", idx, errlog);
}

static void serve_start(replica_proc *s, const char *dir, const char *keys, int redis_port, int idx)
{
    serve_start_opt(s, dir, keys, redis_port, idx, 1);
}

static void serve_stop(replica_proc *s)
{
    if (s->pid <= 0) return;
    kill(s->pid, SIGTERM);
    int st;
    for (int i = 0; i < 500 && waitpid(s->pid, &st, WNOHANG) != s->pid; i++) sleep_ms(10);
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
}

/* one HTTP/1.1 request (Connection: close); the body malloc'd, *status its code */
static char *http(int port, const char *method, const char *path, const char *key, const char *body, int *status)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    size_t bl = body ? strlen(body) : 0, cap = bl + 512;
    char *req = malloc(cap);
    int n = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                               "Content-Length: %zu\r\nConnection: close\r\n\r\n%s", method, path, key, bl, body ? body : "");
    cr_assert_eq(write(fd, req, (size_t)n), n);
    free(req);
    size_t got = 0, rcap = 1 << 16;
    char *resp = malloc(rcap);
    for (ssize_t k; (k = read(fd, resp + got, rcap - got - 1)) > 0;) {
        got += (size_t)k;
        if (got + 1 == rcap) resp = realloc(resp, rcap *= 2);
    }
    resp[got] = 0;
    close(fd);
    cr_assert_eq(sscanf(resp, "HTTP/1.1 %d", status), 1, "no HTTP status: %.200s", resp);
    char *b = strstr(resp, "\r\n\r\n");
    char *out = strdup(b ? b + 4 : "");
    free(resp);
    return out;
}

static long json_number_after(const char *s, const char *key)
{
    const char *k = strstr(s, key);
    cr_assert(k, "no %s in %.300s", key, s);
    k += strlen(key);
    while (*k == '"' || *k == ':' || *k == ' ') k++;
    return strtol(k, NULL, 10);
}

/* POST a chat of doc + question; cached_tokens of its usage */
static long chat(int port, const char *key, const char *doc_json, const char *q)
{
    char *body = malloc(strlen(doc_json) + 512);
    sprintf(body, "{\"model\":\"cp-books-6m\",\"max_tokens\":3,\"messages\":[{\"role\":\"document\",\"content\":%s},"
                  "{\"role\":\"user\",\"content\":\"%s\"}]}", doc_json, q);
    int st;
    char *r = http(port, "POST", "/v1/chat/completions", key, body, &st);
    cr_assert_eq(st, 200, "chat: %d %.300s", st, r);
    long cached = json_number_after(r, "\"cached_tokens\"");
    free(r), free(body);
    return cached;
}

/* waits until Redis's key count stops moving (the writer threads done) */
static void redis_settle(int port)
{
    size_t last = (size_t)-1;
    for (int i = 0; i < 100; i++) {
        size_t n = redis_count(port, "*");
        if (n == last && n > 0) return;
        last = n;
        sleep_ms(100);
    }
}

Test(tier, two_serve_replicas_share_isolate_count_and_purge, .timeout = TEST_TIMEOUT(90))
{
    require_kit();
    redis_proc rp = { 0 };
    redis_start(&rp, "tier_serve");
    char dir[512], keys[600];
    test_tmpdir(dir, sizeof dir, "tier_serve_files");
    snprintf(keys, sizeof keys, "%s/keys", dir);
    const char *k = SK_ALICE " alice\n" SK_BOB " bob\n" SK_OPS " ops operator\n";
    cr_assert(write_bytes(keys, k, strlen(k)));
    chmod(keys, 0600);
    char *doc = doc_of(2), *dj = malloc(strlen(doc) * 2 + 3), *q = dj;
    *q++ = '"';
    for (const char *p = doc; *p; p++) {
        if (*p == '"' || *p == '\\') *q++ = '\\', *q++ = *p;
        else *q++ = (unsigned char)*p < 0x20 ? ' ' : *p;
    }
    *q++ = '"', *q = 0;
    replica_proc r1, r2;
    serve_start(&r1, dir, keys, rp.port, 1);
    serve_start(&r2, dir, keys, rp.port, 2);
    cr_assert_eq(chat(r1.port, SK_ALICE, dj, "Who speaks?"), 0);
    redis_settle(rp.port);
    /* bob through replica 2: the shared document, from the tier */
    long bob = chat(r2.port, SK_BOB, dj, "Who speaks?");
    cr_assert_gt(bob, 0, "replica 2 did not reuse what replica 1 stored");
    int st;
    char *m = http(r2.port, "GET", "/metrics", SK_OPS, NULL, &st);
    cr_assert_eq(st, 200);
    long hits_bob = json_number_after(m, "\ncacheprune_tier_hits_total ");
    cr_assert_gt(hits_bob, 0, "%s", m);
    cr_assert_gt(json_number_after(m, "\ncacheprune_tier_read_bytes_total "), 0);
    cr_assert_eq(json_number_after(m, "\ncacheprune_tier_bad_values_total "), 0);
    free(m);
    /* alice through replica 2: her private segment comes from the tier too (bob's fetch did not bring it) */
    cr_assert_gt(chat(r2.port, SK_ALICE, dj, "Who speaks?"), 0);
    m = http(r2.port, "GET", "/metrics", SK_OPS, NULL, &st);
    cr_assert_gt(json_number_after(m, "\ncacheprune_tier_hits_total "), hits_bob, "alice's private segment was not fetched");
    free(m);
    /* alice purges through replica 2: no key of her private space is left in Redis */
    uint8_t ak[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key("alice", 5, ak);
    char pat[128] = "cacheprune:p:";
    for (int i = 0; i < CP_TIER_KEY_BYTES; i++) snprintf(pat + 13 + 2 * i, 3, "%02x", ak[i]);
    strcat(pat, ":*");
    redis_settle(rp.port);
    cr_assert_gt(redis_count(rp.port, pat), 0);
    char *pr = http(r2.port, "POST", "/v1/cacheprune/purge", SK_ALICE, "{}", &st);
    cr_assert_eq(st, 200, "%s", pr);
    free(pr);
    cr_assert_eq(redis_count(rp.port, pat), 0, "alice's keys survived her purge");
    serve_stop(&r1), serve_stop(&r2);
    redis_stop(&rp);
    free(doc), free(dj);
}

Test(tier, a_purge_through_one_serve_replica_reaches_the_other, .timeout = TEST_TIMEOUT(90))
{
    require_kit();
    redis_proc rp = { 0 };
    redis_start(&rp, "tier_serve_purge");
    char dir[512], keys[600];
    test_tmpdir(dir, sizeof dir, "tier_serve_purge_files");
    snprintf(keys, sizeof keys, "%s/keys", dir);
    const char *k = SK_ALICE " alice\n" SK_BOB " bob\n";
    cr_assert(write_bytes(keys, k, strlen(k)));
    chmod(keys, 0600);
    char *doc = doc_of(4), *dj = malloc(strlen(doc) * 2 + 3), *q = dj;
    *q++ = '"';
    for (const char *p = doc; *p; p++) {
        if (*p == '"' || *p == '\\') *q++ = '\\', *q++ = *p;
        else *q++ = (unsigned char)*p < 0x20 ? ' ' : *p;
    }
    *q++ = '"', *q = 0;
    /* without --report-reuse: cached_tokens counts the tenant's own (private) segments only */
    replica_proc r1, r2;
    serve_start_opt(&r1, dir, keys, rp.port, 1, 0);
    serve_start_opt(&r2, dir, keys, rp.port, 2, 0);
    const char *qq = "What does the passage describe?";
    cr_assert_eq(chat(r1.port, SK_ALICE, dj, qq), 0);
    redis_settle(rp.port);
    cr_assert_gt(chat(r2.port, SK_ALICE, dj, qq), 0, "replica 2 did not reuse alice's segments from the tier");
    long before = chat(r2.port, SK_ALICE, dj, qq);
    cr_assert_gt(before, 0, "replica 2 holds nothing of alice's to purge");
    redis_settle(rp.port);
    int st;
    char *pr = http(r1.port, "POST", "/v1/cacheprune/purge", SK_ALICE, "{}", &st);
    cr_assert_eq(st, 200, "%s", pr);
    /* what each level dropped: replica 1's pool and the tier's values */
    cr_assert_gt(json_number_after(pr, "\"levels\":{\"pool\""), 0, "%s", pr);
    cr_assert_gt(json_number_after(pr, "\"tier\""), 0, "%s", pr);
    free(pr);
    uint8_t ak[CP_TIER_KEY_BYTES];
    cp_tier_tenant_key("alice", 5, ak);
    char pat[128] = "cacheprune:p:";
    for (int i = 0; i < CP_TIER_KEY_BYTES; i++) snprintf(pat + 13 + 2 * i, 3, "%02x", ak[i]);
    strcat(pat, ":*");
    cr_assert_eq(redis_count(rp.port, pat), 0, "alice's keys survived her purge");
    long after = chat(r2.port, SK_ALICE, dj, qq);
    cr_assert_eq(after, 0, "replica 2 reused %ld tokens of alice's prompt after her purge through replica 1 (%ld before)", after, before);
    serve_stop(&r1), serve_stop(&r2);
    redis_stop(&rp);
    free(doc), free(dj);
}
