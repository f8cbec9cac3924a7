/* The --admit-k table: which distinct tenants produced a token sequence
 * (keyed by its SHA-256), so a segment is shared only once k of them did.
 * What it records never reaches a tenant's figures (THREAT_MODEL.md, "The
 * rule": not the admission state of segments). */
#ifndef CP_CACHE_ADMISSION_H
#define CP_CACHE_ADMISSION_H

#include <stddef.h>
#include <stdint.h>

typedef struct cp_admit_entry {
    uint64_t key; /* 0 = empty */
    uint32_t tenants[8];
    int n;
} cp_admit_entry;

typedef struct cp_admission {
    int k; /* [1, 8]; 1: every sequence is admitted, nothing is recorded */
    cp_admit_entry *v;
    size_t cap, n;
} cp_admission;

/* Records that tenant produced t[0, n); 1 once k distinct tenants have (0
 * when it cannot record: out of memory does not share). */
int cp_admission_record(cp_admission *a, uint32_t tenant, const int32_t *t, int n);
/* Forgets that tenant produced anything; returns the records it left. */
size_t cp_admission_forget(cp_admission *a, uint32_t tenant);
void cp_admission_free(cp_admission *a);

#endif
