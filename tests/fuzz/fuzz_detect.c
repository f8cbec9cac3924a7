/* libFuzzer target: arbitrary bytes through the built-in detector chain.
 * Invalid UTF-8 must fail closed; valid text must give spans inside it. */
#include <stdint.h>
#include <stdlib.h>

#include "../../engine/detect/detect.h"
#include "../../kernels/log.h"

/* the fuzz process's chain, built once */
static cp_detect_chain fuzz_chain;
static int fuzz_chain_ready;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cp_error err;
    if (!fuzz_chain_ready) {
        cp_detector *d;
        cp_log_set_level(CP_LOG_ERROR); /* fail-closed warnings would flood the run */
        cp_chain_init(&fuzz_chain);
        if (cp_detector_builtin(&d, &err) != CP_OK || cp_chain_add(&fuzz_chain, d, &err) != CP_OK) abort();
        fuzz_chain_ready = 1;
    }
    cp_spans s = { 0 };
    if (cp_chain_detect(&fuzz_chain, (const char *)data, size, CP_ROLE_USER, &s, &err) != CP_OK) abort();
    for (size_t i = 0; i < s.n; i++)
        if (s.v[i].start >= s.v[i].end || s.v[i].end > size) abort();
    cp_spans_free(&s);
    return 0;
}
