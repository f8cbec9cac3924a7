#include "helpers.h"

#include "../tokenizer/tokenizer.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* The skip and failure messages start with this; the summary hook below
 * counts the tests by it. */
#define KIT_MISSING "reference kit not found at "

const char *kit_root(void)
{
    const char *root = getenv("CP_SHARED");
    return root && *root ? root : "../shared";
}

/* A folder without models/ is no kit (an empty folder, a wrong path): the
 * same answer as no folder at all.  A kit that is there but lacks a file a
 * test needs is not absent: that test runs and fails on the file. */
int kit_present(void)
{
    char dir[4096];
    struct stat st;
    snprintf(dir, sizeof dir, "%s/models", kit_root());
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/* CI=true (GitHub, GitLab and .ci/run set it): a missing kit must fail,
 * or CI would go green having run half the suite. */
static int ci_mode(void)
{
    const char *ci = getenv("CI");
    return ci && *ci && strcmp(ci, "0") != 0 && strcasecmp(ci, "false") != 0;
}

void require_kit(void)
{
    if (kit_present()) return;
    if (ci_mode())
        cr_assert_fail(KIT_MISSING "%s and CI=%s: CI runs every test (set CP_SHARED=DIR)", kit_root(), getenv("CI"));
    cr_skip_test(KIT_MISSING "%s", kit_root());
}

const char *shared_path(char *out, size_t cap, const char *rel)
{
    require_kit();
    snprintf(out, cap, "%s/%s", kit_root(), rel);
    return out;
}

/* One line after the run, in the runner process, instead of one per test:
 * what is missing and how to provide it. */
ReportHook(POST_ALL)(struct criterion_global_stats *st)
{
    size_t skipped = 0, failed = 0;
    const size_t k = strlen(KIT_MISSING);
    for (const struct criterion_suite_stats *s = st->suites; s; s = s->next)
        for (const struct criterion_test_stats *t = s->tests; t; t = t->next) {
            if (t->test_status == CR_STATUS_SKIPPED && t->message && strncmp(t->message, KIT_MISSING, k) == 0) skipped++;
            for (const struct criterion_assert_stats *a = t->asserts; a; a = a->next)
                if (!a->passed && a->message && strncmp(a->message, KIT_MISSING, k) == 0) {
                    failed++;
                    break;
                }
        }
    if (skipped)
        fprintf(stderr, "tests: " KIT_MISSING "%s (set CP_SHARED=DIR): %zu tests skipped\n", kit_root(), skipped);
    if (failed)
        fprintf(stderr, "tests: " KIT_MISSING "%s and CI is set: %zu tests FAILED (set CP_SHARED=DIR)\n", kit_root(), failed);
}

void test_note_untested(const char *what)
{
    fprintf(stderr, "[NOTE] %s\n", what);
}

const char *test_tmpdir(char *out, size_t cap, const char *name)
{
    const char *root = getenv("CP_TMP");
    if (!root || !*root) root = "build/tmp";
    mkdir("build", 0755);
    mkdir(root, 0755);
    snprintf(out, cap, "%s/%s-%d", root, name, (int)getpid());
    mkdir(out, 0755);
    return out;
}

cp_model *load_model_or_die(const char *dir, cp_backend **be_out)
{
    cp_error err = { 0 };
    cp_backend *be = NULL;
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK, "%s", err.msg);
    cp_model *m = NULL;
    cp_status rc = cp_model_load(dir, be, NULL, &m, &err);
    cr_assert_eq(rc, CP_OK, "loading %s: %s", dir, err.msg);
    *be_out = be;
    return m;
}

struct cp_tokenizer *open_tokenizer_or_die(const char *rel)
{
    char dir[512];
    cp_error err = { 0 };
    cp_tokenizer *t = NULL;
    cr_assert_eq(cp_tokenizer_load(shared_path(dir, sizeof dir, rel), &t, &err), CP_OK, "%s", err.msg);
    return t;
}

/* GPT-2's byte -> symbol map (ByteLevel): printable Latin-1 bytes stand for
 * themselves, the rest take code points from 256 up, in byte order */
static void byte_symbol(int b, char out[4])
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff), cp = b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++) n += !((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff));
        cp = 256 + n;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

