/* The step scheduler's rules with fake requests (no model): a randomized
 * 10 000-step simulation with arrivals, early finishes and cancellations,
 * checking after every step the invariants the scheduler promises — strict
 * FIFO admission, the step's token budget, one decode token per decoding
 * request, contiguous prefill chunks, the KV budget,
 * every request retired exactly once with its pins released, a cancelled
 * request freeing everything and getting no more work. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/batch/step_sched.h"

typedef struct fake {
    uint64_t id;
    int arrival; /* index in arrival order */
    uint32_t tenant;
    int prompt, max_new, prefilled, generated;
    int submitted_at, retired_at, cancelled_at;
    int pins;    /* taken at the first chunk (retrieval), given back at retirement */
    int retired, cancelled;
} fake;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

#define MAXF 20000

typedef struct sim {
    cp_sched_opts o;
    cp_sched *s;
    cp_sched_step st;
    fake *f;
    int n, last_first_arrival, max_wait;
    int kv_tight; /* steps whose reservations came within 90 % of the budget: the budget was exercised */
    int big_steps; /* all-prefill steps past step_tokens: prefill_tokens was exercised */
} sim;

static void on_retired(sim *m, int from, int step)
{
    for (int k = from; k < m->st.n_retired; k++) {
        fake *x = m->st.retired[k];
        cr_assert(!x->retired, "request %d retired twice", x->arrival);
        x->retired = 1, x->retired_at = step;
        x->pins = 0; /* the caller releases them here; the check is that this happens for everyone */
        cr_assert_eq(cp_sched_where(m->s, x->id), 0, "a retired request is still held");
    }
}

/* every invariant that holds between steps */
static void check_state(sim *m)
{
    long long kv = 0;
    int running = 0;
    for (int i = 0; i < m->n; i++) {
        fake *x = &m->f[i];
        int where = cp_sched_where(m->s, x->id);
        cr_assert_eq(where == 0, x->retired, "request %d: held %d, retired %d", i, where, x->retired);
        if (where == 2) kv += x->prompt + x->max_new, running++;
        if (where == 1) cr_assert_eq(x->prefilled, 0, "a queued request was prefilled");
    }
    cr_assert_eq(cp_sched_kv_used(m->s), kv, "KV accounting %lld, the running requests reserve %lld", cp_sched_kv_used(m->s), kv);
    cr_assert(kv <= m->o.kv_budget, "KV %lld over the budget %lld", kv, m->o.kv_budget);
    m->kv_tight += kv * 10 >= m->o.kv_budget * 9;
    cr_assert(running <= m->o.max_running);
}

