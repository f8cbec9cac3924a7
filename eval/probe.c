/* The scheduling-channel probe (see probe.h). */
#include "probe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tokenizer/tokenizer.h"

#define MAX_CANDS 64
#define MAX_FILLERS 16

void cp_probe_opts_default(cp_probe_opts *o)
{
    *o = (cp_probe_opts){ .trials = 4, .candidates = 8, .fillers = 2, .max_running = 2, .step_tokens = 32, .max_tokens = 2,
                          .order = CP_SCHED_FIFO, .seed = 0x9E3779B97F4A7C15ull };
}

void cp_probe_sort_by_hits(cp_batcher_waiting *w, int *hits, size_t n)
{
    for (size_t i = 1; i < n; i++) { /* insertion sort: the queue is short where this runs */
        cp_batcher_waiting x = w[i];
        int h = hits[i];
        size_t j = i;
        while (j > 0 && (hits[j - 1] < h || (hits[j - 1] == h && w[j - 1].id > x.id))) w[j] = w[j - 1], hits[j] = hits[j - 1], j--;
        w[j] = x, hits[j] = h;
    }
}

/* The LPM control's policy (probe.h): each waiting request's pool hits
 * looked up now (a failed lookup counts as none), longest first. */
static cp_status lpm_order(void *ctx, cp_batcher_waiting *w, size_t n, cp_error *err)
{
    (void)ctx;
    int *hits = cp_calloc(n ? n : 1, sizeof *hits, "LPM control", err);
    if (!hits) return CP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        cp_error e = { 0 };
        if (cp_job_peek_hits(w[i].job, &hits[i], &e)) hits[i] = 0;
    }
    cp_probe_sort_by_hits(w, hits, n);
    free(hits);
    return CP_OK;
}

static uint32_t next_rand(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (uint32_t)(*s >> 16);
}

void cp_probe_card_format(const int d15[15], char *out, size_t cap)
{
    int sum = 0;
    for (int i = 0; i < 15; i++) {
        int x = d15[14 - i];
        if (i % 2 == 0 && (x *= 2) > 9) x -= 9;
        sum += x;
    }
    snprintf(out, cap, "%d%d%d%d %d%d%d%d %d%d%d%d %d%d%d%d", d15[0], d15[1], d15[2], d15[3], d15[4], d15[5], d15[6], d15[7], d15[8],
             d15[9], d15[10], d15[11], d15[12], d15[13], d15[14], (10 - sum % 10) % 10);
}

/* a Luhn-valid 16-digit card number starting with 4 */
static void card(uint64_t *rs, char *out, size_t cap)
{
    int d[15];
    d[0] = 4;
    for (int i = 1; i < 15; i++) d[i] = (int)(next_rand(rs) % 10);
    cp_probe_card_format(d, out, cap);
}

static cp_status tok_len(cp_tokenizer *t, const char *s, int *n, cp_error *err)
{
    cp_encoding e = { 0 };
    cp_status rc = cp_tokenize(t, s, strlen(s), 0, &e, err);
    *n = rc == CP_OK ? (int)e.n : -1;
    cp_encoding_free(&e);
    return rc;
}

/* k + 1 distinct cards of one token length: the candidates (the true one
 * first) and, last, the decoy the baseline's victim sends.  Equal lengths:
 * the candidates' prompts differ in no way the FIFO scheduler reads. */
static cp_status make_cards(cp_tokenizer *t, uint64_t *rs, int k, char cards[][32], cp_error *err)
{
    int want = -1, n = 0;
    for (int tries = 0; n < k && tries < 20000; tries++) {
        char s[32];
        int len, dup = 0;
        card(rs, s, sizeof s);
        for (int i = 0; i < n; i++) dup |= strcmp(cards[i], s) == 0;
        cp_status rc = tok_len(t, s, &len, err);
        if (rc) return rc;
        if (dup || (want >= 0 && len != want)) continue;
        want = len;
        snprintf(cards[n++], 32, "%s", s);
    }
    return n == k ? CP_OK : cp_fail(err, CP_EINVAL, "scheduling probe: no %d card numbers of one token length", k);
}

