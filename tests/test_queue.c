/* The server's one queue (engine/server/queue.h) without a model or a
 * socket: arrival order, the bound and the per-tenant cap (429s), cancel
 * as one operation whatever the job's state (queued: out at once, answered,
 * its slot back; taken: handed to the engine thread once), the slot given
 * back when a taken job's answer is ready, and one round of taking bounded
 * by what was queued when it began. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../engine/server/pacer.h"
#include "../engine/server/queue.h"

static srv_job *job(uint32_t tenant)
{
    cp_error err = { 0 };
    srv_gen g = { 0 };
    srv_job *j = NULL;
    cr_assert_eq(srv_job_create(&g, tenant, &j, &err), CP_OK, "%s", err.msg);
    return j;
}

static int always(void *ctx, const srv_job *head)
{
    (void)ctx, (void)head;
    return 1;
}

static int never(void *ctx, const srv_job *head)
{
    (void)head;
    (*(int *)ctx)++;
    return 0;
}

static srv_job *take_one(srv_queue *q)
{
    size_t round = SIZE_MAX;
    return srv_queue_take(q, &round, always, NULL);
}

/* A purge of a tenant whose purge is still queued joins it instead of
 * taking a place (purges are not held to the tenant's cap, so a tenant at
 * its cap could otherwise fill the queue with them and shut the others
 * out); one of another tenant, or once the first has been taken, queues. */
Test(queue, a_second_purge_of_a_tenant_joins_the_queued_one)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(5, 2, 2, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *a = job(0), *b = job(0), *p[5], *other = job(1), *g = job(1);
    for (int i = 0; i < 5; i++) p[i] = job(0), p[i]->purge = 1, p[i]->purge_tenant = 0;
    other->purge = 1, other->purge_tenant = 1;
    cr_assert_eq(srv_queue_push(q, a), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, b), SRV_SUBMIT_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq(srv_queue_push(q, p[i]), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_pending(q), 3, "tenant 0's four purges took more than one place");
    cr_assert_null(p[0]->joined);
    for (int i = 1; i < 4; i++) cr_assert_eq(p[i]->joined, p[0], "purge %d did not join the queued one", i);
    cr_assert_eq(srv_queue_push(q, other), SRV_SUBMIT_OK);
    cr_assert_null(other->joined, "another tenant's purge joined tenant 0's");
    cr_assert_eq(srv_queue_push(q, g), SRV_SUBMIT_OK, "tenant 1 still finds room");
    cr_assert_eq(take_one(q), a, "nothing in the engine: the oldest first");
    cr_assert_eq(take_one(q), other, "tenant 1 (nothing in the engine) before tenant 0 (one)");
    cr_assert_eq(take_one(q), g);
    cr_assert_eq(take_one(q), b);
    cr_assert_eq(take_one(q), p[0]);
    cr_assert_eq(srv_queue_push(q, p[4]), SRV_SUBMIT_OK);
    cr_assert_null(p[4]->joined, "a purge joined one already taken (it may have run before this one arrived)");
    srv_queue_stop(q);
    srv_queue_free(q);
    srv_job_unref(a), srv_job_unref(b), srv_job_unref(other), srv_job_unref(g);
    for (int i = 0; i < 5; i++) srv_job_unref(p[i]);
}

/* A purge asked for after one of the tenant's requests that waits behind
 * an earlier queued purge does not join that purge: it would answer before
 * the request ran and stored, and the request's text would outlive the
 * erasure its tenant was told was done.  It queues after the request (and
 * a purge after it joins the new one). */
