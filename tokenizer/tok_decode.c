/* Decoders (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip) and
 * the streaming decoder. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "utf8.h"

/* A list of growable strings: the decoders rewrite the token strings. */
typedef struct strbuf {
    char *s;
    size_t n, cap;
} strbuf;

typedef struct strlist {
    strbuf *v;
    size_t n;
} strlist;

static int sb_add(strbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 16;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) return 0;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 1;
}

static void list_free(strlist *l)
{
    for (size_t i = 0; i < l->n; i++) free(l->v[i].s);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

/* Replaces the list by the single string b (taken over). */
static int list_set_single(strlist *l, strbuf b)
{
    list_free(l);
    l->v = calloc(1, sizeof *l->v);
    if (!l->v) {
        free(b.s);
        return 0;
    }
    l->v[0] = b;
    l->n = 1;
    return 1;
}

static const char replacement_char[] = "\xef\xbf\xbd"; /* U+FFFD */

/* Copies s, replacing each byte that does not start a valid sequence with
 * U+FFFD (what from_utf8_lossy does, per invalid byte). */
static int add_lossy(strbuf *b, const char *s, size_t n)
{
    size_t i = 0, run = 0;
    uint32_t cp;
    while (i < n) {
        int l = cp_utf8_len((const unsigned char *)s + i, n - i, &cp);
        if (l) {
            i += (size_t)l;
            continue;
        }
        if (!sb_add(b, s + run, i - run) || !sb_add(b, replacement_char, 3)) return 0;
        run = ++i;
    }
    return sb_add(b, s + run, n - run);
}

/* Replaces every occurrence of `from` in b by `to`. */
static int replace_all(strbuf *b, const char *from, const char *to)
{
    size_t fl = strlen(from);
    if (!fl || !b->s || !strstr(b->s, from)) return 1;
    strbuf o = { 0 };
    const char *p = b->s, *q;
    while ((q = strstr(p, from))) {
        if (!sb_add(&o, p, (size_t)(q - p)) || !sb_add(&o, to, strlen(to))) {
            free(o.s);
            return 0;
        }
        p = q + fl;
    }
    if (!sb_add(&o, p, strlen(p))) {
        free(o.s);
        return 0;
    }
    free(b->s);
    *b = o;
    return 1;
}

static int is_byte_piece(const strbuf *b, int *byte)
{
    /* "<0xAB>" */
    if (b->n != 6 || memcmp(b->s, "<0x", 3) != 0 || b->s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = b->s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    *byte = v;
    return 1;
}

static int dec_bytelevel(strlist *l)
{
    strbuf raw = { 0 }, out = { 0 };
    int ok = 1;
    for (size_t i = 0; i < l->n && ok; i++) {
        const unsigned char *s = (const unsigned char *)l->v[i].s;
        size_t n = l->v[i].n, k = 0;
        while (k < n && ok) {
            uint32_t cp;
            int len = cp_utf8_len(s + k, n - k, &cp);
            int b = len ? tk_cp_to_byte(cp) : -1;
            if (b >= 0) {
                char c = (char)b;
                ok = sb_add(&raw, &c, 1);
            } else { /* not a byte stand-in (e.g. an added token): keep it */
                if (!len) len = 1;
                ok = sb_add(&raw, (const char *)s + k, (size_t)len);
            }
            k += (size_t)len;
        }
    }
    if (ok) ok = add_lossy(&out, raw.s ? raw.s : "", raw.n);
    free(raw.s);
    if (!ok) {
        free(out.s);
        return 0;
    }
    return list_set_single(l, out);
}

static int dec_bytefallback(strlist *l)
{
    strlist o = { calloc(l->n + 1, sizeof(strbuf)), 0 };
    if (!o.v) return 0;
    int ok = 1;
    for (size_t i = 0; i < l->n && ok;) {
        int b;
        if (!is_byte_piece(&l->v[i], &b)) {
            o.v[o.n++] = l->v[i];
            l->v[i] = (strbuf){ 0 };
            i++;
            continue;
        }
        strbuf bytes = { 0 }, s = { 0 };
        size_t j = i;
        while (j < l->n && is_byte_piece(&l->v[j], &b) && ok) {
            char c = (char)b;
            ok = sb_add(&bytes, &c, 1);
            j++;
        }
        if (ok) {
            if (cp_utf8_validate(bytes.s, bytes.n) == bytes.n) ok = sb_add(&s, bytes.s, bytes.n);
            else
                for (size_t k = 0; k < bytes.n && ok; k++) ok = sb_add(&s, replacement_char, 3);
        }
        free(bytes.s);
        o.v[o.n++] = s;
        i = j;
    }
    list_free(l);
    *l = o;
    return ok;
}

static int dec_strip(strlist *l, const tk_dec *d)
{
    char c[4];
    size_t cl = (size_t)cp_utf8_encode(d->strip_char, c);
    for (size_t i = 0; i < l->n; i++) {
        strbuf *b = &l->v[i];
        if (!b->s) continue;
        size_t s = 0, e = b->n;
        for (int k = 0; k < d->strip_start && e - s >= cl && memcmp(b->s + s, c, cl) == 0; k++) s += cl;
        for (int k = 0; k < d->strip_stop && e - s >= cl && memcmp(b->s + e - cl, c, cl) == 0; k++) e -= cl;
        memmove(b->s, b->s + s, e - s);
        b->n = e - s;
        b->s[b->n] = 0;
    }
    return 1;
}

static int dec_fuse(strlist *l)
{
    strbuf all = { 0 };
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].s && !sb_add(&all, l->v[i].s, l->v[i].n)) {
            free(all.s);
            return 0;
        }
    return list_set_single(l, all);
}

