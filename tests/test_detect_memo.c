/* The detection memo (engine/detect_memo.h): model-free, then through an
 * engine whose chain counts its detector's calls. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/detect_memo.h"
#include "../engine/request.h"
#include "helpers.h"

static void key_of(uint32_t tenant, cp_role role, const char *text, uint8_t key[32])
{
    cp_detect_memo_key(tenant, role, text, strlen(text), key);
}

static cp_spans spans_of(int n, int wholly)
{
    cp_spans s = { 0 };
    cp_error err = { 0 };
    for (int i = 0; i < n; i++) cr_assert_eq(cp_spans_add(&s, (uint32_t)(3 * i), (uint32_t)(3 * i + 2), "card", 0.5f + i, &err), CP_OK);
    s.wholly = wholly;
    return s;
}

/* a kept result comes back span for span; another tenant, role or text
 * (one byte more) is a miss */
Test(detect_memo, a_hit_needs_the_same_tenant_role_and_text)
{
    cp_detect_memo *m;
    cp_error err = { 0 };
    cr_assert_eq(cp_detect_memo_create(8, &m, &err), CP_OK, "%s", err.msg);
    uint8_t k[32], other[32];
    key_of(1, CP_ROLE_USER, "my card is 4111", k);
    cp_spans s = spans_of(3, 0);
    cp_detect_memo_put(m, k, 1, &s);
    cp_spans back = { 0 };
    cr_assert_eq(cp_detect_memo_get(m, k, &back, &err), 1);
    cr_assert_eq(back.n, 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert(back.v[i].start == s.v[i].start && back.v[i].end == s.v[i].end && back.v[i].score == s.v[i].score &&
                  strcmp(back.v[i].type, "card") == 0);
    cp_spans_free(&back);
    key_of(2, CP_ROLE_USER, "my card is 4111", other);
    cr_assert_eq(cp_detect_memo_get(m, other, &back, &err), 0, "another tenant's same text hit");
    key_of(1, CP_ROLE_ASSISTANT, "my card is 4111", other);
    cr_assert_eq(cp_detect_memo_get(m, other, &back, &err), 0, "another role hit");
    key_of(1, CP_ROLE_USER, "my card is 41111", other);
    cr_assert_eq(cp_detect_memo_get(m, other, &back, &err), 0, "another text hit");
    cr_assert_eq(back.n, 0);
    cp_spans_free(&s);
    cp_detect_memo_free(m);
}

/* full: the least recently used goes; a get makes an entry recent */
Test(detect_memo, the_least_recently_used_entry_goes_first)
{
    cp_detect_memo *m;
    cp_error err = { 0 };
    cr_assert_eq(cp_detect_memo_create(3, &m, &err), CP_OK, "%s", err.msg);
    uint8_t k[5][32];
    const char *texts[5] = { "a", "b", "c", "d", "e" };
    cp_spans s = spans_of(1, 0), back = { 0 };
    for (int i = 0; i < 3; i++) key_of(7, CP_ROLE_USER, texts[i], k[i]), cp_detect_memo_put(m, k[i], 7, &s);
    cr_assert_eq(cp_detect_memo_get(m, k[0], &back, &err), 1); /* a is recent now: b is the oldest */
    key_of(7, CP_ROLE_USER, texts[3], k[3]);
    cp_detect_memo_put(m, k[3], 7, &s);
    cr_assert_eq(cp_detect_memo_size(m), 3);
    cr_assert_eq(cp_detect_memo_get(m, k[1], &back, &err), 0, "b, the least recently used, was kept");
    cr_assert_eq(cp_detect_memo_get(m, k[0], &back, &err), 1, "a, used last, was evicted");
    cr_assert_eq(cp_detect_memo_get(m, k[2], &back, &err), 1);
    cr_assert_eq(cp_detect_memo_get(m, k[3], &back, &err), 1);
    cp_spans_free(&back), cp_spans_free(&s);
    cp_detect_memo_free(m);
}

/* Each tenant's messages evict only its own: a tenant that fills its part
 * of the memo, and then one more, pushes out none of another's entries,
 * which come back as they were and stay the other's least recently used
 * order (the first of them is still the one its next message evicts). */
Test(detect_memo, one_tenants_messages_never_push_out_anothers)
{
    cp_detect_memo *m;
    cp_error err = { 0 };
    cr_assert_eq(cp_detect_memo_create(3, &m, &err), CP_OK, "%s", err.msg);
    uint8_t a[4][32], b[8][32];
    char t[8];
    cp_spans s = spans_of(1, 0), back = { 0 };
    for (int i = 0; i < 3; i++) snprintf(t, sizeof t, "a%d", i), key_of(1, CP_ROLE_USER, t, a[i]), cp_detect_memo_put(m, a[i], 1, &s);
    for (int i = 0; i < 8; i++) snprintf(t, sizeof t, "b%d", i), key_of(2, CP_ROLE_USER, t, b[i]), cp_detect_memo_put(m, b[i], 2, &s);
    cr_assert_eq(cp_detect_memo_size(m), 6, "not 3 entries a tenant: %zu", cp_detect_memo_size(m));
    for (int i = 0; i < 3; i++) cr_assert(cp_detect_memo_has(m, a[i]), "tenant 2's messages pushed out tenant 1's entry %d", i);
    for (int i = 0; i < 5; i++) cr_assert(!cp_detect_memo_has(m, b[i]), "tenant 2 holds more than its 3 (entry %d)", i);
    for (int i = 5; i < 8; i++) cr_assert(cp_detect_memo_has(m, b[i]), "tenant 2's recent entry %d went", i);
    key_of(1, CP_ROLE_USER, "a3", a[3]);
    cp_detect_memo_put(m, a[3], 1, &s);
    cr_assert(!cp_detect_memo_has(m, a[0]), "tenant 1's oldest stayed");
    cr_assert(cp_detect_memo_has(m, a[1]) && cp_detect_memo_has(m, a[3]));
    cr_assert_eq(cp_detect_memo_purge(m, 2), 3);
    cr_assert_eq(cp_detect_memo_get(m, a[1], &back, &err), 1);
    cp_spans_free(&back), cp_spans_free(&s);
    cp_detect_memo_free(m);
}

/* a tenant's erasure drops its entries only; a wholly-sensitive outcome
 * keeps its flag; a message of too many spans is not kept */
Test(detect_memo, purge_wholly_and_the_span_bound)
{
    cp_detect_memo *m;
    cp_error err = { 0 };
    cr_assert_eq(cp_detect_memo_create(16, &m, &err), CP_OK, "%s", err.msg);
    uint8_t k1[32], k2[32], k3[32], big[32];
    key_of(1, CP_ROLE_USER, "x", k1), key_of(1, CP_ROLE_USER, "y", k2), key_of(2, CP_ROLE_USER, "x", k3);
    cp_spans none = spans_of(0, 1), s = spans_of(2, 0), back = { 0 };
    cp_detect_memo_put(m, k1, 1, &none);
    cp_detect_memo_put(m, k2, 1, &s);
    cp_detect_memo_put(m, k3, 2, &s);
    cr_assert_eq(cp_detect_memo_get(m, k1, &back, &err), 1);
    cr_assert(back.wholly && back.n == 0, "the wholly flag did not come back");
    cr_assert_eq(cp_detect_memo_purge(m, 1), 2);
    cr_assert_eq(cp_detect_memo_get(m, k2, &back, &err), 0, "a purged tenant's entry hit");
    cr_assert_eq(cp_detect_memo_get(m, k3, &back, &err), 1, "another tenant's entry went with the purge");
    cp_spans many = spans_of(CP_DETECT_MEMO_SPANS + 1, 0);
    key_of(3, CP_ROLE_USER, "z", big);
    cp_detect_memo_put(m, big, 3, &many);
    cr_assert_eq(cp_detect_memo_get(m, big, &back, &err), 0, "a message of %d spans was kept", CP_DETECT_MEMO_SPANS + 1);
    cp_spans_free(&back), cp_spans_free(&none), cp_spans_free(&s), cp_spans_free(&many);
    cp_detect_memo_free(m);
}

/* ---- through an engine -------------------------------------------------- */

typedef struct counting {
    int calls, fail_next;
    char seen[256]; /* the last text it was given */
} counting;

/* a detector that marks every "4111" and counts its calls; fail_next makes
 * the next call fail (the chain then fails the message closed) */
static cp_status count_detect(cp_detector *d, const char *text, size_t len, cp_role role, cp_spans *out, cp_error *err)
{
    (void)role;
    counting *c = d->impl;
    c->calls++;
    snprintf(c->seen, sizeof c->seen, "%.*s", (int)(len < 255 ? len : 255), text);
    if (c->fail_next) {
        c->fail_next = 0;
        return cp_fail(err, CP_EIO, "told to fail");
    }
    for (size_t i = 0; i + 4 <= len; i++)
        if (memcmp(text + i, "4111", 4) == 0 && cp_spans_add(out, (uint32_t)i, (uint32_t)i + 4, "card", 1, err)) return CP_ENOMEM;
    return CP_OK;
}

static void no_destroy(cp_detector *d) { (void)d; }

/* a pool of the model's f32 KV, the default budget */
static cp_pool *memo_pool(const cp_model *m, cp_backend *be)
{
    cp_kv_layout l;
    cp_engine_kv_layout_as(m, CP_F32, &l);
    cp_pool *pool = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_pool_create(&l, be, NULL, &pool, &err), CP_OK, "%s", err.msg);
    return pool;
}

