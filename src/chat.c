/*
 * chat.c — built-in chat formats: detection from the model's template,
 * rendering of messages, end-of-turn tokens (see chat.h). Moved here from
 * tools/rt.c so the engine can serve chat-message requests.
 */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

/* The id of a special token given by its text, or -1. */
static int32_t special_id(const tokenizer *tok, const char *text) {
    tok_ids ids = {0};
    int32_t id = -1;
    if (tokenizer_encode(tok, text, strlen(text), TOK_PARSE_SPECIAL, &ids, NULL) == CELLM_OK &&
        ids.n == 1)
        id = ids.ids[0];
    tok_ids_free(&ids);
    return id;
}

cellm_status chat_tpl_detect(const model *m, const tokenizer *tok, const char *name, chat_tpl *t,
                             cellm_error *err) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < CHAT_MAX_STOP; i++) t->stop[i] = -1;
    gguf_str tpl = {"", 0};
    bool has = gguf_get_str(m->file, "tokenizer.chat_template", &tpl);
    char *text = malloc((size_t)tpl.len + 1);
    if (!text) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    memcpy(text, tpl.ptr, (size_t)tpl.len);
    text[tpl.len] = '\0';
    if (name) {
        if (!strcmp(name, "chatml"))
            t->format = CHAT_CHATML;
        else if (!strcmp(name, "gemma"))
            t->format = CHAT_GEMMA;
        else if (!strcmp(name, "llama3"))
            t->format = CHAT_LLAMA3;
        else {
            free(text);
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "unknown chat format '%s' (known: chatml, gemma, llama3)", name);
        }
    } else if (strstr(text, "<|im_start|>")) {
        t->format = CHAT_CHATML;
    } else if (strstr(text, "<start_of_turn>") || (!has && !strncmp(m->arch, "gemma", 5))) {
        t->format = CHAT_GEMMA;
    } else if (strstr(text, "<|start_header_id|>")) {
        t->format = CHAT_LLAMA3;
    } else {
        free(text);
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the model's chat template is not one cellm knows yet; pick a format with "
                       "--chat-template chatml|gemma|llama3");
    }
    /* A default system prompt written into a ChatML template (SmolLM2's). */
    const char *sys = strstr(text, "<|im_start|>system\n");
    if (t->format == CHAT_CHATML && sys) {
        sys += strlen("<|im_start|>system\n");
        const char *end = strstr(sys, "<|im_end|>");
        size_t n = end ? (size_t)(end - sys) : 0;
        if (n < sizeof t->default_system && !memchr(sys, '{', n) && !memchr(sys, '\'', n)) {
            memcpy(t->default_system, sys, n);
            t->default_system[n] = '\0';
        }
    }
    free(text);
    static const char *const stops[] = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>"};
    t->stop[0] = special_id(tok, stops[t->format]);
    return CELLM_OK;
}

/* A growing string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n + 1);
    b->n += n;
}

char *chat_render(const chat_tpl *t, const chat_msg *msgs, int n, bool add_generation) {
    sbuf b = {0};
    put(&b, "");
    const char *system = NULL;
    int first = 0;
    if (n > 0 && !strcmp(msgs[0].role, "system")) {
        system = msgs[0].content;
        first = 1;
    }
    switch (t->format) {
    case CHAT_CHATML:
        if (!system && t->default_system[0]) system = t->default_system;
        if (system) {
            put(&b, "<|im_start|>system\n");
            put(&b, system);
            put(&b, "<|im_end|>\n");
        }
        for (int i = first; i < n; i++) {
            put(&b, "<|im_start|>");
            put(&b, msgs[i].role);
            put(&b, "\n");
            put(&b, msgs[i].content);
            put(&b, "<|im_end|>\n");
        }
        if (add_generation) put(&b, "<|im_start|>assistant\n");
        break;
    case CHAT_GEMMA:
        /* Gemma has no system role: the system text opens the first user
         * turn. BOS comes from the tokenizer. */
        for (int i = first; i < n; i++) {
            bool user = strcmp(msgs[i].role, "assistant") != 0;
            put(&b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            if (system && i == first) {
                put(&b, system);
                put(&b, "\n\n");
            }
            put(&b, msgs[i].content);
            put(&b, "<end_of_turn>\n");
        }
        if (add_generation) put(&b, "<start_of_turn>model\n");
        break;
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            put(&b, "<|start_header_id|>");
            put(&b, msgs[i].role);
            put(&b, "<|end_header_id|>\n\n");
            put(&b, msgs[i].content);
            put(&b, "<|eot_id|>");
        }
        if (add_generation) put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
    return b.p;
}

bool chat_is_stop(const chat_tpl *t, const tokenizer *tok, int32_t id) {
    if (id == tokenizer_eos(tok)) return true;
    for (int i = 0; i < CHAT_MAX_STOP; i++)
        if (t->stop[i] >= 0 && t->stop[i] == id) return true;
    return false;
}
