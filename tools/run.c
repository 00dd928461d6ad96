/*
 * run.c — `cellm run [MODEL]`: chat with a model in the terminal (line
 * editing and history through libedit), or answer one prompt with -p. The
 * default model is fetched on first use. Tokens stream as they are made.
 *
 * A chat samples with llama.cpp's and Ollama's defaults (temperature 0.8,
 * top-k 40, top-p 0.95, min-p 0.05) or what the model file recommends,
 * from a fixed seed, so a run repeats itself; --raw and --temp 0 are
 * greedy. Flags always win.
 *
 * Each turn renders the whole conversation in the model's chat format and
 * feeds only what the KV cache does not already hold, so earlier turns are
 * not recomputed. When the conversation outgrows the context, the oldest
 * turns are dropped.
 *
 * With --draft or --lookup, each pass of the model also checks guesses of
 * the next tokens (speculative decoding, rt.h): the same text, in fewer
 * passes when the guesses are good.
 */
#include <editline/readline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <math.h>

#include "cli.h"
#include "runtime/engine.h" /* spec_sample */
#include "text/grammar.h"
#include "image_file.h"
#include "rt.h"
#include "run.h"
#include "runtime/sampler.h"
#include "text/schema.h"
#include "text/stop.h"

#define RUN_DEFAULT_MODEL "smollm2-135m"
#define MAX_MSGS 256

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct chat {
    rt r;
    chat_tpl tpl;
    sampler *smp;
    size_t window;       /* the sampler's penalty window */
    stop_matcher *stops; /* reverse prompts; NULL without */
    kv_seq seq;
    tok_ids hist; /* tokens in the KV cache, in order */
    chat_msg msgs[MAX_MSGS];
    int n_msgs;
    int32_t max_tokens;
    bool raw, verbose, ignore_eos;
    float *logits;
    rt_spec spec; /* guesses checked in each pass (on with a draft or lookup) */
    /* --grammar-file / --json-schema: every answer follows the grammar. */
    grammar *gram;
    grammar_vocab *gv;
    grammar_state *gst; /* the answer's; made anew for each */
    float *masked;
    /* speed, for --verbose */
    double t_prompt, t_gen;
    long n_prompt, n_gen;
} chat;

static void usage(FILE *out) {
    fprintf(out,
            "usage: cellm run [MODEL] [options]\n\n"
            "Chats with MODEL (a GGUF path or a model store name; default %s, fetched on first\n"
            "use). Type a message and press Enter; /reset starts over, /exit (or Ctrl-D) quits.\n\n"
            "  -p, --prompt TEXT     answer TEXT once and exit\n"
            "  -sys, --system-prompt TEXT   system prompt (also --system)\n"
            "  --mmproj FILE --image PATH   answer -p TEXT about a PNG or JPEG picture, with\n"
            "                        the model's projector (a SmolVLM mmproj GGUF file)\n"
            "  -n, --n-predict N     at most N tokens per answer; -1: no limit (default 1024)\n"
            "  -c, --ctx-size N      context length (default: the model's, at most 4096)\n"
            "  --kv-type T           KV cache type: " CLI_KV_TYPES
            " (default f16)\n" CLI_DEVICE_USAGE
            "  -t, --threads N       threads (default: cores, at most 4)\n"
            "  --chat-template NAME  the chat format: the model's own Jinja template by default;\n"
            "                        chatml, gemma or llama3 for a built-in one, or a Jinja text\n"
            "  --chat-template-file FILE   a Jinja chat template from FILE\n"
            "  --raw                 no chat format: continue the prompt as plain text (greedy\n"
            "                        unless sampling flags say otherwise)\n"
            "  --ignore-eos          keep generating past end-of-text (for benchmarks)\n"
            "  --grammar-file FILE   answers follow the GBNF grammar in FILE (docs/grammar.md)\n"
            "  --json-schema S       answers are JSON valid against the schema S: JSON text, or\n"
            "                        a file holding it\n"
            "  -v, --verbose         print the sampling settings, prompt and generation "
            "speed,\n"
            "                        and how many guesses were kept\n\n" RT_SPEC_USAGE
            "\n" RT_SAMPLING_USAGE,
            RUN_DEFAULT_MODEL);
}