static int dec_metaspace(strlist *l, const tk_dec *d)
{
    for (size_t i = 0; i < l->n; i++) {
        if (!replace_all(&l->v[i], d->replacement, " ")) return 0;
        strbuf *b = &l->v[i];
        if (i == 0 && d->prepend != PREPEND_NEVER && b->n && b->s[0] == ' ') {
            memmove(b->s, b->s + 1, b->n);
            b->n--;
        }
    }
    return 1;
}

cp_status cp_detokenize(const cp_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **out, size_t *len,
                        cp_error *err)
{
    *out = NULL;
    strlist l = { calloc(n + 1, sizeof(strbuf)), 0 };
    if (!l.v) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory decoding %zu ids", n);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->pieces[ids[i]]) {
            list_free(&l);
            return cp_fail(err, CP_ERANGE, "tokenizer: id %d at index %zu is not a token of %s", ids[i], i, t->where);
        }
        if (skip_special && t->is_special[ids[i]]) continue;
        if (!sb_add(&l.v[l.n++], t->pieces[ids[i]], strlen(t->pieces[ids[i]]))) goto oom;
    }
    for (int k = 0; k < t->n_decs; k++) {
        const tk_dec *d = &t->decs[k];
        int ok = 1;
        switch (d->kind) {
        case DEC_BYTELEVEL: ok = dec_bytelevel(&l); break;
        case DEC_BYTEFALLBACK: ok = dec_bytefallback(&l); break;
        case DEC_FUSE: ok = dec_fuse(&l); break;
        case DEC_STRIP: ok = dec_strip(&l, d); break;
        case DEC_METASPACE: ok = dec_metaspace(&l, d); break;
        case DEC_REPLACE:
            for (size_t i = 0; i < l.n && ok; i++) ok = replace_all(&l.v[i], d->from, d->to);
            break;
        }
        if (!ok) goto oom;
    }
    strbuf all = { 0 };
    for (size_t i = 0; i < l.n; i++)
        if (l.v[i].s && !add_lossy(&all, l.v[i].s, l.v[i].n)) {
            free(all.s);
            goto oom;
        }
    list_free(&l);
    if (!all.s && !sb_add(&all, "", 0)) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory");
    *out = all.s;
    if (len) *len = all.n;
    return CP_OK;
oom:
    list_free(&l);
    return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory decoding %zu ids", n);
}

/* ---- streaming ------------------------------------------------------------- */

void cp_detok_stream_init(cp_detok_stream *s, const cp_tokenizer *t, int skip_special)
{
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
}

void cp_detok_stream_free(cp_detok_stream *s)
{
    free(s->ids);
    s->ids = NULL;
}

/* Text ending in U+FFFD may still be waiting for the rest of a character. */
static int ends_incomplete(const char *s, size_t n) { return n >= 3 && memcmp(s + n - 3, replacement_char, 3) == 0; }

/* Decodes ids[prefix..read) and ids[prefix..n): the new text is what the
 * second adds to the first, once it no longer ends in a half character.
 * Decoding from `prefix` (not from 0) keeps each step short while giving the
 * decoders (Strip, Metaspace) the context of the tokens before. */
cp_status cp_detok_stream_push(cp_detok_stream *s, int32_t id, char **out, cp_error *err)
{
    *out = NULL;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        int32_t *v = realloc(s->ids, cap * sizeof *v);
        if (!v) return cp_fail(err, CP_ENOMEM, "tokenizer: out of memory streaming");
        s->ids = v;
        s->cap = cap;
    }
    s->ids[s->n++] = id;
    char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    cp_status rc = cp_detokenize(s->t, s->ids + s->prefix, s->read - s->prefix, s->skip_special, &before, &nb, err);
    if (rc == CP_OK) rc = cp_detokenize(s->t, s->ids + s->prefix, s->n - s->prefix, s->skip_special, &after, &na, err);
    if (rc != CP_OK) {
        s->n--;
        free(before);
        return rc;
    }
    if (na > nb && !ends_incomplete(after, na) && memcmp(before, after, nb) == 0) {
        memmove(after, after + nb, na - nb + 1);
        *out = after;
        s->prefix = s->read;
        s->read = s->n;
    } else {
        after[0] = 0;
        *out = after;
    }
    free(before);
    return CP_OK;
}
