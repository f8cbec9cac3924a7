/* tokenizer.json -> cp_tokenizer.  Every component is checked; anything we
 * do not implement is "unsupported tokenizer component X", never ignored. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../kernels/fileio.h"
#include "tok_internal.h"
#include "utf8.h"

/* GPT-2's printable stand-ins for bytes: printable Latin-1 bytes map to
 * themselves, the other 68 to U+0100.. in byte order. */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

uint32_t tk_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b)) return b;
    uint32_t k = 0;
    for (int x = 0; x < b; x++) k += !byte_is_printable(x);
    return 256 + k;
}

int tk_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (int b = 0; b < 256; b++)
        if (!byte_is_printable(b) && k-- == 0) return b;
    return -1;
}

/* ---- JSON helpers ---------------------------------------------------------- */

typedef struct ld {
    cp_tokenizer *t;
    cp_error *err;
} ld;

static const char *type_of(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int get_bool(const cJSON *o, const char *k, int def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static const char *get_str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static cp_status unsupported(ld *L, const char *what, const char *name)
{
    return cp_fail(L->err, CP_EUNSUPPORTED, "%s: unsupported tokenizer component %s '%.64s'", L->t->where, what,
                   name ? name : "(no type)");
}

static char *dup_str(ld *L, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = cp_malloc(n, "tokenizer string", L->err);
    if (d) memcpy(d, s, n);
    return d;
}

/* {"String": "..."} or {"Regex": "..."} */
static cp_status load_pattern(ld *L, const cJSON *o, const char *what, tk_pattern *p)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *str = get_str(pat, "String"), *re = get_str(pat, "Regex");
    if (!str && !re) return cp_fail(L->err, CP_EFORMAT, "%s: %s needs a pattern {\"String\"|\"Regex\": ...}", L->t->where, what);
    char where[320];
    snprintf(where, sizeof where, "%s: %s pattern", L->t->where, what);
    const char *src = str ? str : re;
    return cp_regex_compile(p, src, strlen(src), str != NULL, where, L->err);
}

static cp_status read_replacement(ld *L, const cJSON *o, char out[8])
{
    const char *r = get_str(o, "replacement");
    if (!r) r = "\xe2\x96\x81"; /* ▁ */
    uint32_t cp;
    size_t n = strlen(r);
    if (n == 0 || n > 4 || cp_utf8_len((const unsigned char *)r, n, &cp) != (int)n)
        return cp_fail(L->err, CP_EFORMAT, "%s: Metaspace replacement must be one character", L->t->where);
    memcpy(out, r, n + 1);
    return CP_OK;
}

static cp_status read_prepend(ld *L, const cJSON *o, tk_prepend *out)
{
    const char *ps = get_str(o, "prepend_scheme");
    if (!ps) {
        /* files older than prepend_scheme carry add_prefix_space */
        *out = get_bool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
        return CP_OK;
    }
    if (strcmp(ps, "always") == 0) *out = PREPEND_ALWAYS;
    else if (strcmp(ps, "first") == 0) *out = PREPEND_FIRST;
    else if (strcmp(ps, "never") == 0) *out = PREPEND_NEVER;
    else return unsupported(L, "Metaspace prepend_scheme", ps);
    return CP_OK;
}

/* ---- components ------------------------------------------------------------ */

static cp_status load_normalizer(ld *L, const cJSON *o)
{
    if (!o || cJSON_IsNull(o)) return CP_OK;
    const char *ty = type_of(o);
    cp_tokenizer *t = L->t;
    if (ty && strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        cp_status rc = CP_OK;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e && rc == CP_OK; e = e->next) rc = load_normalizer(L, e);
        return rc;
    }
    if (t->n_norms == TK_MAX_STEPS) return cp_fail(L->err, CP_EFORMAT, "%s: more than %d normalizers", t->where, TK_MAX_STEPS);
    tk_norm *n = &t->norms[t->n_norms];
    memset(n, 0, sizeof *n);
    if (ty && strcmp(ty, "NFC") == 0) n->kind = NORM_NFC;
    else if (ty && strcmp(ty, "Prepend") == 0) {
        const char *p = get_str(o, "prepend");
        if (!p) return cp_fail(L->err, CP_EFORMAT, "%s: Prepend normalizer without 'prepend'", t->where);
        n->kind = NORM_PREPEND;
        if (!(n->text = dup_str(L, p))) return CP_ENOMEM;
    } else if (ty && strcmp(ty, "Replace") == 0) {
        const char *c = get_str(o, "content");
        if (!c) return cp_fail(L->err, CP_EFORMAT, "%s: Replace normalizer without 'content'", t->where);
        n->kind = NORM_REPLACE;
        if (!(n->text = dup_str(L, c))) return CP_ENOMEM;
        t->n_norms++; /* owned from here on, freed with the tokenizer */
        return load_pattern(L, o, "Replace normalizer", &n->pattern);
    } else return unsupported(L, "normalizer", ty);
    t->n_norms++;
    return CP_OK;
}