Test(queue, a_purge_never_joins_one_queued_before_the_tenants_later_request)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(8, 2, 4, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *p1 = job(0), *r = job(0), *p2 = job(2), *p3 = job(0), *g = job(1);
    p1->purge = 1, p1->purge_tenant = 0;
    p2->purge = 1, p2->purge_tenant = 0; /* the operator's (tenant 2's) purge of tenant 0 */
    p3->purge = 1, p3->purge_tenant = 0;
    cr_assert_eq(srv_queue_push(q, p1), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, r), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, g), SRV_SUBMIT_OK); /* another tenant's request does not matter */
    cr_assert_eq(srv_queue_push(q, p2), SRV_SUBMIT_OK);
    cr_assert_null(p2->joined, "a purge joined one queued before the tenant's request");
    cr_assert_eq(srv_queue_push(q, p3), SRV_SUBMIT_OK);
    cr_assert_eq(p3->joined, p2, "a purge with nothing of the tenant's between did not join the last one");
    cr_assert_eq(take_one(q), p1);
    cr_assert_eq(take_one(q), r);
    cr_assert_eq(take_one(q), g);
    cr_assert_eq(take_one(q), p2, "the second purge does not run after the request it followed");
    srv_queue_stop(q);
    srv_queue_free(q);
    srv_job_unref(p1), srv_job_unref(r), srv_job_unref(p2), srv_job_unref(p3), srv_job_unref(g);
}

/* Purges that cannot join (each after one of its tenant's requests) take
 * places, but not the last eighth: that stays for a tenant with nothing
 * queued, so tenants alternating requests and purges cannot fill the queue
 * against a newcomer (they did: 64 of 64, the newcomer's first request 429). */
Test(queue, purges_between_requests_leave_the_last_eighth_to_a_newcomer)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(16, 0, 3, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *j[16];
    int n = 0;
    for (; n < 14; n++) {
        j[n] = job((uint32_t)(n / 2 % 2)); /* tenants 0 and 1: request, purge, request, purge ... */
        if (n % 2 && n < 13) j[n]->purge = 1, j[n]->purge_tenant = j[n]->tenant; /* the last a request of tenant 0 */
        cr_assert_eq(srv_queue_push(q, j[n]), SRV_SUBMIT_OK, "job %d", n);
        cr_assert_null(j[n]->joined);
    }
    j[n] = job(0), j[n]->purge = 1, j[n]->purge_tenant = 0;
    cr_assert_eq(srv_queue_push(q, j[n]), SRV_SUBMIT_FULL, "a purge of a tenant with requests queued took the last eighth");
    n++;
    j[n] = job(2);
    cr_assert_eq(srv_queue_push(q, j[n]), SRV_SUBMIT_OK, "a newcomer's first request was turned away");
    n++;
    srv_queue_stop(q);
    srv_queue_free(q);
    for (int i = 0; i < n; i++) srv_job_unref(j[i]);
}

/* A tenant's jobs leave in arrival order, the tenant with fewer
 * generations in the engine first; a full queue, a tenant at its cap, a tenant past the
 * key table and a closed queue refuse at once, and a purge does not count
 * against its tenant's cap. */
Test(queue, each_tenant_in_arrival_order_and_every_refusal)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(0, 0, 2, NULL, &q, &err), CP_ERANGE);
    cr_assert_eq(srv_queue_create(4, 2, 2, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *a = job(0), *b = job(1), *c = job(0), *d = job(0), *e = job(5), *p = job(0), *f = job(1);
    p->purge = 1, p->purge_tenant = 0;
    cr_assert_eq(srv_queue_push(q, a), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, b), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, c), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, d), SRV_SUBMIT_TENANT_FULL, "tenant 0 has 2 of 2 queued");
    cr_assert_eq(srv_queue_push(q, e), SRV_SUBMIT_TENANT_FULL, "a tenant past the key table is refused (fail closed)");
    cr_assert_eq(srv_queue_push(q, p), SRV_SUBMIT_OK, "a purge is not one of the tenant's generations");
    cr_assert_eq(srv_queue_push(q, f), SRV_SUBMIT_FULL, "4 of 4 places taken");
    cr_assert_eq(srv_queue_pending(q), 4);
    srv_job *want[4] = { a, b, c, p }; /* a first (nothing taken yet), then b: tenant 1 had none in the engine */
    for (int i = 0; i < 4; i++) {
        srv_job *t = take_one(q);
        cr_assert_eq(t, want[i], "place %d: another job", i);
        cr_assert_eq(srv_job_wait_ms(t, SRV_JOB_RUNNING, 0), t->purge ? SRV_JOB_QUEUED : SRV_JOB_RUNNING, "a taken generation is started");
    }
    cr_assert_null(take_one(q));
    cr_assert_eq(srv_queue_pending(q), 4, "taken jobs count until answered");
    /* tenant 0 has a and c taken: still at its cap until one is released */
    cr_assert_eq(srv_queue_push(q, d), SRV_SUBMIT_TENANT_FULL);
    srv_queue_release(q, a);
    cr_assert_eq(srv_queue_push(q, d), SRV_SUBMIT_OK, "a's slot came back with its answer");
    srv_queue_done(q, a), srv_queue_done(q, b), srv_queue_done(q, c), srv_queue_done(q, p);
    cr_assert_eq(srv_queue_pending(q), 1);
    srv_queue_close(q);
    cr_assert_eq(srv_queue_push(q, f), SRV_SUBMIT_CLOSED);
    cr_assert_eq(take_one(q), d, "a closed queue still hands out what it accepted");
    srv_queue_done(q, d);
    srv_queue_stop(q);
    cr_assert_eq(srv_queue_wait(q), 0, "stopped and drained");
    srv_queue_free(q);
    srv_job *mine[7] = { a, b, c, d, e, p, f };
    for (int i = 0; i < 7; i++) srv_job_unref(mine[i]);
}