/* Drops the KV cache's tail past the first `keep` tokens of hist (from the
 * start when a windowed layer has already let go of what it would need). */
static void rewind_to(chat *c, size_t keep) {
    if (keep == c->hist.n) return;
    if (kv_seq_truncate(c->r.kv, &c->seq, (int32_t)keep)) {
        c->hist.n = keep;
    } else {
        kv_seq_reset(c->r.kv, &c->seq);
        c->hist.n = 0;
    }
    rt_spec_rewind(&c->spec, (int32_t)c->hist.n); /* the draft holds a prefix of hist */
}

/* Feeds the prompt's tokens (taking them over); returns false (with a
 * message) when they cannot fit the context. */
static bool feed_prompt(chat *c, tok_ids ids, cellm_error *err) {
    size_t same = 0;
    while (same < ids.n && same < c->hist.n && ids.ids[same] == c->hist.ids[same]) same++;
    if (same == ids.n && same > 0) same--; /* always feed at least one token for logits */
    rewind_to(c, same);
    if (c->hist.n != same) same = 0;
    if ((long)ids.n >= c->r.ctx) { /* a prompt of ctx - 1 still gets its one token */
        err_set(err, CELLM_ERR_NO_MEMORY, "the prompt (%zu tokens) does not fit the context (%d)",
                ids.n, c->r.ctx);
        tok_ids_free(&ids);
        return false;
    }
    double t0 = now_s();
    cellm_status st =
        rt_feed(&c->r, &c->seq, ids.ids + same, (int32_t)(ids.n - same), c->logits, err);
    c->t_prompt += now_s() - t0;
    c->n_prompt += (long)(ids.n - same);
    if (st) {
        tok_ids_free(&ids);
        return false;
    }
    tok_ids_free(&c->hist);
    c->hist = ids;
    return true;
}

/* The answer so far: what was shown. */
typedef struct text_buf {
    char *p;
    size_t n, cap;
} text_buf;

/* Prints a piece of the answer and keeps it; false when out of memory. */
static bool show(text_buf *b, const char *piece, size_t n) {
    if (!n) return true;
    fwrite(piece, 1, n, stdout);
    fflush(stdout);
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, piece, n);
    b->n += n;
    b->p[b->n] = '\0';
    return true;
}

/* Shows decoded text through the reverse prompts; true once one matched. */
static bool pass_on(chat *c, text_buf *b, const char *piece, size_t n) {
    if (!c->stops) return !show(b, piece, n);
    const char *out;
    size_t out_n = 0;
    bool stopped = false;
    if (stop_feed(c->stops, piece, n, &out, &out_n, &stopped, NULL) != CELLM_OK) return true;
    return !show(b, out, out_n) || stopped;
}

/* An answer being made: its text so far and how it ended. */
typedef struct reply {
    tok_stream ts;
    char *piece; /* tok_stream output, cap bytes */
    size_t cap;
    text_buf out;
    int32_t n;    /* tokens taken */
    bool stopped; /* a reverse prompt matched */
} reply;

/* Takes t, just sampled, as the answer's next token: the sampler records
 * it and its text is shown. False when the answer ends here: at an
 * end-of-text token (not taken), a reverse prompt, the token limit, or a
 * context with no room for t. */
static bool is_end(const chat *c, int32_t t) {
    if (c->ignore_eos) return false;
    return c->raw ? t == tokenizer_eos(c->r.tok) : chat_is_stop(&c->tpl, c->r.tok, t);
}

/* With a grammar: whether it allows t now (an end token where the text is
 * whole). */
static bool grammar_allows(chat *c, int32_t t) {
    if (is_end(c, t)) return grammar_state_complete(c->gst);
    size_t len = 0;
    const char *p = tokenizer_piece(c->r.tok, t, 0, &len);
    return p && grammar_state_allows(c->gst, p, len);
}

