/* libFuzzer target: arbitrary bytes as a --rules file (kind, type, pattern
 * lines; PCRE2 patterns, word lists, allow lines).  The loader must refuse
 * with a message or load; a loaded rule set must scan a fixed text without
 * crashing and give spans inside it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../engine/detect/detect.h"
#include "../../kernels/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) {
        /* a file per exec: in memory where there is a tmpfs (ten times the execs) */
        snprintf(path, sizeof path, "%s/cp_fuzz_rules_%d.txt", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
        cp_log_set_level(CP_LOG_ERROR);
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    cp_detector *d = NULL;
    cp_error err;
    err.msg[0] = 0;
    if (cp_detector_rules(path, &d, &err) != CP_OK) {
        if (d || !err.msg[0]) abort();
        return 0;
    }
    static const char text[] = "Call Alice Smith at 555-0100 or alice@example.com; ticket ABC-12345, code xyzzy.";
    cp_spans s = { 0 };
    if (d->detect(d, text, sizeof text - 1, CP_ROLE_USER, &s, &err) == CP_OK)
        for (size_t i = 0; i < s.n; i++)
            if (s.v[i].start >= s.v[i].end || s.v[i].end > sizeof text - 1) abort();
    cp_spans_free(&s);
    d->destroy(d);
    return 0;
}
