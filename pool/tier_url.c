/* The tier's endpoint and password: parsed here, strictly (hiredis parses
 * no URLs), because a lax parser turns a typo into a connection to
 * somewhere else. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/log.h"
#include "tier.h"

/* decimal digits s[0..n) as a number <= max; 0 on anything else (a sign,
 * a leading zero of a longer number, too many digits) */
static int parse_dec(const char *s, size_t n, long max, long *out)
{
    if (n == 0 || n > 5 || (n > 1 && s[0] == '0')) return 0;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max) return 0;
    *out = v;
    return 1;
}

static int host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
}

cp_status cp_tier_url_parse(const char *url, cp_tier_url *out, cp_error *err)
{
    static const char scheme[] = "redis://";
    memset(out, 0, sizeof *out);
    if (!url) return cp_fail(err, CP_EINVAL, "--tier: no URL");
    if (strncmp(url, "rediss://", 9) == 0)
        return cp_fail(err, CP_EUNSUPPORTED, "--tier: rediss:// (TLS) is not supported by this client (hiredis 0.14): see README");
    if (strncmp(url, scheme, sizeof scheme - 1) != 0) return cp_fail(err, CP_EINVAL, "--tier: the URL must start with redis://");
    const char *h = url + sizeof scheme - 1, *colon = strchr(h, ':');
    if (!colon) return cp_fail(err, CP_EINVAL, "--tier: redis://HOST:PORT[/DB]: the port is missing");
    size_t hn = (size_t)(colon - h);
    if (hn == 0 || hn > CP_TIER_HOST_MAX) return cp_fail(err, CP_EINVAL, "--tier: the host is empty or longer than %d bytes", CP_TIER_HOST_MAX);
    for (size_t i = 0; i < hn; i++)
        if (!host_char(h[i]))
            return cp_fail(err, CP_EINVAL, "--tier: byte %zu of the host is not a letter, digit, '.' or '-' (no user@, no [IPv6])", i);
    if (h[0] == '-' || h[0] == '.') return cp_fail(err, CP_EINVAL, "--tier: the host starts with '%c'", h[0]);
    const char *p = colon + 1, *slash = strchr(p, '/');
    size_t pn = slash ? (size_t)(slash - p) : strlen(p);
    long port, db = 0;
    if (!parse_dec(p, pn, 65535, &port) || port == 0) return cp_fail(err, CP_EINVAL, "--tier: the port must be a decimal 1..65535");
    if (slash && !parse_dec(slash + 1, strlen(slash + 1), 65535, &db))
        return cp_fail(err, CP_EINVAL, "--tier: after the port, only /DB (a decimal 0..65535) may follow");
    memcpy(out->host, h, hn);
    out->host[hn] = 0;
    out->port = (int)port;
    out->db = (int)db;
    return CP_OK;
}

/* one secret line of a file: the option's name for the messages, at least
 * min bytes of it */
static cp_status secret_read(const char *opt, const char *path, size_t min, char *pw, size_t *len, cp_error *err)
{
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cp_fail(err, CP_EIO, "%s %s: %s", opt, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 077))
        cp_warn("%s %s: readable by group or others (chmod 600 it)", opt, path);
    char buf[CP_TIER_PASSWORD_MAX + 3];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            close(fd);
            return cp_fail(err, CP_EIO, "%s %s: %s", opt, path, strerror(errno));
        }
        if (r == 0 || (n += (size_t)r) == sizeof buf) break;
    }
    close(fd);
    cp_status rc = CP_OK;
    size_t m = n;
    if (m && buf[m - 1] == '\n') m--;
    if (m && buf[m - 1] == '\r' && m < n) m--;
    if (n == sizeof buf || m > CP_TIER_PASSWORD_MAX)
        rc = cp_fail(err, CP_ERANGE, "%s %s: longer than %d bytes", opt, path, CP_TIER_PASSWORD_MAX);
    else if (m == 0) rc = cp_fail(err, CP_EINVAL, "%s %s: empty", opt, path);
    else if (m < min) rc = cp_fail(err, CP_EINVAL, "%s %s: %zu bytes, fewer than %zu (make one: openssl rand -hex 32)", opt, path, m, min);
    else if (memchr(buf, 0, m) || memchr(buf, '\n', m) || memchr(buf, '\r', m))
        rc = cp_fail(err, CP_EINVAL, "%s %s: a NUL, CR or LF inside", opt, path);
    if (rc == CP_OK) {
        memcpy(pw, buf, m);
        pw[m] = 0;
        *len = m;
    }
    OPENSSL_cleanse(buf, sizeof buf); /* the password does not outlive its use on the stack */
    return rc;
}

cp_status cp_tier_password_read(const char *path, char *pw, size_t *len, cp_error *err)
{
    return secret_read("--tier-password-file", path, 1, pw, len, err);
}

cp_status cp_tier_key_read(const char *path, char *key, size_t *len, cp_error *err)
{
    return secret_read("--tier-key-file", path, CP_TIER_VALUE_KEY_MIN, key, len, err);
}
