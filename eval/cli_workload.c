/* cacheprune workload: fixed, seeded benchmark request logs (presets are
 * published in the README so results stay comparable).  Every prompt is
 * checked to fit 1024 tokens of the given model's tokenizer (cp-books-6m by
 * default).  Personal data is synthetic.  rag-v1, chat-v1 and meetings-v1
 * read their texts from the reference kit; rag-synth-v1 generates its
 * passages, so that a clone without the kit (make demo) has a workload. */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/fileio.h"
#include "../engine/cli/cli.h"

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rnext(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double runif(rng *r) { return (double)(rnext(r) >> 11) / 9007199254740992.0; }
static int rint_(rng *r, int n) { return (int)(rnext(r) % (uint64_t)n); }

/* Zipf(s) over n items by inverse CDF */
static int zipf(rng *r, int n, double s)
{
    double h = 0, u;
    for (int k = 1; k <= n; k++) h += 1 / pow(k, s);
    u = runif(r) * h;
    for (int k = 1; k <= n; k++) {
        u -= 1 / pow(k, s);
        if (u <= 0) return k - 1;
    }
    return n - 1;
}

/* ---- synthetic personal data ---------------------------------------------------- */

static const char *const first_names[] = { "Anna", "Boris", "Chloe", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas",
                                           "Keiko", "Lars", "Maya", "Nils", "Olga", "Pavel", "Quinn", "Rosa", "Sami", "Tara" };
static const char *const last_names[] = { "Kowalska", "Novak", "Lindqvist", "Okafor", "Moreau", "Tanaka", "Haddad", "Fischer",
                                          "Ivanova", "Costa", "Brennan", "Varga", "Nakamura", "Silva", "Duarte", "Holm" };
static const char *const streets[] = { "Maple Street", "Oak Avenue", "Harbour Road", "Mill Lane", "Station Drive", "Elm Court" };

/* one PII phrase; the number of digits etc. vary like real data */
static void pii(rng *r, char *out, size_t cap)
{
    const char *fn = first_names[rint_(r, 20)], *ln = last_names[rint_(r, 16)];
    switch (rint_(r, 5)) {
    case 0: snprintf(out, cap, "my name is %s %s", fn, ln); break;
    case 1: snprintf(out, cap, "my e-mail is %c%s.%d@example.org", fn[0] | 32, ln, rint_(r, 90) + 10); break;
    case 2: snprintf(out, cap, "my phone number is +44 7700 %03d %03d", rint_(r, 1000), rint_(r, 1000)); break;
    case 3: { /* a Luhn-valid card */
        int d[16], sum = 0;
        d[0] = 4;
        for (int i = 1; i < 15; i++) d[i] = rint_(r, 10);
        for (int i = 0; i < 15; i++) {
            int x = d[14 - i];
            if (i % 2 == 0 && (x *= 2) > 9) x -= 9;
            sum += x;
        }
        d[15] = (10 - sum % 10) % 10;
        snprintf(out, cap, "my card is %d%d%d%d %d%d%d%d %d%d%d%d %d%d%d%d", d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8],
                 d[9], d[10], d[11], d[12], d[13], d[14], d[15]);
        break;
    }
    default: snprintf(out, cap, "I live at %d %s", rint_(r, 200) + 1, streets[rint_(r, 6)]); break;
    }
}

/* ---- sources ----------------------------------------------------------------------- */

typedef struct texts {
    char **v;
    size_t n;
} texts;

/* 0 when out of memory (nothing added: callers count what they got) */
static int texts_add(texts *t, const char *s, size_t n)
{
    char *copy = strndup(s, n), **v = copy ? realloc(t->v, (t->n + 1) * sizeof *v) : NULL;
    if (!v) {
        free(copy);
        return 0;
    }
    t->v = v;
    t->v[t->n++] = copy;
    return 1;
}

static void texts_free(texts *t)
{
    for (size_t i = 0; i < t->n; i++) free(t->v[i]);
    free(t->v);
}

/* the byte length of text's first `max_tokens` tokens, cut back to the end
 * of a sentence when one ends in the last third */
