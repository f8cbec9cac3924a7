/* Pre-tokenizers: Split (the file's regex), ByteLevel, Metaspace, Digits. */
#include <string.h>
#include <utf8proc.h>

#include "tok_internal.h"
#include "utf8.h"

typedef struct seg {
    size_t s, e;
    int match;
} seg;

static size_t next_char(const char *s, size_t n, size_t i)
{
    i++;
    while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80) i++;
    return i;
}

/* Emits the pieces of split sp given its segments (matches and gaps, in
 * order, covering it) under a Split behavior. */
static cp_status emit_pieces(const tk_split *sp, const seg *g, size_t ng, tk_split_behavior b, tk_splits *out,
                             cp_error *err)
{
    cp_status rc = CP_OK;
    size_t ps = 0, pe = 0; /* the open piece, relative to sp */
    int open = 0, open_ends_with_match = 0;
#define FLUSH()                                                                                      \
    do {                                                                                             \
        if (open && pe > ps) rc = tk_splits_push(out, (tk_split){ sp->off + ps, pe - ps, -1, sp->bytelevel }, err); \
        open = 0;                                                                                    \
    } while (0)
    for (size_t i = 0; i < ng && rc == CP_OK; i++) {
        const seg *x = &g[i];
        switch (b) {
        case SPLIT_ISOLATED:
            rc = tk_splits_push(out, (tk_split){ sp->off + x->s, x->e - x->s, -1, sp->bytelevel }, err);
            break;
        case SPLIT_REMOVED:
            if (!x->match) rc = tk_splits_push(out, (tk_split){ sp->off + x->s, x->e - x->s, -1, sp->bytelevel }, err);
            break;
        case SPLIT_MERGED_PREV: /* a match closes the piece before it */
            if (!open) ps = x->s, open = 1;
            pe = x->e;
            if (x->match) FLUSH();
            break;
        case SPLIT_MERGED_NEXT: /* a match opens a piece */
            if (x->match) FLUSH();
            if (!open) ps = x->s, open = 1;
            pe = x->e;
            break;
        case SPLIT_CONTIGUOUS: /* runs of matches become one piece */
            if (!(open && x->match && open_ends_with_match)) FLUSH();
            if (!open) ps = x->s, open = 1;
            pe = x->e;
            open_ends_with_match = x->match;
            break;
        }
    }
    if (rc == CP_OK) FLUSH();
#undef FLUSH
    return rc;
}

static cp_status grow_segs(seg **g, size_t *cap, size_t need, cp_error *err)
{
    if (need <= *cap) return CP_OK;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need) c *= 2;
    seg *p = realloc(*g, c * sizeof *p);
    if (!p) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory splitting text");
    *g = p;
    *cap = c;
    return CP_OK;
}

static cp_status regex_split(tk_matcher *m, const tk_arena *a, const tk_split *sp, const tk_pattern *pat,
                             tk_split_behavior b, int invert, tk_splits *out, cp_error *err)
{
    seg *g = NULL;
    size_t ng = 0, cap = 0, pos = 0, from = 0, ms, me;
    int found;
    cp_status rc = CP_OK;
    const char *s = a->s + sp->off;
    while (from <= sp->len) {
        if ((rc = find_span(pat, m, s, sp->len, from, &ms, &me, &found, err)) || !found) break;
        if (me == ms) { /* empty matches split nothing */
            if (ms >= sp->len) break;
            from = next_char(s, sp->len, ms);
            continue;
        }
        if ((rc = grow_segs(&g, &cap, ng + 2, err))) break;
        if (ms > pos) g[ng++] = (seg){ pos, ms, invert };
        g[ng++] = (seg){ ms, me, !invert };
        pos = from = me;
    }
    if (rc == CP_OK && pos < sp->len && (rc = grow_segs(&g, &cap, ng + 1, err)) == CP_OK) g[ng++] = (seg){ pos, sp->len, invert };
    if (rc == CP_OK) rc = emit_pieces(sp, g, ng, b, out, err);
    free(g);
    return rc;
}

static cp_status bytelevel(const tk_pre *p, tk_matcher *m, tk_arena *a, tk_split sp, tk_splits *out, cp_error *err)
{
    cp_status rc;
    if (p->add_prefix_space && sp.len > 0 && a->s[sp.off] != ' ') {
        size_t at, at2;
        uint32_t anchor = a->a0[sp.off];
        if ((rc = tk_arena_put(a, " ", 1, anchor, anchor, &at, err)) || (rc = tk_arena_copy(a, sp.off, sp.len, &at2, err)))
            return rc;
        sp.off = at;
        sp.len += 1;
    }
    sp.bytelevel = 1;
    if (!p->use_regex) return tk_splits_push(out, sp, err);
    return regex_split(m, a, &sp, &p->pattern, SPLIT_ISOLATED, 0, out, err);
}