/* r through e: its sensitive tokens */
static int masked_by(cp_engine *e, const cp_request *r)
{
    cp_response resp;
    cp_error err = { 0 };
    cr_assert_eq(cp_engine_run(e, r, &resp, &err), CP_OK, "%s", err.msg);
    int n = resp.sensitive_tokens;
    cp_response_free(&resp);
    return n;
}

static int sensitive_tokens(cp_engine *e, uint32_t tenant, const char *question)
{
    static const char doc[] = "The harbour master keeps the tide tables in the office by the pier.";
    cp_request_msg msgs[2] = { { CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 },
                               { CP_ROLE_USER, question, strlen(question), 0, NULL, 0 } };
    cp_request r = { .tenant = tenant, .msgs = msgs, .n_msgs = 2, .max_tokens = 1, .sampling = { .top_p = 1 } };
    return masked_by(e, &r);
}

/* the kit model, its tokenizer and a chain of one counting detector */
typedef struct memo_kit {
    cp_backend *be;
    cp_model *m;
    cp_tokenizer *tok;
    counting cnt;
    cp_detector det;
    cp_detect_chain chain;
} memo_kit;

static void memo_kit_open(memo_kit *k)
{
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    memset(k, 0, sizeof *k);
    k->m = load_model_or_die(dir, &k->be);
    k->tok = open_tokenizer_or_die("models/cp-books-6m");
    k->det = (cp_detector){ .name = "count", .detect = count_detect, .destroy = no_destroy, .impl = &k->cnt };
    cp_chain_init(&k->chain);
    cp_error err = { 0 };
    cr_assert_eq(cp_chain_add(&k->chain, &k->det, &err), CP_OK);
}

