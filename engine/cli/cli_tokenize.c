/* cacheprune tokenize: ids, pieces and byte offsets of a text or a chat. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../tokenizer/chat.h"
#include "cli.h"

static void usage(FILE *f)
{
    fputs("usage: cacheprune tokenize --model DIR [options] TEXT\n"
          "       cacheprune tokenize --model DIR --chat FILE.json [options]\n"
          "\n"
          "  --model DIR           directory with tokenizer.json (+ tokenizer_config.json)\n"
          "  --json                print {\"ids\":[...],\"pieces\":[...],\"offsets\":[[s,e],...]}\n"
          "  --special             run the post-processor (add BOS/EOS as the file says)\n"
          "  --chat FILE.json      render messages {\"messages\":[{\"role\":...,\"content\":...}]}\n"
          "                        (roles: system, user, assistant, document)\n"
          "  --chat-template NAME  plain, chatml, mistral, llama2, llama3 (default: from tokenizer_config.json)\n"
          "  --no-generation-prompt  do not open the assistant turn\n"
          "\n"
          "Offsets are UTF-8 byte offsets into TEXT (or into the rendered chat).\n",
          f);
}

static void print_json_string(const char *s, size_t n)
{
    char *tmp = malloc(n + 1);
    if (!tmp) return;
    memcpy(tmp, s, n);
    tmp[n] = 0;
    cJSON *j = cJSON_CreateString(tmp);
    char *p = j ? cJSON_PrintUnformatted(j) : NULL;
    fputs(p ? p : "null", stdout);
    free(p);
    cJSON_Delete(j);
    free(tmp);
}

int cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *chat = NULL, *tpl_name = NULL, *text = NULL;
    int json = 0, special = 0, gen = 1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(o, "--json") == 0) json = 1;
        else if (strcmp(o, "--special") == 0) special = 1;
        else if (strcmp(o, "--no-generation-prompt") == 0) gen = 0;
        else if (strcmp(o, "--model") == 0 || strcmp(o, "--chat") == 0 || strcmp(o, "--chat-template") == 0) {
            if (!v) {
                cli_error("tokenize: %s needs a value", o);
                return 2;
            }
            *(strcmp(o, "--model") == 0 ? &model : strcmp(o, "--chat") == 0 ? &chat : &tpl_name) = v;
            i++;
        } else if (o[0] == '-' && o[1] == '-') {
            cli_error("tokenize: unknown option '%s' (see --help)", o);
            return 2;
        } else if (!text) text = o;
        else {
            cli_error("tokenize: give the text as one argument (quote it)");
            return 2;
        }
    }
    if (!model || (!text && !chat) || (text && chat)) {
        cli_error("tokenize: --model DIR and either TEXT or --chat FILE are required (see --help)");
        return 2;
    }
    cp_error err = { 0 };
    cp_tokenizer *t = NULL;
    if (cp_tokenizer_load(model, &t, &err) != CP_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    int rcode = 1;
    cJSON *root = NULL;
    cp_message *msgs = NULL;
    size_t n_msgs = 0;
    cp_prompt p = { 0 };
    const char *src = text;
    size_t src_len = text ? strlen(text) : 0;
    if (chat) {
        cp_template tpl;
        if (!cli_load_chat(chat, &root, &msgs, &n_msgs)) goto done;
        cp_status rc = tpl_name ? cp_template_from_name(tpl_name, &tpl, &err) : cp_template_detect(t, &tpl, &err);
        if (rc == CP_OK) rc = cp_chat_render(t, tpl, msgs, n_msgs, gen, &p, &err);
        if (rc) {
            cli_error("%s", err.msg);
            goto done;
        }
        src = p.text;
        src_len = p.len;
    } else if (cp_tokenize(t, text, src_len, special ? CP_TOK_ADD_SPECIAL : 0, &p.enc, &err) != CP_OK) {
        cli_error("%s", err.msg);
        goto done;
    }
    const cp_encoding *e = &p.enc;
    if (json) {
        printf("{\"ids\":[");
        for (size_t k = 0; k < e->n; k++) printf("%s%d", k ? "," : "", e->ids[k]);
        printf("],\"pieces\":[");
        for (size_t k = 0; k < e->n; k++) {
            const char *pc = cp_tokenizer_piece(t, e->ids[k]);
            if (k) putchar(',');
            print_json_string(pc ? pc : "", pc ? strlen(pc) : 0);
        }
        printf("],\"offsets\":[");
        for (size_t k = 0; k < e->n; k++) printf("%s[%u,%u]", k ? "," : "", e->start[k], e->end[k]);
        printf("]");
        if (chat) {
            printf(",\"message\":[");
            for (size_t k = 0; k < e->n; k++) printf("%s%d", k ? "," : "", p.msg[k]);
            printf("],\"text\":");
            print_json_string(p.text, p.len);
        }
        printf("}\n");
    } else {
        if (chat) printf("%s\n---\n", p.text);
        for (size_t k = 0; k < e->n; k++) {
            const char *pc = cp_tokenizer_piece(t, e->ids[k]);
            printf("%6d  [%u, %u)  %-20s", e->ids[k], e->start[k], e->end[k], pc ? pc : "?");
            if (chat) printf("  msg %d", p.msg[k]);
            printf("  ");
            print_json_string(src + e->start[k], e->end[k] - e->start[k]);
            printf("\n");
        }
    }
    rcode = 0;
done:
    cp_prompt_free(&p);
    free(msgs);
    cJSON_Delete(root);
    cp_tokenizer_free(t);
    return rcode;
}
