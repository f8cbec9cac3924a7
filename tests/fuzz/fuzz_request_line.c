/* libFuzzer target: arbitrary bytes as one line of `run`'s request log.
 * The line must be refused with a reason or become a request whose every
 * message and marked span lies inside the parsed JSON (a span past its
 * message would mark the wrong bytes private). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/json_fields.h"
#include "../../engine/run_lines.h"
#include "../../kernels/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static cp_tenant_table *ten;
    cp_error err;
    if (!ten) {
        cp_log_set_level(CP_LOG_ERROR);
        if (cp_tenant_table_create(&ten, &err) != CP_OK) abort();
    }
    cJSON *j = NULL;
    err.msg[0] = 0;
    if (cp_json_parse_strict((const char *)data, size, &j, &err) != CP_OK) {
        if (j || !err.msg[0]) abort();
        return 0;
    }
    cp_request r;
    cp_request_msg *msgs = NULL;
    cp_span *spans = NULL;
    char why[512] = "";
    if (cp_run_request_parse(j, ten, 16, &r, &msgs, &spans, why, sizeof why)) {
        if (r.n_msgs < 1 || r.max_tokens < 0) abort();
        for (size_t i = 0; i < r.n_msgs; i++) {
            const cp_request_msg *m = &r.msgs[i];
            if (strlen(m->text) != m->len) abort(); /* a NUL inside was refused */
            for (size_t k = 0; k < m->n_marked; k++)
                if (m->marked[k].start >= m->marked[k].end || m->marked[k].end > m->len) abort();
        }
    } else if (!why[0]) {
        abort();
    }
    free(msgs), free(spans);
    cJSON_Delete(j);
    return 0;
}