/* The next token from `row`: drawn from the whole distribution, and drawn
 * again from what the grammar allows when it refuses that one (as the
 * engine does, src/runtime/engine.c). */
static int32_t draw(chat *c, const float *row, int32_t guess, const sampler_dist *q) {
    /* The resample rule: the token at position hist.n against the guess
     * made there (spec.c). */
    if (c->spec.sp) return spec_sample(c->smp, row, (int32_t)c->hist.n, guess, q);
    int32_t t = sampler_sample(c->smp, row);
    if (!c->gst || grammar_allows(c, t)) return t;
    int32_t n = c->r.m->n_vocab;
    const uint32_t *bits = grammar_state_mask(c->gst);
    for (int32_t i = 0; i < n; i++)
        c->masked[i] = (bits[i >> 5] >> (i & 31)) & 1 ? row[i] : -INFINITY;
    bool whole = grammar_state_complete(c->gst);
    for (int32_t i = 0; i < n; i++)
        if (is_end(c, i)) c->masked[i] = whole ? row[i] : -INFINITY;
    return sampler_sample(c->smp, c->masked);
}

static bool take(chat *c, reply *a, int32_t t, cellm_error *err) {
    if (is_end(c, t)) return false;
    if (c->gst) {
        size_t len = 0;
        const char *p = tokenizer_piece(c->r.tok, t, 0, &len);
        if (!p || !grammar_state_accept(c->gst, p, len)) {
            err_set(err, CELLM_ERR_FORMAT, "grammar: no token can continue the answer");
            return false;
        }
    }
    sampler_accept(c->smp, t, NULL);
    size_t n = 0;
    if (tok_stream_push(&a->ts, t, a->piece, a->cap, &n, err) != CELLM_OK) return false;
    c->n_gen++;
    a->n++;
    a->stopped = pass_on(c, &a->out, a->piece, n);
    /* t would go at position hist.n, leaving room for one more. */
    return !a->stopped && (long)c->hist.n + 1 < c->r.ctx &&
           (c->max_tokens < 0 || a->n < c->max_tokens);
}

/* The KV cache back to hist after a pass that fed guesses: what the
 * rejected ones wrote goes. */
static bool drop_guesses(chat *c, cellm_error *err) {
    int32_t keep = (int32_t)c->hist.n;
    if (c->seq.n_pos <= keep || kv_seq_truncate(c->r.kv, &c->seq, keep)) return true;
    /* The slack keeps what a truncation needs; should it not, recompute. */
    kv_seq_reset(c->r.kv, &c->seq);
    return rt_feed(&c->r, &c->seq, c->hist.ids, keep, NULL, err) == CELLM_OK;
}

/* Feeds the pending token t (hist's last) and guesses of what follows it
 * in one pass; *row is then t's logits, followed by each guess's. Returns
 * the number of guesses (0: t alone), or -1 on an error. */
static int32_t feed_pending(chat *c, int32_t t, const reply *a, int32_t *guess, const float **row,
                            cellm_error *err) {
    int32_t room = c->r.ctx - 1 - (int32_t)c->hist.n; /* as take() leaves room */
    if (c->max_tokens >= 0 && c->max_tokens - a->n - 1 < room)
        room = c->max_tokens - a->n - 1; /* the last token is not guessed */
    int32_t n = rt_spec_propose(&c->spec, c->hist.ids, (int32_t)c->hist.n, room, guess + 1);
    if (n == 0) {
        if (rt_feed(&c->r, &c->seq, &t, 1, c->logits, err) != CELLM_OK) return -1;
        *row = c->logits;
        return 0;
    }
    guess[0] = t;
    if (rt_feed_all(&c->r, &c->seq, guess, n + 1, row, err) != CELLM_OK) return -1;
    return n;
}

/* Generates an answer after the prompt already fed; streams it to stdout
 * and returns it (malloc'd). With speculation, each pass of the model
 * also checks guesses of the tokens that follow: sampling goes row by row
 * as without them, and a row is used only while the guesses before it
 * were what was drawn, so the text is the same. */
