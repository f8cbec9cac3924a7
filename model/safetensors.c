#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise: glibc's posix_madvise ignores DONTNEED */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/fileio.h"
#include "../kernels/log.h"

typedef struct st_mapping {
    char *path;
    void *map;
    size_t size;
} st_mapping;

struct st_set {
    st_tensor *tensors; /* sorted by name after loading */
    size_t n, cap;
    st_mapping *files;
    size_t n_files;
};

static char *dup_str(const char *s, cp_error *err)
{
    size_t n = strlen(s) + 1;
    char *d = cp_malloc(n, "string", err);
    if (d) memcpy(d, s, n);
    return d;
}

void st_close(st_set *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free(s->tensors[i].name);
    free(s->tensors);
    for (size_t i = 0; i < s->n_files; i++) {
        if (s->files[i].map) munmap(s->files[i].map, s->files[i].size);
        free(s->files[i].path);
    }
    free(s->files);
    free(s);
}

size_t st_count(const st_set *s) { return s->n; }
st_tensor *st_at(st_set *s, size_t i) { return i < s->n ? &s->tensors[i] : NULL; }

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

st_tensor *st_find(st_set *s, const char *name)
{
    st_tensor key = { .name = (char *)name };
    return bsearch(&key, s->tensors, s->n, sizeof key, cmp_tensor_name);
}

st_tensor *st_take(st_set *s, const char *name)
{
    st_tensor *t = st_find(s, name);
    if (t) t->used = 1;
    return t;
}

/* ---- parsing one file ------------------------------------------------- */

