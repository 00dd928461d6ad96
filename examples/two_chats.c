/*
 * two_chats.c — the smallest program that serves two conversations at once
 * with cellm, using nothing but the public header. Each conversation is a
 * session on one engine, which batches the tokens of both into shared
 * forward passes; each answer streams into its own buffer through the
 * piece callback (which runs on the engine thread), and the main thread
 * waits for both. The second question of each chat is a follow-up: the
 * session kept the first turn's KV cache, so only the new tokens are
 * computed.
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

    static const char *const questions[2][2] = {
        {"What is the capital of France?", "And how many people live there?"},
        {"Give me two tips for sleeping well.", "Which of the two matters more?"},
    };
    cellm_session *chat[2] = {NULL, NULL};
    cellm_session_params sp = cellm_session_default_params();
    sp.max_tokens = 96;
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++)
        if (cellm_session_create(engine, &sp, &chat[i]) != CELLM_OK) rc = 1;

    for (int t = 0; t < 2 && !rc; t++) {
        static answer answers[2];
        cellm_request *req[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            answers[i].len = 0;
            answers[i].text[0] = '\0';
            cellm_request_params p = cellm_session_request_params(chat[i]);
            p.on_piece = on_piece;
            p.user = &answers[i];
            if (cellm_session_send(chat[i], questions[i][t], &p, &req[i]) != CELLM_OK) {
                rc = 1;
                break;
            }
        }
        for (int i = 0; i < 2 && req[i]; i++) {
            cellm_result res;
            cellm_wait(req[i], &res);
            printf("> %s\n%s\n(%d prompt tokens, %d of them kept from earlier turns; %d "
                   "completion tokens; first token after %.0f ms)\n\n",
                   questions[i][t], answers[i].text, res.n_prompt_tokens, res.n_cached_tokens,
                   res.n_completion_tokens, res.first_token_ms);
            cellm_request_free(req[i]);
        }
    }
    if (rc) fprintf(stderr, "cellm: %s\n", cellm_last_error());

    cellm_stats st;
    cellm_engine_stats(engine, &st);
    printf("engine: %llu steps, %.1f MiB in use, %d KV blocks kept by %d sessions\n",
           (unsigned long long)st.n_steps, (double)st.bytes_in_use / (1 << 20), st.blocks_kept,
           st.n_sessions_kept);
    /* Told that memory runs low, the engine gives back what it can spare. */
    size_t released = 0;
    cellm_engine_trim(engine, CELLM_TRIM_MODERATE, &released);
    printf("trimmed: %.1f MiB given back to the OS\n", (double)released / (1 << 20));
    for (int i = 0; i < 2; i++) cellm_session_free(chat[i]);
    cellm_engine_free(engine);
    cellm_model_free(model);
    return rc;
}