static void memo_kit_close(memo_kit *k)
{
    k->chain.n = 0; /* the detector lives in the kit */
    cp_chain_free(&k->chain);
    cp_tokenizer_free(k->tok);
    cp_model_free(k->m);
    cp_backend_destroy(k->be);
}

/* an engine over the kit's chain, sharing by `sharing`, on a fresh pool */
static cp_engine *memo_engine(memo_kit *k, cp_sharing sharing, cp_pool **pool)
{
    cp_error err = { 0 };
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = sharing;
    *pool = memo_pool(k->m, k->be);
    cp_engine *e;
    cr_assert_eq(cp_engine_create(k->m, k->tok, *pool, &k->chain, &o, &e, &err), CP_OK, "%s", err.msg);
    return e;
}

/* The same tenant's same message is not scanned again and masks the same
 * tokens; another tenant's is scanned; a failed scan is not kept (the next
 * request scans again); after the tenant's erasure it is scanned again. */
Test(detect_memo, an_engine_scans_a_tenants_repeated_message_once, .timeout = TEST_TIMEOUT(60))
{
    memo_kit k;
    memo_kit_open(&k);
    cp_pool *pool;
    cp_engine *e = memo_engine(&k, CP_SHARE_CHUNK, &pool); /* a mode that shares (none runs no detector) */
    const char *q = "My card is 4111 1111 1111 1111, what does the harbour master keep?";
    int first = sensitive_tokens(e, 1, q);
    cr_assert(first > 0 && k.cnt.calls == 1, "the first request: %d sensitive tokens, %d scans", first, k.cnt.calls);
    cr_assert_eq(sensitive_tokens(e, 1, q), first, "the memo's spans mask other tokens");
    cr_assert_eq(k.cnt.calls, 1, "the same tenant's same message was scanned again");
    cr_assert_eq(sensitive_tokens(e, 2, q), first);
    cr_assert_eq(k.cnt.calls, 2, "another tenant's message was not scanned");
    const char *q2 = "And where are the tide tables?";
    k.cnt.fail_next = 1;
    int failed = sensitive_tokens(e, 1, q2);
    cr_assert_eq(k.cnt.calls, 3);
    cr_assert_gt(failed, 0, "a failed scan did not fail closed");
    cr_assert_eq(sensitive_tokens(e, 1, q2), 0, "a failed scan's outcome was kept");
    cr_assert_eq(k.cnt.calls, 4);
    size_t segments, admissions;
    cp_engine_purge_tenant(e, 1, &segments, &admissions, NULL);
    cr_assert_eq(sensitive_tokens(e, 1, q), first);
    cr_assert_eq(k.cnt.calls, 5, "after the tenant's erasure its message was not scanned again");
    cp_engine_free(e);
    cp_pool_free(pool);
    memo_kit_close(&k);
}