struct cp_tokenizer *llama3_style_tokenizer(void)
{
    static const char regex[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char *const merges[][2] = { { "\xc4\xa0", "B" }, { "o", "b" }, { "\xc4\xa0" "B", "ob" } };
    static const char *const added[] = { "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>" };
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model"), *vocab, *mg, *at;
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddTrueToObject(model, "ignore_merges");
    vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int b = 0; b < 256; b++) {
        char sym[4];
        byte_symbol(b, sym);
        cJSON_AddNumberToObject(vocab, sym, b);
    }
    mg = cJSON_AddArrayToObject(model, "merges");
    for (int i = 0; i < 3; i++) {
        char joined[16];
        snprintf(joined, sizeof joined, "%s%s", merges[i][0], merges[i][1]);
        cJSON_AddNumberToObject(vocab, joined, 256 + i);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(merges[i][0]));
        cJSON_AddItemToArray(pair, cJSON_CreateString(merges[i][1]));
        cJSON_AddItemToArray(mg, pair);
    }
    at = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < 4; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", 259 + i);
        cJSON_AddStringToObject(t, "content", added[i]);
        cJSON_AddTrueToObject(t, "special");
        cJSON_AddItemToArray(at, t);
    }
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer"), *seq = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *split = cJSON_CreateObject(), *pat = cJSON_AddObjectToObject(split, "pattern");
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(pat, "Regex", regex);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddFalseToObject(split, "invert");
    cJSON_AddItemToArray(seq, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "add_prefix_space");
    cJSON_AddFalseToObject(bl, "use_regex");
    cJSON_AddItemToArray(seq, bl);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "decoder"), "type", "ByteLevel");
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    cr_assert(json);
    static const char config[] = "{\"bos_token\":\"<|begin_of_text|>\",\"eos_token\":\"<|eot_id|>\"}";
    cp_tokenizer *t = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_tokenizer_from_json(json, strlen(json), config, "llama3-style", &t, &err), CP_OK, "%s", err.msg);
    free(json);
    return t;
}

float max_abs_diff(const float *a, const float *b, size_t n)
{
    float d = 0;
    for (size_t i = 0; i < n; i++) {
        float x = fabsf(a[i] - b[i]);
        if (!(x <= d)) d = x; /* NaN propagates */
    }
    return d;
}

float max_abs(const float *a, size_t n)
{
    float d = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(a[i]) > d) d = fabsf(a[i]);
    return d;
}

char *read_text(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) {
        buf[n] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}

int write_bytes(const char *path, const void *data, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    int ok = fwrite(data, 1, n, fp) == n;
    return fclose(fp) == 0 && ok;
}

int test_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The CLI's default chain adds the NER plugin where make deps installed it
 * (plugins/ner/node_modules, or $CP_NER_DIR): the suite's results must not
 * depend on whether this machine ran make deps, so the suite and every
 * command it runs look in a folder that has no plugin.  The tests of that
 * default set CP_NER_DIR on their own commands. */
__attribute__((constructor)) static void no_default_ner(void) { setenv("CP_NER_DIR", "/nonexistent/cp-tests-no-ner", 1); }

/* The same for automatic calibration (cli_calib_default.h): the suite's
 * run and serve commands keep the built-in setting (epic R 0.85) the
 * tests pin, and none writes under the user's home; the tests of automatic
 * calibration set CACHEPRUNE_CALIBRATION=auto and a state directory of
 * their own on their commands. */
__attribute__((constructor)) static void no_automatic_calibration(void)
{
    setenv("CACHEPRUNE_CALIBRATION", "off", 1);
    setenv("CACHEPRUNE_STATE_DIR", "/nonexistent/cp-tests-state", 1);
}

int test_cli_output(const char *args, char *out, size_t cap) { return test_cli_output_env("", args, out, cap); }

