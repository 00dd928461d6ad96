/*
 * spec.c — speculative decoding in the engine: before each step, every
 * running request that decodes guesses up to k tokens ahead; the step
 * feeds the guesses after the request's pending token, so one pass of the
 * model gives the logits of every guessed position; the engine then
 * samples position by position as a plain run would (engine.c,
 * step_outputs) and keeps guesses while they equal what it drew.
 *
 * Why the text is exactly the plain run's. The forward pass is
 * batch-invariant: a row's logits depend on its sequence's tokens and not
 * on the rows beside it, so the logits at a guessed position whose guesses
 * before it were all kept are those a plain step would compute there. The
 * sampler draws each position in the state the plain run would have there
 * (the same PRNG stream, one draw per token, the same penalty window),
 * because it only ever sees kept tokens. So a seeded sampled run gives the
 * same text as well as a greedy one. What the guesses cost is only the
 * rows of rejected ones; the KV they wrote is taken back (kv_seq_truncate;
 * windowed groups keep `slack` positions beyond their window for that).
 *
 * Where guesses come from:
 *  - prompt lookup (lookup_ngram N): the tokens that followed the latest
 *    earlier occurrence of the last n tokens, n = N .. 2 (1 for N = 1);
 *  - a draft model: a second, smaller model with the same vocabulary,
 *    greedy, with its own paged KV pool (no prefix cache) in the engine's
 *    budget. Each step it first catches up with the tokens it has not
 *    seen (a new request's prompt, the last step's kept tokens), batched
 *    over all drafting requests, then runs one batched pass per further
 *    guess; a request stops guessing when the draft gives its own choice
 *    less than draft_p_min probability.
 * The draft's gate (spec_gate_want): a draft pass costs a good part of
 * a pass of the model, so unless draft_always the engine compares what a
 * generated token has cost lately in steps with the draft's passes and
 * without (a drafted step that guessed nothing tells the latter too), one
 * comparison per count of decoding requests, and drafts only while that
 * pays, trying a losing draft again after 16, 32, ... 256 steps. The
 * clock picks the steps, so not under the resample rule, whose guesses
 * decide its text.
 * With both, lookup goes first and the draft fills in where it finds no
 * match. A step's guesses share spec_step_rows rows with the decoding
 * requests' pending tokens (default 1 + draft_max), in queue order: on a
 * CPU a pass over many rows is compute-bound, and many sessions decoding
 * at once already fill it. Each request adapts its k: it grows while every guess is kept and
 * falls back to one more than were kept when one is not.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul.h"
#include "model/kv_calib.h"
#include "runtime/engine.h"

int32_t spec_lookup(const int32_t *tok, int32_t n_tok, int32_t ngram_max, int32_t k, int32_t *out) {
    if (k <= 0) return 0;
    /* A lone matching token is a poor guide: the token after it was right
     * 10-15% of the time on the bench's editing, summary and prose tasks,
     * where two matching tokens gave 25-40%, three 55-80% and four 67-99%
     * (docs/benchmarks.md, "Prompt lookup from two tokens up"), while a
     * wrong guess makes a one-row pass cost what four rows do. So 1-grams
     * only with ngram_max 1. */
    const int32_t n_min = ngram_max >= 2 ? 2 : 1;
    for (int32_t n = ngram_max < n_tok ? ngram_max : n_tok - 1; n >= n_min; n--) {
        const int32_t *pat = tok + n_tok - n;
        /* The latest earlier occurrence: it starts at or before n_tok - n - 1,
         * so at least one token follows it. */
        for (int32_t i = n_tok - n - 1; i >= 0; i--) {
            if (tok[i] != pat[0] || memcmp(tok + i, pat, (size_t)n * sizeof *tok) != 0) continue;
            int32_t from = i + n, m = n_tok - from;
            if (m > k) m = k;
            memcpy(out, tok + from, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

const char *spec_check(const cellm_model *cm, const cellm_engine_params *p, char *msg, size_t cap) {
    const cellm_model *dm = p->draft_model;
    bool on = dm || p->lookup_ngram > 0;
    if (p->lookup_ngram < 0 || p->lookup_ngram > 64) return "lookup_ngram must be 0..64";
    if (on && (p->draft_max < 1 || p->draft_max > 64)) return "draft_max must be 1..64";
    if (on && (p->draft_min < 0 || p->draft_min > p->draft_max))
        return "draft_min must be 0..draft_max";
    if (!(p->draft_p_min >= 0 && p->draft_p_min <= 1)) return "draft_p_min must be 0..1";
    if (p->spec_step_rows < 0 || p->spec_step_rows > 65536)
        return "spec_step_rows must be 0..65536";
    if (p->spec_accept != CELLM_SPEC_ACCEPT_EXACT && p->spec_accept != CELLM_SPEC_ACCEPT_RESAMPLE)
        return "spec_accept must be CELLM_SPEC_ACCEPT_EXACT or CELLM_SPEC_ACCEPT_RESAMPLE";
    if (!dm) return NULL;
    const model *m = cm->m, *d = dm->m;
    if (dm == cm) {
        snprintf(msg, cap,
                 "the draft model is the model itself: it would guess right every time "
                 "and save nothing; load a smaller file");
        return msg;
    }
    if (strcmp(m->arch, d->arch) != 0) {
        snprintf(msg, cap,
                 "the draft model's architecture family is %s and the model's is %s: a draft "
                 "must be of the same family",
                 d->arch, m->arch);
        return msg;
    }
    const tokenizer *tm = cm->tok, *td = dm->tok;
    if (tokenizer_n_vocab(tm) != tokenizer_n_vocab(td) || m->n_vocab != d->n_vocab) {
        snprintf(msg, cap,
                 "the draft model's vocabulary has %d tokens and the model's %d: a draft must "
                 "have the same vocabulary",
                 tokenizer_n_vocab(td), tokenizer_n_vocab(tm));
        return msg;
    }
    for (int32_t i = 0; i < tokenizer_n_vocab(tm); i++) {
        size_t la, lb;
        const char *a = tokenizer_token_text(tm, i, &la), *b = tokenizer_token_text(td, i, &lb);
        if (la != lb || memcmp(a, b, la) != 0 ||
            tokenizer_token_type(tm, i) != tokenizer_token_type(td, i)) {
            snprintf(msg, cap,
                     "the draft model's vocabulary differs from the model's at token %d "
                     "(\"%.*s\" against \"%.*s\"): a draft must have the same vocabulary",
                     i, (int)(lb > 40 ? 40 : lb), b, (int)(la > 40 ? 40 : la), a);
            return msg;
        }
    }
    if (tokenizer_bos(tm) != tokenizer_bos(td) || tokenizer_eos(tm) != tokenizer_eos(td)) {
        snprintf(msg, cap,
                 "the draft model's BOS/EOS tokens (%d/%d) differ from the model's (%d/%d)",
                 tokenizer_bos(td), tokenizer_eos(td), tokenizer_bos(tm), tokenizer_eos(tm));
        return msg;
    }
    return NULL;
}

static bool spec_on(const cellm_engine_params *p) {
    return p->draft_model || p->lookup_ngram > 0;
}

int32_t spec_logit_rows(const cellm_engine_params *p) {
    int64_t rows = (int64_t)p->max_seqs * (spec_on(p) ? 1 + p->draft_max : 1);
    return rows < p->max_batch_tokens ? (int32_t)rows : p->max_batch_tokens;
}

size_t spec_draft_act_bytes(const cellm_engine_params *p) {
    if (!p->draft_model) return 0;
    return forward_bytes(p->draft_model->m, p->max_batch_tokens, p->max_seqs, p->n_threads,
                         p->max_ctx) +
           (size_t)p->max_batch_tokens * sizeof(fwd_row) +
           (size_t)p->max_seqs * (sizeof(cellm_request *) + sizeof(int32_t));
}

size_t spec_draft_kv_bytes(const cellm_engine_params *p) {
    if (!p->draft_model) return 0;
    return kv_cache_bytes(p->draft_model->m, p->kv_type, p->max_ctx, p->max_seqs,
                          p->max_batch_tokens + p->draft_max + 1);
}

cellm_status spec_create(cellm_engine *e, size_t kv_bytes, cellm_error *err) {
    const cellm_engine_params *p = &e->p;
    e->spec_on = spec_on(p);
    if (!p->draft_model) return CELLM_OK;
    const model *d = p->draft_model->m;
    cellm_status st;
    if ((st = kv_type_check(d, p->kv_type, err))) return st;
    if ((st = kv_cache_create(d, kv_bytes, p->max_ctx, p->max_seqs,
                              p->max_batch_tokens + p->draft_max + 1, p->kv_type, &e->dkv, err)))
        return st;
    kv_cache_set_prefix(e->dkv, false);
    e->dkv->seq_slack = p->draft_max + 1;
    e->drows = malloc((size_t)p->max_batch_tokens * sizeof *e->drows);
    e->dreq = malloc((size_t)p->max_seqs * sizeof *e->dreq);
    e->dfirst = malloc((size_t)p->max_seqs * sizeof *e->dfirst);
    if (!e->drows || !e->dreq || !e->dfirst)
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for the draft model's batch");
    if ((st = device_backend(p->device, 0, d, e->dkv, e->tp, p->max_batch_tokens, p->max_seqs,
                             &e->dfwd, err)))
        return st;
    return kv_calibrate(e->dkv, d, p->draft_model->tok, &e->dfwd, p->max_batch_tokens, err);
}

void spec_destroy(cellm_engine *e) {
    backend_free(&e->dfwd);
    kv_cache_free(e->dkv);
    free(e->drows);
    free(e->dreq);
    free(e->dfirst);
}

void spec_drop(cellm_engine *e, cellm_request *r) {
    if (r->has_dseq) {
        kv_seq_free(e->dkv, &r->dseq);
        r->has_dseq = false;
    }
    r->sched.n_draft = 0;
}

size_t spec_trim(cellm_engine *e) {
    if (!e->dkv) return 0;
    for (int32_t i = 0; i < e->sched.n_running; i++) spec_drop(e, req_of(e->sched.running[i]));
    return kv_cache_release_free(e->dkv);
}

void spec_after(cellm_engine *e, cellm_request *r) {
    r->sched.n_draft = 0;
    if (!r->has_dseq) return;
    /* Positions before the pending token hold kept tokens; the draft's KV
     * from the pending token's position on is of guesses. */
    int32_t valid = r->sched.n_tokens - 1;
    if (r->dseq.n_pos > valid && !kv_seq_truncate(e->dkv, &r->dseq, valid))
        kv_seq_reset(e->dkv, &r->dseq);
}

int32_t spec_draft_pick(const float *row, int32_t n, float p_min, float *prob) {
    int32_t best = sampler_argmax(row, n);
    *prob = 1;
    if (p_min <= 0) return best;
    float mx = row[best];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)(row[i] - mx));
    *prob = (float)(1.0 / sum);
    return best;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double spec_uniform(uint64_t seed, int32_t pos, int32_t stream) {
    uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull);
    z = mix64(z ^ ((uint64_t)(uint32_t)pos * 4u + (uint64_t)(uint32_t)stream));
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t spec_draft_sample(const float *row, int32_t n, const sampler_params *sp, double u,
                          sampler_dist *q, float *prob) {
    /* The best m logits, best first (ties: the lower id), by insertion:
     * most tokens fall below the m-th and cost one comparison. */
    int32_t m = sp->top_k > 0 && sp->top_k < SAMPLER_DIST_MAX ? sp->top_k : SAMPLER_DIST_MAX;
    if (m > n) m = n;
    float val[SAMPLER_DIST_MAX];
    int32_t c = 0;
    for (int32_t t = 0; t < n; t++) {
        float x = row[t];
        if (!(x > -INFINITY)) continue;
        if (c == m && !(x > val[c - 1])) continue;
        int32_t i = c < m ? c++ : c - 1;
        while (i > 0 && x > val[i - 1]) {
            val[i] = val[i - 1];
            q->ids[i] = q->ids[i - 1];
            i--;
        }
        val[i] = x;
        q->ids[i] = t;
    }
    if (c == 0 || !(val[0] < INFINITY)) { /* nothing to weigh: the argmax alone */
        q->n = 1;
        q->ids[0] = sampler_argmax(row, n);
        q->p[0] = 1;
        *prob = 1;
        return q->ids[0];
    }
    /* Temperature, then top-p and min-p over these, renormalised. */
    double w[SAMPLER_DIST_MAX], z = 0;
    for (int32_t i = 0; i < c; i++) z += w[i] = exp((double)(val[i] - val[0]) / sp->temperature);
    int32_t keep = c;
    if (sp->top_p < 1) {
        double acc = 0;
        for (int32_t i = 0; i < c; i++)
            if ((acc += w[i]) >= sp->top_p * z) {
                keep = i + 1;
                break;
            }
    }
    if (sp->min_p > 0)
        for (int32_t i = 1; i < keep; i++)
            if (w[i] < sp->min_p) {
                keep = i;
                break;
            }
    z = 0;
    for (int32_t i = 0; i < keep; i++) z += w[i];
    double x = u * z, acc = 0;
    int32_t pick = keep - 1;
    for (int32_t i = 0; i < keep; i++)
        if (x < (acc += w[i])) {
            pick = i;
            break;
        }
    q->n = keep;
    for (int32_t i = 0; i < keep; i++) q->p[i] = (float)(w[i] / z);
    *prob = q->p[pick];
    return q->ids[pick];
}

/* The resample rule's streams of random numbers. */
enum { U_DRAFT, U_ACCEPT, U_DRAW };

int32_t spec_sample(sampler *smp, const float *row, int32_t pos, int32_t guess,
                    const sampler_dist *q) {
    uint64_t seed = sampler_get_params(smp)->seed;
    double ua = spec_uniform(seed, pos, U_ACCEPT), ud = spec_uniform(seed, pos, U_DRAW);
    if (!q) return sampler_sample_spec(smp, row, -1, NULL, NULL, 0, ua, ud);
    return sampler_sample_spec(smp, row, guess, q->ids, q->p, q->n, ua, ud);
}

int32_t spec_draft_guess(const float *row, int32_t n, const sampler_params *sp, int32_t pos,
                         sampler_dist *q, float *prob) {
    return spec_draft_sample(row, n, sp, spec_uniform(sp->seed, pos, U_DRAFT), q, prob);
}

/* Guess j of r (at tokens[n_tokens + j]) from a row of the draft's
 * logits: greedy, or under the resample rule drawn from the draft's
 * distribution; *prob as spec_draft_pick's. */
static int32_t draft_guess(const cellm_engine *e, cellm_request *r, const float *row, int32_t j,
                           float *prob) {
    int32_t n_vocab = e->p.draft_model->m->n_vocab;
    if (!r->spec_q) return spec_draft_pick(row, n_vocab, e->p.draft_p_min, prob);
    return spec_draft_guess(row, n_vocab, sampler_get_params(r->smp), r->sched.n_tokens + j,
                            &r->spec_q[j], prob);
}

int32_t spec_next_k(int32_t k, int32_t n_guess, int32_t kept, int32_t draft_max) {
    if (kept == n_guess && n_guess == k) return k + 2 < draft_max ? k + 2 : draft_max;
    return kept + 1;
}

/* How many of k guesses r may make this step: k bounded by its token
 * array, the context, max_tokens and the batch. */
static int32_t room_for(const cellm_engine *e, const cellm_request *r, int32_t k) {
    int32_t lim = r->cap - r->sched.n_tokens;
    if (lim < k) k = lim;
    /* Rows at positions n_tokens - 1 .. n_tokens - 1 + k. */
    lim = e->kv->max_ctx - r->sched.n_tokens;
    if (lim < k) k = lim;
    if (r->max_tokens >= 0) {
        /* The last token is not guessed. */
        lim = r->max_tokens - (r->sched.n_tokens - r->n_prompt) - 1;
        if (lim < k) k = lim;
    }
    lim = e->p.max_batch_tokens - 1;
    if (lim < k) k = lim;
    return k > 0 ? k : 0;
}

/* Whether the draft pool has the blocks for n more positions of every
 * planned request, given `taken` already promised this step. */
static bool draft_fits(const cellm_engine *e, const kv_seq *s, int32_t n, int32_t *taken) {
    for (int32_t g = 0; g < e->dkv->n_groups; g++)
        if (kv_seq_need(e->dkv, s, g, n) > e->dkv->groups[g].n_free - taken[g]) return false;
    for (int32_t g = 0; g < e->dkv->n_groups; g++) taken[g] += kv_seq_need(e->dkv, s, g, n);
    return true;
}

/* The draft model's passes for the requests in e->dreq[0..n): catch up,
 * then one pass per further guess. */
static void draft_run(cellm_engine *e, int32_t n) {
    cellm_error err;
    const float *logits = NULL;
    int32_t n_vocab = e->p.draft_model->m->n_vocab;
    int32_t budget = e->p.max_batch_tokens, n_rows = 0, taken[2] = {0, 0};
    int32_t n_act = 0;
    /* Pass 0: what each has not seen yet; those that see it all get logits. */
    for (int32_t i = 0; i < n; i++) {
        cellm_request *r = e->dreq[i];
        int32_t from = r->dseq.n_pos, want = r->sched.n_tokens - from;
        int32_t feed = want < budget - n_rows ? want : budget - n_rows;
        bool whole = feed == want;
        /* Whole: room for the catch-up and the guesses fed after it. */
        if (feed <= 0 || !draft_fits(e, &r->dseq, whole ? want + r->spec_room - 1 : feed, taken)) {
            e->dfirst[i] = -1;
            continue;
        }
        for (int32_t j = 0; j < feed; j++)
            e->drows[n_rows++] =
                (fwd_row){&r->dseq, r->tokens[from + j], from + j, whole && j == feed - 1};
        e->dfirst[i] = whole ? n_act++ : -1;
    }
    if (n_rows == 0) return;
    err_clear(&err);
    if (backend_run(&e->dfwd, e->drows, n_rows, &logits, &err) != CELLM_OK) goto fail;
    e->n_draft_steps++;
    int32_t li = 0;
    n_act = 0;
    for (int32_t i = 0; i < n; i++) {
        if (e->dfirst[i] < 0) continue;
        cellm_request *r = e->dreq[i];
        float p;
        int32_t t = draft_guess(e, r, logits + (size_t)li++ * (size_t)n_vocab, 0, &p);
        if (p < e->p.draft_p_min) continue;
        r->tokens[r->sched.n_tokens] = t;
        r->sched.n_draft = 1;
        if (r->sched.n_draft < r->spec_room) e->dreq[n_act++] = r;
    }
    /* Further passes: one row per request still guessing. */
    while (n_act > 0) {
        for (int32_t i = 0; i < n_act; i++) {
            cellm_request *r = e->dreq[i];
            int32_t pos = r->sched.n_tokens + r->sched.n_draft - 1;
            e->drows[i] = (fwd_row){&r->dseq, r->tokens[pos], pos, true};
        }
        err_clear(&err);
        if (backend_run(&e->dfwd, e->drows, n_act, &logits, &err) != CELLM_OK) goto fail;
        e->n_draft_steps++;
        int32_t m = 0;
        for (int32_t i = 0; i < n_act; i++) {
            cellm_request *r = e->dreq[i];
            float p;
            int32_t t =
                draft_guess(e, r, logits + (size_t)i * (size_t)n_vocab, r->sched.n_draft, &p);
            if (p < e->p.draft_p_min) continue;
            r->tokens[r->sched.n_tokens + r->sched.n_draft++] = t;
            if (r->sched.n_draft < r->spec_room) e->dreq[m++] = r;
        }
        n_act = m;
    }
    return;
fail:
    /* The blocks were counted, so this is a bug; guesses are only a
     * speed-up: drop them and the draft's KV, and decode plainly. */
    for (int32_t i = 0; i < e->sched.n_running; i++) spec_drop(e, req_of(e->sched.running[i]));
}

/* A moving average over about the last four samples: the costs move with
 * the text (how often the draft is right) and with the context. */
static void gate_add(spec_gate *g, int i, double x) {
    g->ms[i] = g->n[i] == 0 ? x : g->ms[i] + 0.25 * (x - g->ms[i]);
    if (g->n[i] < INT32_MAX) g->n[i]++;
}

bool spec_gate_want(spec_gate *g) {
    bool d;
    if (g->n[1] < SPEC_GATE_WARM) {
        d = true; /* the draft's first steps, or a trial's */
    } else if (g->n[0] < SPEC_GATE_WARM) {
        d = false; /* the drafted steps did not tell what a plain one costs */
    } else if (g->ms[1] < g->ms[0]) {
        g->period = 0;
        g->off = false;
        d = true;
    } else if (!g->off) {
        /* It stopped paying, or a trial lost: wait, longer each time. */
        int32_t w = g->period > 0 ? g->period : SPEC_GATE_WAIT;
        g->wait = w;
        g->period = w < SPEC_GATE_WAIT_MAX / 2 ? 2 * w : SPEC_GATE_WAIT_MAX;
        g->off = true;
        d = false;
    } else if (g->wait > 0) {
        g->wait--;
        d = false;
    } else {
        g->n[1] = 0; /* a trial: its samples replace the draft's average */
        g->off = false;
        d = true;
    }
    g->cold = d && !g->last;
    g->last = d;
    return d;
}

void spec_gate_note(spec_gate *g, bool drafted, double ms, double plain_ms, int32_t tokens) {
    if (tokens > 0 && ms >= 0) {
        /* The first drafted step after plain ones also feeds the draft
         * the tokens it missed: a cost of switching, not of drafting. */
        if (drafted && !g->cold) gate_add(g, 1, ms / tokens);
        if (!drafted) gate_add(g, 0, ms / tokens);
        if (drafted && plain_ms >= 0) gate_add(g, 0, plain_ms / tokens);
    }
    g->cold = false;
}

/* What a step costs on the CPU goes up in steps: the matmul fills a
 * remainder of rows up to a tile (matmul_padded_rows), so those rows cost
 * no more, while a row alone past a tile (the 9th) takes a vec_dot of its
 * own and filling it up would cost more (docs/benchmarks.md, "Speculative
 * decoding, quiet machine"). */
int32_t spec_fill_k(int32_t used, int32_t k, int32_t cap) {
    int32_t end = (int32_t)matmul_padded_rows(true, true, used + k);
    if (end - used > k) k = end - used < cap ? end - used : cap;
    return k;
}

void spec_propose(cellm_engine *e) {
    if (!e->spec_on) return;
    /* The step's rows for guesses: what spec_step_rows leaves after every
     * decoding request's pending token. */
    int32_t rows = e->p.spec_step_rows > 0 ? e->p.spec_step_rows : 1 + e->p.draft_max;
    int32_t used = 0; /* rows of the step so far: pending tokens, then guesses */
    for (int32_t i = 0; i < e->sched.n_running; i++)
        used += e->sched.running[i]->seq->n_pos == e->sched.running[i]->n_tokens - 1;
    rows -= used;
    /* A draft pass costs a good part of a step whatever it guesses, so a
     * step whose rows for guesses are fewer than its decoding rows (many
     * sessions at once: with the default spec_step_rows, 8 decoding leave
     * one) does not run the draft: it could at best add a few tokens to
     * many. Lookup's guesses cost no pass and still go in. */
    const bool drafting = e->dkv && rows >= used;
    /* The gate of this count of decoding requests, asked when a request
     * would draft (0: not asked, 1: draft, -1: not this step). */
    const int32_t n_dec = used;
    e->gate_at = n_dec < SPEC_GATE_N ? n_dec - 1 : SPEC_GATE_N - 1;
    e->gate_asked = e->gate_drafted = false;
    int gate = e->p.draft_always ? 1 : 0;
    int32_t n_cand = 0;
    for (int32_t i = 0; i < e->sched.n_running; i++) {
        cellm_request *r = req_of(e->sched.running[i]);
        r->sched.n_draft = 0;
        if (r->seq.n_pos != r->sched.n_tokens - 1) continue; /* not decoding */
        /* With pictures the prompt holds pseudo tokens (engine_image.c):
         * neither lookup nor a draft model can guess from it. */
        if (r->img_at) continue;
        /* Its adaptive k, and what it could take at most. */
        int32_t k = room_for(e, r, r->spec_k > 0 ? r->spec_k : e->p.draft_max);
        int32_t room = room_for(e, r, e->p.draft_max);
        /* Under the resample rule the guesses decide the text: they must
         * not depend on the other requests. */
        if (!r->spec_q) {
            if (k > rows) k = rows;
            if (room > rows) room = rows;
        }
        if (k < 1 || k < e->p.draft_min) continue;
        if (e->p.lookup_ngram > 0) {
            /* Guesses from the text cost no pass of their own, only rows:
             * up to the end of the tile they fall in, those cost nothing
             * more either. */
            int32_t kl = r->spec_q ? k : spec_fill_k(used, k, room);
            int32_t n = spec_lookup(r->tokens, r->sched.n_tokens, e->p.lookup_ngram, kl,
                                    r->tokens + r->sched.n_tokens);
            if (n >= e->p.draft_min && n > 0) {
                r->sched.n_draft = n;
                rows -= n;
                used += n;
                /* A guess from earlier text is certain to its source: q
                 * is all on it. */
                for (int32_t j = 0; r->spec_q && j < n; j++)
                    r->spec_q[j] = (sampler_dist){1, {r->tokens[r->sched.n_tokens + j]}, {1.0f}};
                continue;
            }
        }
        if (!drafting || e->gate_at < 0) continue;
        /* Under the resample rule the guesses decide the text: it drafts
         * whatever the gate says, which goes by the clock. */
        if (gate == 0 && !r->spec_q) {
            e->gate_asked = true;
            gate = spec_gate_want(&e->gate[e->gate_at]) ? 1 : -1;
        }
        if (gate < 0 && !r->spec_q) continue;
        if (!r->has_dseq) {
            if (kv_seq_init(e->dkv, &r->dseq, NULL) != CELLM_OK) continue;
            r->has_dseq = true;
        }
        r->spec_room = k;
        rows -= k;
        used += k;
        e->dreq[n_cand++] = r;
    }
    e->gate_draft_ms = 0;
    if (n_cand > 0) {
        double t0 = engine_now_s();
        draft_run(e, n_cand);
        e->gate_draft_ms = (engine_now_s() - t0) * 1e3;
        e->gate_drafted = true;
    }
    e->gate_rows = 0;
    for (int32_t i = 0; i < e->sched.n_running; i++) {
        cellm_request *r = req_of(e->sched.running[i]);
        if (r->sched.n_draft < e->p.draft_min) r->sched.n_draft = 0;
        e->gate_rows += r->sched.n_draft;
    }
    e->gate_guesses = e->gate_rows;
    e->gate_rows += n_dec;
}

void spec_step_done(cellm_engine *e, int32_t n_rows, int32_t n_prompt_rows, double target_ms,
                    int32_t tokens) {
    /* Only steps of decoding requests alone, as planned, compare. */
    if (!(e->gate_asked || e->gate_drafted) || e->gate_at < 0 || n_prompt_rows > 0 ||
        n_rows != e->gate_rows)
        return;
    /* (gate_draft_ms is 0 where the draft did not run) */
    spec_gate_note(&e->gate[e->gate_at], e->gate_drafted, target_ms + e->gate_draft_ms,
                   e->gate_drafted && e->gate_guesses == 0 ? target_ms : -1, tokens);
}
