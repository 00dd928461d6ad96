/*
 * test_chat.c — how chat messages become prompt tokens (src/model/chat.h): the
 * model's own Jinja template by default (SmolLM2's gives the same tokens as
 * the built-in ChatML with its default system prompt), the built-in formats
 * by name and as the fallback for a file without a template (Gemma), a
 * template given as text, one BOS when both the template and the tokenizer
 * write it, end-of-turn tokens found in the template, and the errors: an
 * unknown name, a model template cellm cannot render (the message names the
 * fault, its position and --chat-template), a file with no template.
 *
 * Files without tensors stand in for models whose metadata matters here:
 * chat_tpl_init reads only the architecture and the template.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "model/chat.h"
#include "test_common.h"

typedef struct loaded {
    gguf_file *f;
    tokenizer *tok;
} loaded;

static loaded load_tok(const char *name) {
    char path[4096];
    loaded l = {0};
    test_model_path(name, path, sizeof path);
    cellm_error err;
    assert_int_equal(gguf_open(path, &l.f, &err), CELLM_OK);
    assert_int_equal(tokenizer_load(l.f, &l.tok, &err), CELLM_OK);
    return l;
}

static void unload(loaded *l) {
    tokenizer_free(l->tok);
    gguf_close(l->f);
}

/* A model whose file holds only an architecture name and, if `tpl` is not
 * NULL, a chat template. Free with fake_free. */
typedef struct fake {
    model m;
    uint8_t *buf;
} fake;

static void fake_make(fake *fk, const char *arch, const char *tpl) {
    memset(fk, 0, sizeof *fk);
    cellm_error err;
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", arch, &err), CELLM_OK);
    if (tpl)
        assert_int_equal(gguf_writer_set_str(w, "tokenizer.chat_template", tpl, &err), CELLM_OK);
    size_t size = 0;
    assert_int_equal(gguf_writer_write_mem(w, &fk->buf, &size, &err), CELLM_OK);
    gguf_writer_free(w);
    assert_int_equal(gguf_open_memory(fk->buf, size, &fk->m.file, &err), CELLM_OK);
    snprintf(fk->m.arch, sizeof fk->m.arch, "%s", arch);
}

static void fake_free(fake *fk) {
    gguf_close(fk->m.file);
    free(fk->buf);
}

static tok_ids encode(const chat_tpl *t, const tokenizer *tok, const chat_msg *msgs, int n) {
    tok_ids ids = {0};
    cellm_error err;
    if (chat_encode(t, tok, msgs, n, true, &ids, &err) != CELLM_OK) {
        print_error("chat_encode: %s\n", err.msg);
        fail();
    }
    return ids;
}

static void assert_same_ids(const tok_ids *a, const tok_ids *b) {
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->ids, b->ids, a->n * sizeof(int32_t));
}

static bool has_stop(const chat_tpl *t, int32_t id) {
    for (int i = 0; i < CHAT_MAX_STOP; i++)
        if (t->stop[i] == id) return true;
    return false;
}

static const chat_msg conv[] = {
    {"system", "You are terse."},
    {"user", "What is 2+2?"},
    {"assistant", "4."},
    {"user", "And 3+3?"},
};

static void test_smollm2_own_template(void **st) {
    (void)st;
    char path[4096];
    test_model_path("smollm2-135m", path, sizeof path);
    model *m = NULL;
    tokenizer *tok = NULL;
    cellm_error err;
    assert_int_equal(model_load(path, &m, &err), CELLM_OK);
    assert_int_equal(tokenizer_load(m->file, &tok, &err), CELLM_OK);
    chat_tpl own, builtin;
    assert_int_equal(chat_tpl_init(m, tok, NULL, &own, &err), CELLM_OK);
    assert_int_equal(own.format, CHAT_JINJA);
    assert_true(own.from_model);
    assert_int_equal(chat_tpl_init(m, tok, "chatml", &builtin, &err), CELLM_OK);
    assert_int_equal(builtin.format, CHAT_CHATML);
    assert_true(builtin.default_system[0] != '\0');
    /* With and without a system message, one turn and several. */
    for (int first = 0; first < 2; first++)
        for (int n = 1; first + n <= 4; n += 2) {
            tok_ids a = encode(&own, tok, conv + first, n),
                    b = encode(&builtin, tok, conv + first, n);
            assert_same_ids(&a, &b);
            tok_ids_free(&a);
            tok_ids_free(&b);
        }
    char *text = NULL;
    assert_int_equal(chat_render(&own, conv + 1, 1, false, &text, &err), CELLM_OK);
    assert_non_null(strstr(text, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"));
    assert_null(strstr(text, "<|im_start|>assistant"));
    free(text);
    /* <|im_end|> is SmolLM2's EOS, so a stop either way. */
    int32_t im_end = -1;
    tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(tok, "<|im_end|>", 10, TOK_PARSE_SPECIAL, &ids, &err),
                     CELLM_OK);
    im_end = ids.ids[0];
    tok_ids_free(&ids);
    assert_true(chat_is_stop(&own, tok, im_end));
    assert_true(chat_is_stop(&builtin, tok, im_end));
    chat_tpl_free(&own);
    chat_tpl_free(&builtin);
    assert_int_equal(chat_tpl_init(m, tok, "vicuna", &own, &err), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "chatml"));
    tokenizer_free(tok);
    model_free(m);
}

