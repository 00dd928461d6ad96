/*
 * two_chats.c — the smallest program that serves two conversations at once
 * with cellm, using nothing but the public header. Both requests go to one
 * engine, which batches their tokens into shared forward passes; each
 * answer streams into its own buffer through the piece callback (which
 * runs on the engine thread), and the main thread waits for both.
 *
 *   example_two_chats MODEL.gguf
 */
#include <stdio.h>
#include <string.h>

#include "cellm.h"

typedef struct answer {
    char text[8192];
    size_t len;
} answer;

/* Runs on the engine thread: append the piece. */
static void on_piece(const char *piece, size_t len, void *user) {
    answer *a = user;
    if (a->len + len < sizeof a->text) {
        memcpy(a->text + a->len, piece, len);
        a->len += len;
        a->text[a->len] = '\0';
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    cellm_model *model = NULL;
    cellm_engine *engine = NULL;
    if (cellm_model_load(argv[1], NULL, &model) != CELLM_OK ||
        cellm_engine_create(model, NULL, &engine) != CELLM_OK) {
        fprintf(stderr, "cellm: %s\n", cellm_last_error());
        cellm_model_free(model);
        return 1;
    }

    static const char *const questions[2] = {"What is the capital of France?",
                                             "Give me two tips for sleeping well."};
    static answer answers[2];
    cellm_request *req[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        cellm_chat_message msgs[1] = {{"user", questions[i]}};
        cellm_request_params p = cellm_request_default_params();
        p.messages = msgs; /* copied by cellm_submit */
        p.n_messages = 1;
        p.max_tokens = 96;
        p.on_piece = on_piece;
        p.user = &answers[i];
        if (cellm_submit(engine, &p, &req[i]) != CELLM_OK) {
            fprintf(stderr, "cellm: %s\n", cellm_last_error());
            break;
        }
    }
    for (int i = 0; i < 2 && req[i]; i++) {
        cellm_result res;
        cellm_wait(req[i], &res);
        printf("> %s\n%s\n(%d prompt + %d completion tokens, first token after %.0f ms)\n\n",
               questions[i], answers[i].text, res.n_prompt_tokens, res.n_completion_tokens,
               res.first_token_ms);
        cellm_request_free(req[i]);
    }
    cellm_stats st;
    cellm_engine_stats(engine, &st);
    printf("engine: %llu steps, %.1f MiB in use\n", (unsigned long long)st.n_steps,
           (double)st.bytes_in_use / (1 << 20));
    cellm_engine_free(engine);
    cellm_model_free(model);
    return 0;
}