static size_t cut_tokens(cp_tokenizer *tok, const char *text, int max_tokens)
{
    cp_encoding e = { 0 };
    cp_error err;
    size_t len = strlen(text), end = len;
    if (cp_tokenize(tok, text, len, 0, &e, &err) == CP_OK && e.n > (size_t)max_tokens) end = e.end[max_tokens - 1];
    cp_encoding_free(&e);
    for (size_t i = end; i > end * 2 / 3; i--)
        if (i < len && text[i - 1] == '.' && (text[i] == ' ' || text[i] == '\n')) return i;
    return end;
}

static int count_tokens(cp_tokenizer *tok, const char *text)
{
    cp_encoding e = { 0 };
    cp_error err;
    int n = cp_tokenize(tok, text, strlen(text), CP_TOK_ADD_SPECIAL, &e, &err) == CP_OK ? (int)e.n : 1 << 20;
    cp_encoding_free(&e);
    return n;
}

static int load_musique(const char *root, cp_tokenizer *tok, int n, int max_tokens, texts *out)
{
    char path[4096], *js;
    cp_error err;
    snprintf(path, sizeof path, "%s/data/cacheblend/musique_s.json", root);
    if (cp_read_file(path, 64u << 20, &js, NULL, &err)) return cli_error("%s", err.msg), 0;
    cJSON *d = cJSON_Parse(js);
    free(js);
    for (const cJSON *q = cJSON_IsArray(d) ? d->child : NULL; q && (int)out->n < n; q = q->next)
        for (const cJSON *c = cJSON_GetObjectItem(q, "ctxs") ? cJSON_GetObjectItem(q, "ctxs")->child : NULL; c && (int)out->n < n; c = c->next) {
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
            if (!t || strlen(t) < 400) continue;
            int dup = 0;
            for (size_t i = 0; i < out->n; i++) dup |= strncmp(out->v[i], t, 80) == 0;
            if (!dup) texts_add(out, t, cut_tokens(tok, t, max_tokens));
        }
    cJSON_Delete(d);
    return (int)out->n == n || (cli_error("%s: fewer than %d passages", path, n), 0);
}

/* QMSum transcripts as "Speaker: words" lines, turns [a, b] */
static char *qmsum_excerpt(const cJSON *meeting, int a, int b)
{
    const cJSON *tr = cJSON_GetObjectItem(meeting, "meeting_transcripts");
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    int i = 0;
    for (const cJSON *t = tr ? tr->child : NULL; t && s; t = t->next, i++) {
        if (i < a || i > b) continue;
        const char *sp = cJSON_GetStringValue(cJSON_GetObjectItem(t, "speaker")), *ct = cJSON_GetStringValue(cJSON_GetObjectItem(t, "content"));
        if (!sp || !ct) continue;
        size_t need = strlen(sp) + strlen(ct) + 4;
        while (len + need >= cap) s = realloc(s, cap *= 2);
        if (s) len += (size_t)sprintf(s + len, "%s: %s\n", sp, ct);
    }
    if (s) s[len] = 0;
    return s;
}

/* ---- output -------------------------------------------------------------------------- */

static cJSON *msg(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    return m;
}

