#include "pack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/dtype.h"
#include "../kernels/fileio.h"

#define PACK_MAGIC "CPPACK 1\n"
#define PACK_MAX_DIM (1 << 20)
#define PACK_MAX_TOKENS (1 << 16)

static const char *arch_names[] = { "", "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM" };

static int put(FILE *f, const void *p, size_t bytes) { return fwrite(p, 1, bytes, f) == bytes; }

cp_status cp_pack_write(const char *path, cp_model *m, const cp_pack_extra *x, cp_error *err)
{
    const cp_config *c = &m->cfg;
    if (x->n_ids < 1 || x->n_ids > PACK_MAX_TOKENS || x->n_greedy < 0 || x->n_greedy > PACK_MAX_TOKENS)
        return cp_fail(err, CP_EINVAL, "pack %s: %d ids and %d greedy ids are out of range", path, x->n_ids, x->n_greedy);
    FILE *f = fopen(path, "wb");
    if (!f) return cp_fail(err, CP_EIO, "pack %s: cannot create it", path);
    fprintf(f, PACK_MAGIC "name %s\narch %d\nhidden %d\nintermediate %d\nlayers %d\nheads %d\nkv_heads %d\nhead_dim %d\n"
               "vocab %d\nmax_pos %d\nrms_eps %.9g\nrope_theta %.17g\ntie %d\nqkv_bias %d\nbos %d\ntokens %d\ngreedy %d\n"
               "logits %d\nwindow",
            x->name[0] ? x->name : "-", (int)c->arch, c->hidden, c->intermediate, c->n_layers, c->n_heads, c->n_kv_heads,
            c->head_dim, c->vocab, c->max_pos, c->rms_eps, c->rope_theta, c->tie_embeddings, c->qkv_bias, c->bos_id, x->n_ids,
            x->n_greedy, x->logits != NULL);
    for (int l = 0; l < c->n_layers; l++) fprintf(f, " %d", c->window[l]);
    fprintf(f, "\ndata\n");
    int ok = put(f, m->rope_inv_freq, (size_t)c->head_dim / 2 * sizeof(double));
    size_t n = cp_model_tensor_refs(m, NULL, 0);
    cp_tensor_ref *refs = malloc(n * sizeof *refs);
    float *buf = NULL;
    size_t buf_elems = 0;
    cp_status rc = refs ? CP_OK : cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
    if (refs) cp_model_tensor_refs(m, refs, n);
    for (size_t i = 0; rc == CP_OK && ok && i < n; i++) {
        size_t elems = (size_t)refs[i].rows * refs[i].cols, esz = cp_dtype_size(refs[i].matrix ? m->be->matrix_dtype : CP_F32);
        if (elems * 2 > buf_elems) { /* room for the backend's bytes and the f32 copy */
            free(buf);
            buf_elems = elems * 2;
            if (!(buf = malloc(buf_elems * sizeof(float)))) rc = cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
        }
        if (rc == CP_OK) rc = refs[i].mat ? cp_matrix_download(m->be, buf + elems, refs[i].mat, err) /* row-major whatever its layout */
                                          : m->be->download(m->be, buf + elems, *refs[i].slot, elems * esz, err);
        if (rc == CP_OK && !cp_convert_to_f32(buf, buf + elems, refs[i].matrix ? m->be->matrix_dtype : CP_F32, elems))
            rc = cp_fail(err, CP_EINVAL, "pack %s: cannot convert %s", path, refs[i].what);
        if (rc == CP_OK) ok = put(f, buf, elems * sizeof(float));
    }
    free(buf), free(refs);
    if (rc == CP_OK && ok) ok = put(f, x->ids, (size_t)x->n_ids * 4);
    if (rc == CP_OK && ok && x->logits) ok = put(f, x->logits, (size_t)x->n_ids * c->vocab * sizeof(float));
    if (rc == CP_OK && ok && x->n_greedy) ok = put(f, x->greedy, (size_t)x->n_greedy * 4);
    if (fclose(f) != 0) ok = 0;
    if (rc == CP_OK && !ok) rc = cp_fail(err, CP_EIO, "pack %s: write failed", path);
    if (rc != CP_OK) remove(path);
    return rc;
}