static int read_u64_field(const cJSON *v, uint64_t *out)
{
    /* cJSON keeps numbers as double: exact up to 2^53, which bounds any
     * real file; reject anything that is not a non-negative integer. */
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

typedef struct span { uint64_t begin, end; const char *name; } span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

static cp_status grow(st_set *s, cp_error *err)
{
    if (s->n < s->cap) return CP_OK;
    size_t cap = s->cap ? s->cap * 2 : 64;
    st_tensor *t = realloc(s->tensors, cap * sizeof *t);
    if (!t) return cp_fail(err, CP_ENOMEM, "out of memory growing the tensor table to %zu entries", cap);
    s->tensors = t;
    s->cap = cap;
    return CP_OK;
}

/* Parses the header of files[fi] (already mapped) and appends its tensors. */
static cp_status parse_header(st_set *s, size_t fi, cp_error *err)
{
    const st_mapping *f = &s->files[fi];
    const char *path = f->path;
    const unsigned char *base = f->map;
    if (f->size < 8)
        return cp_fail(err, CP_EFORMAT, "%s: truncated file: %zu bytes, less than the 8-byte header length", path, f->size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > ST_MAX_HEADER_BYTES)
        return cp_fail(err, CP_EFORMAT, "%s: header length %llu exceeds the cap of %u bytes", path,
                       (unsigned long long)hlen, ST_MAX_HEADER_BYTES);
    if (hlen > f->size - 8)
        return cp_fail(err, CP_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                       (unsigned long long)hlen, f->size);
    const char *json = (const char *)base + 8;
    const unsigned char *data = base + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;

    cJSON *root = cJSON_ParseWithLength(json, (size_t)hlen);
    if (!root) return cp_fail(err, CP_EFORMAT, "%s: header is not well-formed JSON", path);
    cp_status rc = CP_OK;
    span *spans = NULL;
    size_t n_spans = 0;
    if (!cJSON_IsObject(root)) {
        rc = cp_fail(err, CP_EFORMAT, "%s: header is not a JSON object", path);
        goto out;
    }
    spans = cp_calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *spans, "tensor spans", err);
    if (!spans) { rc = CP_ENOMEM; goto out; }

    for (const cJSON *e = root->child; e; e = e->next) {
        const char *name = e->string;
        if (!name || !*name) { rc = cp_fail(err, CP_EFORMAT, "%s: tensor with an empty name", path); goto out; }
        if (strcmp(name, "__metadata__") == 0) continue;
        if (!cJSON_IsObject(e)) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': entry is not an object", path, name);
            goto out;
        }
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(jd)) { rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': missing or non-string 'dtype'", path, name); goto out; }
        cp_dtype dt = cp_dtype_from_name(jd->valuestring);
        if (dt == CP_I8) dt = CP_DTYPE_INVALID; /* our I8 is the in-memory q8 blob; no checkpoint tensor reads as one */
        if (dt == CP_DTYPE_INVALID) {
            rc = cp_fail(err, CP_EUNSUPPORTED, "%s: tensor '%s': unknown dtype '%.32s' (supported: F32 F16 BF16 I32 I64)", path, name, jd->valuestring);
            goto out;
        }
        if (!cJSON_IsArray(js)) { rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': missing or non-array 'shape'", path, name); goto out; }
        int nd = cJSON_GetArraySize(js);
        if (nd > ST_MAX_DIMS) { rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': %d dimensions, more than %d", path, name, nd, ST_MAX_DIMS); goto out; }
        if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': 'data_offsets' must be [begin, end]", path, name);
            goto out;
        }
        if ((rc = grow(s, err)) != CP_OK) goto out;
        st_tensor *t = &s->tensors[s->n];
        memset(t, 0, sizeof *t);
        t->dtype = dt;
        t->ndim = nd;
        t->file = path;
        size_t numel = 1;
        int d = 0;
        for (const cJSON *x = js->child; x; x = x->next, d++) {
            uint64_t v;
            if (!read_u64_field(x, &v) || v > INT64_MAX ||
                !cp_mul_size(numel, (size_t)v, &numel)) {
                rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': shape[%d] is not a valid size", path, name, d);
                goto out;
            }
            t->shape[d] = (int64_t)v;
        }
        size_t nbytes;
        if (!cp_mul_size(numel, cp_dtype_size(dt), &nbytes)) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': shape overflows", path, name);
            goto out;
        }
        uint64_t b, en;
        if (!read_u64_field(jo->child, &b) || !read_u64_field(jo->child->next, &en) || en < b) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': data_offsets are not integers with begin <= end", path, name);
            goto out;
        }
        if (en > data_size) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section is %llu bytes)",
                         path, name, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
            goto out;
        }
        if (en - b != nbytes) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensor '%s': %s x shape is %zu bytes but data_offsets span %llu", path, name,
                         cp_dtype_name(dt), nbytes, (unsigned long long)(en - b));
            goto out;
        }
        t->numel = numel;
        t->nbytes = nbytes;
        t->data = data + b;
        t->name = dup_str(name, err);
        if (!t->name) { rc = CP_ENOMEM; goto out; }
        s->n++;
        spans[n_spans++] = (span){ b, en, t->name };
    }
    qsort(spans, n_spans, sizeof *spans, cmp_span);
    for (size_t i = 1; i < n_spans; i++) {
        if (spans[i].begin < spans[i - 1].end) {
            rc = cp_fail(err, CP_EFORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets %llu..%llu and %llu..%llu)", path,
                         spans[i - 1].name, spans[i].name, (unsigned long long)spans[i - 1].begin,
                         (unsigned long long)spans[i - 1].end, (unsigned long long)spans[i].begin,
                         (unsigned long long)spans[i].end);
            goto out;
        }
    }
out:
    free(spans);
    cJSON_Delete(root);
    return rc;
}

static cp_status map_file(st_set *s, const char *path, cp_error *err)
{
    st_mapping *files = realloc(s->files, (s->n_files + 1) * sizeof *files);
    if (!files) return cp_fail(err, CP_ENOMEM, "out of memory opening %s", path);
    s->files = files;
    st_mapping *f = &s->files[s->n_files];
    memset(f, 0, sizeof *f);
    f->path = dup_str(path, err);
    if (!f->path) return CP_ENOMEM;
    s->n_files++;
    int fd;
    cp_status rc = cp_open_regular(path, &fd, &f->size, err);
    if (rc) return rc;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cp_fail(err, CP_EIO, "%s: mmap of %zu bytes failed: %s", path, f->size, strerror(e));
        }
        f->map = m;
    }
    close(fd);
    return parse_header(s, s->n_files - 1, err);
}