int test_cli_output_env(const char *env, const char *args, char *out, size_t cap)
{
    const char *bin = getenv("CP_BIN");
    char cmd[4096];
    int w = snprintf(cmd, sizeof cmd, "%s%s%s %s 2>&1", env, *env ? " " : "", bin && *bin ? bin : "build/cacheprune", args);
    cr_assert(w > 0 && (size_t)w < sizeof cmd, "command line too long (%d bytes)", w);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "cannot run %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *test_passage(int which, size_t want, size_t div, size_t stride)
{
    char path[512];
    static const char *books[] = { "data/gutenberg/pg174_picture_of_dorian_gray.txt", "data/gutenberg/pg84_frankenstein.txt" };
    size_t len;
    char *b = read_text(shared_path(path, sizeof path, books[which % 2]), &len);
    cr_assert(b, "no %s", path);
    char *p = strchr(b + len / div + (size_t)which * stride, '\n');
    cr_assert(p);
    while (*p == '\n' || *p == '\r') p++;
    size_t n = want;
    while (((unsigned char)p[n] & 0xc0) == 0x80) n--;
    char *out = strndup(p, n);
    cr_assert(out);
    for (char *q = out; *q; q++)
        if (*q == '\r') *q = ' ';
    free(b);
    return out;
}

float *test_all_logits(cp_model *m, const int32_t *ids, int T, int chunk)
{
    cp_error err = { 0 };
    cp_state *s = NULL;
    cr_assert_eq(cp_state_create(m, T, chunk, &s, &err), CP_OK, "%s", err.msg);
    float *lg = malloc((size_t)T * m->cfg.vocab * 4);
    cr_assert(lg);
    cr_assert_eq(cp_forward(m, s, ids, NULL, T, CP_LOGITS_ALL, lg, NULL, &err), CP_OK, "%s", err.msg);
    cp_state_free(m, s);
    return lg;
}

double test_nmse(const float *a, const float *ref, size_t n)
{
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) e += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]), s += (double)ref[i] * ref[i];
    return e / s;
}

/* mean over positions of KL(p_ref || p) of the softmaxes, in nats */
double test_mean_kl(const float *lg, const float *ref, int T, int V)
{
    double total = 0;
    for (int t = 0; t < T; t++) {
        const float *a = ref + (size_t)t * V, *b = lg + (size_t)t * V;
        double ma = a[0], mb = b[0], za = 0, zb = 0, kl = 0;
        for (int v = 1; v < V; v++) ma = a[v] > ma ? a[v] : ma, mb = b[v] > mb ? b[v] : mb;
        for (int v = 0; v < V; v++) za += exp(a[v] - ma), zb += exp(b[v] - mb);
        for (int v = 0; v < V; v++) {
            double pa = exp(a[v] - ma) / za;
            kl += pa * ((a[v] - ma - log(za)) - (b[v] - mb - log(zb)));
        }
        total += kl;
    }
    return total / T;
}

int32_t *test_golden_ids(const char *dir, int *T)
{
    char path[700];
    snprintf(path, sizeof path, "%s/golden.safetensors", dir);
    st_set *g = NULL;
    cp_error err = { 0 };
    cr_assert_eq(st_open_file(path, &g, &err), CP_OK, "%s", err.msg);
    st_tensor *ti = st_find(g, "input_ids");
    cr_assert(ti);
    *T = (int)ti->shape[0];
    int32_t *ids = malloc(ti->numel * 4);
    cr_assert(ids);
    cr_assert_eq(st_read_i32(ti, ids, &err), CP_OK);
    st_close(g);
    return ids;
}

cp_backend *test_cpu_backend_on(const char *isa)
{
    if (isa) setenv("CP_CPU_ISA", isa, 1);
    else unsetenv("CP_CPU_ISA");
    cp_backend *be = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_backend_cpu_create(&be, &err), CP_OK, "CP_CPU_ISA=%s: %s", isa ? isa : "", err.msg);
    unsetenv("CP_CPU_ISA");
    return be;
}

cp_model *test_load_as(const char *dir, const char *isa, cp_weight_dtype dt, cp_backend **be)
{
    *be = test_cpu_backend_on(isa);
    cp_load_opts lo = { .dtype = dt };
    cp_model *m = NULL;
    cp_error err = { 0 };
    cr_assert_eq(cp_model_load(dir, *be, &lo, &m, &err), CP_OK, "loading %s: %s", dir, err.msg);
    return m;
}