/* one user message of tenant 1 (no-store, or declared sensitive) */
static int ask_user(cp_engine *e, const char *q, int no_store, int sensitive)
{
    cp_request_msg msg = { CP_ROLE_USER, q, strlen(q), sensitive, NULL, 0 };
    cp_request r = { .tenant = 1, .msgs = &msg, .n_msgs = 1, .max_tokens = 1, .no_store = no_store, .sampling = { .top_p = 1 } };
    return masked_by(e, &r);
}

/* A no-store request leaves nothing in the memo (its message is scanned
 * again next time), and a message declared sensitive is masked whole
 * without any detector seeing its text. */
Test(detect_memo, no_store_keeps_nothing_and_a_sensitive_message_is_not_scanned, .timeout = TEST_TIMEOUT(60))
{
    memo_kit k;
    memo_kit_open(&k);
    cp_pool *pool;
    cp_engine *e = memo_engine(&k, CP_SHARE_CACHEPRUNE, &pool);
    const char *q = "My card is 4111 1111 1111 1111, what does the harbour master keep?";
    cr_assert_gt(ask_user(e, q, 1, 0), 0);
    cr_assert_gt(ask_user(e, q, 1, 0), 0);
    cr_assert_eq(k.cnt.calls, 2, "a no-store request's message was answered from the memo");
    const int whole = ask_user(e, "Tell me about the pier.", 0, 1);
    cr_assert_eq(k.cnt.calls, 2, "a message declared sensitive reached the detector");
    cr_assert_gt(whole, 0, "a message declared sensitive was not masked");
    cp_engine_free(e);
    cp_pool_free(pool);
    memo_kit_close(&k);
}

/* Bytes a client marked sensitive (<pii> markers, or a message's spans)
 * reach no detector that works elsewhere -- a plugin's process keeps what
 * it is sent -- as themselves: they are spaces there.  A detector in this
 * process sees them (a card half marked is still a card to it). */
Test(detect_memo, marked_bytes_reach_no_detector_elsewhere, .timeout = TEST_TIMEOUT(60))
{
    memo_kit k;
    memo_kit_open(&k);
    cp_pool *pool;
    cp_engine *e = memo_engine(&k, CP_SHARE_CACHEPRUNE, &pool);
    for (int away = 0; away < 2; away++) {
        k.det.elsewhere = away;
        const char *q = away ? "My code word is <pii>zanzibar</pii> today." : "My code word is <pii>zanzibar</pii> now.";
        cr_assert_gt(ask_user(e, q, 1, 0), 0);
        const char *want = away ? "My code word is          today." : "My code word is zanzibar now.";
        cr_assert_str_eq(k.cnt.seen, want, "a detector %s got '%s'", away ? "elsewhere" : "in this process", k.cnt.seen);
        cp_span sp = { .start = 4, .end = 8, .type = "marked", .score = 1 };
        cp_request_msg msg = { CP_ROLE_USER, "the code word is kilimanjaro", 28, 0, &sp, 1 };
        cp_request r = { .tenant = 2, .msgs = &msg, .n_msgs = 1, .max_tokens = 1, .no_store = 1, .sampling = { .top_p = 1 } };
        cr_assert_gt(masked_by(e, &r), 0);
        cr_assert_str_eq(k.cnt.seen, away ? "the      word is kilimanjaro" : "the code word is kilimanjaro", "spans: '%s'", k.cnt.seen);
    }
    cp_engine_free(e);
    cp_pool_free(pool);
    memo_kit_close(&k);
}

/* A mode that shares nothing (none) runs no detector -- it would pay for a
 * mask nothing reads -- and every mode that looks up or stores does. */
Test(detect_memo, only_a_mode_that_shares_runs_the_detector, .timeout = TEST_TIMEOUT(60))
{
    memo_kit k;
    memo_kit_open(&k);
    static const cp_sharing modes[] = { CP_SHARE_NONE, CP_SHARE_TENANT_PREFIX, CP_SHARE_GLOBAL_PREFIX, CP_SHARE_CHUNK, CP_SHARE_CACHEPRUNE };
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        cp_pool *pool;
        cp_engine *e = memo_engine(&k, modes[mi], &pool);
        k.cnt.calls = 0;
        int n = sensitive_tokens(e, 1, "My card is 4111 1111 1111 1111, what does the harbour master keep?");
        const int shares = modes[mi] != CP_SHARE_NONE;
        cr_assert_eq(k.cnt.calls > 0, shares, "%s: %d detector calls", cp_sharing_name(modes[mi]), k.cnt.calls);
        cr_assert_eq(n > 0, shares, "%s: %d sensitive tokens", cp_sharing_name(modes[mi]), n);
        cp_engine_free(e);
        cp_pool_free(pool);
    }
    memo_kit_close(&k);
}
