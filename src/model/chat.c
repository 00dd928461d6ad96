/*
 * chat.c — chat prompts: the model's Jinja template or a built-in format,
 * rendering and tokenizing messages, end-of-turn tokens (see chat.h).
 */
#include "model/chat.h"

#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"
#include "text/json.h"
#include "text/toolcall.h"

static const char *const builtin_names[] = {"chatml", "gemma", "llama3"};
static const chat_format builtin_formats[] = {CHAT_CHATML, CHAT_GEMMA, CHAT_LLAMA3};
#define N_BUILTIN 3
#define BUILTIN_LIST "chatml|gemma|llama3"

/* Texts of end-of-turn tokens in the templates of the model families
 * cellm knows; a template that writes one ends each turn with it. */
static const char *const eot_texts[] = {
    "<|im_end|>", "<end_of_turn>",   "<|eot_id|>",         "<|eom_id|>",
    "<|end|>",    "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
};

/* The id of a special token given by its text, or -1. */
static int32_t special_id(const tokenizer *tok, const char *text) {
    tok_ids ids = {0};
    int32_t id = -1;
    if (tokenizer_encode(tok, text, strlen(text), TOK_PARSE_SPECIAL, &ids, NULL) == CELLM_OK &&
        ids.n == 1 && tokenizer_token_type(tok, ids.ids[0]) != TOK_TYPE_NORMAL)
        id = ids.ids[0];
    tok_ids_free(&ids);
    return id;
}

static void add_stop(chat_tpl *t, const tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tokenizer_n_vocab(tok) || id == tokenizer_eos(tok)) return;
    for (int i = 0; i < CHAT_MAX_STOP; i++) {
        if (t->stop[i] == id) return;
        if (t->stop[i] < 0) {
            t->stop[i] = id;
            return;
        }
    }
}

/* The text of token `id`, copied; NULL for no token (and when out of
 * memory, which then only leaves the variable undefined). */
static char *token_text(const tokenizer *tok, int32_t id) {
    size_t n = 0;
    const char *s = id >= 0 ? tokenizer_token_text(tok, id, &n) : NULL;
    return s ? str_dup_n(s, n) : NULL;
}

void chat_tpl_free(chat_tpl *t) {
    free(t->jinja);
    free(t->bos);
    free(t->eos);
    memset(t, 0, sizeof *t);
}

