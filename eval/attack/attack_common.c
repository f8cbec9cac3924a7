/* The attack harness's shared helpers (attack.h): its random numbers, the
 * candidates of one token length, the engine each trial builds, a request
 * as one tenant, the probes' texts and the statistics of the verdicts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attack.h"

uint32_t att_rnd(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return (uint32_t)(*s >> 16);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double att_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : 0;
}

/* two-sample Kolmogorov-Smirnov: statistic and asymptotic p-value */
double att_ks(double *a, int na, double *b, int nb, double *D)
{
    qsort(a, (size_t)na, sizeof *a, cmp_d);
    qsort(b, (size_t)nb, sizeof *b, cmp_d);
    int i = 0, j = 0;
    double d = 0;
    while (i < na && j < nb) {
        double x = a[i] < b[j] ? a[i] : b[j];
        while (i < na && a[i] <= x) i++;
        while (j < nb && b[j] <= x) j++;
        d = fmax(d, fabs((double)i / na - (double)j / nb));
    }
    *D = d;
    if (!na || !nb) return 1;
    double ne = (double)na * nb / (na + nb), lam = (sqrt(ne) + 0.12 + 0.11 / sqrt(ne)) * d, p = 0;
    for (int k = 1; k <= 100; k++) p += 2 * (k % 2 ? 1 : -1) * exp(-2.0 * k * k * lam * lam);
    return fmin(1, fmax(0, p));
}

static void card(uint64_t *rng, char *out, size_t cap)
{
    int d[15];
    d[0] = 4;
    for (int i = 1; i < 15; i++) d[i] = (int)(att_rnd(rng) % 10);
    cp_probe_card_format(d, out, cap);
}

static const char *const fn[] = { "Anna", "Boris", "Chloe", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Keiko",
                                  "Lars", "Maya", "Nils", "Olga", "Pavel", "Rosa", "Sami", "Tara", "Ugo", "Vera", "Wim" };
static const char *const ln[] = { "Kowalska", "Novak", "Lindqvist", "Okafor", "Moreau", "Tanaka", "Haddad", "Fischer", "Ivanova",
                                  "Costa", "Brennan", "Varga", "Nakamura", "Silva", "Duarte", "Holm", "Berg", "Rossi" };

int att_tok_len(cp_tokenizer *t, const char *s)
{
    cp_encoding e = { 0 };
    cp_error err;
    int n = cp_tokenize(t, s, strlen(s), 0, &e, &err) == CP_OK ? (int)e.n : -1;
    cp_encoding_free(&e);
    return n;
}

int att_candidates_of(uint64_t *rng, cp_tokenizer *t, int K, char cand[][64], void (*make)(uint64_t *rng, char *s, size_t cap))
{
    int want = -1, n = 0;
    for (int tries = 0; n < K && tries < 20000; tries++) {
        char s[64];
        make(rng, s, sizeof s);
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= strcmp(cand[i], s) == 0;
        int L = att_tok_len(t, s);
        if (dup || (want >= 0 && L != want)) continue;
        want = L;
        snprintf(cand[n++], 64, "%s", s);
    }
    return n == K;
}

static void name(uint64_t *rng, char *out, size_t cap) { snprintf(out, cap, "%s %s", fn[att_rnd(rng) % 22], ln[att_rnd(rng) % 18]); }

int att_candidates(uint64_t *rng, cp_tokenizer *t, int misses, int K, char cand[][64])
{
    return att_candidates_of(rng, t, K, cand, misses ? name : card);
}

int att_make_engine(const att_opts *o, cp_model *m, cp_tokenizer *tok, cp_detect_chain *ch, const char *mode, att_engine *es)
{
    cp_error err = { 0 };
    cp_engine_opts eo;
    cp_engine_opts_default(&eo);
    eo.report_reuse = o->report_reuse;
    eo.user_text_private = o->user_private;
    eo.admit_k = o->admit_k;
    eo.segment_kv = o->segkv;
    eo.kv_dtype = o->kv_dtype;
    if (o->row_limit >= 0) eo.annot.row_limit = o->row_limit;
    if (o->beta >= 0) eo.annot.beta = o->beta;
    if (cp_sharing_from_name(mode, &eo.sharing, &err)) return cli_error("%s", err.msg), 0;
    cp_kv_layout l;
    cp_engine_kv_layout_as(m, o->kv_dtype ? o->kv_dtype : CP_F32, &l); /* --pool-blocks counts blocks of this dtype */
    cp_pool_opts po;
    cp_pool_opts_default(&po);
    po.budget_bytes = o->pool_blocks ? (size_t)o->pool_blocks * cp_kv_block_bytes(&l) : (size_t)256 << 20;
    if (o->quota) po.quota_bytes = po.budget_bytes / 4;
    es->pool = NULL;
    if (eo.sharing != CP_SHARE_NONE && cp_pool_create(&l, m->be, &po, &es->pool, &err)) return cli_error("%s", err.msg), 0;
    if (cp_engine_create(m, tok, es->pool, ch, &eo, &es->e, &err)) return cli_error("%s", err.msg), cp_pool_free(es->pool), 0;
    return 1;
}