static char *generate(chat *c, cellm_error *err) {
    reply a = {.cap = tok_stream_bound(c->r.tok) + 1};
    tok_stream_init(&a.ts, c->r.tok, 0);
    a.piece = malloc(a.cap);
    a.out = (text_buf){calloc(1, 1), 0, 1};
    if (!a.piece || !a.out.p) {
        free(a.piece);
        free(a.out.p);
        err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    if (c->stops) stop_reset(c->stops);
    if (c->gram) {
        grammar_state_free(c->gst);
        c->gst = NULL;
        if (grammar_state_create(c->gram, c->gv, &c->gst, err) != CELLM_OK) {
            free(a.piece);
            free(a.out.p);
            return NULL;
        }
    }
    /* The penalty window: the conversation's last tokens. */
    sampler_reset_history(c->smp);
    for (size_t i = c->hist.n > c->window ? c->hist.n - c->window : 0; i < c->hist.n; i++)
        sampler_accept(c->smp, c->hist.ids[i], NULL);
    double t0 = now_s();
    const float *row = c->logits; /* the logits to sample the next token from */
    /* The pending token and the guesses fed after it in the last pass
     * (guess[1 .. n_guess]); kept: those drawn so far. */
    int32_t guess[RT_SPEC_MAX + 1], n_guess = 0, kept = 0;
    while (c->max_tokens != 0) {
        int32_t t = kept < n_guess ? draw(c, row, guess[kept + 1], &c->spec.q[kept])
                                   : draw(c, row, -1, NULL);
        if (!take(c, &a, t, err)) break;
        if (kept < n_guess && t == guess[kept + 1]) {
            /* Guessed: its KV is in, and its logits are the next row. */
            if (!tok_ids_push(&c->hist, t)) break;
            kept++;
            row += c->r.m->n_vocab;
            continue;
        }
        if (n_guess > 0) {
            rt_spec_done(&c->spec, n_guess, kept, (int32_t)c->hist.n);
            n_guess = kept = 0;
            if (!drop_guesses(c, err)) break;
        }
        if (!tok_ids_push(&c->hist, t)) break;
        n_guess = feed_pending(c, t, &a, guess, &row, err);
        if (n_guess < 0) {
            n_guess = 0;
            c->hist.n--; /* hist is what the KV cache holds */
            break;
        }
    }
    if (n_guess > 0) {
        rt_spec_done(&c->spec, n_guess, kept, (int32_t)c->hist.n);
        drop_guesses(c, err);
    }
    rt_spec_rewind(&c->spec, (int32_t)c->hist.n);
    rt_spec_pause(&c->spec);
    size_t n = 0;
    bool stopped = a.stopped;
    if (!stopped && tok_stream_flush(&a.ts, a.piece, a.cap, &n, err) == CELLM_OK)
        stopped = pass_on(c, &a.out, a.piece, n);
    if (!stopped && c->stops) {
        const char *tail;
        stop_flush(c->stops, &tail, &n);
        show(&a.out, tail, n);
    }
    c->t_gen += now_s() - t0;
    fputc('\n', stdout);
    fflush(stdout);
    free(a.piece);
    return a.out.p;
}

static void free_msgs(chat *c, int from) {
    for (int i = from; i < c->n_msgs; i++) free((char *)c->msgs[i].content);
    c->n_msgs = from;
}

/* One user turn: add the message, render, feed, generate, keep the answer. */
static bool turn(chat *c, const char *user, cellm_error *err) {
    if (c->raw) {
        tok_ids ids = {0};
        if (tokenizer_encode(c->r.tok, user, strlen(user), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL,
                             &ids, err) != CELLM_OK) {
            tok_ids_free(&ids);
            return false;
        }
        if (!feed_prompt(c, ids, err)) return false;
        free(generate(c, err));
        return true;
    }
    if (c->n_msgs + 2 > MAX_MSGS) free_msgs(c, c->msgs[0].role[0] == 's' ? 1 : 0);
    c->msgs[c->n_msgs++] = (chat_msg){"user", strdup(user)};
    for (;;) {
        tok_ids ids = {0};
        if (chat_encode(&c->tpl, c->r.tok, c->msgs, c->n_msgs, true, &ids, err) != CELLM_OK) {
            tok_ids_free(&ids);
            c->n_msgs--; /* the turn did not happen */
            free((char *)c->msgs[c->n_msgs].content);
            return false;
        }
        if (feed_prompt(c, ids, err)) break;
        /* Too long: drop the oldest exchange (keeping a system message). */
        int first = c->msgs[0].role[0] == 's' ? 1 : 0;
        if (c->n_msgs - first <= 1) return false;
        free((char *)c->msgs[first].content);
        memmove(&c->msgs[first], &c->msgs[first + 1],
                sizeof(chat_msg) * (size_t)(c->n_msgs - first - 1));
        c->n_msgs--;
    }
    char *answer = generate(c, err);
    if (!answer) return false;
    c->msgs[c->n_msgs++] = (chat_msg){"assistant", answer};
    return true;
}

/* One answer about a picture: the projector encodes it, the template
 * places its tokens, their rows enter the prompt's batch. */
static bool image_turn(chat *c, const char *mmproj, const char *path, const char *text,
                       const char *system, int threads, cellm_error *err) {
    cellm_mmproj_params mp = cellm_mmproj_default_params();
    if (threads > 0) mp.n_threads = threads;
    cellm_mmproj *mm = NULL;
    cellm_image_embed *e = NULL;
    uint8_t *rgb = NULL;
    char *itext = NULL;
    tok_ids ids = {0}, one = {0};
    int32_t w, h;
    bool ok = false;
    if (cellm_mmproj_load(mmproj, c->r.cm, &mp, &mm)) {
        err_set(err, CELLM_ERR_INVALID_ARG, "%s", cellm_last_error());
        goto done;
    }
    if (image_file_read(path, &rgb, &w, &h, err)) goto done;
    double t0 = now_s();
    if (cellm_image_encode(mm, rgb, w, h, &e) || cellm_image_prompt(e, &itext)) {
        err_set(err, CELLM_ERR_INVALID_ARG, "%s: %s", path, cellm_last_error());
        goto done;
    }
    if (c->verbose)
        fprintf(stderr,
                "image: %dx%d, %d frames (%dx%d tiles + 1), %d tokens, encoded in %.0f ms\n",
                (int)w, (int)h, (int)e->n_frames, (int)e->rows, (int)e->cols, (int)e->n_tokens,
                (now_s() - t0) * 1e3);
    if (tokenizer_encode(c->r.tok, "<image>", 7, TOK_PARSE_SPECIAL, &one, err)) goto done;
    if (one.n != 1) {
        err_set(err, CELLM_ERR_UNSUPPORTED, "the model has no <image> token: not a vision model");
        goto done;
    }
    if (chat_encode_image(&c->tpl, c->r.tok, system, text, itext, &ids, err)) goto done;
    if ((long)ids.n >= c->r.ctx) {
        err_set(err, CELLM_ERR_NO_MEMORY, "the prompt (%zu tokens) does not fit the context (%d)",
                ids.n, c->r.ctx);
        goto done;
    }
    t0 = now_s();
    if (rt_feed_image(&c->r, &c->seq, ids.ids, (int32_t)ids.n, one.ids[0], e->embd, e->n_tokens,
                      c->logits, err))
        goto done;
    c->t_prompt += now_s() - t0;
    c->n_prompt += (long)ids.n;
    tok_ids_free(&c->hist);
    c->hist = ids;
    ids = (tok_ids){0};
    char *answer = generate(c, err);
    ok = answer != NULL;
    free(answer);
done:
    tok_ids_free(&ids);
    tok_ids_free(&one);
    free(itext);
    cellm_image_embed_free(e);
    free(rgb);
    cellm_mmproj_free(mm);
    return ok;
}

static void print_speed(const chat *c) {
    fprintf(stderr, "prompt: %ld tokens, %.1f tokens/s; generation: %ld tokens, %.1f tokens/s\n",
            c->n_prompt, c->t_prompt > 0 ? c->n_prompt / c->t_prompt : 0.0, c->n_gen,
            c->t_gen > 0 ? c->n_gen / c->t_gen : 0.0);
    if (c->spec.on) rt_spec_print(&c->spec, stderr);
}

static int repl(chat *c) {
    bool tty = isatty(0) && isatty(1);
    if (tty)
        fprintf(stderr, "cellm: chatting with %s (%s). /reset starts over, /exit quits.\n",
                c->r.m->arch, tokenizer_model_name(c->r.tok));
    char *line;
    size_t cap = 0;
    char *buf = NULL;
    for (;;) {
        if (tty) {
            line = readline("> ");
            if (!line) break;
            if (*line) add_history(line);
        } else {
            ssize_t n = getline(&buf, &cap, stdin);
            if (n < 0) break;
            if (n && buf[n - 1] == '\n') buf[n - 1] = '\0';
            line = strdup(buf);
        }
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) {
            free(line);
            break;
        }
        if (!strcmp(line, "/reset")) {
            free_msgs(c, c->n_msgs && !strcmp(c->msgs[0].role, "system") ? 1 : 0);
            kv_seq_reset(c->r.kv, &c->seq);
            c->hist.n = 0;
            rt_spec_rewind(&c->spec, 0);
            fprintf(stderr, "(conversation cleared)\n");
        } else if (*line) {
            cellm_error err;
            err_clear(&err);
            if (!turn(c, line, &err)) cli_error("%s", err.msg[0] ? err.msg : "generation failed");
            if (c->verbose) print_speed(c);
        }
        free(line);
    }
    free(buf);
    return 0;
}