static const char doc_text[] =
    "The lighthouse on the northern cape was built in 1868 from granite quarried on the island itself. Its keepers "
    "recorded the weather three times a day for ninety years, and their logbooks are now kept in the county archive, "
    "where historians use them to study the storms of the late nineteenth century.";
static const char *const filler_docs[] = {
    "The river town held a market every Saturday. Farmers brought apples, cheese and wool from the hills, and the "
    "fishermen sold their catch from flat boats tied along the quay.",
    "In the winter of that year the old mill stopped turning. The ice had crept up the wheel until it could no longer "
    "move, and the miller spent his days by the fire mending sacks.",
};
static const char filler_q[] = "What is this passage about? Answer in one sentence.";

/* One request of the burst (or the victim): its messages, request, response,
 * and what its client saw. */
typedef struct probe_req {
    char user[192];
    cp_request_msg msgs[2];
    cp_request req;
    cp_response resp;
    int done_step; /* the step its response completed (0: not yet) */
    double ttft;   /* ms from submission to its first token: what its client measures */
    cp_status rc;
    char msg[128];
} probe_req;

static void fill_req(probe_req *r, uint32_t tenant, const char *doc, const char *user, int max_tokens)
{
    snprintf(r->user, sizeof r->user, "%s", user);
    r->msgs[0] = (cp_request_msg){ CP_ROLE_DOCUMENT, doc, strlen(doc), 0, NULL, 0 };
    r->msgs[1] = (cp_request_msg){ CP_ROLE_USER, r->user, strlen(r->user), 0, NULL, 0 };
    r->req = (cp_request){ .tenant = tenant, .msgs = r->msgs, .n_msgs = 2, .max_tokens = max_tokens, .ignore_eos = 1,
                           .sampling = { .top_p = 1 } };
    r->done_step = 0, r->rc = CP_OK, r->msg[0] = 0;
}

static void secret_text(char *out, size_t cap, const char *secret)
{
    snprintf(out, cap, "Hello, my card is %s and I would like a short summary of the passage above, please.", secret);
}

typedef struct burst {
    probe_req *r;
    int step; /* the step being run */
} burst;

static void on_done(void *ctx, void *user, cp_status rc, const cp_error *err)
{
    burst *b = ctx;
    probe_req *r = user;
    r->done_step = b->step;
    r->ttft = r->resp.ttft_ms;
    r->rc = rc;
    if (rc) snprintf(r->msg, sizeof r->msg, "%.120s", err ? err->msg : "?");
}

/* One run: the victim sends victim_card alone, then the burst goes through a
 * batcher: fillers, then the candidates in the order perm gives. */
static cp_status run_burst(const cp_probe_env *env, const cp_probe_opts *o, char cards[][32], const char *victim_card,
                           const int *perm, probe_req *r, cp_error *err)
{
    cp_engine *e = NULL;
    cp_status rc = env->open(env->ctx, &e, err);
    if (rc) return rc;
    char text[192];
    probe_req victim;
    secret_text(text, sizeof text, victim_card);
    fill_req(&victim, 1, doc_text, text, 1);
    rc = cp_engine_run(e, &victim.req, &victim.resp, err); /* the victim stores its prompt */
    if (rc == CP_OK) cp_response_free(&victim.resp);
    int n = o->fillers + o->candidates;
    for (int f = 0; f < o->fillers; f++) fill_req(&r[f], 100 + (uint32_t)f, filler_docs[f % 2], filler_q, o->max_tokens);
    for (int k = 0; k < o->candidates; k++) {
        secret_text(text, sizeof text, cards[perm[k]]);
        fill_req(&r[o->fillers + k], 1000 + (uint32_t)k, doc_text, text, o->max_tokens);
    }
    static const cp_batcher_policy lpm = { lpm_order, NULL };
    cp_batcher_opts bo = { .max_running = o->max_running, .step_tokens = o->step_tokens, .kv_bytes = (size_t)64 << 20 };
    bo.policy = o->order == CP_SCHED_LPM_UNSAFE ? &lpm : NULL; /* FIFO: no policy, nothing peeked */
    cp_batcher *b = NULL;
    if (rc == CP_OK) rc = cp_batcher_create(e, &bo, &b, err);
    burst bu = { .r = r, .step = 0 };
    int submitted = 0;
    for (int i = 0; i < n && rc == CP_OK; i++) { /* all at once: they queue */
        rc = cp_batcher_submit(b, &r[i].req, &r[i].resp, &r[i], NULL, err);
        submitted += rc == CP_OK;
    }
    while (rc == CP_OK && cp_batcher_pending(b)) {
        bu.step++;
        rc = cp_batcher_step(b, on_done, &bu, err);
    }
    for (int i = 0; rc == CP_OK && i < n; i++)
        if (r[i].rc) rc = cp_fail(err, r[i].rc, "scheduling probe: request %d of the burst failed: %s", i, r[i].msg);
    cp_batcher_free(b); /* what is still held (after an error) is finished without a callback */
    for (int i = 0; i < submitted; i++) cp_response_free(&r[i].resp);
    env->close(env->ctx, e);
    return rc;
}