/* GPT-2's split regex, used by ByteLevel with use_regex */
static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static cp_status load_pretok(ld *L, const cJSON *o)
{
    if (!o || cJSON_IsNull(o)) return CP_OK;
    const char *ty = type_of(o);
    cp_tokenizer *t = L->t;
    if (ty && strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        cp_status rc = CP_OK;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e && rc == CP_OK; e = e->next) rc = load_pretok(L, e);
        return rc;
    }
    if (t->n_pres == TK_MAX_STEPS) return cp_fail(L->err, CP_EFORMAT, "%s: more than %d pre-tokenizers", t->where, TK_MAX_STEPS);
    tk_pre *p = &t->pres[t->n_pres];
    memset(p, 0, sizeof *p);
    cp_status rc = CP_OK;
    if (ty && strcmp(ty, "Split") == 0) {
        p->kind = PRE_SPLIT;
        const char *b = get_str(o, "behavior");
        static const struct { const char *n; tk_split_behavior b; } bs[] = {
            { "Isolated", SPLIT_ISOLATED }, { "Removed", SPLIT_REMOVED }, { "MergedWithPrevious", SPLIT_MERGED_PREV },
            { "MergedWithNext", SPLIT_MERGED_NEXT }, { "Contiguous", SPLIT_CONTIGUOUS },
        };
        int ok = 0;
        for (size_t i = 0; b && i < sizeof bs / sizeof bs[0]; i++)
            if (strcmp(b, bs[i].n) == 0) p->behavior = bs[i].b, ok = 1;
        if (!ok) return unsupported(L, "Split behavior", b);
        p->invert = get_bool(o, "invert", 0);
        t->n_pres++;
        return load_pattern(L, o, "Split pre-tokenizer", &p->pattern);
    } else if (ty && strcmp(ty, "ByteLevel") == 0) {
        p->kind = PRE_BYTELEVEL;
        p->add_prefix_space = get_bool(o, "add_prefix_space", 1);
        p->use_regex = get_bool(o, "use_regex", 1);
        t->n_pres++;
        if (p->use_regex) {
            char where[320];
            snprintf(where, sizeof where, "%s: ByteLevel regex", t->where);
            rc = cp_regex_compile(&p->pattern, gpt2_regex, strlen(gpt2_regex), 0, where, L->err);
        }
        return rc;
    } else if (ty && strcmp(ty, "Metaspace") == 0) {
        p->kind = PRE_METASPACE;
        if ((rc = read_replacement(L, o, p->replacement)) || (rc = read_prepend(L, o, &p->prepend))) return rc;
        p->split = get_bool(o, "split", 1);
    } else if (ty && strcmp(ty, "Digits") == 0) {
        p->kind = PRE_DIGITS;
        p->individual_digits = get_bool(o, "individual_digits", 0);
    } else return unsupported(L, "pre-tokenizer", ty);
    t->n_pres++;
    return CP_OK;
}

/* The most special tokens a template may add to every prompt: real ones add
 * 1 to 3 (BOS, EOS, a separator); 100 000 BOS tokens made every prompt
 * overflow the context, and the prefill ran for minutes before that. */
#define TK_TEMPLATE_MAX_ADDED 64