/* The prefix tree of the model's token bytes, for the grammar. */
static cellm_status grammar_vocab_for(const tokenizer *tok, grammar_vocab **out, cellm_error *err) {
    int32_t n = tokenizer_n_vocab(tok);
    const char **pieces = malloc(sizeof(char *) * (size_t)n);
    size_t *lens = malloc(sizeof(size_t) * (size_t)n);
    cellm_status st = CELLM_ERR_NO_MEMORY;
    if (pieces && lens) {
        for (int32_t t = 0; t < n; t++) {
            pieces[t] = tokenizer_piece(tok, t, 0, &lens[t]);
            if (!pieces[t]) lens[t] = 0;
        }
        st = grammar_vocab_create(pieces, lens, n, out, err);
    } else {
        err_set(err, st, "out of memory");
    }
    free(pieces);
    free(lens);
    return st;
}

/* --grammar-file FILE or --json-schema (JSON text or a file of it) into a
 * compiled grammar; 0, or 2 with the reason printed. */
static int load_grammar(const char *file, const char *schema, grammar **out) {
    if (file && schema) {
        cli_error("run: give --grammar-file or --json-schema, not both");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    bool inline_json = schema && (schema[0] == '{' || !strcmp(schema, "true"));
    if (inline_json) {
        len = strlen(schema);
    } else {
        text = cli_read_file(file ? file : schema, &len);
        if (!text) {
            cli_error("run: cannot read '%s'", file ? file : schema);
            return 2;
        }
    }
    cellm_error err;
    err_clear(&err);
    char *gbnf = NULL;
    size_t n = 0;
    cellm_status st = CELLM_OK;
    if (schema) {
        st = schema_to_gbnf(inline_json ? schema : text, len, &gbnf, &n, &err);
        free(text);
        text = gbnf;
        len = n;
    }
    if (st == CELLM_OK) st = grammar_parse(text, len, out, &err);
    free(text);
    if (st != CELLM_OK) {
        cli_error("run: %s", err.msg);
        return 2;
    }
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *model_name = NULL, *prompt = NULL, *system = NULL, *tpl = NULL, *tpl_file = NULL;
    const char *grammar_file = NULL, *json_schema = NULL, *mmproj = NULL, *image = NULL;
    rt_opts o = {0};
    long gpu_layers = -1;
    static rt_sampling rs; /* its bias table is 8 KiB */
    rt_sampling_init(&rs);
    rt_spec_opts so;
    rt_spec_opts_init(&so);
    chat c;
    memset(&c, 0, sizeof c);
    c.max_tokens = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long u;
#define NEED_ARG()                                                                                 \
    do {                                                                                           \
        if (!v) {                                                                                  \
            cli_error("run: %s needs a value", a);                                                 \
            return 2;                                                                              \
        }                                                                                          \
        i++;                                                                                       \
    } while (0)
#define UINT_ARG(dst, max)                                                                         \
    do {                                                                                           \
        NEED_ARG();                                                                                \
        if (!cli_parse_uint(v, (max), &u)) {                                                       \
            cli_error("run: %s needs a whole number up to %llu", a, (unsigned long long)(max));    \
            return 2;                                                                              \
        }                                                                                          \
        dst = u;                                                                                   \
    } while (0)
        int taken = rt_sampling_flag(&rs, argc, argv, &i, "run");
        if (!taken) taken = rt_spec_flag(&so, argc, argv, &i, "run");
        if (taken < 0) return 2;
        if (taken > 0) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            NEED_ARG();
            prompt = v;
        } else if (!strcmp(a, "-sys") || !strcmp(a, "--system-prompt") || !strcmp(a, "--system")) {
            NEED_ARG();
            system = v;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--n-predict")) && v && !strcmp(v, "-1")) {
            c.max_tokens = -1;
            i++;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            UINT_ARG(c.max_tokens, 1u << 24);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            UINT_ARG(o.ctx, 1u << 20);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            UINT_ARG(o.threads, 256);
        } else if (!strcmp(a, "--kv-type")) {
            NEED_ARG();
            if (!cli_parse_kv_type(v, &o.kv_type)) {
                cli_error("run: --kv-type needs one of " CLI_KV_TYPES);
                return 2;
            }
        } else if (!strcmp(a, "--device")) {
            NEED_ARG();
            if (!cli_parse_device(v, &o.device)) {
                cli_error("run: --device needs one of " CLI_DEVICES);
                return 2;
            }
        } else if (cli_is_gpu_layers(a)) {
            NEED_ARG();
            if (!cli_parse_gpu_layers(v, &gpu_layers)) {
                cli_error("run: %s needs a count of layers", a);
                return 2;
            }
        } else if (!strcmp(a, "--chat-template")) {
            NEED_ARG();
            tpl = v;
        } else if (!strcmp(a, "--chat-template-file")) {
            NEED_ARG();
            tpl_file = v;
        } else if (!strcmp(a, "--grammar-file")) {
            NEED_ARG();
            grammar_file = v;
        } else if (!strcmp(a, "--json-schema")) {
            NEED_ARG();
            json_schema = v;
        } else if (!strcmp(a, "--mmproj")) {
            NEED_ARG();
            mmproj = v;
        } else if (!strcmp(a, "--image")) {
            NEED_ARG();
            image = v;
        } else if (!strcmp(a, "--raw")) {
            c.raw = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            c.ignore_eos = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            c.verbose = true;
        } else if (a[0] == '-') {
            cli_error("run: unknown option '%s' (see `cellm run --help`)", a);
            return 2;
        } else if (!model_name) {
            model_name = a;
        } else {
            cli_error("run: more than one model given ('%s', '%s')", model_name, a);
            return 2;
        }
    }
    if (!model_name) model_name = RUN_DEFAULT_MODEL;
    if (so.draft_min > so.draft_max) {
        cli_error("run: --draft-min (%d) must not exceed --draft-max (%d)", (int)so.draft_min,
                  (int)so.draft_max);
        return 2;
    }
    if ((image || mmproj) && (!image || !mmproj || !prompt || c.raw)) {
        cli_error("run: --image needs --mmproj FILE (the model's projector) and -p TEXT, "
                  "without --raw");
        return 2;
    }
    rt_spec_target_opts(&so, &o);
    char *tpl_text = NULL;
    if (tpl_file) {
        size_t len;
        if (tpl) {
            cli_error("run: give --chat-template or --chat-template-file, not both");
            return 2;
        }
        tpl_text = cli_read_file(tpl_file, &len);
        if (!tpl_text || strlen(tpl_text) != len ||
            !(strstr(tpl_text, "{{") || strstr(tpl_text, "{%"))) {
            cli_error("run: cannot read a Jinja template from '%s'", tpl_file);
            free(tpl_text);
            return 2;
        }
        tpl = tpl_text;
    }
    cellm_error err;
    err_clear(&err);
    int rc = 1;
    if (grammar_file || json_schema) {
        if (load_grammar(grammar_file, json_schema, &c.gram) != 0) {
            free(tpl_text);
            return 2;
        }
    }
    cli_apply_gpu_layers(gpu_layers, &o.device, &o.gpu_layers);
    if (rt_open(model_name, &o, &c.r, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        free(tpl_text);
        return 1;
    }
    if (rt_spec_open(&c.spec, &so, &c.r, &o, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        rt_close(&c.r);
        free(tpl_text);
        return 1;
    }
    /* A chat samples (docs/sampling.md); --raw stays greedy unless told. */
    if (!c.raw) rt_sampling_chat_defaults(&rs, c.r.m->file, stderr);
    if (c.verbose) rt_sampling_print(&rs, stderr);
    sampler_params sp = rt_sampler_params(&rs, c.r.ctx);
    c.window = (size_t)sp.penalty_last_n;
    bool sampled = sp.temperature > 0 && sp.top_k != 1;
    if ((!c.raw && chat_tpl_init(c.r.m, c.r.tok, tpl, &c.tpl, &err) != CELLM_OK) ||
        sampler_create(&sp, c.r.m->n_vocab, &c.smp, &err) != CELLM_OK ||
        (rs.n_stop > 0 && (stop_create(rs.stop, (size_t)rs.n_stop, &c.stops, &err) != CELLM_OK ||
                           stop_reserve(c.stops, tok_stream_bound(c.r.tok) + 1, &err))) ||
        kv_seq_init(c.r.kv, &c.seq, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        goto done;
    }
    if (so.accept == CELLM_SPEC_ACCEPT_RESAMPLE && sampled && !c.gram)
        c.spec.sp = sampler_get_params(c.smp);
    c.logits = malloc(sizeof(float) * (size_t)c.r.m->n_vocab);
    if (c.gram) {
        c.masked = malloc(sizeof(float) * (size_t)c.r.m->n_vocab);
        if (!c.masked || grammar_vocab_for(c.r.tok, &c.gv, &err) != CELLM_OK) {
            cli_error("%s", err.msg[0] ? err.msg : "out of memory");
            goto done;
        }
    }
    if (!c.logits) {
        cli_error("out of memory");
        goto done;
    }
    if (system) c.msgs[c.n_msgs++] = (chat_msg){"system", strdup(system)};
    if (image) {
        rc = image_turn(&c, mmproj, image, prompt, system, o.threads, &err) ? 0 : 1;
        if (rc) cli_error("%s", err.msg);
        if (c.verbose) print_speed(&c);
    } else if (prompt) {
        rc = turn(&c, prompt, &err) ? 0 : 1;
        if (rc) cli_error("%s", err.msg);
        if (c.verbose) print_speed(&c);
    } else {
        rc = repl(&c);
    }
done:
    free_msgs(&c, 0);
    chat_tpl_free(&c.tpl);
    free(c.logits);
    free(c.masked);
    grammar_state_free(c.gst);
    grammar_vocab_free(c.gv);
    grammar_free(c.gram);
    tok_ids_free(&c.hist);
    if (c.seq.table[0]) kv_seq_free(c.r.kv, &c.seq);
    sampler_free(c.smp);
    stop_free(c.stops);
    rt_spec_close(&c.spec); /* it shares the model's threads */
    rt_close(&c.r);
    free(tpl_text);
    return rc;
}
