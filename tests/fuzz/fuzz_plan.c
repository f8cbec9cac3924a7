/* libFuzzer target: arbitrary bytes as a --plan-in line (against a fixed
 * request line).  Refused with a message, or ids and codes of one length
 * with every id an int32 >= 0 and every code 0, 1 or 2. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/run_lines.h"
#include "../../kernels/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char req[] = "{\"tenant\":\"a\",\"prompt\":\"hi\",\"max_tokens\":4}";
    static int ready;
    if (!ready) cp_log_set_level(CP_LOG_ERROR), ready = 1;
    int32_t *ids = NULL;
    uint8_t *codes = NULL;
    int n = -1, mt = -1;
    cp_error err;
    err.msg[0] = 0;
    if (cp_run_plan_parse((const char *)data, size, req, sizeof req - 1, 16, &ids, &codes, &n, &mt, &err) != CP_OK) {
        if (ids || codes || n != 0 || !err.msg[0]) abort();
        return 0;
    }
    if (n < 1 || !ids || !codes || mt != 4) abort();
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || (codes[i] & 3) > 2 || codes[i] > 15) abort();
    free(ids), free(codes);
    return 0;
}
