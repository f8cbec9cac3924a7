#include "auth.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "../../kernels/fileio.h"
#include "../../kernels/log.h"
#include "../../kernels/sha256.h"

typedef struct key_entry {
    uint8_t digest[32];
    uint32_t tenant;
    int operator_;
    size_t line;
} key_entry;

struct srv_keys {
    key_entry *v;
    size_t n, cap;
};

static void digest_of(const char *key, size_t len, uint8_t out[32])
{
    const void *parts[1] = { key };
    size_t lens[1] = { len };
    cp_sha256(parts, lens, 1, out);
}

void srv_keys_free(srv_keys *k)
{
    if (!k) return;
    if (k->v) OPENSSL_cleanse(k->v, k->cap * sizeof *k->v);
    free(k->v);
    free(k);
}

size_t srv_keys_count(const srv_keys *k) { return k ? k->n : 0; }

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* The next whitespace-separated field of [*p, end). */
static size_t next_field(const char **p, const char *end, const char **field)
{
    while (*p < end && is_blank(**p)) (*p)++;
    *field = *p;
    while (*p < end && !is_blank(**p)) (*p)++;
    return (size_t)(*p - *field);
}

static cp_status add_entry(srv_keys *k, const key_entry *e, cp_error *err)
{
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 16;
        key_entry *v = cp_calloc(cap, sizeof *v, "keys", err);
        if (!v) return CP_ENOMEM;
        if (k->v) memcpy(v, k->v, k->n * sizeof *v), OPENSSL_cleanse(k->v, k->cap * sizeof *k->v);
        free(k->v);
        k->v = v, k->cap = cap;
    }
    k->v[k->n++] = *e;
    return CP_OK;
}

static cp_status parse_line(srv_keys *k, const char *p, const char *end, const char *where, size_t lineno, cp_tenant_table *ten,
                            cp_error *err)
{
    const char *key, *tenant, *role, *extra;
    size_t nk = next_field(&p, end, &key);
    if (nk == 0 || key[0] == '#') return CP_OK; /* blank or comment */
    size_t nt = next_field(&p, end, &tenant), nr = next_field(&p, end, &role), nx = next_field(&p, end, &extra);
    if (nt == 0) return cp_fail(err, CP_EFORMAT, "%s:%zu: expected KEY TENANT [operator]", where, lineno);
    if (nr && !(nr == 8 && memcmp(role, "operator", 8) == 0))
        return cp_fail(err, CP_EFORMAT, "%s:%zu: the third field must be 'operator' or nothing", where, lineno);
    if (nx) return cp_fail(err, CP_EFORMAT, "%s:%zu: too many fields (expected KEY TENANT [operator])", where, lineno);
    if (nk < SRV_KEY_MIN || nk > SRV_KEY_MAX)
        return cp_fail(err, CP_EFORMAT, "%s:%zu: a key must be %d to %d characters (this one has %zu)", where, lineno, SRV_KEY_MIN,
                       SRV_KEY_MAX, nk);
    for (size_t i = 0; i < nk; i++)
        if ((unsigned char)key[i] < 0x21 || (unsigned char)key[i] > 0x7e)
            return cp_fail(err, CP_EFORMAT, "%s:%zu: a key is visible ASCII only (byte %zu is not)", where, lineno, i);
    key_entry e = { .operator_ = nr != 0, .line = lineno };
    if (cp_tenant_intern(ten, tenant, nt, &e.tenant, err)) return cp_fail_wrap(err, "%s:%zu", where, lineno);
    digest_of(key, nk, e.digest);
    cp_status rc = add_entry(k, &e, err);
    OPENSSL_cleanse(&e, sizeof e);
    return rc;
}