cellm_status chat_tpl_init(const model *m, const tokenizer *tok, const char *name, chat_tpl *t,
                           cellm_error *err) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < CHAT_MAX_STOP; i++) t->stop[i] = -1;
    t->bos_id = tokenizer_adds_bos(tok) ? tokenizer_bos(tok) : -1;
    bool given = name && (strstr(name, "{{") || strstr(name, "{%"));
    gguf_str own = {"", 0};
    bool has_own = gguf_get_str(m->file, "tokenizer.chat_template", &own) && own.len > 0;
    if (name && !given) {
        int i = 0;
        while (i < N_BUILTIN && strcmp(name, builtin_names[i])) i++;
        if (i == N_BUILTIN)
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "unknown chat template '%s' (built-in: chatml, gemma, llama3; or give "
                           "a Jinja template text)",
                           name);
        t->format = builtin_formats[i];
    } else if (given) {
        t->format = CHAT_JINJA;
        t->jinja_len = strlen(name);
        t->jinja = str_dup_n(name, t->jinja_len);
    } else if (has_own) {
        t->format = CHAT_JINJA;
        t->from_model = true;
        t->jinja_len = (size_t)own.len;
        t->jinja = str_dup_n(own.ptr, t->jinja_len);
    } else if (!strncmp(m->arch, "gemma", 5)) {
        t->format = CHAT_GEMMA;
    } else {
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the model file has no chat template (tokenizer.chat_template); pick a "
                       "built-in format with --chat-template " BUILTIN_LIST);
    }
    if (t->format == CHAT_JINJA && !t->jinja) goto oom;
    if (t->format == CHAT_JINJA) {
        t->bos = token_text(tok, tokenizer_bos(tok));
        t->eos = token_text(tok, tokenizer_eos(tok));
        /* Try it once, so that a template cellm cannot parse fails here
         * and not at the first request. raise_exception() is about the
         * conversation, not the template, so it does not count. */
        const chat_msg probe = {"user", "Hello"};
        char *text = NULL;
        cellm_error perr;
        err_clear(&perr);
        cellm_status st = chat_render(t, &probe, 1, true, &text, &perr);
        free(text);
        if (st != CELLM_OK && st != CELLM_ERR_INVALID_ARG) {
            chat_tpl_free(t);
            return err_set(err, given ? CELLM_ERR_INVALID_ARG : CELLM_ERR_UNSUPPORTED, "%s",
                           perr.msg);
        }
        t->tool_fmt = (int)tool_format_of_template(t->jinja, &t->tools_native);
        for (size_t i = 0; i < sizeof eot_texts / sizeof *eot_texts; i++)
            if (strstr(t->jinja, eot_texts[i])) add_stop(t, tok, special_id(tok, eot_texts[i]));
    } else {
        static const char *const marks[] = {"", "<|im_end|>", "<end_of_turn>", "<|eot_id|>"};
        add_stop(t, tok, special_id(tok, marks[t->format]));
    }
    /* End-of-turn ids the file names (llama.cpp's keys). */
    int64_t id;
    if (gguf_get_int(m->file, "tokenizer.ggml.eot_token_id", &id) && id >= 0 && id < INT32_MAX)
        add_stop(t, tok, (int32_t)id);
    if (gguf_get_int(m->file, "tokenizer.ggml.eom_token_id", &id) && id >= 0 && id < INT32_MAX)
        add_stop(t, tok, (int32_t)id);
    /* A default system prompt written into a ChatML template (SmolLM2's),
     * for the built-in format: the Jinja template writes it itself. */
    if (t->format == CHAT_CHATML && own.len > 0) {
        char *text = str_dup_n(own.ptr, (size_t)own.len);
        if (!text) goto oom;
        const char *sys = strstr(text, "<|im_start|>system\n");
        if (sys) {
            sys += strlen("<|im_start|>system\n");
            const char *end = strstr(sys, "<|im_end|>");
            size_t n = end ? (size_t)(end - sys) : 0;
            if (n < sizeof t->default_system && !memchr(sys, '{', n) && !memchr(sys, '\'', n)) {
                memcpy(t->default_system, sys, n);
                t->default_system[n] = '\0';
            }
        }
        free(text);
    }
    return CELLM_OK;
oom:
    chat_tpl_free(t);
    return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
}

/* The built-in formats. */
static void render_builtin(const chat_tpl *t, const chat_msg *msgs, int n, bool add_generation,
                           json_buf *b) {
    const char *system = NULL;
    int first = 0;
    if (n > 0 && !strcmp(msgs[0].role, "system")) {
        system = msgs[0].content;
        first = 1;
    }
    switch (t->format) {
    case CHAT_JINJA: break;
    case CHAT_CHATML:
        if (!system && t->default_system[0]) system = t->default_system;
        if (system) {
            json_buf_str(b, "<|im_start|>system\n");
            json_buf_str(b, system);
            json_buf_str(b, "<|im_end|>\n");
        }
        for (int i = first; i < n; i++) {
            json_buf_str(b, "<|im_start|>");
            json_buf_str(b, msgs[i].role);
            json_buf_str(b, "\n");
            json_buf_str(b, msgs[i].content);
            json_buf_str(b, "<|im_end|>\n");
        }
        if (add_generation) json_buf_str(b, "<|im_start|>assistant\n");
        break;
    case CHAT_GEMMA:
        /* Gemma has no system role: the system text opens the first user
         * turn. */
        for (int i = first; i < n; i++) {
            bool user = strcmp(msgs[i].role, "assistant") != 0;
            json_buf_str(b, user ? "<start_of_turn>user\n" : "<start_of_turn>model\n");
            if (system && i == first) {
                json_buf_str(b, system);
                json_buf_str(b, "\n\n");
            }
            json_buf_str(b, msgs[i].content);
            json_buf_str(b, "<end_of_turn>\n");
        }
        if (add_generation) json_buf_str(b, "<start_of_turn>model\n");
        break;
    case CHAT_LLAMA3:
        for (int i = 0; i < n; i++) {
            json_buf_str(b, "<|start_header_id|>");
            json_buf_str(b, msgs[i].role);
            json_buf_str(b, "<|end_header_id|>\n\n");
            json_buf_str(b, msgs[i].content);
            json_buf_str(b, "<|eot_id|>");
        }
        if (add_generation) json_buf_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    }
}

/* Renders msgs, or for a Jinja template the variables in vars (a JSON
 * object, vars_len bytes) when not NULL. */