unsigned char *test_books_checkpoint_copy(const char *name, const char *tensor, char *dir, size_t cap, size_t *len,
                                          size_t *off)
{
    char src[512], path[700];
    shared_path(src, sizeof src, "models/cp-books-6m");
    test_tmpdir(dir, cap, name);
    cr_assert_eq(test_sh("cp %s/config.json %s/model.safetensors %s/", src, src, dir), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unsigned char *st = (unsigned char *)read_text(path, len);
    cr_assert(st && *len > 8, "%s", path);
    uint64_t hlen;
    memcpy(&hlen, st, 8);
    cr_assert(hlen < *len - 8, "%s: header length", path);
    char *hdr = strndup((char *)st + 8, hlen);
    cJSON *h = cJSON_Parse(hdr);
    free(hdr);
    const cJSON *t = cJSON_GetObjectItem(h, tensor);
    cr_assert(t && strcmp(cJSON_GetObjectItem(t, "dtype")->valuestring, "BF16") == 0, "%s: no BF16 tensor %s", path, tensor);
    *off = 8 + hlen + (size_t)cJSON_GetArrayItem(cJSON_GetObjectItem(t, "data_offsets"), 0)->valuedouble;
    cJSON_Delete(h);
    return st;
}

/* out = softmax(q k^T / sqrt(hd)) v per head, in double, over keys with
 * k_pos <= q_pos (and inside the window); zeros when none is visible */
void test_attention_ref(const cp_attn_args *a, const float *k, const float *v, float *out)
{
    const int hd = a->head_dim, qld = a->n_heads * hd, kld = a->n_kv_heads * hd, group = a->n_heads / a->n_kv_heads;
    double *p = malloc((size_t)a->n_keys * sizeof *p);
    cr_assert(p);
    for (int i = 0; i < a->n; i++)
        for (int h = 0; h < a->n_heads; h++) {
            const float *q = a->q + (size_t)i * qld + (size_t)h * hd;
            const int g = h / group;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < a->n_keys; j++) {
                int vis = a->k_pos[j] <= a->q_pos[i] && (a->window == 0 || a->k_pos[j] > a->q_pos[i] - a->window);
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[d] * k[(size_t)j * kld + (size_t)g * hd + d];
                p[j] = vis ? s / sqrt((double)hd) : NAN;
                if (vis && p[j] > mx) mx = p[j];
            }
            for (int j = 0; j < a->n_keys; j++) sum += isnan(p[j]) ? 0 : exp(p[j] - mx);
            for (int d = 0; d < hd; d++) {
                double acc = 0;
                for (int j = 0; j < a->n_keys; j++)
                    if (!isnan(p[j])) acc += exp(p[j] - mx) / sum * v[(size_t)j * kld + (size_t)g * hd + d];
                out[(size_t)i * qld + (size_t)h * hd + d] = sum > 0 ? (float)acc : 0.0f;
            }
        }
    free(p);
}

float test_lcg_uniform(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    return ((float)(*state >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

void *test_xalloc64(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    cr_assert(p, "out of memory (%zu bytes)", bytes);
    return p;
}

cp_detect_chain test_chain_of(cp_status (*make)(cp_detector **out, cp_error *err))
{
    cp_detect_chain c;
    cp_detector *d;
    cp_error err = { 0 };
    cp_chain_init(&c);
    cr_assert_eq(make(&d, &err), CP_OK, "%s", err.msg);
    cr_assert_eq(cp_chain_add(&c, d, &err), CP_OK, "%s", err.msg);
    return c;
}

void test_spans_at(cp_detect_chain *c, const char *text, size_t len, cp_role role, char *out, size_t cap)
{
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(cp_chain_detect(c, text, len, role, &s, &err), CP_OK, "%s", err.msg);
    cr_assert(!s.wholly, "'%s' failed closed", text);
    out[0] = 0;
    size_t n = 0;
    for (size_t i = 0; i < s.n && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s[%u,%u);", s.v[i].type, s.v[i].start, s.v[i].end);
    cp_spans_free(&s);
}

void test_spans_text(cp_detect_chain *c, const char *text, const char *only, char *out, size_t cap)
{
    cp_spans s = { 0 };
    cp_error err = { 0 };
    cr_assert_eq(cp_chain_detect(c, text, strlen(text), CP_ROLE_USER, &s, &err), CP_OK, "%s", err.msg);
    cr_assert(!s.wholly, "'%s' failed closed", text);
    out[0] = 0;
    size_t n = 0;
    for (size_t i = 0; i < s.n && n < cap; i++) {
        const int len = (int)(s.v[i].end - s.v[i].start);
        if (!only) n += (size_t)snprintf(out + n, cap - n, "%s:%.*s;", s.v[i].type, len, text + s.v[i].start);
        else if (strcmp(s.v[i].type, only) == 0) n += (size_t)snprintf(out + n, cap - n, "%.*s;", len, text + s.v[i].start);
    }
    cp_spans_free(&s);
}
