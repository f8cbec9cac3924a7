/* safetensors reader (mmap, validated) and writer.
 *
 * Format: u64 little-endian header length N, N bytes of JSON mapping tensor
 * names to {dtype, shape, data_offsets:[begin,end]} (offsets relative to the
 * byte after the header), then the data.  Every field is treated as hostile:
 * header length against the file size and a cap, offsets in range and not
 * overlapping, dtype x shape == byte length, no duplicate names. */
#ifndef CP_SAFETENSORS_H
#define CP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/dtype.h"
#include "../kernels/status.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_BYTES (100u << 20) /* the cap HF's reader uses too */

typedef struct st_tensor {
    char *name;
    cp_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t numel;
    size_t nbytes;
    const void *data; /* inside the read-only mapping; may be unaligned */
    const char *file; /* path of the file that holds it, for messages */
    int used;         /* set by st_take(); untaken ones are leftovers */
} st_tensor;

typedef struct st_set st_set; /* tensors of one checkpoint (one or more files) */

/* One .safetensors file. */
cp_status st_open_file(const char *path, st_set **out, cp_error *err);
/* A model directory: model.safetensors, or model.safetensors.index.json and
 * the shards its weight_map names. */
cp_status st_open_dir(const char *dir, st_set **out, cp_error *err);
void st_close(st_set *s);

size_t st_count(const st_set *s);
st_tensor *st_at(st_set *s, size_t i);
/* NULL when absent.  st_take also marks the tensor used. */
st_tensor *st_find(st_set *s, const char *name);
st_tensor *st_take(st_set *s, const char *name);

/* Drops the tensor's pages from this process's resident set (the mapping
 * stays valid: a later read faults them in again from the file): the
 * loader calls it once a tensor is converted, so a checkpoint's mapping
 * and its converted copy are never resident together. */
void st_release(const st_tensor *t);

/* Copies a float tensor (F32/F16/BF16) into dst as f32, or an I32/I64 tensor
 * into dst as int32 (I64 values must fit). */
cp_status st_read_f32(const st_tensor *t, float *dst, cp_error *err);
cp_status st_read_i32(const st_tensor *t, int32_t *dst, cp_error *err);

/* Writer.  `produce` fills buf (nbytes long) with the data of entries[i];
 * tensors are produced one at a time so a large checkpoint never has to be
 * in memory at once. */
typedef struct st_write_entry {
    const char *name;
    cp_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
} st_write_entry;

typedef cp_status (*st_produce_fn)(void *ctx, size_t i, void *buf, size_t nbytes, cp_error *err);

cp_status st_write_file(const char *path, const st_write_entry *entries, size_t n,
                        st_produce_fn produce, void *ctx, cp_error *err);

/* Byte length of an entry (dtype x shape); 0 on overflow or bad dtype. */
size_t st_entry_nbytes(const st_write_entry *e);

#endif
