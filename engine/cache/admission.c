/* The --admit-k table (see admission.h). */
#include "admission.h"

#include <stdlib.h>
#include <string.h>

#include "../../kernels/sha256.h"

int cp_admission_record(cp_admission *e, uint32_t tenant, const int32_t *t, int n)
{
    if (e->k <= 1) return 1;
    uint8_t sha[32];
    const void *parts[1] = { t };
    size_t lens[1] = { (size_t)n * sizeof *t };
    cp_sha256(parts, lens, 1, sha);
    uint64_t key;
    memcpy(&key, sha, sizeof key);
    if (!key) key = 1;
    if ((e->n + 1) * 2 > e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 1024;
        cp_admit_entry *v = calloc(cap, sizeof *v);
        if (!v) return 0; /* cannot record: do not share */
        for (size_t i = 0; i < e->cap; i++)
            if (e->v[i].key) {
                size_t j = e->v[i].key & (cap - 1);
                while (v[j].key) j = (j + 1) & (cap - 1);
                v[j] = e->v[i];
            }
        free(e->v);
        e->v = v;
        e->cap = cap;
    }
    size_t j = key & (e->cap - 1);
    while (e->v[j].key && e->v[j].key != key) j = (j + 1) & (e->cap - 1);
    cp_admit_entry *a = &e->v[j];
    if (!a->key) a->key = key, e->n++;
    int seen = 0;
    for (int i = 0; i < a->n; i++) seen |= a->tenants[i] == tenant;
    if (!seen && a->n < 8) a->tenants[a->n++] = tenant;
    return a->n >= e->k;
}

size_t cp_admission_forget(cp_admission *e, uint32_t tenant)
{
    size_t n = 0;
    for (size_t i = 0; i < e->cap; i++) {
        cp_admit_entry *a = &e->v[i];
        for (int k = 0; a->key && k < a->n; k++)
            if (a->tenants[k] == tenant) {
                a->tenants[k] = a->tenants[--a->n];
                n++;
                break;
            }
    }
    return n;
}

void cp_admission_free(cp_admission *e)
{
    free(e->v);
    e->v = NULL;
    e->cap = e->n = 0;
}