static int emit(FILE *f, cp_tokenizer *tok, int tenant, cJSON *msgs, int max_tokens)
{
    /* the rendered prompt (plain template: BOS + messages, blank lines) must fit */
    size_t cap = 1, len = 0;
    for (const cJSON *m = msgs->child; m; m = m->next) cap += strlen(cJSON_GetStringValue(cJSON_GetObjectItem(m, "content"))) + 2;
    char *all = malloc(cap);
    for (const cJSON *m = msgs->child; all && m; m = m->next) len += (size_t)sprintf(all + len, "%s%s", len ? "\n\n" : "", cJSON_GetStringValue(cJSON_GetObjectItem(m, "content")));
    int n = all ? count_tokens(tok, all) : 1 << 20;
    free(all);
    if (n + max_tokens > 1024) {
        cJSON_Delete(msgs);
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    char t[16];
    snprintf(t, sizeof t, "t%02d", tenant);
    cJSON_AddStringToObject(o, "tenant", t);
    cJSON_AddItemToObject(o, "messages", msgs);
    cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
    char *s = cJSON_PrintUnformatted(o);
    if (s) fprintf(f, "%s\n", s);
    free(s);
    cJSON_Delete(o);
    return 1;
}

static const char system_prompt[] =
    "You are a careful research assistant for a team of analysts. Answer using only the passages provided with each "
    "question, quote the passage you rely on, and say clearly when the passages do not contain the answer. Keep answers "
    "short and factual, avoid speculation, and never repeat personal information that a user shares with you. When a "
    "question is ambiguous, state the reading you chose. Dates, names and numbers must be copied exactly as they appear "
    "in the passages. If two passages disagree, report both and say which one seems more reliable and why. Write in "
    "plain English.";

/* rag-synth-v1's: short enough that its prompts fit 1024 tokens of a
 * byte-level tokenizer (a synth model's), where system_prompt alone is 560 */
static const char synth_system_prompt[] =
    "You are a careful research assistant. Answer only from the passages and never repeat personal data.";

static const char *const questions[] = {
    "Can you tell me which of these passages mentions the earliest date, and what happened then?",
    "Which person appears in more than one passage, and what do the passages say about them?",
    "Summarise the second passage in two sentences for a colleague who has not read it.",
    "Is there anything in these passages about a city or a country? Please list what you find.",
    "What is the main topic shared by the first and the last passage, if there is one?",
    "Please explain the most surprising fact in these passages and why it matters.",
};

/* Passages of our own for rag-synth-v1: prose-shaped sentences about made-up
 * places, from a fixed seed (like rag-v1's fixed MuSiQue passages, the
 * corpus does not change with --seed).  Whole sentences, as many as fit
 * max_tokens (the first one cut if it alone does not). */
static int synth_passages(cp_tokenizer *tok, int n, int max_tokens, texts *out)
{
    static const char *const places[] = { "Velmar", "Ostrava Bay", "Kellin", "the Aldra valley", "Port Serin", "Hollow Creek",
                                          "Marrowick", "the Tessel islands" };
    static const char *const things[] = { "lighthouse", "railway bridge", "wool market", "observatory", "paper mill",
                                          "river ferry", "clock tower", "salt works" };
    static const char *const people[] = { "a guild of clockmakers", "the harbour council", "two surveyors from the coast",
                                          "a travelling printer", "the first schoolmistress", "merchants from the south" };
    static const char *const deeds[] = { "rebuilt it after the great flood", "kept its records in a locked chest",
                                         "argued for years about its cost", "opened it to visitors on feast days",
                                         "moved it stone by stone to higher ground", "sold it to the town for a single coin" };
    rng r = { 0x5eedu };
    char buf[2048];
    for (int d = 0; d < n; d++) {
        size_t len = 0;
        const char *place = places[rint_(&r, 8)], *thing = things[rint_(&r, 8)];
        int built = 1700 + rint_(&r, 120); /* the events come after it */
        len += (size_t)snprintf(buf + len, sizeof buf - len, "The %s of %s was built in %d.", thing, place, built);
        while (len < 1500) {
            size_t keep = len;
            int k = rint_(&r, 4), w = 0;
            if (k == 0) w = snprintf(buf + len, sizeof buf - len, " In %d %s %s.", built + 5 + rint_(&r, 180), people[rint_(&r, 6)], deeds[rint_(&r, 6)]);
            else if (k == 1) w = snprintf(buf + len, sizeof buf - len, " It stands %d metres from the %s, on the road to %s.",
                                          10 * (rint_(&r, 90) + 1), things[rint_(&r, 8)], places[rint_(&r, 8)]);
            else if (k == 2) w = snprintf(buf + len, sizeof buf - len, " Local accounts say that %s %s, though the records disagree.",
                                          people[rint_(&r, 6)], deeds[rint_(&r, 6)]);
            else w = snprintf(buf + len, sizeof buf - len, " By %d the %s of %s drew %d visitors a year.", built + 5 + rint_(&r, 180), thing,
                              place, 100 * (rint_(&r, 50) + 1));
            if (w < 0 || (size_t)w >= sizeof buf - len) break;
            len += (size_t)w;
            if (count_tokens(tok, buf) > max_tokens) { /* counted with BOS/EOS: errs short */
                buf[len = keep] = 0;
                break;
            }
        }
        if (!texts_add(out, buf, cut_tokens(tok, buf, max_tokens))) return cli_error("workload: out of memory"), 0;
    }
    return 1;
}

static void progress_made(cli_progress *pr, int made, int n_req)
{
    cli_progress_items(pr, (size_t)made, (size_t)n_req, "requests");
}

/* sys: the system prompt every conversation opens with */
static int rag_v1(FILE *f, cp_tokenizer *tok, const texts docs, const char *sys, uint64_t seed, int n_req, int n_tenants,
                  cli_progress *pr)
{
    rng r = { seed };
    cJSON **history = calloc((size_t)n_req, sizeof *history); /* a copy of each request's messages */
    int *owner = calloc((size_t)n_req, sizeof *owner), made = 0, tries = 0;
    if (!history || !owner) {
        free(history), free(owner);
        return cli_error("workload: out of memory for %d requests", n_req), 0;
    }
    while (made < n_req && tries++ < n_req * 10) {
        progress_made(pr, made, n_req);
        int tenant = rint_(&r, n_tenants);
        cJSON *msgs;
        char q[512], p[160];
        if (runif(&r) < 0.3 && made > 0) { /* a follow-up of an earlier conversation of this tenant */
            int prev = -1;
            for (int k = made - 1; k >= 0 && prev < 0; k--)
                if (owner[k] == tenant && history[k]) prev = k;
            if (prev >= 0) {
                msgs = cJSON_Duplicate(history[prev], 1);
                cJSON_AddItemToArray(msgs, msg("assistant", "According to the passages, the answer is in the first passage."));
                snprintf(q, sizeof q, "Thanks. And what does the third passage add to that?");
                if (runif(&r) < 0.3) pii(&r, p, sizeof p), snprintf(q, sizeof q, "Thanks, %s. And what does the third passage add?", p);
                cJSON_AddItemToArray(msgs, msg("user", q));
                if (emit(f, tok, tenant, msgs, 16)) owner[made] = tenant, history[made] = NULL, made++;
                continue;
            }
        }
        msgs = cJSON_CreateArray();
        cJSON_AddItemToArray(msgs, msg("system", sys));
        int pick[6], np = 0;
        while (np < 6) {
            int k = zipf(&r, (int)docs.n, 1.0), dup = 0;
            for (int i = 0; i < np; i++) dup |= pick[i] == k;
            if (!dup) pick[np++] = k;
        }
        for (int i = 0; i < 6; i++) cJSON_AddItemToArray(msgs, msg("document", docs.v[pick[i]]));
        const char *base = questions[rint_(&r, 6)];
        if (runif(&r) < 0.33) { /* ~1 PII phrase in 3 turns: 2.3 % of user tokens */
            pii(&r, p, sizeof p);
            snprintf(q, sizeof q, "Hello, %s. %s I need it for a report due this week.", p, base);
        } else {
            snprintf(q, sizeof q, "Hello. %s I need it for a report due this week.", base);
        }
        cJSON_AddItemToArray(msgs, msg("user", q));
        cJSON *copy = cJSON_Duplicate(msgs, 1);
        if (emit(f, tok, tenant, msgs, 16)) owner[made] = tenant, history[made] = copy, made++;
        else cJSON_Delete(copy);
    }
    for (int i = 0; i < n_req; i++) cJSON_Delete(history[i]);
    free(history), free(owner);
    progress_made(pr, made, n_req);
    return made == n_req;
}

static const char *const letters[] = {
    "Dear Sir or Madam,\n\nI am writing to dispute a charge that appeared on my statement last month. The amount was billed "
    "twice for a single purchase at your online store, and although I contacted customer service by phone, the duplicate "
    "charge has not been reversed. I have attached a copy of the receipt and of the statement page showing both charges. "
    "I would be grateful if you could investigate and refund the duplicate amount within the period required by law. "
    "Please confirm in writing once the refund has been issued, and tell me whether any further information is needed from "
    "me to complete the process. I have been a loyal customer for several years and I hope this can be resolved quickly.\n\n"
    "Yours faithfully,",
    "To the housing office,\n\nI would like to report a persistent problem with the heating in my flat. Since the start of "
    "the winter the radiators in the bedroom and the kitchen have stayed cold for most of the day, and the boiler shows an "
    "error light every evening. A technician visited once but the fault returned two days later. The temperature indoors "
    "has fallen below eighteen degrees on several nights, which is difficult for my family. I am asking for a full repair "
    "or a replacement of the boiler as soon as possible, and for a written record of this complaint. I am available on "
    "weekday mornings for another visit and can provide photographs of the error messages if that helps.\n\nKind regards,",
};

/* a QMSum turn number ("12"): digits only, within int */
static int turn_number(const cJSON *v, long long *out)
{
    const char *s = cJSON_GetStringValue(v);
    char *end;
    if (!s || !isdigit((unsigned char)s[0])) return 0;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end || errno || x > INT32_MAX) return 0;
    *out = x;
    return 1;
}

