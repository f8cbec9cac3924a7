#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

static const char *const role_names[] = { "system", "user", "assistant", "document" };
static const char *const tpl_names[] = { "plain", "chatml", "mistral", "llama2", "llama3" };

cp_status cp_role_from_name(const char *name, cp_role *out, cp_error *err)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, role_names[i]) == 0) {
            *out = (cp_role)i;
            return CP_OK;
        }
    return cp_fail(err, CP_EINVAL, "unknown role '%.32s' (system, user, assistant, document)", name);
}

const char *cp_role_name(cp_role r) { return (unsigned)r < 4 ? role_names[r] : "?"; }

cp_status cp_template_from_name(const char *name, cp_template *out, cp_error *err)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(name, tpl_names[i]) == 0) {
            *out = (cp_template)i;
            return CP_OK;
        }
    return cp_fail(err, CP_EINVAL, "unknown chat template '%.32s' (plain, chatml, mistral, llama2, llama3)", name);
}

const char *cp_template_name(cp_template t) { return (unsigned)t < 5 ? tpl_names[t] : "?"; }

cp_status cp_template_detect(const cp_tokenizer *t, cp_template *out, cp_error *err)
{
    const char *s = cp_tokenizer_chat_template(t);
    if (!s) *out = CP_TPL_PLAIN;
    else if (strstr(s, "<|im_start|>")) *out = CP_TPL_CHATML;
    else if (strstr(s, "<|start_header_id|>")) *out = CP_TPL_LLAMA3;
    else if (strstr(s, "<<SYS>>")) *out = CP_TPL_LLAMA2;
    else if (strstr(s, "[INST]")) *out = CP_TPL_MISTRAL;
    else
        return cp_fail(err, CP_EUNSUPPORTED,
                       "the tokenizer's chat_template is not one we recognise (ChatML, Mistral, Llama-2, Llama-3): "
                       "choose one with --chat-template");
    return CP_OK;
}

/* ---- rendering ----------------------------------------------------------- */

typedef struct render {
    char *s;
    uint8_t *markup; /* per byte: 1 = template markup (special tokens allowed) */
    size_t n, cap;
    cp_prompt *p;
    cp_error *err;
} render;

static cp_status put(render *r, const char *s, size_t n, int markup)
{
    if (r->n + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->n + n + 1) cap *= 2;
        char *ns = tk_grow(r->s, r->cap, cap); /* the old block held the prompt so far */
        if (ns) r->s = ns;
        uint8_t *nm = ns ? realloc(r->markup, cap) : NULL;
        if (!nm) return cp_fail(r->err, CP_ENOMEM, "chat: out of memory rendering %zu bytes", cap);
        r->markup = nm;
        r->cap = cap;
    }
    memcpy(r->s + r->n, s, n);
    memset(r->markup + r->n, markup, n);
    r->n += n;
    r->s[r->n] = 0;
    return CP_OK;
}

static cp_status mark(render *r, const char *s) { return put(r, s, strlen(s), 1); }

/* A message's own text (or, for Llama-3, its text without surrounding
 * whitespace, as that template trims). */
static cp_status content(render *r, const cp_message *m, size_t idx, int trim)
{
    const char *s = m->text;
    size_t n = m->len;
    if (trim) {
        while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')) s++, n--;
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    }
    r->p->msg_begin[idx] = r->n;
    cp_status rc = put(r, s, n, 0);
    r->p->msg_end[idx] = r->n;
    return rc;
}

/* The documents waiting for the next user turn, then the user's text. */
static cp_status user_block(render *r, const cp_message *msgs, size_t docs_from, size_t user, int trim)
{
    cp_status rc = CP_OK;
    for (size_t d = docs_from; d < user && rc == CP_OK; d++) {
        if (msgs[d].role != CP_ROLE_DOCUMENT) continue;
        if ((rc = content(r, &msgs[d], d, 0)) == CP_OK) rc = mark(r, "\n\n");
    }
    return rc ? rc : content(r, &msgs[user], user, trim);
}

static const char *piece_or(const cp_tokenizer *t, int32_t id, const char *fallback)
{
    const char *p = id >= 0 ? cp_tokenizer_piece(t, id) : NULL;
    return p ? p : fallback;
}

/* Checks documents precede a user turn; for [INST] families also that the
 * turns alternate user/assistant after an optional leading system. */
static cp_status check_order(const cp_message *msgs, size_t n, int alternate, cp_error *err)
{
    int pending_doc = 0, expect_user = 1;
    for (size_t i = 0; i < n; i++) {
        cp_role r = msgs[i].role;
        if (r == CP_ROLE_DOCUMENT) pending_doc = 1;
        if (r == CP_ROLE_USER) pending_doc = 0;
        if (!alternate || r == CP_ROLE_DOCUMENT) continue;
        if (r == CP_ROLE_SYSTEM) {
            if (i != 0) return cp_fail(err, CP_EINVAL, "chat: a system message must come first (message %zu)", i);
            continue;
        }
        if ((r == CP_ROLE_USER) != expect_user)
            return cp_fail(err, CP_EINVAL, "chat: roles must alternate user/assistant, starting with user (message %zu is %s)",
                           i, cp_role_name(r));
        expect_user = !expect_user;
    }
    if (pending_doc) return cp_fail(err, CP_EINVAL, "chat: a document message must be followed by a user message");
    if (alternate && n > 0 && msgs[0].role == CP_ROLE_SYSTEM && !(n > 1 && msgs[1].role != CP_ROLE_ASSISTANT))
        return cp_fail(err, CP_EINVAL, "chat: this template places the system text in the first user turn: add one");
    return CP_OK;
}