void cp_pack_extra_free(cp_pack_extra *x)
{
    free(x->ids), free(x->logits), free(x->greedy);
    memset(x, 0, sizeof *x);
}

/* reads "key value\n" with an integer value in [lo, hi] */
static int header_int(FILE *f, const char *key, long lo, long hi, int *out)
{
    char k[32];
    long v;
    if (fscanf(f, "%31s %ld", k, &v) != 2 || strcmp(k, key) != 0 || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int header_double(FILE *f, const char *key, double lo, double hi, double *out)
{
    char k[32];
    double v;
    if (fscanf(f, "%31s %lf", k, &v) != 2 || strcmp(k, key) != 0 || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

static int get(FILE *f, void *p, size_t bytes) { return fread(p, 1, bytes, f) == bytes; }

cp_status cp_pack_read(const char *path, cp_backend *be, cp_model **out, cp_pack_extra *x, cp_error *err)
{
    *out = NULL;
    memset(x, 0, sizeof *x);
    FILE *f;
    if (cp_fopen_regular(path, &f, err)) return cp_fail_wrap(err, "pack");
    cp_model *m = calloc(1, sizeof *m);
    if (!m) return fclose(f), cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
    m->be = be;
    m->matrix_dtype = be->matrix_dtype;
    cp_config *c = &m->cfg;
    char magic[sizeof PACK_MAGIC] = { 0 }, key[32];
    int arch = 0, has_logits = 0, ok = get(f, magic, sizeof PACK_MAGIC - 1) && strcmp(magic, PACK_MAGIC) == 0;
    double eps = 0;
    ok = ok && fscanf(f, "%31s %63s", key, x->name) == 2 && strcmp(key, "name") == 0;
    ok = ok && header_int(f, "arch", 1, 3, &arch) && header_int(f, "hidden", 1, PACK_MAX_DIM, &c->hidden) &&
         header_int(f, "intermediate", 1, PACK_MAX_DIM, &c->intermediate) && header_int(f, "layers", 1, CP_MAX_LAYERS, &c->n_layers) &&
         header_int(f, "heads", 1, 4096, &c->n_heads) && header_int(f, "kv_heads", 1, 4096, &c->n_kv_heads) &&
         header_int(f, "head_dim", 2, 1024, &c->head_dim) && header_int(f, "vocab", 1, 1 << 22, &c->vocab) &&
         header_int(f, "max_pos", 1, 1 << 30, &c->max_pos) && header_double(f, "rms_eps", 0, 1, &eps) &&
         header_double(f, "rope_theta", 1, 1e12, &c->rope_theta) && header_int(f, "tie", 0, 1, &c->tie_embeddings) &&
         header_int(f, "qkv_bias", 0, 1, &c->qkv_bias) && header_int(f, "bos", -1, 1 << 22, &c->bos_id) &&
         header_int(f, "tokens", 1, PACK_MAX_TOKENS, &x->n_ids) && header_int(f, "greedy", 0, PACK_MAX_TOKENS, &x->n_greedy) &&
         header_int(f, "logits", 0, 1, &has_logits);
    ok = ok && c->head_dim % 2 == 0 && c->n_heads % c->n_kv_heads == 0;
    ok = ok && fscanf(f, "%31s", key) == 1 && strcmp(key, "window") == 0;
    for (int l = 0; ok && l < c->n_layers; l++) ok = fscanf(f, "%d", &c->window[l]) == 1 && c->window[l] >= 0;
    ok = ok && fscanf(f, "%31s", key) == 1 && strcmp(key, "data") == 0 && fgetc(f) == '\n';
    cp_status rc = ok ? CP_OK : cp_fail(err, CP_EFORMAT, "pack %s: bad or truncated header", path);
    if (rc == CP_OK) {
        c->arch = (cp_arch)arch;
        c->arch_name = arch_names[arch];
        c->rms_eps = (float)eps;
        m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
        m->rope_inv_freq = malloc((size_t)c->head_dim / 2 * sizeof(double));
        if (!m->layers || !m->rope_inv_freq) rc = cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
    }
    /* the size the header promises, before any allocation it drives */
    size_t n = 0, data = 0;
    cp_tensor_ref *refs = NULL;
    if (rc == CP_OK) {
        n = cp_model_tensor_refs(m, NULL, 0);
        if (!(refs = malloc(n * sizeof *refs))) rc = cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
    }
    if (rc == CP_OK) {
        cp_model_tensor_refs(m, refs, n);
        long here = ftell(f);
        data = (size_t)c->head_dim / 2 * sizeof(double);
        for (size_t i = 0; i < n; i++) data += (size_t)refs[i].rows * refs[i].cols * sizeof(float);
        data += (size_t)x->n_ids * 4 + (has_logits ? (size_t)x->n_ids * c->vocab * sizeof(float) : 0) + (size_t)x->n_greedy * 4;
        if (here < 0 || fseek(f, 0, SEEK_END) != 0 || (size_t)ftell(f) != (size_t)here + data || fseek(f, here, SEEK_SET) != 0)
            rc = cp_fail(err, CP_EFORMAT, "pack %s: the file size does not match its header", path);
    }
    if (rc == CP_OK && !get(f, m->rope_inv_freq, (size_t)c->head_dim / 2 * sizeof(double)))
        rc = cp_fail(err, CP_EIO, "pack %s: short read", path);
    float *buf = NULL;
    size_t buf_elems = 0;
    for (size_t i = 0; rc == CP_OK && i < n; i++) {
        size_t elems = (size_t)refs[i].rows * refs[i].cols;
        cp_dtype dt = refs[i].matrix ? be->matrix_dtype : CP_F32;
        if (elems * 2 > buf_elems) {
            free(buf);
            buf_elems = elems * 2;
            if (!(buf = malloc(buf_elems * sizeof(float)))) rc = cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
        }
        if (rc == CP_OK && !get(f, buf, elems * sizeof(float))) rc = cp_fail(err, CP_EIO, "pack %s: short read", path);
        for (size_t k = 0; rc == CP_OK && k < elems; k++)
            if (!isfinite(buf[k])) rc = cp_fail(err, CP_EFORMAT, "pack %s: %s holds a non-finite value", path, refs[i].what);
        if (rc == CP_OK && !cp_convert_float(buf + elems, dt, buf, CP_F32, elems))
            rc = cp_fail(err, CP_EINVAL, "pack %s: cannot convert %s", path, refs[i].what);
        if (rc == CP_OK) rc = be->alloc(be, elems * cp_dtype_size(dt), refs[i].slot, err);
        if (rc == CP_OK) rc = be->upload(be, *refs[i].slot, buf + elems, elems * cp_dtype_size(dt), err);
        if (rc == CP_OK && refs[i].mat) *refs[i].mat = cp_matrix_rows(*refs[i].slot, dt, (int)refs[i].rows, (int)refs[i].cols);
    }
    free(buf), free(refs);
    if (rc == CP_OK && c->tie_embeddings) m->lm_head = m->embed;
    if (rc == CP_OK) {
        x->ids = malloc((size_t)x->n_ids * 4);
        x->logits = has_logits ? malloc((size_t)x->n_ids * c->vocab * sizeof(float)) : NULL;
        x->greedy = malloc((size_t)(x->n_greedy ? x->n_greedy : 1) * 4);
        if (!x->ids || !x->greedy || (has_logits && !x->logits)) rc = cp_fail(err, CP_ENOMEM, "pack %s: out of memory", path);
    }
    if (rc == CP_OK && !(get(f, x->ids, (size_t)x->n_ids * 4) &&
                         (!has_logits || get(f, x->logits, (size_t)x->n_ids * c->vocab * sizeof(float))) &&
                         get(f, x->greedy, (size_t)x->n_greedy * 4)))
        rc = cp_fail(err, CP_EIO, "pack %s: short read", path);
    for (int i = 0; rc == CP_OK && i < x->n_ids; i++)
        if (x->ids[i] < 0 || x->ids[i] >= c->vocab) rc = cp_fail(err, CP_EFORMAT, "pack %s: id %d out of the vocabulary", path, x->ids[i]);
    fclose(f);
    if (rc == CP_OK) rc = be->sync(be, err);
    if (rc != CP_OK) {
        cp_model_free(m);
        cp_pack_extra_free(x);
        return rc;
    }
    *out = m;
    return CP_OK;
}
