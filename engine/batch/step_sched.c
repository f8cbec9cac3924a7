/* The step scheduler's core (see step_sched.h). */
#include "step_sched.h"

#include <stdlib.h>
#include <string.h>

typedef struct item {
    uint64_t id;
    uint32_t tenant;
    int prompt, max_new, prefilled, generated, cancelled;
    void *user;
} item;

/* prefill_by_tenant: when each tenant's last prompt started prefilling
 * (a step count), for the most recent SCHED_TENANT_STARTS tenants; one
 * older than those counts as never (it goes first: bounded by the table) */
#define SCHED_TENANT_STARTS 64
typedef struct tenant_start {
    uint32_t tenant;
    uint64_t stamp; /* 0: an empty entry */
} tenant_start;

struct cp_sched {
    cp_sched_opts o;
    tenant_start starts[SCHED_TENANT_STARTS];
    uint64_t start_clock;
    uint64_t next_id;
    item **wait; /* arrival order */
    size_t wait_n, wait_cap;
    item **run;  /* admission order */
    size_t run_n, run_cap;
    long long kv_used;
};

static long long need_of(const item *it) { return (long long)it->prompt + it->max_new; }

cp_status cp_sched_create(const cp_sched_opts *o, cp_sched **out, cp_error *err)
{
    *out = NULL;
    if (o->max_running < 1 || o->step_tokens <= o->max_running)
        return cp_fail(err, CP_EINVAL, "scheduler: --step-tokens %d must exceed --concurrency %d (each request in flight decodes one a step)",
                       o->step_tokens, o->max_running);
    if (o->kv_budget < 2) return cp_fail(err, CP_EINVAL, "scheduler: KV budget of %lld slots out of range", o->kv_budget);
    cp_sched *s = cp_calloc(1, sizeof *s, "scheduler", err);
    if (!s) return CP_ENOMEM;
    s->o = *o;
    s->next_id = 1;
    *out = s;
    return CP_OK;
}

void cp_sched_free(cp_sched *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->wait_n; i++) free(s->wait[i]);
    for (size_t i = 0; i < s->run_n; i++) free(s->run[i]);
    free(s->wait), free(s->run), free(s);
}

static cp_status push_ptr(void ***v, size_t *n, size_t *cap, void *p, cp_error *err)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        void **nv = realloc(*v, c * sizeof *nv);
        if (!nv) return cp_fail(err, CP_ENOMEM, "scheduler: out of memory (%zu entries)", c);
        *v = nv, *cap = c;
    }
    (*v)[(*n)++] = p;
    return CP_OK;
}

cp_status cp_sched_submit(cp_sched *s, uint32_t tenant, int prompt, int max_new, void *user, uint64_t *id, cp_error *err)
{
    if (prompt < 1 || max_new < 0) return cp_fail(err, CP_EINVAL, "scheduler: a request of %d prompt tokens, %d to generate", prompt, max_new);
    if ((long long)prompt + max_new > s->o.kv_budget)
        return cp_fail(err, CP_ERANGE, "scheduler: a request of %d + %d tokens exceeds the KV budget of %lld slots", prompt, max_new,
                       s->o.kv_budget);
    item *it = cp_calloc(1, sizeof *it, "scheduler request", err);
    if (!it) return CP_ENOMEM;
    *it = (item){ .id = s->next_id++, .tenant = tenant, .prompt = prompt, .max_new = max_new, .user = user };
    cp_status rc = push_ptr((void ***)&s->wait, &s->wait_n, &s->wait_cap, it, err);
    if (rc) {
        free(it);
        return rc;
    }
    if (id) *id = it->id;
    return CP_OK;
}

int cp_sched_cancel(cp_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->wait_n; i++)
        if (s->wait[i]->id == id) return s->wait[i]->cancelled = 1;
    for (size_t i = 0; i < s->run_n; i++)
        if (s->run[i]->id == id) return s->run[i]->cancelled = 1;
    return 0;
}

void cp_sched_cancel_all(cp_sched *s)
{
    for (size_t i = 0; i < s->wait_n; i++) s->wait[i]->cancelled = 1;
    for (size_t i = 0; i < s->run_n; i++) s->run[i]->cancelled = 1;
}

static cp_status retire(cp_sched *s, cp_sched_step *st, item *it, int running, cp_error *err)
{
    if (running) s->kv_used -= need_of(it);
    size_t n = (size_t)st->n_retired, cap = (size_t)st->cap_retired;
    cp_status rc = push_ptr(&st->retired, &n, &cap, it->user, err);
    st->n_retired = (int)n, st->cap_retired = (int)cap;
    free(it);
    return rc;
}