static cp_status load_template(ld *L, const cJSON *o, tk_post *p)
{
    cp_tokenizer *t = L->t;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
    if (!cJSON_IsArray(single))
        return cp_fail(L->err, CP_EFORMAT, "%s: TemplateProcessing without a 'single' template", t->where);
    int ns = cJSON_IsObject(specials) ? cJSON_GetArraySize(specials) : 0;
    p->n_special = ns;
    p->special_ids = cp_calloc((size_t)ns + 1, sizeof *p->special_ids, "template", L->err);
    p->special_n = cp_calloc((size_t)ns + 1, sizeof *p->special_n, "template", L->err);
    p->items = cp_calloc((size_t)cJSON_GetArraySize(single) + 1, sizeof *p->items, "template", L->err);
    if (!p->special_ids || !p->special_n || !p->items) return CP_ENOMEM;
    int k = 0;
    for (const cJSON *e = specials ? specials->child : NULL; e; e = e->next, k++) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(e, "ids");
        int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        p->special_ids[k] = cp_calloc((size_t)n + 1, sizeof(int32_t), "template", L->err);
        if (!p->special_ids[k]) return CP_ENOMEM;
        for (const cJSON *x = ids ? ids->child : NULL; x; x = x->next) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= t->n_ids)
                return cp_fail(L->err, CP_EFORMAT, "%s: TemplateProcessing special token '%.64s' has an id out of range",
                               t->where, e->string);
            p->special_ids[k][p->special_n[k]++] = (int32_t)x->valuedouble;
        }
    }
    long added = 0;
    int n_seq = 0;
    for (const cJSON *e = single->child; e; e = e->next) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
        if (sq) {
            /* a second $A would copy the whole prompt again */
            if (n_seq++)
                return cp_fail(L->err, CP_EFORMAT, "%s: TemplateProcessing's 'single' template names the sequence more than once",
                               t->where);
            p->items[p->n_items++] = -1;
            continue;
        }
        const char *id = get_str(sp, "id");
        int found = -1, j = 0;
        for (const cJSON *x = specials ? specials->child : NULL; x && id; x = x->next, j++)
            if (strcmp(x->string, id) == 0) found = j;
        if (found < 0)
            return cp_fail(L->err, CP_EFORMAT, "%s: TemplateProcessing names special token '%.64s' it does not define",
                           t->where, id ? id : "");
        p->items[p->n_items++] = found;
        added += p->special_n[found];
        if (added > TK_TEMPLATE_MAX_ADDED)
            return cp_fail(L->err, CP_EFORMAT, "%s: TemplateProcessing adds more than %d special tokens to every prompt (real "
                           "templates add 1 to 3): refused", t->where, TK_TEMPLATE_MAX_ADDED);
    }
    return CP_OK;
}

static cp_status load_post(ld *L, const cJSON *o)
{
    if (!o || cJSON_IsNull(o)) return CP_OK;
    const char *ty = type_of(o);
    cp_tokenizer *t = L->t;
    if (ty && strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "processors");
        cp_status rc = CP_OK;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e && rc == CP_OK; e = e->next) rc = load_post(L, e);
        return rc;
    }
    if (t->n_posts == TK_MAX_STEPS) return cp_fail(L->err, CP_EFORMAT, "%s: more than %d post-processors", t->where, TK_MAX_STEPS);
    tk_post *p = &t->posts[t->n_posts];
    memset(p, 0, sizeof *p);
    if (ty && strcmp(ty, "TemplateProcessing") == 0) {
        p->kind = POST_TEMPLATE;
        t->n_posts++;
        return load_template(L, o, p);
    }
    if (ty && strcmp(ty, "ByteLevel") == 0) {
        p->kind = POST_BYTELEVEL;
        p->trim_offsets = get_bool(o, "trim_offsets", 1);
        t->n_posts++;
        return CP_OK;
    }
    return unsupported(L, "post-processor", ty);
}

