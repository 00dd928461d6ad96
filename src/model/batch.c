/*
 * batch.c — the checks and KV bookkeeping around a forward pass, shared by
 * the backends (see batch.h).
 */
#include "model/batch.h"

cellm_status batch_reserve(const model *m, kv_cache *kv, const fwd_row *rows, int32_t n,
                           int32_t max_rows, int32_t max_logit_rows, cellm_error *err) {
    if (n < 1 || n > max_rows)
        return err_set(err, CELLM_ERR_INVALID_ARG, "batch of %d rows (limit %d)", n, max_rows);
    int32_t n_logits = 0;
    for (int32_t r = 0; r < n; r++) {
        if (!rows[r].seq) return err_set(err, CELLM_ERR_INVALID_ARG, "row %d has no sequence", r);
        if (rows[r].token < 0 || rows[r].token >= m->n_vocab)
            return err_set(err, CELLM_ERR_INVALID_ARG, "row %d: token %d is not in 0..%d", r,
                           rows[r].token, m->n_vocab - 1);
        n_logits += rows[r].logits;
    }
    if (n_logits > max_logit_rows)
        return err_set(err, CELLM_ERR_INVALID_ARG, "%d rows want logits (limit %d)", n_logits,
                       max_logit_rows);
    /* Each sequence's rows must continue it in order: row positions are
     * n_pos, n_pos + 1, ... in batch order. Count them per sequence using
     * n_pos as a cursor, then reserve and rewind. */
    cellm_status st = CELLM_OK;
    int32_t r = 0;
    for (; r < n; r++) {
        kv_seq *s = rows[r].seq;
        if (rows[r].pos != s->n_pos) {
            st = err_set(err, CELLM_ERR_INVALID_ARG,
                         "row %d: position %d does not continue its sequence (next is %d)", r,
                         rows[r].pos, s->n_pos);
            break;
        }
        if ((st = kv_seq_reserve(kv, s, 1, err))) break;
        s->n_pos++;
    }
    /* Rewind the cursors; blocks reserved stay with their sequences. */
    for (int32_t i = r - 1; i >= 0; i--) rows[i].seq->n_pos--;
    return st;
}

void batch_advance(kv_cache *kv, const fwd_row *rows, int32_t n) {
    for (int32_t r = 0; r < n; r++) rows[r].seq->n_pos = rows[r].pos + 1;
    for (int32_t r = 0; r < n; r++) kv_seq_trim(kv, rows[r].seq);
}