static cp_status finish(st_set *s, cp_error *err)
{
    if (s->n) qsort(s->tensors, s->n, sizeof *s->tensors, cmp_tensor_name);
    for (size_t i = 1; i < s->n; i++)
        if (strcmp(s->tensors[i].name, s->tensors[i - 1].name) == 0)
            return cp_fail(err, CP_EFORMAT, "tensor '%s' appears twice (%s and %s)", s->tensors[i].name,
                           s->tensors[i - 1].file, s->tensors[i].file);
    return CP_OK;
}

cp_status st_open_file(const char *path, st_set **out, cp_error *err)
{
    *out = NULL;
    st_set *s = cp_calloc(1, sizeof *s, "safetensors set", err);
    if (!s) return CP_ENOMEM;
    cp_status rc = map_file(s, path, err);
    if (rc == CP_OK) rc = finish(s, err);
    if (rc != CP_OK) {
        st_close(s);
        return rc;
    }
    *out = s;
    return CP_OK;
}

static int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* A shard name from an index file must be a plain file name in the model
 * directory: no separators, no "..", nothing hidden. */
static int safe_shard_name(const char *n)
{
    size_t len = strlen(n);
    return len > 0 && len < 256 && !strchr(n, '/') && !strchr(n, '\\') && n[0] != '.';
}

static cp_status open_sharded(st_set *s, const char *dir, const char *index_path, cp_error *err)
{
    char *text;
    cp_status rc = cp_read_file(index_path, (size_t)64 << 20, &text, NULL, err);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) return cp_fail(err, CP_EFORMAT, "%s: not well-formed JSON", index_path);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return cp_fail(err, CP_EFORMAT, "%s: missing or non-object field 'weight_map'", index_path);
    }
    char path[4096];
    for (const cJSON *e = wm->child; e && rc == CP_OK; e = e->next) {
        if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
            rc = cp_fail(err, CP_EFORMAT, "%s: weight_map['%.200s'] is not a plain file name in the model directory",
                         index_path, e->string ? e->string : "");
            break;
        }
        int seen = 0;
        for (size_t i = 0; i < s->n_files && !seen; i++) {
            const char *slash = strrchr(s->files[i].path, '/');
            seen = strcmp(slash ? slash + 1 : s->files[i].path, e->valuestring) == 0;
        }
        if (seen) continue;
        if ((rc = cp_path_join(path, sizeof path, dir, e->valuestring, err)) == CP_OK) rc = map_file(s, path, err);
    }
    if (rc == CP_OK) rc = finish(s, err);
    /* every name in the map must be in the shard the map names */
    for (const cJSON *e = wm->child; e && rc == CP_OK; e = e->next) {
        st_tensor *t = st_find(s, e->string);
        const char *slash = t ? strrchr(t->file, '/') : NULL;
        if (!t || strcmp(slash ? slash + 1 : t->file, e->valuestring) != 0)
            rc = cp_fail(err, CP_EFORMAT, "%s: weight_map names tensor '%.200s' in %s, but that shard does not hold it",
                         index_path, e->string, e->valuestring);
    }
    cJSON_Delete(root);
    return rc;
}

cp_status st_open_dir(const char *dir, st_set **out, cp_error *err)
{
    *out = NULL;
    char single[4096], index[4096];
    cp_status rc;
    if ((rc = cp_path_join(single, sizeof single, dir, "model.safetensors", err)) ||
        (rc = cp_path_join(index, sizeof index, dir, "model.safetensors.index.json", err)))
        return rc;
    if (file_exists(single)) return st_open_file(single, out, err);
    if (!file_exists(index))
        return cp_fail(err, CP_EIO, "%s: no model.safetensors or model.safetensors.index.json", dir);
    st_set *s = cp_calloc(1, sizeof *s, "safetensors set", err);
    if (!s) return CP_ENOMEM;
    rc = open_sharded(s, dir, index, err);
    if (rc != CP_OK) {
        st_close(s);
        return rc;
    }
    *out = s;
    return CP_OK;
}

void st_release(const st_tensor *t)
{
    if (!t->nbytes) return;
    /* whole pages around the tensor: a neighbour's pages shared at the
     * edges fault back in when read (a read-only private file mapping) */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)t->data & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)t->data + t->nbytes + page - 1) & ~(uintptr_t)(page - 1);
    madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: a failure leaves the pages resident, nothing more */
}

