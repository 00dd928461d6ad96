/*
 * engine_image.c — pictures in engine requests (cellm_request_params.images).
 *
 * At submit a request copies its pictures' rows (cellm_image_encode's
 * embeddings) and notes, for each prompt position, which row is its input.
 * The image token's id alone cannot key the prefix cache (every picture's
 * rows carry it), so each image position holds a pseudo token in the
 * request's tokens instead: a negative id (no vocabulary id is negative)
 * from a hash of the picture's embeddings and the row's index. The
 * scheduler, the KV's prefix index and kv_seq.tokens see only those, so
 * the same picture at the same place after the same text finds its
 * blocks, and another picture does not. Before each pass the engine turns
 * the batch's pseudo tokens back into the image token and points the
 * backend at the rows (backend_run_embd); a preempted request recomputes
 * from the same copies.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"

/* A hash of a picture's embeddings (their bits) and shape. */
static uint64_t image_hash(const cellm_image_embed *im) {
    uint64_t h = 0xcbf29ce484222325ull ^ ((uint64_t)(uint32_t)im->n_tokens << 32) ^
                 (uint64_t)(uint32_t)im->n_embd;
    size_t n = (size_t)im->n_tokens * (size_t)im->n_embd;
    for (size_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, &im->embd[i], sizeof w);
        h = (h ^ w) * 0x100000001b3ull;
    }
    return h;
}

/* splitmix64's finaliser: spreads a picture's hash and a row index. */
static uint64_t mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Row j of a picture of hash h as a pseudo token: -2^31 .. -1. */
static int32_t pseudo_token(uint64_t h, int32_t j) {
    uint64_t x = mix64(h + (uint64_t)(uint32_t)j * 0x9e3779b97f4a7c15ull);
    return -(int32_t)((x >> 33) & 0x7fffffff) - 1;
}

/* The checks of p's pictures that need no prompt. */
static cellm_status check_images(const cellm_engine *e, const cellm_request_params *p,
                                 int64_t *rows, cellm_error *err) {
    if (p->n_images < 0 || p->n_images > CELLM_MAX_IMAGES || !p->images)
        return err_set(err, CELLM_ERR_INVALID_ARG, "n_images must be 0..%d, with images when not 0",
                       CELLM_MAX_IMAGES);
    int32_t d = e->model->m->n_embd;
    *rows = 0;
    for (int32_t i = 0; i < p->n_images; i++) {
        const cellm_image_embed *im = p->images[i];
        if (!im || !im->embd || im->n_tokens < 1)
            return err_set(err, CELLM_ERR_INVALID_ARG, "image %d is not an encoded picture",
                           (int)i);
        if (im->n_embd != d)
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "image %d has rows of width %d, but the model's are %d wide: its "
                           "projector belongs to another model",
                           (int)i, (int)im->n_embd, (int)d);
        *rows += im->n_tokens;
        if (*rows > CELLM_MAX_IMAGE_ROWS)
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "the images have more than %d rows together (the most a request takes)",
                           CELLM_MAX_IMAGE_ROWS);
    }
    return CELLM_OK;
}

cellm_status engine_image_chat(const cellm_engine *e, const cellm_request_params *p,
                               const chat_msg *msgs, tok_ids *ids, cellm_error *err) {
    int64_t rows;
    if (check_images(e, p, &rows, err)) return err->code;
    char **text = calloc((size_t)p->n_images, sizeof *text);
    if (!text) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    cellm_status st = CELLM_OK;
    for (int32_t i = 0; i < p->n_images && !st; i++)
        if (cellm_image_prompt(p->images[i], &text[i]))
            st = err_set(err, CELLM_ERR_INVALID_ARG, "image %d: %s", (int)i, cellm_last_error());
    if (!st)
        st = chat_encode_images(&e->model->chat, e->model->tok, msgs, p->n_messages, true,
                                (const char *const *)text, p->n_images, ids, err);
    for (int32_t i = 0; i < p->n_images; i++) free(text[i]);
    free(text);
    return st;
}

int32_t engine_image_token(const cellm_model *cm) {
    tok_ids one = {0};
    cellm_error err;
    err_clear(&err);
    int32_t id = -1;
    if (tokenizer_encode(cm->tok, "<image>", 7, TOK_PARSE_SPECIAL, &one, &err) == CELLM_OK &&
        one.n == 1)
        id = one.ids[0];
    tok_ids_free(&one);
    return id;
}