/* Spaces become the replacement character; the replacement is prepended per
 * prepend_scheme.  "first" prepends to the split that starts the input, even
 * when it already starts with a space: SentencePiece's dummy prefix, which
 * the reference encodings (and Mistral/Llama's real tokenizers) follow. */
static cp_status metaspace(const tk_pre *p, tk_arena *a, tk_split sp, tk_splits *out, cp_error *err)
{
    if (sp.len == 0) return CP_OK;
    size_t rlen = strlen(p->replacement), start = a->len, at;
    cp_status rc;
    uint32_t anchor = a->a0[sp.off];
    int starts_rep = sp.len >= rlen && memcmp(a->s + sp.off, p->replacement, rlen) == 0;
    int pre = (p->prepend == PREPEND_ALWAYS && !starts_rep && a->s[sp.off] != ' ') ||
              (p->prepend == PREPEND_FIRST && anchor == 0);
    if (pre && (rc = tk_arena_put(a, p->replacement, rlen, anchor, anchor, &at, err))) return rc;
    size_t run = sp.off, end = sp.off + sp.len;
    for (size_t i = sp.off; i < end; i++) {
        if (a->s[i] != ' ') continue;
        if (i > run && (rc = tk_arena_copy(a, run, i - run, &at, err))) return rc;
        if ((rc = tk_arena_put(a, p->replacement, rlen, a->a0[i], a->a1[i], &at, err))) return rc;
        run = i + 1;
    }
    if (end > run && (rc = tk_arena_copy(a, run, end - run, &at, err))) return rc;
    tk_split ns = { start, a->len - start, -1, sp.bytelevel };
    if (!p->split && !p->word_split) return tk_splits_push(out, ns, err);
    /* split before every replacement character (MergedWithNext), or with
     * word_split only before one that starts a word (follows another char) */
    size_t ps = ns.off;
    for (size_t i = ns.off + 1; i + rlen <= ns.off + ns.len; i++) {
        if (memcmp(a->s + i, p->replacement, rlen) != 0) continue;
        if (!p->split && i >= ns.off + rlen && memcmp(a->s + i - rlen, p->replacement, rlen) == 0) continue;
        if ((rc = tk_splits_push(out, (tk_split){ ps, i - ps, -1, sp.bytelevel }, err))) return rc;
        ps = i;
    }
    return tk_splits_push(out, (tk_split){ ps, ns.off + ns.len - ps, -1, sp.bytelevel }, err);
}

static int is_numeric(const char *s, size_t n, size_t *clen)
{
    uint32_t cp;
    int l = cp_utf8_len((const unsigned char *)s, n, &cp);
    *clen = l ? (size_t)l : 1;
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

static cp_status digits(const tk_pre *p, const tk_arena *a, tk_split sp, tk_splits *out, cp_error *err)
{
    cp_status rc = CP_OK;
    size_t i = 0, ps = 0, cl;
    int in_digits = 0;
    const char *s = a->s + sp.off;
    while (i < sp.len && rc == CP_OK) {
        int d = is_numeric(s + i, sp.len - i, &cl);
        if (i > ps && (d != in_digits || (d && p->individual_digits))) {
            rc = tk_splits_push(out, (tk_split){ sp.off + ps, i - ps, -1, sp.bytelevel }, err);
            ps = i;
        }
        in_digits = d;
        i += cl;
    }
    if (rc == CP_OK && sp.len > ps) rc = tk_splits_push(out, (tk_split){ sp.off + ps, sp.len - ps, -1, sp.bytelevel }, err);
    return rc;
}

cp_status tk_pretokenize(const cp_tokenizer *t, tk_matcher *m, tk_arena *a, const tk_pre *p, const tk_splits *in,
                         tk_splits *out, cp_error *err)
{
    (void)t;
    cp_status rc = CP_OK;
    for (size_t k = 0; k < in->n && rc == CP_OK; k++) {
        tk_split sp = in->v[k];
        if (sp.token >= 0) {
            rc = tk_splits_push(out, sp, err);
            continue;
        }
        switch (p->kind) {
        case PRE_SPLIT: rc = regex_split(m, a, &sp, &p->pattern, p->behavior, p->invert, out, err); break;
        case PRE_BYTELEVEL: rc = bytelevel(p, m, a, sp, out, err); break;
        case PRE_METASPACE: rc = metaspace(p, a, sp, out, err); break;
        case PRE_DIGITS: rc = digits(p, a, sp, out, err); break;
        }
    }
    return rc;
}