static void one_step(sim *m, int step)
{
    cp_error err = { 0 };
    cr_assert_eq(cp_sched_next(m->s, &m->st, &err), CP_OK, "%s", err.msg);
    on_retired(m, 0, step);
    int planned = m->st.n_retired;
    for (int k = 0; k < m->st.n_retired; k++) { /* only cancelled ones retire here */
        fake *x = m->st.retired[k];
        cr_assert(x->cancelled, "request %d retired at planning without being cancelled", x->arrival);
    }
    check_state(m);
    int decodes = 0;
    for (int j = 0; j < m->st.n_work; j++) decodes += m->st.work[j].kind == CP_SCHED_DECODE;
    /* the budget: step_tokens while anyone decodes, prefill_tokens when the step is all prefill */
    int cap = decodes ? m->o.step_tokens : m->o.prefill_tokens;
    cr_assert(m->st.tokens <= cap, "step %d carries %d tokens (%d decoding)", step, m->st.tokens, decodes);
    m->big_steps += m->st.tokens > m->o.step_tokens;
    int sum = 0;
    uint8_t *fin = calloc((size_t)m->st.n_work + 1, 1);
    static uint8_t seen[MAXF], want[MAXF], prompt_left[MAXF];
    memset(seen, 0, (size_t)m->n);
    for (int i = 0; i < m->n; i++) {
        fake *x = &m->f[i];
        want[i] = cp_sched_where(m->s, x->id) == 2 && x->prefilled == x->prompt && x->generated < x->max_new;
        prompt_left[i] = cp_sched_where(m->s, x->id) == 2 && x->prefilled < x->prompt;
    }
    for (int j = 0; j < m->st.n_work; j++) {
        const cp_sched_work *w = &m->st.work[j];
        fake *x = w->user;
        sum += w->n;
        cr_assert(!x->retired && !x->cancelled, "work for a retired or cancelled request %d", x->arrival);
        cr_assert(!seen[x->arrival], "request %d has two pieces of work in one step", x->arrival);
        seen[x->arrival] = 1;
        if (w->kind == CP_SCHED_PREFILL) {
            cr_assert(w->n >= 1 && w->from == x->prefilled && w->from + w->n <= x->prompt, "chunk [%d, +%d) after %d of %d", w->from,
                      w->n, x->prefilled, x->prompt);
            cr_assert_eq(w->first, x->prefilled == 0);
            cr_assert_eq(w->last, w->from + w->n == x->prompt);
            if (w->first) { /* retrieval: pins taken; first chunks come in arrival order */
                cr_assert(x->arrival > m->last_first_arrival, "request %d started before %d (not FIFO)", x->arrival,
                          m->last_first_arrival);
                m->last_first_arrival = x->arrival;
                x->pins = 1 + (int)rnd(3);
                int wait = step - x->submitted_at;
                if (wait > m->max_wait) m->max_wait = wait;
            }
            x->prefilled += w->n;
            if (w->last) x->generated = x->max_new > 0;
        } else {
            cr_assert(x->prefilled == x->prompt && x->generated < x->max_new && w->n == 1, "decode for request %d out of turn", x->arrival);
            x->generated++;
        }
        fin[j] = rnd(40) == 0; /* an end of sequence, a stop string */
    }
    cr_assert_eq(sum, m->st.tokens);
    int prefills = 0;
    for (int j = 0; j < m->st.n_work; j++) prefills += m->st.work[j].kind == CP_SCHED_PREFILL;
    cr_assert(prefills <= 1 || m->o.prefill_many, "step %d: %d requests prefill (one at a time: the next retrieves after the one before stored)", step,
              prefills);
    for (int i = 0; m->o.prefill_many && i < m->n; i++) /* without a pool: a prompt waits only when the budget is spent */
        cr_assert(!prompt_left[i] || seen[i] || m->st.tokens == cap,
                  "step %d: request %d has prompt left and got nothing, with %d of %d tokens used", step, i, m->st.tokens, cap);
    for (int i = 0; i < m->n; i++) cr_assert(!want[i] || seen[i], "decoding request %d got no token this step", i);
    cr_assert_eq(cp_sched_end(m->s, &m->st, fin, &err), CP_OK, "%s", err.msg);
    for (int k = planned; k < m->st.n_retired; k++) { /* finished: max_new reached or the caller said so */
        fake *x = m->st.retired[k];
        cr_assert(!x->cancelled && (x->prefilled == x->prompt || x->prefilled > 0), "request %d retired from no work", x->arrival);
    }
    on_retired(m, planned, step);
    free(fin);
    check_state(m);
}

static void simulate(int prefill_many, int steps)
{
    sim m = { .o = { .step_tokens = 48, .prefill_tokens = 160, .kv_budget = 600, .max_running = 8,
                     .prefill_many = prefill_many },
              .last_first_arrival = -1 };
    cp_error err = { 0 };
    cr_assert_eq(cp_sched_create(&m.o, &m.s, &err), CP_OK, "%s", err.msg);
    m.f = calloc(MAXF, sizeof *m.f);
    int cancels = 0;
    for (int step = 0; step < steps; step++) {
        int arrivals = rnd(10) == 0 ? 1 + (int)rnd(3) : 0;
        for (int a = 0; a < arrivals && m.n < MAXF; a++) {
            fake *x = &m.f[m.n];
            *x = (fake){ .arrival = m.n, .tenant = rnd(5), .prompt = 1 + (int)rnd(rnd(4) == 0 ? 400 : 60), .max_new = (int)rnd(30),
                         .submitted_at = step, .retired_at = -1, .cancelled_at = -1 };
            cr_assert_eq(cp_sched_submit(m.s, x->tenant, x->prompt, x->max_new, x, &x->id, &err), CP_OK, "%s", err.msg);
            m.n++;
        }
        if (m.n && rnd(8) == 0) { /* a client goes away, queued or running */
            fake *x = &m.f[m.n - 1 - (int)rnd(m.n < 30 ? (uint32_t)m.n : 30)]; /* a recent one: likely still held */
            int held = cp_sched_where(m.s, x->id) != 0;
            cr_assert_eq(cp_sched_cancel(m.s, x->id), held && !x->cancelled ? 1 : held);
            if (held && !x->cancelled) x->cancelled = 1, x->cancelled_at = step, cancels++;
        }
        one_step(&m, step);
        for (int i = 0; i < m.n; i++) /* a cancelled request is gone after the next step's planning */
            if (m.f[i].cancelled) cr_assert(m.f[i].retired, "request %d cancelled at step %d still held", i, m.f[i].cancelled_at);
    }
    int drain = 0;
    while (cp_sched_pending(m.s) && drain < 5000) one_step(&m, steps + drain++);
    cr_assert_eq(cp_sched_pending(m.s), 0, "requests left after draining");
    int pins = 0;
    for (int i = 0; i < m.n; i++) {
        cr_assert(m.f[i].retired, "request %d never retired (starved)", i);
        pins += m.f[i].pins;
    }
    cr_assert_eq(pins, 0, "pins held after everything retired");
    cr_assert_eq(cp_sched_kv_used(m.s), 0);
    cr_assert(m.n > 1500 * steps / 10000 && cancels > 100 * steps / 10000 && m.kv_tight > 100 * steps / 10000 && m.big_steps > 20 * steps / 10000,
              "the simulation exercised %d requests, %d cancels, %d steps near the KV budget, %d all-prefill steps past step_tokens",
              m.n, cancels, m.kv_tight, m.big_steps);
    cr_log_info("scheduler simulation: %d requests, %d cancelled, %d checks near the KV budget, longest wait for a first chunk %d steps, "
                "drained in %d",
                m.n, cancels, m.kv_tight, m.max_wait, drain);
    cp_sched_step_free(&m.st);
    cp_sched_free(m.s);
    free(m.f);
}