static cellm_status render(const chat_tpl *t, const chat_msg *msgs, int n, const char *vars,
                           size_t vars_len, bool add_generation, char **out, cellm_error *err) {
    *out = NULL;
    if (t->format != CHAT_JINJA) {
        json_buf b = {0};
        json_buf_str(&b, "");
        render_builtin(t, msgs, n, add_generation, &b);
        if (b.full) {
            free(b.s);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        }
        *out = b.s;
        return CELLM_OK;
    }
    jinja_message *jm = malloc(sizeof *jm * (size_t)(n > 0 ? n : 1));
    if (!jm) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) jm[i] = (jinja_message){msgs[i].role, msgs[i].content};
    jinja_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.messages = jm;
    ctx.n_messages = (size_t)n;
    ctx.add_generation_prompt = add_generation;
    ctx.bos_token = t->bos;
    ctx.eos_token = t->eos;
    ctx.vars_json = vars;
    ctx.vars_json_len = vars_len;
    size_t len = 0;
    cellm_error jerr;
    err_clear(&jerr);
    cellm_status st = jinja_render(t->jinja, t->jinja_len, &ctx, out, &len, &jerr);
    free(jm);
    if (st == CELLM_OK) return CELLM_OK;
    /* raise_exception is the conversation breaking the template's rules:
     * its message says what to fix. Anything else is the template. */
    if (st == CELLM_ERR_INVALID_ARG) return err_set(err, st, "%s", jerr.msg);
    if (t->from_model)
        return err_set(err, st,
                       "the model's chat template cannot be rendered: %.360s; pick a built-in "
                       "format with --chat-template " BUILTIN_LIST,
                       jerr.msg);
    return err_set(err, st, "the chat template cannot be rendered: %.400s", jerr.msg);
}

cellm_status chat_render(const chat_tpl *t, const chat_msg *msgs, int n, bool add_generation,
                         char **out, cellm_error *err) {
    return render(t, msgs, n, NULL, 0, add_generation, out, err);
}