static void test_gemma_fallback_and_bos(void **st) {
    (void)st;
    loaded g = load_tok("gemma3-270m");
    assert_true(tokenizer_adds_bos(g.tok));
    cellm_error err;
    /* No template in the file: the built-in Gemma format, by architecture. */
    fake bare;
    fake_make(&bare, "gemma3", NULL);
    chat_tpl builtin;
    assert_int_equal(chat_tpl_init(&bare.m, g.tok, NULL, &builtin, &err), CELLM_OK);
    assert_int_equal(builtin.format, CHAT_GEMMA);
    tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(g.tok, "<end_of_turn>", 13, TOK_PARSE_SPECIAL, &ids, &err),
                     CELLM_OK);
    int32_t eot = ids.ids[0];
    tok_ids_free(&ids);
    assert_true(has_stop(&builtin, eot));
    /* A Gemma-style template that writes BOS itself: the prompt still has
     * exactly one, and the tokens equal the built-in format's. */
    fake tpl;
    fake_make(&tpl, "gemma3",
              "{{ bos_token }}{% for m in messages %}<start_of_turn>"
              "{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<end_of_turn>\n"
              "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}");
    chat_tpl own;
    assert_int_equal(chat_tpl_init(&tpl.m, g.tok, NULL, &own, &err), CELLM_OK);
    assert_int_equal(own.format, CHAT_JINJA);
    assert_true(has_stop(&own, eot));
    tok_ids a = encode(&own, g.tok, conv + 1, 3), b = encode(&builtin, g.tok, conv + 1, 3);
    assert_same_ids(&a, &b);
    assert_int_equal(a.ids[0], tokenizer_bos(g.tok));
    assert_true(a.ids[1] != tokenizer_bos(g.tok));
    tok_ids_free(&a);
    tok_ids_free(&b);
    chat_tpl_free(&own);
    chat_tpl_free(&builtin);
    fake_free(&tpl);
    fake_free(&bare);
    unload(&g);
}

static void test_errors(void **st) {
    (void)st;
    loaded s = load_tok("smollm2-135m");
    cellm_error err;
    chat_tpl t;
    /* The file's template uses a filter the interpreter lacks. */
    fake bad;
    fake_make(&bad, "llama", "{% for m in messages %}{{ m.content | frobnicate }}{% endfor %}");
    assert_int_equal(chat_tpl_init(&bad.m, s.tok, NULL, &t, &err), CELLM_ERR_UNSUPPORTED);
    print_message("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "frobnicate"));
    assert_non_null(strstr(err.msg, "byte"));
    assert_non_null(strstr(err.msg, "--chat-template"));
    /* ... and a built-in format named instead still works. */
    assert_int_equal(chat_tpl_init(&bad.m, s.tok, "chatml", &t, &err), CELLM_OK);
    chat_tpl_free(&t);
    fake_free(&bad);
    /* A syntax error. */
    fake_make(&bad, "llama", "{% for m in messages %}{{ m.content }}");
    assert_int_equal(chat_tpl_init(&bad.m, s.tok, NULL, &t, &err), CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--chat-template"));
    fake_free(&bad);
    /* No template and an architecture without a built-in format. */
    fake_make(&bad, "llama", NULL);
    assert_int_equal(chat_tpl_init(&bad.m, s.tok, NULL, &t, &err), CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "--chat-template"));
    /* A given template that fails is the caller's error. */
    assert_int_equal(chat_tpl_init(&bad.m, s.tok, "{{ x | nope }}", &t, &err),
                     CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "nope"));
    /* A given template that works. */
    assert_int_equal(chat_tpl_init(&bad.m, s.tok, "{{ messages[-1].content }}", &t, &err),
                     CELLM_OK);
    char *text = NULL;
    assert_int_equal(chat_render(&t, conv, 4, true, &text, &err), CELLM_OK);
    assert_string_equal(text, "And 3+3?");
    free(text);
    chat_tpl_free(&t);
    /* raise_exception at render time: the template's own message. */
    assert_int_equal(chat_tpl_init(&bad.m, s.tok,
                                   "{% if messages|length > 1 %}{{ raise_exception('one message "
                                   "only') }}{% endif %}{{ messages[0].content }}",
                                   &t, &err),
                     CELLM_OK);
    assert_int_equal(chat_render(&t, conv, 2, true, &text, &err), CELLM_ERR_INVALID_ARG);
    assert_null(text);
    assert_non_null(strstr(err.msg, "one message only"));
    chat_tpl_free(&t);
    fake_free(&bad);
    unload(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_smollm2_own_template),
        cmocka_unit_test(test_gemma_fallback_and_bos),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