Test(batch, sched_simulation_10000_steps, .timeout = 60) { simulate(0, 10000); }

/* an engine without a pool lets several prompts share a step: the same
 * invariants, and a prompt left waiting only when the budget is spent */
Test(batch, sched_simulation_prefill_many, .timeout = 60) { simulate(1, 5000); }

/* What can never run is refused at once; a budget that cannot carry one
 * decode token per request in flight is refused at creation. */
Test(batch, sched_refuses_what_cannot_run)
{
    cp_error err = { 0 };
    cp_sched *s = NULL;
    cp_sched_opts bad = { .step_tokens = 8, .kv_budget = 100, .max_running = 8 };
    cr_assert_eq(cp_sched_create(&bad, &s, &err), CP_EINVAL);
    cp_sched_opts o = { .step_tokens = 16, .kv_budget = 100, .max_running = 4 };
    cr_assert_eq(cp_sched_create(&o, &s, &err), CP_OK, "%s", err.msg);
    uint64_t id;
    cr_assert_eq(cp_sched_submit(s, 0, 90, 11, NULL, &id, &err), CP_ERANGE);
    cr_assert_eq(cp_sched_submit(s, 0, 0, 1, NULL, &id, &err), CP_EINVAL);
    cr_assert_eq(cp_sched_submit(s, 0, 90, 10, NULL, &id, &err), CP_OK);
    cp_sched_free(s);
}

/* A long prompt is cut into chunks under the budget while the others keep
 * decoding: exact chunk sizes from the rule (decode first, then prefill
 * oldest first with what is left). */
Test(batch, sched_chunks_prefill_under_the_budget)
{
    cp_error err = { 0 };
    cp_sched *s = NULL;
    cp_sched_opts o = { .step_tokens = 10, .kv_budget = 1000, .max_running = 4 };
    cr_assert_eq(cp_sched_create(&o, &s, &err), CP_OK, "%s", err.msg);
    int a = 0, b = 1;
    cr_assert_eq(cp_sched_submit(s, 0, 3, 5, &a, NULL, &err), CP_OK);
    cp_sched_step st = { 0 };
    cr_assert_eq(cp_sched_next(s, &st, &err), CP_OK);
    cr_assert_eq(st.n_work, 1);
    cr_assert(st.work[0].kind == CP_SCHED_PREFILL && st.work[0].n == 3 && st.work[0].first && st.work[0].last);
    cr_assert_eq(cp_sched_end(s, &st, NULL, &err), CP_OK);
    cr_assert_eq(cp_sched_submit(s, 1, 25, 2, &b, NULL, &err), CP_OK);
    int expect[] = { 9, 9, 7 }; /* 10 a step, one of them a's decode token */
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(cp_sched_next(s, &st, &err), CP_OK);
        cr_assert_eq(st.n_work, 2);
        cr_assert(st.work[0].kind == CP_SCHED_DECODE && st.work[0].user == &a);
        cr_assert(st.work[1].kind == CP_SCHED_PREFILL && st.work[1].user == &b && st.work[1].n == expect[k], "step %d: chunk %d", k,
                  st.work[1].n);
        cr_assert_eq(st.work[1].last, k == 2);
        cr_assert_eq(cp_sched_end(s, &st, NULL, &err), CP_OK);
    }
    /* a: 1 token from its prefill + 3 decoded = 4 of 5; b: its first token */
    cr_assert_eq(cp_sched_next(s, &st, &err), CP_OK);
    cr_assert_eq(st.n_work, 2);
    cr_assert_eq(cp_sched_end(s, &st, NULL, &err), CP_OK);
    cr_assert_eq(st.n_retired, 2, "a reached 5 tokens, b its 2");
    cr_assert_eq(cp_sched_pending(s), 0);
    cp_sched_step_free(&st);
    cp_sched_free(s);
}

/* A step in which nobody decodes carries up to prefill_tokens of prompt
 * (nobody's next token waits on it); once a request decodes, its steps go
 * back to step_tokens.  Exact chunks from the rule, with one prompt at a
 * time (a pool) and with several (none): a (30 prompt tokens) then b (25). */