static int chat_v1(FILE *f, cp_tokenizer *tok, const char *root, uint64_t seed, int n_req, int n_tenants, cli_progress *pr)
{
    /* shared pastes: form letters, book paragraphs, meeting excerpts (300-700 tokens) */
    texts src = { 0 };
    for (int i = 0; i < 2; i++) texts_add(&src, letters[i], strlen(letters[i]));
    static const char *const books[] = { "pg1342_pride_and_prejudice.txt", "pg1661_adventures_of_sherlock_holmes.txt",
                                         "pg11_alice_in_wonderland.txt", "pg84_frankenstein.txt" };
    for (int b = 0; b < 4; b++) {
        char path[4096], *t;
        size_t n;
        cp_error err;
        snprintf(path, sizeof path, "%s/data/gutenberg/%s", root, books[b]);
        if (cp_read_file(path, 16u << 20, &t, &n, &err)) return cli_error("%s", err.msg), 0;
        for (int k = 0; k < 2; k++) {
            char *p = strchr(t + n / 3 + (size_t)k * (n / 5), '\n');
            while (p && (*p == '\n' || *p == '\r')) p++;
            if (!p) continue;
            char *clean = strndup(p, 6000);
            for (char *c = clean; *c; c++)
                if (*c == '\r') *c = ' ';
            texts_add(&src, clean, cut_tokens(tok, clean, 300 + 100 * k + 50 * b));
            free(clean);
        }
        free(t);
    }
    char path[4096], *js;
    cp_error err;
    snprintf(path, sizeof path, "%s/data/qmsum/test.jsonl", root);
    if (cp_read_file(path, 64u << 20, &js, NULL, &err)) return cli_error("%s", err.msg), 0;
    int m = 0;
    for (char *line = strtok(js, "\n"); line && m < 6; line = strtok(NULL, "\n"), m++) {
        cJSON *j = cJSON_Parse(line);
        char *ex = qmsum_excerpt(j, 5, 40);
        if (ex) texts_add(&src, ex, cut_tokens(tok, ex, 350 + 50 * m)), free(ex);
        cJSON_Delete(j);
    }
    free(js);
    static const char *const asks[] = { "Can you summarise this for me?", "What is the main request here?",
                                        "Please list the key facts.", "Who is involved and what do they want?" };
    rng r = { seed };
    int made = 0, tries = 0;
    while (made < n_req && tries++ < n_req * 10) {
        progress_made(pr, made, n_req);
        int tenant = rint_(&r, n_tenants);
        const char *text = src.v[zipf(&r, (int)src.n, 1.0)];
        size_t len = strlen(text), cap = len + 1024, o = 0;
        char *paste = malloc(cap);
        /* the user's own data in a few places: after the first sentence,
         * at the end, and sometimes in the middle (2.3 % of user tokens) */
        int spots[3] = { -1, -1, -1 }, ns = 0;
        for (size_t i = 0; i + 1 < len && ns < 2; i++)
            if (text[i] == '.' && text[i + 1] == ' ' && (ns == 0 ? i > 40 : i > len / 2)) spots[ns++] = (int)i + 1;
        size_t prev = 0;
        for (int s = 0; s < ns; s++) {
            char p[160];
            pii(&r, p, sizeof p);
            o += (size_t)snprintf(paste + o, cap - o, "%.*s (%s)", (int)((size_t)spots[s] - prev), text + prev, p);
            prev = (size_t)spots[s];
        }
        char p[160];
        pii(&r, p, sizeof p);
        o += (size_t)snprintf(paste + o, cap - o, "%s\n\n(%s.) %s", text + prev, p, asks[rint_(&r, 4)]);
        cJSON *msgs = cJSON_CreateArray();
        cJSON_AddItemToArray(msgs, msg("user", paste));
        free(paste);
        if (emit(f, tok, tenant, msgs, 16)) made++;
    }
    texts_free(&src);
    progress_made(pr, made, n_req);
    return made == n_req;
}