/* A queued job whose client left is out at once: answered as cancelled,
 * its place and its tenant's slot free, the others still in order, and it
 * is never handed to the engine. */
Test(queue, cancel_while_queued_frees_the_place_and_the_slot)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(2, 1, 2, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *a = job(0), *b = job(1), *c = job(0);
    cr_assert_eq(srv_queue_push(q, a), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, b), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, c), SRV_SUBMIT_FULL);
    srv_queue_cancel(q, a);
    cr_assert_eq(srv_job_wait_ms(a, SRV_JOB_DONE, 0), SRV_JOB_DONE, "the leaver is answered at once");
    cr_assert(a->cancelled && a->rc != CP_OK);
    cr_assert_null(srv_queue_next_cancelled(q), "a job that never ran is nothing for the engine to retire");
    cr_assert_eq(srv_queue_pending(q), 1);
    cr_assert_eq(srv_queue_push(q, c), SRV_SUBMIT_OK, "its place and tenant 0's slot are free");
    cr_assert_eq(take_one(q), b);
    cr_assert_eq(take_one(q), c);
    srv_queue_done(q, b), srv_queue_done(q, c);
    srv_queue_free(q);
    srv_job_unref(a), srv_job_unref(b), srv_job_unref(c);
}

/* A taken job whose client left goes to the engine thread once, however
 * often its client is seen leaving; an answered one does not; a job
 * flagged outside the queue is dropped at the take, never run. */
Test(queue, cancel_of_a_taken_job_reaches_the_engine_once)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(4, 0, 2, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *a = job(0), *b = job(1), *c = job(1);
    cr_assert_eq(srv_queue_push(q, a), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, b), SRV_SUBMIT_OK);
    cr_assert_eq(take_one(q), a);
    srv_queue_cancel(q, a);
    srv_queue_cancel(q, a);
    cr_assert_eq(srv_queue_next_cancelled(q), a);
    cr_assert_null(srv_queue_next_cancelled(q), "handed over twice");
    srv_job_unref(a); /* the reference next_cancelled gave */
    cr_assert_eq(take_one(q), b);
    srv_job_set_state(b, SRV_JOB_DONE);
    srv_queue_cancel(q, b);
    cr_assert_null(srv_queue_next_cancelled(q), "an answered job has nothing left to stop");
    cr_assert_eq(srv_queue_push(q, c), SRV_SUBMIT_OK);
    srv_job_cancel(c);
    cr_assert_null(take_one(q), "a cancelled job was handed out");
    cr_assert_eq(srv_job_wait_ms(c, SRV_JOB_DONE, 0), SRV_JOB_DONE);
    cr_assert_eq(srv_queue_pending(q), 2);
    srv_queue_done(q, a), srv_queue_done(q, b);
    cr_assert_eq(srv_queue_pending(q), 0);
    srv_queue_free(q);
    srv_job_unref(a), srv_job_unref(b), srv_job_unref(c);
}

/* may: every generation; a purge unless its tenant is *ctx */
static int purge_waits_for(void *ctx, const srv_job *j)
{
    return !j->purge || j->purge_tenant != *(const uint32_t *)ctx;
}