void att_drop_engine(att_engine *es)
{
    cp_engine_free(es->e);
    cp_pool_free(es->pool);
}

/* one request as a given tenant: what that tenant sees */
int att_ask(att_engine *es, uint32_t tenant, const char *doc, const char *user, int report, double *ttft, int *reused)
{
    cp_request_msg msgs[2] = { { CP_ROLE_DOCUMENT, doc ? doc : "", doc ? strlen(doc) : 0, 0, NULL, 0 },
                               { CP_ROLE_USER, user, strlen(user), 0, NULL, 0 } };
    cp_request r = { .tenant = tenant, .msgs = doc ? msgs : msgs + 1, .n_msgs = doc ? 2 : 1, .max_tokens = 1,
                     .sampling = { .top_p = 1 } };
    cp_response resp, view;
    cp_error err;
    if (cp_engine_run(es->e, &r, &resp, &err)) return cli_error("attack: a probe failed: %s", err.msg), 0;
    cp_response_tenant_view(&resp, report, &view);
    *ttft = resp.ttft_ms;
    *reused = view.reused + view.recomputed;
    cp_response_free(&resp);
    return 1;
}

/* one request of documents and user turns as tenant: its TTFT, and what
 * that tenant is told (every hit with --report-reuse, else only its own):
 * the tokens reused as they were (serve's cached_tokens), and hit =
 * reused + recomputed (run's counters) */
int att_ask_msgs(att_engine *es, uint32_t tenant, const cp_role *roles, const char *const *texts, int n, int no_store, int report,
                 double *ttft, int *seen, int *hit)
{
    cp_request_msg msgs[4];
    for (int i = 0; i < n && i < 4; i++) msgs[i] = (cp_request_msg){ roles[i], texts[i], strlen(texts[i]), 0, NULL, 0 };
    cp_request r = { .tenant = tenant, .msgs = msgs, .n_msgs = (size_t)(n < 4 ? n : 4), .max_tokens = 1, .sampling = { .top_p = 1 },
                     .no_store = no_store };
    cp_response resp, view;
    cp_error err;
    if (cp_engine_run(es->e, &r, &resp, &err)) return cli_error("attack: a probe failed: %s", err.msg), 0;
    cp_response_tenant_view(&resp, report, &view);
    *ttft = resp.ttft_ms;
    *seen = view.reused;
    if (hit) *hit = view.reused + view.recomputed;
    cp_response_free(&resp);
    return 1;
}

/* The row label of a segment-KV dependent attack: cacheprune carries its
 * --segment-kv option; in-context is named only when name_default is set. */
const char *att_segkv_label(const att_opts *o, const char *mode, int name_default)
{
    if (strcmp(mode, "cacheprune") != 0) return mode;
    if (o->segkv == CP_SEGKV_CANONICAL) return "cacheprune/canonical";
    if (o->segkv == CP_SEGKV_STRICT) return "cacheprune/strict";
    return name_default ? "cacheprune/in-context" : mode;
}

const char att_doc_text[] =
    "The lighthouse on the northern cape was built in 1868 from granite quarried on the island itself. Its keepers "
    "recorded the weather three times a day for ninety years, and their logbooks are now kept in the county archive, "
    "where historians use them to study the storms of the late nineteenth century.";

const char *const att_poison_docs[ATT_N_DOCS] = {
    att_doc_text,
    "The river town held a market every Saturday. Farmers brought apples, cheese and wool from the hills, and the "
    "fishermen sold their catch from flat boats tied along the quay. In the afternoon the square filled with music, "
    "and children ran between the stalls while their parents bargained over the price of salt.",
    "In the winter of that year the old mill stopped turning. The ice had crept up the wheel until it could no longer "
    "move, and the miller spent his days by the fire mending sacks and telling his apprentice about the great flood, "
    "when the water had risen above the door and carried away the bridge.",
};

/* the victim's question after a passage (attacks 6 and 7) */
const char att_question[] = "Please tell me in one sentence what the passage above is about.";
