/* The request pipeline (engine/pipeline.c) against a reference built from
 * the model and the sampler alone: cp_engine_run and the batcher share the
 * phases, so comparing them cannot show a fault in a phase both run; here a
 * seeded request's ids must be what the model's own prefill, decoding steps
 * and a sampler with the same seed give. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/request.h"
#include "helpers.h"

Test(pipeline, a_seeded_request_samples_what_the_model_and_its_seed_give, .timeout = TEST_TIMEOUT(60))
{
    enum { N = 16 };
    cp_error err = { 0 };
    char dir[512];
    shared_path(dir, sizeof dir, "models/cp-books-6m");
    cp_backend *be = NULL;
    cp_model *m = load_model_or_die(dir, &be);
    cp_tokenizer *tok = open_tokenizer_or_die("models/cp-books-6m");
    cp_engine_opts o;
    cp_engine_opts_default(&o);
    o.sharing = CP_SHARE_NONE;
    cp_engine *e = NULL;
    cr_assert_eq(cp_engine_create(m, tok, NULL, NULL, &o, &e, &err), CP_OK, "%s", err.msg);
    static const char text[] = "The old house stood at the end of the lane, and every evening";
    cp_request_msg msg = { .role = CP_ROLE_USER, .text = text, .len = sizeof text - 1 };
    cp_sampler_opts so = { .temperature = 0.9f, .top_p = 1, .seed = 77 };
    cp_request r = { .tenant = 1, .msgs = &msg, .n_msgs = 1, .max_tokens = N, .sampling = so, .ignore_eos = 1 };
    cp_response resp;
    cr_assert_eq(cp_engine_run(e, &r, &resp, &err), CP_OK, "%s", err.msg);
    cr_assert_eq((int)resp.n_ids, N);
    cr_assert_not_null(resp.prompt_ids);
    int T = resp.prompt_tokens, V = cp_usable_vocab(m, tok);
    /* the reference: every prompt token computed at its own slot, then one token a step */
    cp_state *st = NULL;
    cr_assert_eq(cp_state_create_kv(m, T + N, 512, CP_F32, &st, &err), CP_OK, "%s", err.msg);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    float *lg = malloc((size_t)m->cfg.vocab * sizeof *lg);
    cr_assert(pos && lg);
    for (int i = 0; i < T; i++) pos[i] = i;
    cr_assert_eq(cp_forward_at(m, st, resp.prompt_ids, pos, pos, T, T, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    cp_sampler smp;
    cr_assert_eq(cp_sampler_init(&smp, &so, V, &err), CP_OK, "%s", err.msg);
    int greedy_differs = 0;
    for (int k = 0; k < N; k++) {
        int32_t id = cp_sample(&smp, lg), top = 0;
        for (int v = 1; v < V; v++) top = lg[v] > lg[top] ? v : top;
        greedy_differs |= id != top;
        cr_assert_eq(resp.ids[k], id, "id %d: the engine sampled %d, the model and its seed %d", k, resp.ids[k], id);
        if (k + 1 < N) cr_assert_eq(cp_forward(m, st, &id, NULL, 1, CP_LOGITS_LAST, lg, NULL, &err), CP_OK, "%s", err.msg);
    }
    cr_assert(greedy_differs, "every sampled id was the argmax: the seed was never tested");
    cp_sampler_free(&smp);
    free(pos), free(lg);
    cp_state_free(m, st);
    cp_response_free(&resp);
    cp_engine_free(e);
    cp_tokenizer_free(tok);
    cp_model_free(m);
    cp_backend_destroy(be);
}