static int by_digest_then_line(const void *a, const void *b)
{
    const key_entry *x = a, *y = b;
    int c = memcmp(x->digest, y->digest, 32);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* A key on two lines is an error naming the first line that repeats an
 * earlier one, and that earlier line.  Sorted, not compared pairwise: the
 * pairs made a file of 80 000 keys take 2.9 s to load, one of 300 000 over a
 * minute.  (Load time, not request time: the order of the work tells
 * nobody anything.) */
static cp_status find_duplicate(const srv_keys *k, const char *where, cp_error *err)
{
    key_entry *s = malloc(k->n * sizeof *s);
    if (!s) return cp_fail(err, CP_ENOMEM, "%s: out of memory checking %zu keys for duplicates", where, k->n);
    memcpy(s, k->v, k->n * sizeof *s);
    qsort(s, k->n, sizeof *s, by_digest_then_line);
    size_t first = 0, again = 0; /* lines of the pair whose repeat comes first in the file */
    for (size_t i = 1; i < k->n; i++)
        if (memcmp(s[i].digest, s[i - 1].digest, 32) == 0 && (again == 0 || s[i].line < again)) {
            size_t r = i;
            while (r > 0 && memcmp(s[r - 1].digest, s[i].digest, 32) == 0) r--;
            first = s[r].line, again = s[i].line;
        }
    OPENSSL_cleanse(s, k->n * sizeof *s);
    free(s);
    if (again) return cp_fail(err, CP_EFORMAT, "%s:%zu: duplicate key (already on line %zu)", where, again, first);
    return CP_OK;
}

cp_status srv_keys_parse(const char *text, size_t len, const char *where, cp_tenant_table *ten, srv_keys **out, cp_error *err)
{
    *out = NULL;
    srv_keys *k = cp_calloc(1, sizeof *k, "keys", err);
    if (!k) return CP_ENOMEM;
    if (memchr(text, 0, len)) {
        srv_keys_free(k);
        return cp_fail(err, CP_EFORMAT, "%s: holds a NUL byte", where);
    }
    size_t lineno = 0;
    for (const char *p = text, *nl; p < text + len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(text + len - p));
        if (!nl) nl = text + len;
        cp_status rc = parse_line(k, p, nl, where, ++lineno, ten, err);
        if (rc) {
            srv_keys_free(k);
            return rc;
        }
    }
    if (k->n == 0) {
        srv_keys_free(k);
        return cp_fail(err, CP_EFORMAT, "%s: no keys (expected lines of KEY TENANT [operator])", where);
    }
    cp_status rc = find_duplicate(k, where, err);
    if (rc) {
        srv_keys_free(k);
        return rc;
    }
    *out = k;
    return CP_OK;
}

cp_status srv_keys_load(const char *path, cp_tenant_table *ten, srv_keys **out, cp_error *err)
{
    char *text;
    size_t len;
    *out = NULL;
    if (cp_read_file(path, (size_t)16 << 20, &text, &len, err)) return cp_fail_wrap(err, "keys file");
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        cp_warn("keys file %s can be read by other users (chmod 600 it)", path);
    cp_status rc = srv_keys_parse(text, len, path, ten, out, err);
    OPENSSL_cleanse(text, len);
    free(text);
    return rc;
}

srv_auth_result srv_authenticate(const srv_keys *k, const char *h, srv_principal *out)
{
    memset(out, 0, sizeof *out);
    if (!h) return SRV_AUTH_MISSING;
    while (*h == ' ' || *h == '\t') h++;
    if (strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t')) return SRV_AUTH_MALFORMED;
    h += 6;
    while (*h == ' ' || *h == '\t') h++;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t')) n--;
    if (n == 0) return SRV_AUTH_MISSING;
    if (n > SRV_KEY_MAX) return SRV_AUTH_UNKNOWN; /* its length is public: no key is that long */
    /* a key is visible ASCII: a control byte or a space in it is a forged or
     * broken header, never a key (the check reads every byte: no early exit) */
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) bad |= (unsigned)((unsigned char)h[i] < 0x21 || (unsigned char)h[i] > 0x7e);
    if (bad) return SRV_AUTH_MALFORMED;
    uint8_t d[32];
    digest_of(h, n, d);
    /* every entry is compared and the match is selected without a branch
     * on its outcome */
    unsigned found = 0;
    uint32_t tenant = 0;
    int op = 0;
    for (size_t i = 0; i < k->n; i++) {
        unsigned eq = (unsigned)(CRYPTO_memcmp(d, k->v[i].digest, 32) == 0);
        unsigned mask = 0u - eq;
        tenant |= k->v[i].tenant & mask;
        op |= k->v[i].operator_ & (int)mask;
        found |= eq;
    }
    OPENSSL_cleanse(d, sizeof d);
    if (!found) return SRV_AUTH_UNKNOWN;
    out->tenant = tenant, out->operator_ = op;
    return SRV_AUTH_OK;
}
