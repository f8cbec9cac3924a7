/* libFuzzer target: arbitrary bytes as a model's config.json.  The parser
 * must refuse (with a message) or accept; an accepted config is one the
 * loader can size buffers from: every count positive and in range, heads
 * divisible, RoPE frequencies finite. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/log.h"
#include "../../model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) cp_log_set_level(CP_LOG_ERROR), ready = 1;
    char *json = malloc(size + 1);
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = 0;
    cp_config c;
    cp_error err;
    err.msg[0] = 0;
    cp_status rc = cp_config_parse(json, "fuzz/config.json", &c, &err);
    free(json);
    if (rc != CP_OK) {
        if (!err.msg[0]) abort();
        return 0;
    }
    if (c.hidden < 1 || c.intermediate < 1 || c.n_layers < 1 || c.n_layers > CP_MAX_LAYERS || c.n_heads < 1 || c.n_kv_heads < 1 ||
        c.n_heads % c.n_kv_heads || c.vocab < 1 || c.max_pos < 1 || c.head_dim < 2 || c.head_dim % 2 || !(c.rms_eps > 0) ||
        !(c.rope_theta >= 1))
        abort();
    double *f = malloc((size_t)c.head_dim / 2 * sizeof *f);
    if (!f) return 0;
    cp_config_rope_inv_freq(&c, f);
    for (int i = 0; i < c.head_dim / 2; i++)
        if (!isfinite(f[i])) abort();
    free(f);
    return 0;
}