static void big_first_step(int many, const int *want_tokens, const int *want_b, int n_steps)
{
    cp_error err = { 0 };
    cp_sched *s = NULL;
    cp_sched_opts o = { .step_tokens = 10, .prefill_tokens = 40, .kv_budget = 1000, .max_running = 4, .prefill_many = many };
    cr_assert_eq(cp_sched_create(&o, &s, &err), CP_OK, "%s", err.msg);
    int a = 0, b = 1;
    cr_assert_eq(cp_sched_submit(s, 0, 30, 5, &a, NULL, &err), CP_OK);
    cr_assert_eq(cp_sched_submit(s, 1, 25, 2, &b, NULL, &err), CP_OK);
    cp_sched_step st = { 0 };
    for (int k = 0; k < n_steps; k++) {
        cr_assert_eq(cp_sched_next(s, &st, &err), CP_OK);
        int nb = 0;
        for (int j = 0; j < st.n_work; j++)
            if (st.work[j].user == &b) nb = st.work[j].n;
        if (k == 0) cr_assert(st.work[0].user == &a && st.work[0].n == 30 && st.work[0].last, "a's whole prompt in step 0 (%d)", st.work[0].n);
        cr_assert_eq(st.tokens, want_tokens[k], "step %d carries %d tokens, not %d", k, st.tokens, want_tokens[k]);
        cr_assert_eq(nb, want_b[k], "step %d: b's chunk is %d, not %d", k, nb, want_b[k]);
        cr_assert_eq(cp_sched_end(s, &st, NULL, &err), CP_OK);
    }
    cp_sched_step_free(&st);
    cp_sched_free(s);
}

Test(batch, sched_all_prefill_step_takes_prefill_tokens)
{
    /* none: b shares step 0 (40 - 30), then 10 - a's decode token a step */
    big_first_step(1, (const int[]){ 40, 10, 7 }, (const int[]){ 10, 9, 6 }, 3);
    /* a pool: b starts after a's last chunk, a decoding beside it from then on */
    big_first_step(0, (const int[]){ 30, 10, 10, 8 }, (const int[]){ 0, 9, 9, 7 }, 4);
}

/* The order prompts start prefilling in, one at a time: the oldest
 * (run: a replay's plans are a sequential engine's), or with
 * prefill_by_tenant (serve) the oldest of the tenant with the fewest
 * started -- tenant 0's four prompts admitted before tenant 1's one no
 * longer all prefill before it: its first token waited for every one. */
static void prefill_starts(int by_tenant, const int *want)
{
    cp_error err = { 0 };
    cp_sched *s = NULL;
    cp_sched_opts o = { .step_tokens = 10, .kv_budget = 1000, .max_running = 8, .prefill_by_tenant = by_tenant };
    cr_assert_eq(cp_sched_create(&o, &s, &err), CP_OK, "%s", err.msg);
    int tag[5] = { 0, 1, 2, 3, 4 }; /* 0-3 tenant 0's, 4 tenant 1's, in arrival order */
    for (int i = 0; i < 5; i++) cr_assert_eq(cp_sched_submit(s, i < 4 ? 0 : 1, 12, 50, &tag[i], NULL, &err), CP_OK);
    cp_sched_step st = { 0 };
    int started = 0, current = -1;
    for (int step = 0; step < 200 && started < 5; step++) {
        cr_assert_eq(cp_sched_next(s, &st, &err), CP_OK);
        int prefills = 0;
        for (int j = 0; j < st.n_work; j++) {
            const cp_sched_work *w = &st.work[j];
            if (w->kind != CP_SCHED_PREFILL) continue;
            prefills++;
            const int who = *(const int *)w->user;
            if (w->first) {
                cr_assert_eq(current, -1, "step %d: prompt %d started while %d was mid-prefill", step, who, current);
                cr_assert_eq(who, want[started], "start %d: prompt %d, not %d", started, who, want[started]);
                started++;
            } else {
                cr_assert_eq(who, current, "step %d: prompt %d went on, %d was mid-prefill", step, who, current);
            }
            current = w->last ? -1 : who;
        }
        cr_assert_leq(prefills, 1, "one prompt prefills at a time");
        cr_assert_eq(cp_sched_end(s, &st, NULL, &err), CP_OK);
    }
    cr_assert_eq(started, 5);
    cp_sched_step_free(&st);
    cp_sched_free(s);
}

Test(batch, sched_starts_prefills_oldest_first_or_by_tenant)
{
    static const int oldest[] = { 0, 1, 2, 3, 4 }, by_tenant[] = { 0, 4, 1, 2, 3 };
    prefill_starts(0, oldest);
    prefill_starts(1, by_tenant);
}