/* Drops cancelled requests from a list (order kept), retiring them. */
static cp_status sweep(cp_sched *s, cp_sched_step *st, item **v, size_t *n, int running, cp_error *err)
{
    size_t k = 0;
    cp_status rc = CP_OK;
    for (size_t i = 0; i < *n; i++) {
        if (!v[i]->cancelled) v[k++] = v[i];
        else if (rc == CP_OK) rc = retire(s, st, v[i], running, err);
        else free(v[i]);
    }
    *n = k;
    return rc;
}

/* A registered policy's order (step_sched.h): the waiting list rebuilt
 * from the ids it hands back, which must be a permutation of those it got
 * (each found once; the queue is short where a policy runs). */
static cp_status reorder(cp_sched *s, cp_error *err)
{
    size_t n = s->wait_n;
    if (n < 2) return CP_OK;
    cp_sched_waiting *w = cp_malloc(n * sizeof *w, "scheduler policy", err);
    item **v = w ? cp_calloc(n, sizeof *v, "scheduler policy", err) : NULL;
    cp_status rc = w && v ? CP_OK : CP_ENOMEM;
    for (size_t i = 0; rc == CP_OK && i < n; i++) w[i] = (cp_sched_waiting){ .id = s->wait[i]->id, .user = s->wait[i]->user };
    if (rc == CP_OK) rc = s->o.policy.order(s->o.policy.ctx, w, n, err);
    for (size_t k = 0; rc == CP_OK && k < n; k++) {
        size_t i = 0;
        while (i < n && s->wait[i]->id != w[k].id) i++;
        if (i == n || v[i]) rc = cp_fail(err, CP_EINVAL, "scheduler: the admission policy returned request %llu missing or twice",
                                         (unsigned long long)w[k].id);
        else v[i] = s->wait[i], w[k].user = v[i]; /* w[k] now names the item at place k */
    }
    for (size_t k = 0; rc == CP_OK && k < n; k++) s->wait[k] = w[k].user;
    free(w), free(v);
    return rc;
}

/* Strict FIFO: the head is admitted or nobody is.  What decides is arrival
 * order (or a registered policy's: the attack harness's only), the
 * reservation (prompt length + max_new) and max_running — never what the
 * cache holds for anyone (THREAT_MODEL.md, scheduling). */
static cp_status admit(cp_sched *s, cp_error *err)
{
    size_t k = 0;
    cp_status rc = CP_OK;
    if (s->o.policy.order && (rc = reorder(s, err))) return rc;
    while (k < s->wait_n && rc == CP_OK) {
        item *it = s->wait[k];
        if (s->run_n >= (size_t)s->o.max_running || s->kv_used + need_of(it) > s->o.kv_budget) break;
        if ((rc = push_ptr((void ***)&s->run, &s->run_n, &s->run_cap, it, err))) break;
        s->kv_used += need_of(it);
        k++;
    }
    if (k) memmove(s->wait, s->wait + k, (s->wait_n - k) * sizeof *s->wait);
    s->wait_n -= k;
    return rc;
}

static cp_status add_work(cp_sched_step *st, const cp_sched_work *w, cp_error *err)
{
    if (st->n_work == st->cap_work) {
        int c = st->cap_work ? st->cap_work * 2 : 32;
        cp_sched_work *v = realloc(st->work, (size_t)c * sizeof *v);
        if (!v) return cp_fail(err, CP_ENOMEM, "scheduler: out of memory (%d work items)", c);
        st->work = v, st->cap_work = c;
    }
    st->work[st->n_work++] = *w;
    st->tokens += w->n;
    return CP_OK;
}

static uint64_t last_start(const cp_sched *s, uint32_t tenant)
{
    for (size_t i = 0; i < SCHED_TENANT_STARTS; i++)
        if (s->starts[i].stamp && s->starts[i].tenant == tenant) return s->starts[i].stamp;
    return 0;
}

static void note_start(cp_sched *s, uint32_t tenant)
{
    size_t at = 0; /* the tenant's entry, else the oldest (an empty one first) */
    for (size_t i = 0; i < SCHED_TENANT_STARTS; i++) {
        if (s->starts[i].stamp && s->starts[i].tenant == tenant) {
            at = i;
            break;
        }
        if (s->starts[i].stamp < s->starts[at].stamp) at = i;
    }
    s->starts[at] = (tenant_start){ .tenant = tenant, .stamp = ++s->start_clock };
}

/* prefill_by_tenant: the running request whose prompt goes next -- the
 * one mid-prefill, else the oldest not started of the tenant whose last
 * prompt started longest ago (never: first; ties: the oldest request);
 * s->run_n if none is left to prefill.  Round-robin over tenants: one
 * tenant's backlog of admitted prompts takes every other start at most. */