/* A purge waiting for its tenant's requests in flight lets the other
 * tenants' requests behind it start (before, it held them all: one tenant
 * interleaving purges made every other tenant's requests wait for its
 * generations), never its own tenant's; once it may run it is next, and
 * its tenant's requests follow in order. */
Test(queue, a_waiting_purge_lets_other_tenants_pass_never_its_own)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(8, 0, 3, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *p = job(0), *g1 = job(1), *g0 = job(0), *g2 = job(2), *p2 = job(2), *g2b = job(2);
    p->purge = 1, p->purge_tenant = 0;
    p2->purge = 1, p2->purge_tenant = 2;
    srv_job *order[6] = { p, g1, g0, g2, p2, g2b };
    for (int i = 0; i < 6; i++) cr_assert_eq(srv_queue_push(q, order[i]), SRV_SUBMIT_OK);
    uint32_t busy = 0; /* tenant 0 has requests in flight: its purge waits */
    size_t round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, purge_waits_for, &busy), g1, "tenant 1's request waited behind tenant 0's purge");
    cr_assert_eq(srv_queue_take(q, &round, purge_waits_for, &busy), g2, "tenant 2's request waited behind tenant 0's purge");
    cr_assert_eq(srv_queue_take(q, &round, purge_waits_for, &busy), p2, "tenant 2's purge (may run) waited");
    cr_assert_eq(srv_queue_take(q, &round, purge_waits_for, &busy), g2b);
    cr_assert_null(srv_queue_take(q, &round, purge_waits_for, &busy), "tenant 0's request passed its own waiting purge");
    busy = 99; /* tenant 0's requests in flight are done */
    round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, purge_waits_for, &busy), p);
    cr_assert_eq(srv_queue_take(q, &round, purge_waits_for, &busy), g0);
    for (int i = 0; i < 6; i++) srv_queue_done(q, order[i]);
    srv_queue_free(q);
    for (int i = 0; i < 6; i++) srv_job_unref(order[i]);
}

/* The head that may not start holds everything behind it (first come,
 * first served), and a round takes at most what was queued when it began. */
Test(queue, a_round_is_bounded_and_the_head_holds_the_rest)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(8, 0, 1, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *v[4];
    for (int i = 0; i < 4; i++) v[i] = job(0);
    cr_assert_eq(srv_queue_push(q, v[0]), SRV_SUBMIT_OK);
    cr_assert_eq(srv_queue_push(q, v[1]), SRV_SUBMIT_OK);
    int asked = 0;
    size_t round = SIZE_MAX;
    cr_assert_null(srv_queue_take(q, &round, never, &asked));
    cr_assert_eq(asked, 1, "only the head is asked");
    cr_assert_eq(srv_queue_pending(q), 2);
    round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), v[0]);
    cr_assert_eq(srv_queue_push(q, v[2]), SRV_SUBMIT_OK); /* arrives during the round */
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), v[1]);
    cr_assert_null(srv_queue_take(q, &round, always, NULL), "the round took a job queued after it began");
    round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), v[2]);
    for (int i = 0; i < 3; i++) srv_queue_done(q, v[i]);
    srv_queue_free(q);
    for (int i = 0; i < 4; i++) srv_job_unref(v[i]);
}

/* may: every job but tenant *ctx's, whose jobs wait while the others pass */
static int tenant_waits(void *ctx, const srv_job *j)
{
    return j->tenant == *(const uint32_t *)ctx ? SRV_MAY_WAIT_TENANT : SRV_MAY_START;
}

/* Between tenants the one with the fewest generations in the engine goes
 * first, whatever the arrival order and however many each has queued (ties:
 * the older job): places in flight alternate between tenants with work
 * waiting, and a job told to wait for its tenant lets the other tenants'
 * jobs pass, never its own tenant's later ones.  Before, the oldest job
 * went first (a request behind one tenant's backlog waited for all of it);
 * and ranked by queued + taken, a tenant keeping one request fewer queued
 * than another took three quarters of the places. */