static int meetings_v1(FILE *f, cp_tokenizer *tok, const char *root, uint64_t seed, int n_req, int n_tenants, cli_progress *pr)
{
    char path[4096], *js;
    cp_error err;
    snprintf(path, sizeof path, "%s/data/qmsum/test.jsonl", root);
    if (cp_read_file(path, 64u << 20, &js, NULL, &err)) return cli_error("%s", err.msg), 0;
    rng r = { seed };
    int made = 0;
    for (char *line = strtok(js, "\n"); line && made < n_req; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *qs = cJSON_GetObjectItem(j, "specific_query_list");
        for (const cJSON *q = qs ? qs->child : NULL; q && made < n_req; q = q->next) {
            const cJSON *span = cJSON_GetObjectItem(q, "relevant_text_span");
            const cJSON *s0 = span && span->child ? span->child : NULL;
            if (!s0 || !s0->child || !s0->child->next) continue;
            long long a, b; /* the span's turn numbers, strings in QMSum: a bad one skips the query, never turn 0 */
            if (!turn_number(s0->child, &a) || !turn_number(s0->child->next, &b)) continue;
            char *ex = qmsum_excerpt(j, (int)a, (int)b);
            if (!ex) continue;
            ex[cut_tokens(tok, ex, 700)] = 0;
            cJSON *msgs = cJSON_CreateArray();
            cJSON_AddItemToArray(msgs, msg("document", ex));
            cJSON_AddItemToArray(msgs, msg("user", cJSON_GetStringValue(cJSON_GetObjectItem(q, "query"))));
            free(ex);
            /* each query is asked by two tenants, so excerpts repeat */
            cJSON *again = cJSON_Duplicate(msgs, 1);
            int t1 = rint_(&r, n_tenants), t2 = rint_(&r, n_tenants);
            progress_made(pr, made, n_req);
            made += emit(f, tok, t1, msgs, 16);
            if (made < n_req) made += emit(f, tok, t2, again, 16);
            else cJSON_Delete(again);
        }
        cJSON_Delete(j);
    }
    free(js);
    progress_made(pr, made, n_req);
    return made == n_req;
}