static size_t next_prefill(const cp_sched *s)
{
    size_t best = s->run_n;
    uint64_t best_stamp = 0;
    for (size_t i = 0; i < s->run_n; i++) {
        const item *it = s->run[i];
        if (it->prefilled == it->prompt) continue;
        if (it->prefilled > 0) return i; /* one prompt at a time: it goes on */
        const uint64_t stamp = last_start(s, it->tenant);
        if (best == s->run_n || stamp < best_stamp) best = i, best_stamp = stamp;
    }
    return best;
}

cp_status cp_sched_next(cp_sched *s, cp_sched_step *st, cp_error *err)
{
    st->n_work = st->n_retired = st->tokens = 0;
    cp_status rc = sweep(s, st, s->run, &s->run_n, 1, err);
    if (rc == CP_OK) rc = sweep(s, st, s->wait, &s->wait_n, 0, err);
    if (rc == CP_OK) rc = admit(s, err);
    for (size_t i = 0; i < s->run_n && rc == CP_OK; i++) { /* one token for every decoding request */
        item *it = s->run[i];
        if (it->prefilled == it->prompt && it->generated < it->max_new)
            rc = add_work(st, &(cp_sched_work){ .id = it->id, .user = it->user, .kind = CP_SCHED_DECODE, .n = 1 }, err);
    }
    /* one request prefills at a time, the oldest: the next starts (and
     * retrieves) in the step after this one's prompt ended, so it sees what
     * this one stored, as a sequential engine would — the same plans.
     * Without a pool (prefill_many) the oldest prompts share the budget. */
    int cap = st->tokens == 0 && s->o.prefill_tokens > s->o.step_tokens ? s->o.prefill_tokens : s->o.step_tokens;
    int budget = cap - st->tokens; /* >= 1: step_tokens > max_running */
    size_t first = s->o.prefill_by_tenant && !s->o.prefill_many ? next_prefill(s) : 0;
    if (first >= s->run_n) first = 0; /* no prompt left: the loop finds none */
    for (size_t k = 0; k < s->run_n && rc == CP_OK; k++) {
        item *it = s->run[k == 0 ? first : k <= first ? k - 1 : k]; /* `first`, then the rest in order */
        if (it->prefilled == it->prompt) continue;
        int n = it->prompt - it->prefilled < budget ? it->prompt - it->prefilled : budget;
        cp_sched_work w = { .id = it->id, .user = it->user, .kind = CP_SCHED_PREFILL, .from = it->prefilled, .n = n,
                            .first = it->prefilled == 0, .last = it->prefilled + n == it->prompt };
        rc = add_work(st, &w, err);
        if (rc == CP_OK && w.first && s->o.prefill_by_tenant) note_start(s, it->tenant);
        budget -= n;
        if (!s->o.prefill_many || budget < 1) break;
    }
    return rc;
}

cp_status cp_sched_end(cp_sched *s, cp_sched_step *st, const uint8_t *finished, cp_error *err)
{
    cp_status rc = CP_OK;
    for (int j = 0; j < st->n_work && rc == CP_OK; j++) {
        const cp_sched_work *w = &st->work[j];
        size_t i = 0;
        while (i < s->run_n && s->run[i]->id != w->id) i++;
        if (i == s->run_n) continue; /* already retired */
        item *it = s->run[i];
        if (w->kind == CP_SCHED_PREFILL) {
            it->prefilled += w->n;
            if (w->last) it->generated = it->max_new > 0;
        } else {
            it->generated++;
        }
        if ((finished && finished[j]) || (it->prefilled == it->prompt && it->generated >= it->max_new)) {
            memmove(s->run + i, s->run + i + 1, (s->run_n - i - 1) * sizeof *s->run);
            s->run_n--;
            rc = retire(s, st, it, 1, err);
        }
    }
    return rc;
}

void cp_sched_step_free(cp_sched_step *st)
{
    free(st->work);
    free(st->retired);
    memset(st, 0, sizeof *st);
}

size_t cp_sched_pending(const cp_sched *s) { return s->wait_n + s->run_n; }
size_t cp_sched_running(const cp_sched *s) { return s->run_n; }
long long cp_sched_kv_used(const cp_sched *s) { return s->kv_used; }

int cp_sched_where(const cp_sched *s, uint64_t id)
{
    for (size_t i = 0; i < s->wait_n; i++)
        if (s->wait[i]->id == id) return 1;
    for (size_t i = 0; i < s->run_n; i++)
        if (s->run[i]->id == id) return 2;
    return 0;
}