/* Takes `bytes` of the engine's room for pictures, or says why not. */
static cellm_status reserve(cellm_engine *e, size_t bytes, cellm_error *err) {
    const size_t kib = 1024;
    if (bytes > e->img_cap)
        return err_set(err, CELLM_ERR_NO_MEMORY,
                       "the pictures' rows need %zu KiB, more than the engine keeps for pictures "
                       "(%zu KiB: image_budget_bytes)",
                       (bytes + kib - 1) / kib, e->img_cap / kib);
    size_t held = atomic_load(&e->img_held);
    do {
        if (held > e->img_cap - bytes)
            return err_set(err, CELLM_ERR_NO_MEMORY,
                           "the pictures' rows need %zu KiB, but other requests' pictures hold "
                           "%zu of the %zu KiB the engine keeps for them: submit again when one "
                           "of those requests ends",
                           (bytes + kib - 1) / kib, (held + kib - 1) / kib, e->img_cap / kib);
    } while (!atomic_compare_exchange_weak(&e->img_held, &held, held + bytes));
    return CELLM_OK;
}

void engine_image_drop(cellm_engine *e, cellm_request *r) {
    if (r->img_bytes) atomic_fetch_sub(&e->img_held, r->img_bytes);
    r->img_bytes = 0;
    free(r->img_embd);
    r->img_embd = NULL;
}

cellm_status engine_image_attach(cellm_engine *e, cellm_request *r, const cellm_request_params *p,
                                 cellm_error *err) {
    if (p->n_images == 0) return CELLM_OK; /* images may be anything then */
    const cellm_model *cm = e->model;
    int32_t d = cm->m->n_embd;
    int64_t rows;
    if (check_images(e, p, &rows, err)) return err->code;
    r->image_token = e->image_token;
    if (r->image_token < 0)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "the model has no <image> token: it takes no pictures");
    int32_t n_img = 0;
    for (int32_t i = 0; i < r->n_prompt; i++) n_img += r->tokens[i] == r->image_token;
    if (n_img != rows)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "the prompt has %d image tokens, but the images have %lld rows", (int)n_img,
                       (long long)rows);
    size_t bytes = (size_t)rows * (size_t)d * sizeof *r->img_embd;
    if (reserve(e, bytes, err)) return err->code;
    r->img_bytes = bytes;
    r->img_at = malloc((size_t)r->n_prompt * sizeof *r->img_at);
    r->img_embd = malloc(bytes);
    if (!r->img_at || !r->img_embd)
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for the images' rows");
    int32_t next = 0, img = 0, j = 0; /* the next row, its picture and its index there */
    uint64_t h = image_hash(p->images[0]);
    for (int32_t i = 0; i < p->n_images; i++) {
        const cellm_image_embed *im = p->images[i];
        memcpy(r->img_embd + (size_t)next * (size_t)d, im->embd,
               (size_t)im->n_tokens * (size_t)d * sizeof *r->img_embd);
        next += im->n_tokens;
    }
    next = 0;
    for (int32_t pos = 0; pos < r->n_prompt; pos++) {
        if (r->tokens[pos] != r->image_token) {
            r->img_at[pos] = -1;
            continue;
        }
        if (j == p->images[img]->n_tokens) {
            img++;
            j = 0;
            h = image_hash(p->images[img]);
        }
        r->img_at[pos] = next++;
        r->tokens[pos] = pseudo_token(h, j++);
    }
    return CELLM_OK;
}

bool engine_image_rows(cellm_engine *e) {
    bool any = false;
    int32_t row = 0, d = e->model->m->n_embd;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        const cellm_request *r = req_of(e->sched.fed[i]);
        int32_t n = r->sched.plan_n;
        for (int32_t k = 0; k < n; k++, row++) {
            fwd_row *fr = &e->sched.rows[row];
            int32_t at = r->img_at && fr->pos < r->n_prompt ? r->img_at[fr->pos] : -1;
            e->embd_rows[row] = at < 0 ? NULL : r->img_embd + (size_t)at * (size_t)d;
            if (at >= 0) {
                fr->token = r->image_token;
                any = true;
            }
        }
    }
    return any;
}