static cp_status load_decoder(ld *L, const cJSON *o)
{
    if (!o || cJSON_IsNull(o)) return CP_OK;
    const char *ty = type_of(o);
    cp_tokenizer *t = L->t;
    if (ty && strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        cp_status rc = CP_OK;
        for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e && rc == CP_OK; e = e->next) rc = load_decoder(L, e);
        return rc;
    }
    if (t->n_decs == TK_MAX_STEPS) return cp_fail(L->err, CP_EFORMAT, "%s: more than %d decoders", t->where, TK_MAX_STEPS);
    tk_dec *d = &t->decs[t->n_decs];
    memset(d, 0, sizeof *d);
    cp_status rc;
    if (ty && strcmp(ty, "ByteLevel") == 0) d->kind = DEC_BYTELEVEL;
    else if (ty && strcmp(ty, "ByteFallback") == 0) d->kind = DEC_BYTEFALLBACK;
    else if (ty && strcmp(ty, "Fuse") == 0) d->kind = DEC_FUSE;
    else if (ty && strcmp(ty, "Metaspace") == 0) {
        d->kind = DEC_METASPACE;
        if ((rc = read_replacement(L, o, d->replacement)) || (rc = read_prepend(L, o, &d->prepend))) return rc;
    } else if (ty && strcmp(ty, "Replace") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
        const char *from = get_str(pat, "String"), *to = get_str(o, "content");
        if (!from) return unsupported(L, "decoder Replace pattern", get_str(pat, "Regex") ? "Regex" : "(missing)");
        if (!to || !*from) return cp_fail(L->err, CP_EFORMAT, "%s: Replace decoder needs a pattern and content", t->where);
        d->kind = DEC_REPLACE;
        t->n_decs++;
        if (!(d->from = dup_str(L, from)) || !(d->to = dup_str(L, to))) return CP_ENOMEM;
        return CP_OK;
    } else if (ty && strcmp(ty, "Strip") == 0) {
        const char *c = get_str(o, "content");
        uint32_t cp;
        if (!c || cp_utf8_len((const unsigned char *)c, strlen(c), &cp) != (int)strlen(c))
            return cp_fail(L->err, CP_EFORMAT, "%s: Strip decoder content must be one character", t->where);
        const cJSON *s0 = cJSON_GetObjectItemCaseSensitive(o, "start"), *s1 = cJSON_GetObjectItemCaseSensitive(o, "stop");
        d->kind = DEC_STRIP;
        d->strip_char = cp;
        d->strip_start = cJSON_IsNumber(s0) && s0->valuedouble > 0 && s0->valuedouble < 1024 ? (int)s0->valuedouble : 0;
        d->strip_stop = cJSON_IsNumber(s1) && s1->valuedouble > 0 && s1->valuedouble < 1024 ? (int)s1->valuedouble : 0;
    } else return unsupported(L, "decoder", ty);
    t->n_decs++;
    return CP_OK;
}

/* ---- model ------------------------------------------------------------------- */

#define TK_MAX_IDS (1 << 24)

static cp_status set_piece(ld *L, int32_t id, const char *s, size_t n)
{
    cp_tokenizer *t = L->t;
    if (t->pieces[id]) return CP_OK; /* the vocab's own spelling wins */
    t->pieces[id] = cp_malloc(n + 1, "token piece", L->err);
    if (!t->pieces[id]) return CP_ENOMEM;
    memcpy(t->pieces[id], s, n);
    t->pieces[id][n] = 0;
    return CP_OK;
}