static void usage(FILE *f)
{
    fputs("usage: cacheprune workload --preset NAME --out FILE.jsonl [options]\n"
          "\n"
          "  --preset NAME     rag-v1, chat-v1, meetings-v1 (texts from the reference kit), or rag-synth-v1\n"
          "                    (rag-v1's shape, generated passages of <= 100 tokens and a short system prompt:\n"
          "                    needs no kit, and fits even a byte-level tokenizer)\n"
          "  --out FILE        the request log (JSONL)\n"
          "  --seed S          the seed (default 1)\n"
          "  --requests N      requests (default 150)\n"
          "  --tenants N       tenants (default 12)\n"
          "  --data DIR        the reference kit (default ../shared)\n"
          "  --model DIR       the tokenizer every prompt must fit 1024 tokens of (default\n"
          "                    ../shared/models/cp-books-6m; e.g. a synth model's directory without the kit)\n"
          "  --quiet-progress  no progress line (shown only when stderr is a terminal)\n"
          "Presets are fixed (see README); --requests and --tenants make other studies, not the presets.\n",
          f);
}

/* preset is one of the four names */
static int make_preset(const char *preset, FILE *f, cp_tokenizer *tok, const char *root, uint64_t seed, int n_req, int n_tenants,
                       cli_progress *pr)
{
    if (strcmp(preset, "chat-v1") == 0) return chat_v1(f, tok, root, seed, n_req, n_tenants, pr);
    if (strcmp(preset, "meetings-v1") == 0) return meetings_v1(f, tok, root, seed, n_req, n_tenants, pr);
    int synth = strcmp(preset, "rag-synth-v1") == 0;
    texts docs = { 0 };
    int ok = synth ? synth_passages(tok, 40, 100, &docs) : load_musique(root, tok, 40, 120, &docs);
    if (ok) ok = rag_v1(f, tok, docs, synth ? synth_system_prompt : system_prompt, seed, n_req, n_tenants, pr);
    texts_free(&docs);
    return ok;
}