static cp_status render_all(render *r, const cp_tokenizer *t, cp_template tpl, const cp_message *m, size_t n, int gen)
{
    cp_status rc = CP_OK;
    const char *bos = piece_or(t, cp_tokenizer_bos(t), NULL), *eos = piece_or(t, cp_tokenizer_eos(t), "</s>");
    size_t docs_from = 0;
#define R(x) if ((rc = (x)) != CP_OK) return rc
    switch (tpl) {
    case CP_TPL_PLAIN:
        if (bos) R(mark(r, bos));
        for (size_t i = 0; i < n; i++) {
            if (i) R(mark(r, "\n\n"));
            R(content(r, &m[i], i, 0));
        }
        break;
    case CP_TPL_CHATML:
    case CP_TPL_LLAMA3: {
        int l3 = tpl == CP_TPL_LLAMA3;
        if (l3) R(mark(r, piece_or(t, cp_tokenizer_bos(t), "<|begin_of_text|>")));
        for (size_t i = 0; i < n; i++) {
            if (m[i].role == CP_ROLE_DOCUMENT) continue;
            const char *role = cp_role_name(m[i].role);
            R(mark(r, l3 ? "<|start_header_id|>" : "<|im_start|>"));
            R(mark(r, role));
            R(mark(r, l3 ? "<|end_header_id|>\n\n" : "\n"));
            if (m[i].role == CP_ROLE_USER) {
                R(user_block(r, m, docs_from, i, l3));
                docs_from = i + 1;
            } else {
                R(content(r, &m[i], i, l3));
            }
            R(mark(r, l3 ? "<|eot_id|>" : "<|im_end|>\n"));
        }
        if (gen) R(mark(r, l3 ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|im_start|>assistant\n"));
        break;
    }
    case CP_TPL_MISTRAL:
    case CP_TPL_LLAMA2: {
        int l2 = tpl == CP_TPL_LLAMA2;
        size_t sys = n > 0 && m[0].role == CP_ROLE_SYSTEM ? 0 : (size_t)-1;
        R(mark(r, bos ? bos : "<s>"));
        for (size_t i = 0; i < n; i++) {
            if (m[i].role == CP_ROLE_USER) {
                R(mark(r, "[INST] "));
                if (sys == 0 && docs_from == 0) {
                    /* the system text opens the first user turn */
                    if (l2) R(mark(r, "<<SYS>>\n"));
                    R(content(r, &m[0], 0, 0));
                    R(mark(r, l2 ? "\n<</SYS>>\n\n" : "\n\n"));
                }
                R(user_block(r, m, docs_from, i, 0));
                docs_from = i + 1;
                R(mark(r, " [/INST]"));
            } else if (m[i].role == CP_ROLE_ASSISTANT) {
                if (l2) R(mark(r, " "));
                R(content(r, &m[i], i, 0));
                if (l2) {
                    R(mark(r, " "));
                    R(mark(r, eos));
                    R(mark(r, bos ? bos : "<s>"));
                } else {
                    R(mark(r, eos));
                }
            }
        }
        break;
    }
    }
#undef R
    return rc;
}

void cp_prompt_free(cp_prompt *p)
{
    tk_wipe(p->text, p->text ? p->len + 1 : 0); /* the rendered prompt */
    free(p->text);
    cp_encoding_free(&p->enc);
    free(p->msg);
    free(p->msg_begin);
    free(p->msg_end);
    memset(p, 0, sizeof *p);
}

cp_status cp_chat_render(cp_tokenizer *t, cp_template tpl, const cp_message *msgs, size_t n, int gen, cp_prompt *out,
                         cp_error *err)
{
    memset(out, 0, sizeof *out);
    cp_status rc = check_order(msgs, n, tpl == CP_TPL_MISTRAL || tpl == CP_TPL_LLAMA2, err);
    if (rc) return rc;
    out->n_msgs = n;
    out->msg_begin = cp_calloc(n + 1, sizeof *out->msg_begin, "chat", err);
    out->msg_end = cp_calloc(n + 1, sizeof *out->msg_end, "chat", err);
    if (!out->msg_begin || !out->msg_end) {
        cp_prompt_free(out);
        return CP_ENOMEM;
    }
    render r = { .p = out, .err = err };
    rc = render_all(&r, t, tpl, msgs, n, gen);
    if (rc == CP_OK && !r.s) rc = put(&r, "", 0, 0);
    if (rc == CP_OK) rc = cp_tokenize_ex(t, r.s, r.n, 0, r.markup, &out->enc, err);
    if (rc == CP_OK) {
        out->msg = cp_malloc((out->enc.n + 1) * sizeof *out->msg, "chat token owners", err);
        if (!out->msg) rc = CP_ENOMEM;
    }
    if (rc == CP_OK) {
        /* a token belongs to the first message its range overlaps */
        for (size_t k = 0; k < out->enc.n; k++) {
            out->msg[k] = -1;
            for (size_t i = 0; i < n; i++) {
                size_t b = out->msg_begin[i], e = out->msg_end[i];
                if (e > b && out->enc.start[k] < e && out->enc.end[k] > b) {
                    out->msg[k] = (int32_t)i;
                    break;
                }
            }
        }
    }
    free(r.markup);
    out->text = r.s;
    out->len = r.n;
    if (rc) cp_prompt_free(out);
    return rc;
}