static cp_status load_model(ld *L, const cJSON *model, const cJSON *added)
{
    cp_tokenizer *t = L->t;
    const char *ty = type_of(model);
    if (!model) return cp_fail(L->err, CP_EFORMAT, "%s: missing 'model'", t->where);
    if (ty && strcmp(ty, "BPE") != 0) return unsupported(L, "model", ty);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return cp_fail(L->err, CP_EFORMAT, "%s: model.vocab must be an object", t->where);
    const char *cs = get_str(model, "continuing_subword_prefix"), *ew = get_str(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew)) return unsupported(L, "BPE option", cs && *cs ? "continuing_subword_prefix" : "end_of_word_suffix");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0) return unsupported(L, "BPE option", "dropout");
    t->byte_fallback = get_bool(model, "byte_fallback", 0);
    t->fuse_unk = get_bool(model, "fuse_unk", 0);
    t->ignore_merges = get_bool(model, "ignore_merges", 0);

    int32_t max_id = -1;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= TK_MAX_IDS || e->valuedouble != (int32_t)e->valuedouble)
            return cp_fail(L->err, CP_EFORMAT, "%s: model.vocab['%.64s'] is not an id in [0, %d)", t->where, e->string, TK_MAX_IDS);
        if ((int32_t)e->valuedouble > max_id) max_id = (int32_t)e->valuedouble;
    }
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= TK_MAX_IDS)
            return cp_fail(L->err, CP_EFORMAT, "%s: added_tokens entry without a valid id", t->where);
        if ((int32_t)id->valuedouble > max_id) max_id = (int32_t)id->valuedouble;
    }
    if (max_id < 0) return cp_fail(L->err, CP_EFORMAT, "%s: empty vocabulary", t->where);
    t->n_ids = max_id + 1;
    t->pieces = cp_calloc((size_t)t->n_ids, sizeof *t->pieces, "token pieces", L->err);
    t->is_special = cp_calloc((size_t)t->n_ids, 1, "token flags", L->err);
    if (!t->pieces || !t->is_special) return CP_ENOMEM;
    cp_status rc;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id = (int32_t)e->valuedouble;
        size_t n = strlen(e->string);
        if ((rc = cp_strmap_put(&t->vocab, e->string, n, id, L->err)) || (rc = set_piece(L, id, e->string, n))) return rc;
    }
    /* merges: "a b" strings or ["a", "b"] pairs; rank = position */
    int32_t rank = 0;
    char buf[1024];
    for (const cJSON *e = cJSON_IsArray(merges) ? merges->child : NULL; e; e = e->next, rank++) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return cp_fail(L->err, CP_EFORMAT, "%s: merge %d '%.64s' is not two pieces separated by one space",
                               t->where, rank, e->valuestring);
            a = e->valuestring, na = (size_t)(sp - a), b = sp + 1, nb = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring, na = strlen(a), b = e->child->next->valuestring, nb = strlen(b);
        } else {
            return cp_fail(L->err, CP_EFORMAT, "%s: merge %d is neither \"a b\" nor [\"a\", \"b\"]", t->where, rank);
        }
        int32_t ia, ib, im;
        if (na + nb >= sizeof buf) return cp_fail(L->err, CP_EFORMAT, "%s: merge %d is too long", t->where, rank);
        memcpy(buf, a, na);
        memcpy(buf + na, b, nb);
        if (!cp_strmap_get(&t->vocab, a, na, &ia) || !cp_strmap_get(&t->vocab, b, nb, &ib) ||
            !cp_strmap_get(&t->vocab, buf, na + nb, &im))
            return cp_fail(L->err, CP_EFORMAT, "%s: merge %d uses a piece that is not in the vocabulary", t->where, rank);
        if ((rc = cp_pairmap_put(&t->merges, ia, ib, rank, im, L->err))) return rc;
        if (nb >= 3 && memcmp(b, "\xe2\x96\x81", 3) == 0)
            for (size_t k = 0; k < na; k += 3)
                if (na - k < 3 || memcmp(a + k, "\xe2\x96\x81", 3) != 0) t->merge_joins_words = 1;
    }
    const char *unk = get_str(model, "unk_token");
    t->unk_id = -1;
    if (unk && !cp_strmap_get(&t->vocab, unk, strlen(unk), &t->unk_id))
        return cp_fail(L->err, CP_EFORMAT, "%s: unk_token '%.64s' is not in the vocabulary", t->where, unk);
    for (int b = 0; b < 256; b++) {
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        if (!cp_strmap_get(&t->vocab, piece, 6, &t->byte_fallback_id[b])) t->byte_fallback_id[b] = -1;
        int n = cp_utf8_encode(tk_byte_to_cp((uint8_t)b), piece);
        if (!cp_strmap_get(&t->vocab, piece, (size_t)n, &t->byte_level_id[b])) t->byte_level_id[b] = -1;
    }
    return CP_OK;
}

typedef struct len_idx {
    size_t len;
    int idx;
} len_idx;

static int by_len_desc(const void *x, const void *y)
{
    const len_idx *a = x, *b = y;
    return a->len < b->len ? 1 : a->len > b->len ? -1 : a->idx - b->idx;
}

