/* Chat templates without a Jinja engine: ChatML (Qwen), Mistral [INST],
 * Llama-2, Llama-3, and "plain" for files with no chat_template.
 *
 * The rendered prompt is tokenized as one string (so merges across markup
 * behave as HF's apply_chat_template + encode), but special tokens are
 * matched only inside the template's own markup: message text cannot forge a
 * control token.  Every token records the message it came from. */
#ifndef CP_CHAT_H
#define CP_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

typedef enum cp_role { CP_ROLE_SYSTEM, CP_ROLE_USER, CP_ROLE_ASSISTANT, CP_ROLE_DOCUMENT } cp_role;

typedef struct cp_message {
    cp_role role;
    const char *text;
    size_t len;
} cp_message;

typedef enum cp_template { CP_TPL_PLAIN, CP_TPL_CHATML, CP_TPL_MISTRAL, CP_TPL_LLAMA2, CP_TPL_LLAMA3 } cp_template;

cp_status cp_role_from_name(const char *name, cp_role *out, cp_error *err);
const char *cp_role_name(cp_role r);
cp_status cp_template_from_name(const char *name, cp_template *out, cp_error *err);
const char *cp_template_name(cp_template t);
/* From tokenizer_config.json's chat_template: plain when there is none;
 * CP_EUNSUPPORTED when there is one we do not recognise. */
cp_status cp_template_detect(const cp_tokenizer *t, cp_template *out, cp_error *err);

typedef struct cp_prompt {
    char *text; /* rendered, NUL-terminated */
    size_t len;
    cp_encoding enc;     /* ids and offsets into text */
    int32_t *msg;        /* per token: message index, or -1 for template markup */
    size_t n_msgs;
    size_t *msg_begin, *msg_end; /* per message: its text's range in `text` */
} cp_prompt;

/* Documents are placed, in order, at the start of the next user turn (each
 * followed by a blank line); a document with no user turn after it is an
 * error.  add_generation_prompt opens the assistant turn where the family
 * has markup for it. */
cp_status cp_chat_render(cp_tokenizer *t, cp_template tpl, const cp_message *msgs, size_t n, int add_generation_prompt,
                         cp_prompt *out, cp_error *err);
void cp_prompt_free(cp_prompt *p);

#endif