Test(queue, places_alternate_between_tenants_each_in_its_own_order)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(16, 0, 3, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *a1 = job(0), *a2 = job(0), *a3 = job(0), *a4 = job(0), *b1 = job(1), *b2 = job(1), *c1 = job(2);
    srv_job *order[6] = { a1, a2, a3, a4, b1, b2 };
    for (int i = 0; i < 6; i++) cr_assert_eq(srv_queue_push(q, order[i]), SRV_SUBMIT_OK);
    size_t round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), a1, "nothing in the engine: the oldest");
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), b1, "tenant 1 (none in the engine) waited behind tenant 0's backlog");
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), a2, "one each in the engine: the older");
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), b2, "tenant 1 (one in the engine) after tenant 0 (two)");
    cr_assert_eq(srv_queue_push(q, c1), SRV_SUBMIT_OK);
    round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), c1, "a newcomer waited behind the others' backlogs");
    srv_queue_release(q, a1), srv_queue_release(q, a2); /* answered: tenant 0 has none in the engine */
    uint32_t waiting = 0;
    srv_job *b3 = job(1);
    cr_assert_eq(srv_queue_push(q, b3), SRV_SUBMIT_OK);
    round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, tenant_waits, &waiting), b3, "a tenant told to wait held another tenant's job");
    cr_assert_null(srv_queue_take(q, &round, tenant_waits, &waiting), "a waiting tenant's later job passed its older one");
    round = SIZE_MAX;
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), a3);
    cr_assert_eq(srv_queue_take(q, &round, always, NULL), a4);
    srv_job *all[8] = { a1, a2, a3, a4, b1, b2, c1, b3 };
    for (int i = 0; i < 8; i++) srv_queue_done(q, all[i]);
    srv_queue_free(q);
    for (int i = 0; i < 8; i++) srv_job_unref(all[i]);
}

/* The last eighth of the queue takes only a tenant's first queued
 * generation: tenants each under their cap but together filling the queue
 * cannot turn a newcomer's first request away. */
Test(queue, the_last_eighth_is_for_a_tenant_with_nothing_queued)
{
    cp_error err = { 0 };
    srv_queue *q = NULL;
    cr_assert_eq(srv_queue_create(8, 0, 3, NULL, &q, &err), CP_OK, "%s", err.msg);
    srv_job *v[10];
    for (int i = 0; i < 10; i++) v[i] = job(i < 7 ? i % 2 : 2);
    for (int i = 0; i < 7; i++) cr_assert_eq(srv_queue_push(q, v[i]), SRV_SUBMIT_OK, "place %d", i);
    srv_job *more = job(0);
    cr_assert_eq(srv_queue_push(q, more), SRV_SUBMIT_FULL, "tenant 0, with requests queued, took the last eighth");
    cr_assert_eq(srv_queue_push(q, v[7]), SRV_SUBMIT_OK, "tenant 2's first request was turned away");
    cr_assert_eq(srv_queue_push(q, v[8]), SRV_SUBMIT_FULL, "a full queue");
    srv_queue_stop(q);
    srv_queue_free(q);
    for (int i = 0; i < 10; i++) srv_job_unref(v[i]);
    srv_job_unref(more);
}

/* Admission takes turns with the steps while requests are in flight: after
 * an admission of 50 ms, none until the steps since have taken 50 ms; with
 * nothing in flight admission is free and owes nothing after. */
Test(queue, admission_waits_for_steps_as_long_as_itself_while_requests_run)
{
    srv_pacer p = { 0 };
    cr_assert(srv_pacer_may_admit(&p, 1), "nothing owed: a job may be admitted");
    srv_pacer_admitted(&p, 1, 50);
    cr_assert_not(srv_pacer_may_admit(&p, 1), "admitted again right after 50 ms of admission");
    cr_assert(srv_pacer_may_admit(&p, 0), "nothing in flight: nothing to pace");
    srv_pacer_stepped(&p, 20);
    cr_assert_not(srv_pacer_may_admit(&p, 1), "20 ms of steps repaid 50 ms of admission");
    srv_pacer_stepped(&p, 30);
    cr_assert(srv_pacer_may_admit(&p, 1), "50 ms of steps did not repay 50 ms of admission");
    srv_pacer_stepped(&p, 500);
    srv_pacer_admitted(&p, 1, 10);
    cr_assert_not(srv_pacer_may_admit(&p, 1), "steps banked credit for later admissions");
    srv_pacer_admitted(&p, 0, 80);
    cr_assert(srv_pacer_may_admit(&p, 1), "an admission with nothing in flight left a debt");
}
