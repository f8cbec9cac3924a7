/* Admission pacing on the engine thread: taking a new job (handing it to
 * the preparing thread, which renders, tokenizes and detects it; what is
 * left here is the queue's choice and the hand-off) and the steps of the
 * requests in flight take turns.  While any is in flight, a
 * job is admitted only once the steps since the last admission have taken
 * as long as the admissions before them, so the requests in flight keep at
 * least half the engine thread whatever arrives.  With nothing in flight
 * there is nothing to pace: admission runs freely and owes nothing. */
#ifndef CP_SRV_PACER_H
#define CP_SRV_PACER_H

typedef struct srv_pacer {
    double debt_ms; /* admission time the steps have not yet matched */
} srv_pacer;

/* May the engine thread admit now?  busy: requests are in flight. */
static inline int srv_pacer_may_admit(const srv_pacer *p, int busy) { return !busy || p->debt_ms <= 0; }

/* Admission took ms (busy: while requests were in flight). */
static inline void srv_pacer_admitted(srv_pacer *p, int busy, double ms) { p->debt_ms = busy ? p->debt_ms + ms : 0; }

/* A step took ms. */
static inline void srv_pacer_stepped(srv_pacer *p, double ms) { p->debt_ms = p->debt_ms > ms ? p->debt_ms - ms : 0; }

#endif