static cp_status load_added(ld *L, const cJSON *added)
{
    cp_tokenizer *t = L->t;
    int n = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    t->added = cp_calloc((size_t)n + 1, sizeof *t->added, "added tokens", L->err);
    if (!t->added) return CP_ENOMEM;
    for (const cJSON *e = n ? added->child : NULL; e; e = e->next) {
        const char *c = get_str(e, "content");
        if (!c || !*c) return cp_fail(L->err, CP_EFORMAT, "%s: added token without content", t->where);
        tk_added *a = &t->added[t->n_added++];
        a->id = (int32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
        a->len = strlen(c);
        if (!(a->content = dup_str(L, c))) return CP_ENOMEM;
        a->special = get_bool(e, "special", 0);
        a->lstrip = get_bool(e, "lstrip", 0);
        a->rstrip = get_bool(e, "rstrip", 0);
        a->single_word = get_bool(e, "single_word", 0);
        a->normalized = get_bool(e, "normalized", !a->special);
        t->is_special[a->id] = (uint8_t)a->special;
        cp_status rc = set_piece(L, a->id, c, a->len);
        if (rc) return rc;
    }
    /* buckets by first byte, longest first: leftmost-longest matching */
    int count[256] = { 0 };
    for (int i = 0; i < t->n_added; i++) count[(unsigned char)t->added[i].content[0]]++;
    for (int b = 0; b < 256; b++) {
        if (!count[b]) continue;
        t->added_by_byte[b] = cp_malloc((size_t)count[b] * sizeof(int), "added token index", L->err);
        if (!t->added_by_byte[b]) return CP_ENOMEM;
    }
    for (int i = 0; i < t->n_added; i++) {
        int b = (unsigned char)t->added[i].content[0];
        t->added_by_byte[b][t->added_by_byte_n[b]++] = i;
    }
    len_idx *tmp = cp_malloc((size_t)t->n_added * sizeof *tmp + 1, "added token sort", L->err);
    if (!tmp) return CP_ENOMEM;
    for (int b = 0; b < 256; b++) {
        int *v = t->added_by_byte[b];
        for (int i = 0; i < count[b]; i++) tmp[i] = (len_idx){ t->added[v[i]].len, v[i] };
        qsort(tmp, (size_t)count[b], sizeof *tmp, by_len_desc);
        for (int i = 0; i < count[b]; i++) v[i] = tmp[i].idx;
    }
    free(tmp);
    return CP_OK;
}

/* tokenizer_config.json: bos/eos (a string or {"content": ...}), chat_template */
static cp_status load_config(ld *L, const char *json)
{
    cp_tokenizer *t = L->t;
    t->bos_id = t->eos_id = -1;
    if (!json) return CP_OK;
    cJSON *c = cJSON_Parse(json);
    if (!c || !cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return cp_fail(L->err, CP_EFORMAT, "%s: tokenizer_config.json is not a JSON object", t->where);
    }
    const char *names[2] = { "bos_token", "eos_token" };
    int32_t *ids[2] = { &t->bos_id, &t->eos_id };
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, names[i]);
        const char *s = cJSON_IsString(v) ? v->valuestring : get_str(v, "content");
        if (s) *ids[i] = cp_tokenizer_find(t, s);
    }
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(c, "chat_template");
    const char *ts = cJSON_IsString(tpl) ? tpl->valuestring : NULL;
    /* a list of named templates: take "default" */
    for (const cJSON *e = cJSON_IsArray(tpl) ? tpl->child : NULL; e && !ts; e = e->next) {
        const char *nm = get_str(e, "name");
        if (nm && strcmp(nm, "default") == 0) ts = get_str(e, "template");
    }
    cp_status rc = CP_OK;
    if (ts && !(t->chat_template = dup_str(L, ts))) rc = CP_ENOMEM;
    cJSON_Delete(c);
    return rc;
}

void cp_tokenizer_free(cp_tokenizer *t)
{
    if (!t) return;
    cp_strmap_free(&t->vocab);
    cp_pairmap_free(&t->merges);
    for (int32_t i = 0; t->pieces && i < t->n_ids; i++) free(t->pieces[i]);
    free(t->pieces);
    free(t->is_special);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int b = 0; b < 256; b++) free(t->added_by_byte[b]);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].text);
        cp_regex_free(&t->norms[i].pattern);
    }
    for (int i = 0; i < t->n_pres; i++) cp_regex_free(&t->pres[i].pattern);
    for (int i = 0; i < t->n_posts; i++) {
        tk_post *p = &t->posts[i];
        for (int k = 0; p->special_ids && k < p->n_special; k++) free(p->special_ids[k]);
        free(p->special_ids);
        free(p->special_n);
        free(p->items);
    }
    for (int i = 0; i < t->n_decs; i++) {
        free(t->decs[i].from);
        free(t->decs[i].to);
    }
    free(t->chat_template);
    free(t);
}