cp_status st_read_f32(const st_tensor *t, float *dst, cp_error *err)
{
    if (!cp_convert_to_f32(dst, t->data, t->dtype, t->numel))
        return cp_fail(err, CP_EFORMAT, "%s: tensor '%s' has dtype %s, expected a float type", t->file, t->name,
                       cp_dtype_name(t->dtype));
    return CP_OK;
}

cp_status st_read_i32(const st_tensor *t, int32_t *dst, cp_error *err)
{
    const unsigned char *p = t->data;
    if (t->dtype == CP_I32) {
        memcpy(dst, p, t->numel * 4);
        return CP_OK;
    }
    if (t->dtype == CP_I64) {
        for (size_t i = 0; i < t->numel; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return cp_fail(err, CP_ERANGE, "%s: tensor '%s'[%zu] = %lld does not fit in int32", t->file, t->name, i,
                               (long long)v);
            dst[i] = (int32_t)v;
        }
        return CP_OK;
    }
    return cp_fail(err, CP_EFORMAT, "%s: tensor '%s' has dtype %s, expected I32 or I64", t->file, t->name,
                   cp_dtype_name(t->dtype));
}

/* ---- writer ----------------------------------------------------------- */

size_t st_entry_nbytes(const st_write_entry *e)
{
    size_t n = cp_dtype_size(e->dtype);
    if (!n || e->ndim < 0 || e->ndim > ST_MAX_DIMS) return 0;
    for (int d = 0; d < e->ndim; d++)
        if (e->shape[d] < 0 || !cp_mul_size(n, (size_t)e->shape[d], &n)) return 0;
    return n;
}

cp_status st_write_file(const char *path, const st_write_entry *entries, size_t n, st_produce_fn produce, void *ctx,
                        cp_error *err)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return cp_fail(err, CP_ENOMEM, "%s: out of memory building the header", path);
    cp_status rc = CP_OK;
    size_t off = 0, max_bytes = 0;
    for (size_t i = 0; i < n && rc == CP_OK; i++) {
        size_t nb = st_entry_nbytes(&entries[i]);
        if (!nb && entries[i].ndim > 0) {
            rc = cp_fail(err, CP_EINVAL, "%s: tensor '%s' has an invalid dtype or shape", path, entries[i].name);
            break;
        }
        cJSON *t = cJSON_AddObjectToObject(root, entries[i].name);
        cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *offs = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        if (!t || !shape || !offs || !cJSON_AddStringToObject(t, "dtype", cp_dtype_name(entries[i].dtype))) {
            rc = cp_fail(err, CP_ENOMEM, "%s: out of memory building the header", path);
            break;
        }
        for (int d = 0; d < entries[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)entries[i].shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
        if (nb > max_bytes) max_bytes = nb;
    }
    char *hdr = rc == CP_OK ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (rc != CP_OK) return rc;
    if (!hdr) return cp_fail(err, CP_ENOMEM, "%s: out of memory printing the header", path);

    /* pad the header with spaces so the data section starts 8-aligned */
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;
    FILE *fp = fopen(path, "wb");
    void *buf = NULL;
    if (!fp) {
        free(hdr);
        return cp_fail(err, CP_EIO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char lenbytes[8];
    for (int i = 0; i < 8; i++) lenbytes[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenbytes, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
    free(hdr);
    if (ok) {
        buf = cp_malloc(max_bytes, "tensor write buffer", err);
        if (!buf) rc = CP_ENOMEM;
    }
    for (size_t i = 0; ok && rc == CP_OK && i < n; i++) {
        size_t nb = st_entry_nbytes(&entries[i]);
        rc = produce(ctx, i, buf, nb, err);
        if (rc == CP_OK) ok = fwrite(buf, 1, nb, fp) == nb;
    }
    free(buf);
    if (fclose(fp) != 0) ok = 0;
    if (rc == CP_OK && !ok) rc = cp_fail(err, CP_EIO, "%s: write failed: %s", path, strerror(errno));
    return rc;
}
