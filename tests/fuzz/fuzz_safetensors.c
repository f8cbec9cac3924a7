/* libFuzzer target: arbitrary bytes as a .safetensors file (header length,
 * JSON header, offsets, dtypes, shapes).  The reader must refuse or open,
 * never read past the file; every tensor it accepts lies inside the file
 * and its byte count matches dtype x shape. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../kernels/log.h"
#include "../../model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) {
        /* a file per exec: in memory where there is a tmpfs (ten times the execs) */
        snprintf(path, sizeof path, "%s/cp_fuzz_st_%d.safetensors", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
        cp_log_set_level(CP_LOG_ERROR);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    st_set *s = NULL;
    cp_error err;
    err.msg[0] = 0;
    if (st_open_file(path, &s, &err) != CP_OK) {
        if (s || !err.msg[0]) abort();
        return 0;
    }
    for (size_t i = 0; i < st_count(s); i++) {
        const st_tensor *t = st_at(s, i);
        size_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= (size_t)t->shape[d];
        if (numel != t->numel || t->nbytes != numel * cp_dtype_size(t->dtype)) abort();
        const uint8_t *p = t->data;
        /* touch the first and last byte: ASan sees a read past the map */
        if (t->nbytes) {
            volatile uint8_t x = p[0];
            x = p[t->nbytes - 1];
            (void)x;
        }
    }
    st_close(s);
    return 0;
}
