/* Status codes and error messages shared by every layer.
 *
 * It lives in kernels/ because that is the lowest layer: everything above may
 * include it, nothing here includes anything above.  The convention follows
 * sqlite: a function that can fail returns a cp_status and, on failure, fills
 * the caller's cp_error with a message that names what failed and where
 * (file, field, value).  Library code never exits or aborts on bad input. */
#ifndef CP_STATUS_H
#define CP_STATUS_H

#include <stddef.h>

typedef enum cp_status {
    CP_OK = 0,
    CP_EINVAL,       /* bad argument from the caller */
    CP_EIO,          /* open/read/write/mmap failed */
    CP_EFORMAT,      /* malformed file or request content */
    CP_EUNSUPPORTED, /* well-formed, but a feature we do not implement */
    CP_ENOMEM,       /* allocation failed */
    CP_ERANGE,       /* a value out of its allowed range */
    CP_EDEVICE,      /* accelerator error or no accelerator */
    CP_EPERM,        /* refused by the privacy policy (e.g. sensitive KV into a shared segment) */
} cp_status;

#define CP_ERR_MSG_MAX 512

typedef struct cp_error {
    cp_status code;
    char msg[CP_ERR_MSG_MAX];
} cp_error;

/* Records code and a printf-style message in err (which may be NULL) and
 * returns code, so a failure site reads `return cp_fail(err, CP_EIO, ...)`. */
cp_status cp_fail(cp_error *err, cp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the message already in err with context ("loading X: ..."). */
cp_status cp_fail_wrap(cp_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

const char *cp_status_name(cp_status s);

/* Checked allocation helpers: on failure they fill err and return NULL.
 * `what` names the buffer in the message. */
void *cp_malloc(size_t n, const char *what, cp_error *err);
void *cp_calloc(size_t count, size_t size, const char *what, cp_error *err);

/* a*b without overflow; returns 0 and leaves *out unchanged on overflow. */
int cp_mul_size(size_t a, size_t b, size_t *out);

#endif