cp_status cp_tokenizer_from_json(const char *json, size_t len, const char *config_json, const char *where,
                                 cp_tokenizer **out, cp_error *err)
{
    *out = NULL;
    cp_tokenizer *t = cp_calloc(1, sizeof *t, "tokenizer", err);
    if (!t) return CP_ENOMEM;
    snprintf(t->where, sizeof t->where, "%s", where);
    ld L = { t, err };
    cJSON *root = cJSON_ParseWithLength(json, len);
    cp_status rc;
    if (!root || !cJSON_IsObject(root)) {
        rc = cp_fail(err, CP_EFORMAT, "%s: not a well-formed JSON object", where);
    } else {
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
        if (!(rc = load_model(&L, cJSON_GetObjectItemCaseSensitive(root, "model"), added)) && !(rc = load_added(&L, added)) &&
            !(rc = load_normalizer(&L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) &&
            !(rc = load_pretok(&L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) &&
            !(rc = load_post(&L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"))) &&
            !(rc = load_decoder(&L, cJSON_GetObjectItemCaseSensitive(root, "decoder"))))
            rc = load_config(&L, config_json);
    }
    /* Metaspace with split=false hands BPE whole paragraphs.  When no merge
     * joins a piece to a following "▁word" (true of SentencePiece-derived
     * files), BPE can never merge across the start of a word, so cutting
     * there first gives identical tokens and lets short words hit the call's cache. */
    int32_t rep_id;
    for (int i = 0; rc == CP_OK && i < t->n_pres; i++) {
        tk_pre *p = &t->pres[i];
        p->word_split = p->kind == PRE_METASPACE && !p->split && !t->merge_joins_words &&
                        strcmp(p->replacement, "\xe2\x96\x81") == 0 && cp_strmap_get(&t->vocab, p->replacement, 3, &rep_id);
    }
    cJSON_Delete(root);
    if (rc) {
        cp_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return CP_OK;
}

cp_status cp_tokenizer_load(const char *dir, cp_tokenizer **out, cp_error *err)
{
    char path[4096], cpath[4096], *json = NULL, *cfg = NULL;
    size_t len;
    cp_status rc;
    if ((rc = cp_model_dir_check(dir, err)) || (rc = cp_path_join(path, sizeof path, dir, "tokenizer.json", err)) ||
        (rc = cp_path_join(cpath, sizeof cpath, dir, "tokenizer_config.json", err)))
        return rc;
    if ((rc = cp_read_file(path, (size_t)64 << 20, &json, &len, err))) {
        /* a SentencePiece checkpoint: say what is missing, not only which file */
        char spm[4096];
        struct stat st;
        if (rc == CP_EIO && cp_path_join(spm, sizeof spm, dir, "tokenizer.model", NULL) == CP_OK && stat(spm, &st) == 0)
            return cp_fail(err, CP_EIO, "%s has tokenizer.model but no tokenizer.json: SentencePiece models need tokenizer.json "
                                        "(the HuggingFace tokenizers file; save it with the model's fast tokenizer)", dir);
        return rc;
    }
    cp_error cerr = { 0 };
    if (cp_read_file(cpath, (size_t)16 << 20, &cfg, NULL, &cerr) != CP_OK && cerr.code != CP_EIO) {
        free(json);
        *err = cerr;
        return cerr.code;
    }
    rc = cp_tokenizer_from_json(json, len, cfg, path, out, err);
    free(json);
    free(cfg);
    return rc;
}

int cp_tokenizer_n_ids(const cp_tokenizer *t) { return t->n_ids; }
const char *cp_tokenizer_piece(const cp_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids ? t->pieces[id] : NULL; }
int cp_tokenizer_is_special(const cp_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_ids && t->is_special[id]; }
int32_t cp_tokenizer_bos(const cp_tokenizer *t) { return t->bos_id; }
int32_t cp_tokenizer_eos(const cp_tokenizer *t) { return t->eos_id; }
const char *cp_tokenizer_chat_template(const cp_tokenizer *t) { return t->chat_template; }

int32_t cp_tokenizer_find(const cp_tokenizer *t, const char *piece)
{
    size_t n = strlen(piece);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].content, piece, n) == 0) return t->added[i].id;
    int32_t id;
    return cp_strmap_get(&t->vocab, piece, n, &id) ? id : -1;
}