/* the credit a guess "the earliest of v[0..k)" earns when v[truth] is the truth: ties share it */
static double credit(const double *v, int k, int truth)
{
    double best = v[0];
    int ties = 0;
    for (int i = 1; i < k; i++) best = v[i] < best ? v[i] : best;
    for (int i = 0; i < k; i++) ties += v[i] == best;
    return v[truth] == best ? 1.0 / ties : 0;
}

cp_status cp_sched_probe(const cp_probe_env *env, const cp_probe_opts *o, cp_probe_result *out, cp_error *err)
{
    memset(out, 0, sizeof *out);
    if (o->trials < 1 || o->candidates < 2 || o->candidates > MAX_CANDS || o->fillers < 0 || o->fillers > MAX_FILLERS ||
        o->max_tokens < 1)
        return cp_fail(err, CP_EINVAL, "scheduling probe: %d trials, %d candidates (2-%d), %d fillers (0-%d), %d tokens", o->trials,
                       o->candidates, MAX_CANDS, o->fillers, MAX_FILLERS, o->max_tokens);
    int K = o->candidates, n = o->fillers + K;
    probe_req *run[2] = { calloc((size_t)n, sizeof(probe_req)), calloc((size_t)n, sizeof(probe_req)) };
    if (!run[0] || !run[1]) {
        free(run[0]), free(run[1]);
        return cp_fail(err, CP_ENOMEM, "scheduling probe: out of memory (%d requests)", n);
    }
    uint64_t rs = o->seed ? o->seed : 1;
    double won_steps = 0, won_wall = 0;
    cp_status rc = CP_OK;
    for (int t = 0; t < o->trials && rc == CP_OK; t++) {
        char cards[MAX_CANDS + 1][32];
        int perm[MAX_CANDS], at_truth = 0;
        rc = make_cards(env->tok, &rs, K + 1, cards, err);
        for (int k = 0; k < K; k++) perm[k] = k;
        for (int k = K - 1; k > 0; k--) { /* a random submission order */
            int j = (int)(next_rand(&rs) % (uint32_t)(k + 1)), x = perm[k];
            perm[k] = perm[j], perm[j] = x;
        }
        for (int k = 0; k < K; k++) at_truth = perm[k] == 0 ? k : at_truth;
        if (rc == CP_OK) rc = run_burst(env, o, cards, cards[0], perm, run[0], err); /* the victim's secret: cards[0] */
        if (rc == CP_OK) rc = run_burst(env, o, cards, cards[K], perm, run[1], err); /* the decoy */
        if (rc) break;
        double steps[MAX_CANDS], wall[MAX_CANDS];
        for (int k = 0; k < K; k++) {
            const probe_req *c = &run[0][o->fillers + k];
            steps[k] = c->done_step, wall[k] = c->ttft;
        }
        won_steps += credit(steps, K, at_truth);
        won_wall += credit(wall, K, at_truth);
        int same = 1;
        for (int i = 0; i < n; i++) same &= run[0][i].done_step == run[1][i].done_step;
        out->same_trace += same;
    }
    free(run[0]), free(run[1]);
    if (rc) return rc;
    out->trials = o->trials, out->candidates = K;
    out->by_steps = won_steps / o->trials, out->by_wall = won_wall / o->trials, out->chance = 1.0 / K;
    return CP_OK;
}
