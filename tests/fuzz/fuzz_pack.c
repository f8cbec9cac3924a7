/* libFuzzer target: arbitrary bytes as a weight pack (model/pack.h).  The
 * reader must refuse or load, never read or allocate past what the file
 * holds; a pack it loads must be usable (its ids inside the vocabulary). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../model/pack.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    static cp_backend *be;
    cp_error err;
    if (!be) {
        /* a file per exec: in memory where there is a tmpfs (ten times the execs) */
        snprintf(path, sizeof path, "%s/cp_fuzz_pack_%d.bin", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
        if (cp_backend_cpu_create(&be, &err) != CP_OK) abort();
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    cp_model *m;
    cp_pack_extra x;
    if (cp_pack_read(path, be, &m, &x, &err) == CP_OK) {
        for (int i = 0; i < x.n_ids; i++)
            if (x.ids[i] < 0 || x.ids[i] >= m->cfg.vocab) abort();
        cp_pack_extra_free(&x);
        cp_model_free(m);
    }
    return 0;
}