cellm_status chat_render_json(const chat_tpl *t, const char *messages_json, const char *tools_json,
                              bool add_generation, char **out, cellm_error *err) {
    *out = NULL;
    tool_chat tc;
    cellm_status st =
        tool_chat_prepare(messages_json, tools_json, t->format == CHAT_JINJA && t->tools_native,
                          t->tool_fmt == TOOL_FMT_MISTRAL, &tc, err);
    if (st) return st;
    chat_msg *msgs = malloc(sizeof *msgs * (size_t)(tc.n_msgs > 0 ? tc.n_msgs : 1));
    if (!msgs) {
        tool_chat_free(&tc);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    for (int i = 0; i < tc.n_msgs; i++) msgs[i] = (chat_msg){tc.msgs[i].role, tc.msgs[i].content};
    st = render(t, msgs, tc.n_msgs, tc.vars_json, tc.vars_len, add_generation, out, err);
    free(msgs);
    tool_chat_free(&tc);
    return st;
}

/* Tokenizes a rendered prompt (and frees it). */
static cellm_status encode_text(const chat_tpl *t, const tokenizer *tok, char *text, tok_ids *ids,
                                cellm_error *err) {
    size_t first = ids->n;
    if (t->bos_id >= 0 && !tok_ids_push(ids, t->bos_id)) {
        free(text);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    cellm_status st = tokenizer_encode(tok, text, strlen(text), TOK_PARSE_SPECIAL, ids, err);
    free(text);
    if (st) return st;
    /* The template wrote BOS itself (Gemma's, Llama's): keep one. */
    if (t->bos_id >= 0 && ids->n >= first + 2 && ids->ids[first + 1] == t->bos_id) {
        memmove(ids->ids + first, ids->ids + first + 1, (ids->n - first - 1) * sizeof(int32_t));
        ids->n--;
    }
    return CELLM_OK;
}

cellm_status chat_encode(const chat_tpl *t, const tokenizer *tok, const chat_msg *msgs, int n,
                         bool add_generation, tok_ids *ids, cellm_error *err) {
    char *text = NULL;
    cellm_status st = chat_render(t, msgs, n, add_generation, &text, err);
    return st ? st : encode_text(t, tok, text, ids, err);
}

cellm_status chat_encode_json(const chat_tpl *t, const tokenizer *tok, const char *messages_json,
                              const char *tools_json, bool add_generation, tok_ids *ids,
                              cellm_error *err) {
    char *text = NULL;
    cellm_status st = chat_render_json(t, messages_json, tools_json, add_generation, &text, err);
    return st ? st : encode_text(t, tok, text, ids, err);
}

/* Appends content as a JSON array of parts: the text between "<image>"
 * markers as text parts, each marker as {"type": "image"}; counts the
 * markers into *n_img. */
static void put_parts(json_buf *b, const char *content, int *n_img) {
    static const char mark[] = "<image>";
    json_buf_str(b, "[");
    bool first = true;
    const char *p = content;
    for (;;) {
        const char *at = strstr(p, mark);
        size_t len = at ? (size_t)(at - p) : strlen(p);
        if (len > 0 || (!at && first)) {
            json_buf_str(b,
                         first ? "{\"type\":\"text\",\"text\":" : ",{\"type\":\"text\",\"text\":");
            json_buf_quote(b, p, len);
            json_buf_str(b, "}");
            first = false;
        }
        if (!at) break;
        json_buf_str(b, first ? "{\"type\":\"image\"}" : ",{\"type\":\"image\"}");
        first = false;
        (*n_img)++;
        p = at + sizeof mark - 1;
    }
    json_buf_str(b, "]");
}

cellm_status chat_encode_images(const chat_tpl *t, const tokenizer *tok, const chat_msg *msgs,
                                int n, bool add_generation, const char *const *image_text,
                                int n_images, tok_ids *ids, cellm_error *err) {
    if (t->format != CHAT_JINJA)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "a picture needs the model's own chat template (a built-in format has "
                       "no place for it)");
    json_buf b = {0};
    int n_marks = 0;
    json_buf_str(&b, "{\"messages\":[");
    for (int i = 0; i < n; i++) {
        json_buf_str(&b, i ? ",{\"role\":" : "{\"role\":");
        json_buf_quote(&b, msgs[i].role, strlen(msgs[i].role));
        json_buf_str(&b, ",\"content\":");
        put_parts(&b, msgs[i].content, &n_marks);
        json_buf_str(&b, "}");
    }
    json_buf_str(&b, "]}");
    if (b.full) {
        free(b.s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    if (n_marks != n_images) {
        free(b.s);
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "the messages mark %d pictures with <image>, but %d pictures are given",
                       n_marks, n_images);
    }
    char *out = NULL;
    cellm_status st = render(t, NULL, 0, b.s, b.n, add_generation, &out, err);
    free(b.s);
    if (st) return st;
    /* The template's "<image>"s, each replaced by its picture's tokens. */
    size_t len = strlen(out), total = len;
    int n_out = 0;
    for (const char *at = strstr(out, "<image>"); at; at = strstr(at + 7, "<image>")) {
        if (n_out < n_images) total += strlen(image_text[n_out]);
        n_out++;
    }
    if (n_out != n_images) {
        free(out);
        if (n_out == 0)
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "the chat template writes no <image> for a picture: not a vision "
                           "model's template");
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "the chat template wrote %d pictures for the %d given", n_out, n_images);
    }
    char *full = malloc(total + 1), *q = full;
    if (!full) {
        free(out);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    const char *p = out;
    for (int k = 0; k < n_images; k++) {
        const char *at = strstr(p, "<image>");
        size_t il = strlen(image_text[k]);
        memcpy(q, p, (size_t)(at - p));
        q += at - p;
        memcpy(q, image_text[k], il);
        q += il;
        p = at + 7;
    }
    memcpy(q, p, strlen(p) + 1);
    free(out);
    return encode_text(t, tok, full, ids, err);
}

cellm_status chat_encode_image(const chat_tpl *t, const tokenizer *tok, const char *system,
                               const char *text, const char *image_text, tok_ids *ids,
                               cellm_error *err) {
    size_t n = strlen(text);
    char *user = malloc(n + 8);
    if (!user) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    memcpy(user, "<image>", 7);
    memcpy(user + 7, text, n + 1);
    chat_msg msgs[2] = {{"system", system}, {"user", user}};
    int first = system ? 0 : 1;
    cellm_status st =
        chat_encode_images(t, tok, msgs + first, 2 - first, true, &image_text, 1, ids, err);
    free(user);
    return st;
}

bool chat_is_stop(const chat_tpl *t, const tokenizer *tok, int32_t id) {
    if (id == tokenizer_eos(tok)) return true;
    for (int i = 0; i < CHAT_MAX_STOP; i++)
        if (t->stop[i] >= 0 && t->stop[i] == id) return true;
    return false;
}