int cli_workload(int argc, char **argv)
{
    const char *preset = NULL, *out = NULL, *root = "../shared", *model = "../shared/models/cp-books-6m";
    long long seed = 1, n_req = 150, n_tenants = 12;
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "--quiet-progress") == 0) {
            quiet = 1;
            continue;
        }
        static const char *const with_value[] = { "--preset", "--out", "--data", "--model", "--seed", "--requests", "--tenants", NULL };
        if (!cli_one_of(a, with_value)) return cli_unknown("workload", a), 2;
        if (!(v = cli_value("workload", argc, argv, &i))) return 2;
        if (strcmp(a, "--preset") == 0) preset = v;
        else if (strcmp(a, "--out") == 0) out = v;
        else if (strcmp(a, "--data") == 0) root = v;
        else if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--seed") == 0) { if (!cli_parse_int(a, v, 0, INT64_MAX, &seed)) return 2; }
        else if (strcmp(a, "--requests") == 0) { if (!cli_parse_int(a, v, 1, 1000000, &n_req)) return 2; }
        else if (!cli_parse_int(a, v, 1, 100000, &n_tenants)) return 2;
    }
    if (!preset || !out) return cli_error("workload: --preset and --out are required (see --help)"), 2;
    static const char *const presets[] = { "rag-v1", "chat-v1", "meetings-v1", "rag-synth-v1", NULL };
    if (!cli_one_of(preset, presets)) return cli_error("workload: unknown preset '%s' (rag-v1, chat-v1, meetings-v1, rag-synth-v1)", preset), 2;
    cp_tokenizer *tok;
    cp_error err;
    if (cp_tokenizer_load(model, &tok, &err))
        return cli_error("%s (--model DIR names the tokenizer; without the reference kit use a synth model's directory)", err.msg), 1;
    FILE *f = fopen(out, "w");
    if (!f) {
        cp_tokenizer_free(tok);
        return cli_error("%s: cannot write", out), 1;
    }
    cli_progress pr = { "workload", -1, cli_progress_wanted(quiet) };
    int ok = make_preset(preset, f, tok, root, (uint64_t)seed, (int)n_req, (int)n_tenants, &pr);
    cli_progress_end(&pr);
    int wrote = fclose(f) == 0;
    cp_tokenizer_free(tok);
    if (ok <= 0) return cli_error("workload: could not make %lld requests for %s", n_req, preset), 1;
    if (!wrote) return cli_error("%s: write failed", out), 1;
    fprintf(stderr, "wrote %lld requests (%s, seed %lld) to %s\n", n_req, preset, seed, out);
    return 0;
}
