/*
 * bench_spec.c — `cellm bench --draft MODEL` / `--lookup N`: speculative
 * decoding against plain decoding, side by side in one run.
 *
 * Workloads (--spec-task), eight chat prompts each, greedy:
 *  - prose: open-ended stories and explanations, where only a draft
 *    model can guess (the answer repeats little of its prompt);
 *  - edit: "rewrite this function with the names changed" with a
 *    ~40-line function in the prompt, which the answer mostly copies;
 *  - summary: a ~400-token document to summarise.
 * For each task, two engines on the same model, one plain and one
 * speculative, each first take every prompt once with max_tokens 1 (which
 * puts the prompts in their prefix caches and the weights in memory);
 * then for each session count the rounds: all eight prompts, `sessions`
 * at a time, on one engine and then the other, the order alternating
 * from round to round. What a round measures is generation: tokens after each request's
 * first over the decode time of each group of concurrent requests (from
 * the group's first first token to its last finish; the prompt was
 * cached, so little prefill falls in it). The speed-up is each round's
 * speculative over plain tokens/s, its median and range over the rounds;
 * the acceptance rate, tokens per checking pass and draft passes per
 * token come from the speculative engine's statistics over the measured
 * rounds. Every speculative completion is compared token for token with
 * the plain one of its round: they must be identical. --spec-temp T
 * samples instead (top-k 40, top-p 0.95, min-p 0.05, a seed per prompt);
 * with --spec-accept resample the speculative text is not the plain one,
 * so each round's must equal the first round's instead.
 */
#include "bench_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

#define SPEC_PROMPTS 8
#define SPEC_MAX_REPS 100

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ workloads */

static const char *const prose[SPEC_PROMPTS] = {
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold.",
    "Describe a walk through a forest in autumn.",
    "Explain to a ten-year-old why the sky is blue.",
    "Write a story about a robot who learns to paint.",
    "Explain how vaccines teach the immune system to fight a disease.",
    "Tell the story of a small dragon who is afraid of fire.",
    "Explain what a compiler does, step by step.",
};

static const char py_func[] =
    "def summarize_orders(orders, tax_rate, discount_codes):\n"
    "    \"\"\"Totals a list of orders and reports them by customer.\"\"\"\n"
    "    totals = {}\n"
    "    counts = {}\n"
    "    skipped = []\n"
    "    for order in orders:\n"
    "        customer = order.get(\"customer\")\n"
    "        if not customer:\n"
    "            skipped.append(order)\n"
    "            continue\n"
    "        amount = 0.0\n"
    "        for item in order.get(\"items\", []):\n"
    "            price = item[\"price\"]\n"
    "            quantity = item.get(\"quantity\", 1)\n"
    "            amount += price * quantity\n"
    "        code = order.get(\"discount\")\n"
    "        if code in discount_codes:\n"
    "            amount -= amount * discount_codes[code]\n"
    "        amount += amount * tax_rate\n"
    "        totals[customer] = totals.get(customer, 0.0) + amount\n"
    "        counts[customer] = counts.get(customer, 0) + 1\n"
    "    report = []\n"
    "    for customer in sorted(totals):\n"
    "        average = totals[customer] / counts[customer]\n"
    "        report.append({\n"
    "            \"customer\": customer,\n"
    "            \"orders\": counts[customer],\n"
    "            \"total\": round(totals[customer], 2),\n"
    "            \"average\": round(average, 2),\n"
    "        })\n"
    "    report.sort(key=lambda row: row[\"total\"], reverse=True)\n"
    "    grand_total = sum(row[\"total\"] for row in report)\n"
    "    return {\n"
    "        \"rows\": report,\n"
    "        \"grand_total\": round(grand_total, 2),\n"
    "        \"skipped\": len(skipped),\n"
    "    }\n";

static const char c_func[] =
    "static int parse_config(const char *text, struct config *cfg, char *err, size_t cap) {\n"
    "    int line_no = 0;\n"
    "    const char *line = text;\n"
    "    while (*line) {\n"
    "        const char *end = strchr(line, '\\n');\n"
    "        size_t len = end ? (size_t)(end - line) : strlen(line);\n"
    "        line_no++;\n"
    "        if (len == 0 || line[0] == '#') {\n"
    "            line = end ? end + 1 : line + len;\n"
    "            continue;\n"
    "        }\n"
    "        const char *eq = memchr(line, '=', len);\n"
    "        if (!eq) {\n"
    "            snprintf(err, cap, \"line %d: expected key=value\", line_no);\n"
    "            return -1;\n"
    "        }\n"
    "        size_t key_len = (size_t)(eq - line);\n"
    "        const char *value = eq + 1;\n"
    "        size_t value_len = len - key_len - 1;\n"
    "        if (key_len == 7 && !memcmp(line, \"threads\", 7)) {\n"
    "            cfg->threads = atoi(value);\n"
    "        } else if (key_len == 4 && !memcmp(line, \"port\", 4)) {\n"
    "            cfg->port = atoi(value);\n"
    "        } else if (key_len == 4 && !memcmp(line, \"host\", 4)) {\n"
    "            if (value_len >= sizeof cfg->host) {\n"
    "                snprintf(err, cap, \"line %d: host too long\", line_no);\n"
    "                return -1;\n"
    "            }\n"
    "            memcpy(cfg->host, value, value_len);\n"
    "            cfg->host[value_len] = '\\0';\n"
    "        } else {\n"
    "            snprintf(err, cap, \"line %d: unknown key\", line_no);\n"
    "            return -1;\n"
    "        }\n"
    "        line = end ? end + 1 : line + len;\n"
    "    }\n"
    "    return 0;\n"
    "}\n";

/* Four renamings of each function; prompt i edits function i / 4. */
static const char *const edits[SPEC_PROMPTS] = {
    "Rewrite this function with the names changed: orders to purchases, totals to sums, "
    "counts to tallies. Change nothing else and output the whole function.",
    "Rewrite this function, renaming summarize_orders to build_customer_report and customer "
    "to client everywhere. Keep the rest exactly as it is.",
    "Rewrite this function with shorter names: amount to amt, quantity to qty, average to "
    "avg. Output the whole function.",
    "Rewrite this function with the names in camelCase: tax_rate to taxRate, discount_codes "
    "to discountCodes, grand_total to grandTotal. Output the whole function.",
    "Rewrite this function with the names changed: parse_config to load_settings, cfg to "
    "settings, line_no to line_number. Change nothing else and output the whole function.",
    "Rewrite this function, renaming text to input and err to message everywhere. Keep the "
    "rest exactly as it is.",
    "Rewrite this function with longer names: eq to equals_sign, len to line_length, cap to "
    "message_capacity. Output the whole function.",
    "Rewrite this function with the names in camelCase: line_no to lineNo, key_len to keyLen, "
    "value_len to valueLen. Output the whole function.",
};

static const char doc_bikes[] =
    "In March the town council of Millbrook opened the first section of its new cycle "
    "network, a four-kilometre protected lane along River Street that links the railway "
    "station with the hospital, the secondary school and the market square. The lane is "
    "separated from traffic by a low concrete kerb and a row of planters, and at each of "
    "the nine junctions cyclists get their own traffic light that turns green four seconds "
    "before the one for cars. The project cost 2.3 million euros, of which the national "
    "government paid sixty percent. Counting stations installed at both ends show that an "
    "average of 1,850 bicycles used the lane each weekday in its first two months, against "
    "about 600 on the old painted lane it replaced. The busiest hours are between seven and "
    "nine in the morning, when most riders are commuters and pupils. Local shops were "
    "worried that removing forty parking spaces would cost them customers, but a survey by "
    "the chamber of commerce found that footfall in the market square rose by eight percent "
    "over the same period, and two new cafes have opened on River Street. Not everyone is "
    "pleased: taxi drivers complain that the narrower road makes it hard to stop, and some "
    "residents say delivery vans now block the side streets. Police figures show no serious "
    "collisions on the new lane so far, against five on River Street in the year before it "
    "opened. Cycling groups have asked for secure parking at the station, where the racks "
    "fill up before eight o'clock, and the council says two hundred more spaces will be "
    "added in the autumn. The council has promised "
    "loading bays at three places along the route by the end of the year. The second "
    "section, which will continue the lane north to the university campus, is due to open "
    "next spring, and the council is studying a third one towards the industrial estate. "
    "The mayor said the numbers showed that people cycle when they feel safe, and that the "
    "town would publish the counts every month so that residents can judge the scheme for "
    "themselves.";

static const char doc_bees[] =
    "Honeybees tell each other where to find food with a movement known as the waggle "
    "dance. When a forager returns to the hive from a rich patch of flowers, she climbs "
    "onto the vertical surface of the comb and runs in a straight line while shaking her "
    "abdomen from side to side, then circles back to the start and repeats the run, turning "
    "alternately left and right. The angle of the straight run relative to vertical tells "
    "the other bees the direction of the food relative to the sun: a run straight up means "
    "fly towards the sun, a run straight down means fly away from it, and a run at forty "
    "degrees to the right of vertical means fly forty degrees to the right of the sun. The "
    "length of the run tells them the distance: each second of waggling stands for roughly "
    "one kilometre of flight, although the exact scale differs between colonies and "
    "subspecies. Because the sun moves across the sky during the day, dancers adjust the "
    "angle of their runs as time passes, even after spending an hour inside the dark hive. "
    "Bees that follow the dance closely pick up the scent of the flowers from the dancer's "
    "body, which helps them recognise the patch once they arrive. For food sources close to "
    "the hive, less than about fifty metres away, foragers perform a simpler round dance "
    "that says food is near without giving its direction. The dance is not always precise: "
    "the directions given by successive runs of the same dancer can differ by more than ten "
    "degrees, and some researchers think this scatter spreads the recruits over a patch of "
    "flowers rather than sending them all to one spot. The Austrian scientist Karl von "
    "Frisch decoded the dance in the 1940s and shared the Nobel Prize in 1973 for the work. "
    "Later experiments with robotic bees and with radar tracking of individual foragers "
    "confirmed that recruits really do use the information in the dance, though they also "
    "rely on smell and on their own memories of earlier trips.";

static const char *const summaries[SPEC_PROMPTS] = {
    "Summarise the following document in three sentences.",
    "Summarise this document in one short paragraph.",
    "Write a summary of this document as a few bullet points.",
    "Summarise the key points of this document for a busy reader.",
};

typedef struct workload {
    const char *name;
    char *text[SPEC_PROMPTS]; /* the user message of each prompt */
} workload;

static void workload_free(workload *w) {
    for (int i = 0; i < SPEC_PROMPTS; i++) free(w->text[i]);
}

/* Fills w with the prompts of task `name`; false for an unknown task or
 * no memory. */
static bool workload_make(const char *name, workload *w) {
    static const char *const names[] = {"prose", "edit", "summary"};
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(name, names[i])) w->name = names[i];
    if (!w->name) return false;
    bool ok = true;
    for (int i = 0; i < SPEC_PROMPTS && ok; i++) {
        const char *head, *body = "", *open = "", *close = "";
        if (!strcmp(name, "prose")) {
            head = prose[i];
        } else if (!strcmp(name, "edit")) {
            head = edits[i];
            body = i < 4 ? py_func : c_func;
            open = i < 4 ? "\n\n```python\n" : "\n\n```c\n";
            close = "```";
        } else if (!strcmp(name, "summary")) {
            head = summaries[i % 4];
            body = i < 4 ? doc_bikes : doc_bees;
            open = "\n\n";
        } else {
            return false;
        }
        size_t n = strlen(head) + strlen(open) + strlen(body) + strlen(close) + 1;
        if (!(w->text[i] = malloc(n))) break;
        snprintf(w->text[i], n, "%s%s%s%s", head, open, body, close);
    }
    for (int i = 0; i < SPEC_PROMPTS; i++) ok &= w->text[i] != NULL;
    if (!ok) workload_free(w);
    return ok;
}

/* ------------------------------------------------------------ rounds */

/* What one engine produced in one round: the completion tokens of each
 * prompt, tokens/s of generation, and its statistics afterwards. */
typedef struct round_out {
    int32_t *ids[SPEC_PROMPTS];
    int32_t n[SPEC_PROMPTS];
    double tps;
    cellm_stats st;
} round_out;

static void round_free(round_out *r) {
    for (int i = 0; i < SPEC_PROMPTS; i++) free(r->ids[i]);
    memset(r, 0, sizeof *r);
}

/* Runs every prompt of w on e, `sessions` at a time, each with at most
 * n_predict tokens; fills *out (round_free it). Returns the exit status. */
static int run_round(cellm_engine *e, const workload *w, int sessions, int32_t n_predict,
                     float temp, round_out *out) {
    memset(out, 0, sizeof *out);
    double decode_s = 0;
    long tokens = 0;
    for (int base = 0; base < SPEC_PROMPTS; base += sessions) {
        int k = SPEC_PROMPTS - base < sessions ? SPEC_PROMPTS - base : sessions;
        cellm_request *req[SPEC_PROMPTS];
        double t_sub[SPEC_PROMPTS], first = 0, last = 0;
        for (int i = 0; i < k; i++) {
            cellm_chat_message msg = {.role = "user", .content = w->text[base + i]};
            cellm_request_params rp = cellm_request_default_params();
            rp.messages = &msg;
            rp.n_messages = 1;
            rp.max_tokens = n_predict;
            if (temp > 0) {
                rp.sampling.temperature = temp;
                rp.sampling.top_k = 40;
                rp.sampling.top_p = 0.95f;
                rp.sampling.min_p = 0.05f;
                rp.sampling.seed = 42 + (uint64_t)(base + i);
            }
            t_sub[i] = now_s();
            if (cellm_submit(e, &rp, &req[i]) != CELLM_OK) {
                cli_error("bench: %s", cellm_last_error());
                for (int j = 0; j < i; j++) {
                    cellm_cancel(req[j]);
                    cellm_wait(req[j], NULL);
                    cellm_request_free(req[j]);
                }
                return 1;
            }
        }
        int rc = 0;
        for (int i = 0; i < k; i++) {
            cellm_result res;
            const int32_t *ids;
            int32_t n = 0;
            if (cellm_wait(req[i], &res) != CELLM_OK || res.status != CELLM_OK ||
                cellm_request_tokens(req[i], &ids, &n) != CELLM_OK) {
                cli_error("bench: %s", cellm_request_error(req[i]));
                rc = 1;
            } else if ((out->ids[base + i] = malloc(((size_t)n + 1) * sizeof *ids))) {
                memcpy(out->ids[base + i], ids, (size_t)n * sizeof *ids);
                out->n[base + i] = n;
                /* The group decodes from its first first token to its last
                 * finish, on the clock of each request's submission. */
                double t1 = t_sub[i] + res.first_token_ms / 1e3;
                double t2 = t_sub[i] + res.total_ms / 1e3;
                if (first == 0 || t1 < first) first = t1;
                if (t2 > last) last = t2;
                if (res.n_completion_tokens > 1) tokens += res.n_completion_tokens - 1;
            } else {
                cli_error("bench: out of memory");
                rc = 1;
            }
            cellm_request_free(req[i]);
        }
        if (rc) return rc;
        decode_s += last - first;
    }
    out->tps = decode_s > 0 ? (double)tokens / decode_s : 0;
    cellm_engine_stats(e, &out->st);
    return 0;
}

/* Every prompt once with max_tokens 1: prompts into the prefix cache,
 * weights into memory. */
static int warm_up(cellm_engine *e, const workload *w, int sessions) {
    round_out r;
    int rc = run_round(e, w, sessions, 1, 0, &r);
    round_free(&r);
    return rc;
}

/* ------------------------------------------------------------ statistics */

typedef struct spread {
    double med, lo, hi;
} spread;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static spread spread_of(const double *v, int n) {
    double s[SPEC_MAX_REPS];
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    spread r = {n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2, s[0], s[n - 1]};
    return r;
}

/* One row of the report: a task at one session count. */
typedef struct spec_row {
    const char *task;
    int sessions;
    double plain[SPEC_MAX_REPS], spec[SPEC_MAX_REPS], ratio[SPEC_MAX_REPS];
    int reps;
    uint64_t drafted, kept, passes, draft_steps, steps_plain, steps_spec;
    long tokens;  /* completion tokens of the speculative rounds */
    int threads;  /* compute threads the engines used */
    int differed; /* completions not identical to the plain run's */
} spec_row;

/* ------------------------------------------------------------ report */

static double ratio_or0(double a, double b) {
    return b > 0 ? a / b : 0;
}

static void print_row(const spec_row *w) {
    spread p = spread_of(w->plain, w->reps), s = spread_of(w->spec, w->reps),
           x = spread_of(w->ratio, w->reps);
    printf("| %s | %d | %.1f | %.1f-%.1f | %.1f | %.1f-%.1f | **%.2fx** | %.2f-%.2f | %.0f%% | "
           "%.2f | %.2f | %.2f | %s |\n",
           w->task, w->sessions, p.med, p.lo, p.hi, s.med, s.lo, s.hi, x.med, x.lo, x.hi,
           100 * ratio_or0((double)w->kept, (double)w->drafted),
           ratio_or0((double)(w->kept + w->passes), (double)w->passes),
           ratio_or0((double)w->steps_plain, (double)w->steps_spec),
           ratio_or0((double)w->draft_steps, (double)w->tokens), w->differed ? "**NO**" : "yes");
}

static void print_spread_json(const char *name, const double *v, int n) {
    spread s = spread_of(v, n);
    printf("\"%s\": {\"median\": %.3f, \"min\": %.3f, \"max\": %.3f, \"samples\": [", name, s.med,
           s.lo, s.hi);
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", v[i]);
    printf("]}");
}

static void print_row_json(const spec_row *w, bool first) {
    printf("%s\n  {\"task\": \"%s\", \"sessions\": %d, ", first ? "" : ",", w->task, w->sessions);
    print_spread_json("plain_tokens_per_s", w->plain, w->reps);
    printf(", ");
    print_spread_json("spec_tokens_per_s", w->spec, w->reps);
    printf(", ");
    print_spread_json("speedup", w->ratio, w->reps);
    printf(", \"draft_tokens\": %llu, \"draft_accepted\": %llu, \"spec_passes\": %llu, "
           "\"draft_steps\": %llu, \"steps_plain\": %llu, \"steps_spec\": %llu, "
           "\"completion_tokens\": %ld, \"acceptance\": %.4f, \"tokens_per_pass\": %.4f, "
           "\"draft_steps_per_token\": %.4f, \"identical\": %s}",
           (unsigned long long)w->drafted, (unsigned long long)w->kept,
           (unsigned long long)w->passes, (unsigned long long)w->draft_steps,
           (unsigned long long)w->steps_plain, (unsigned long long)w->steps_spec, w->tokens,
           ratio_or0((double)w->kept, (double)w->drafted),
           ratio_or0((double)(w->kept + w->passes), (double)w->passes),
           ratio_or0((double)w->draft_steps, (double)w->tokens), w->differed ? "false" : "true");
}

/* The rounds of one task at one session count on the two engines (made
 * and warmed up by the caller). */
static int measure(cellm_engine *plain, cellm_engine *spec, const workload *w, int sessions,
                   const bench_spec_opts *o, spec_row *row) {
    memset(row, 0, sizeof *row);
    row->task = w->name;
    row->sessions = sessions;
    cellm_stats p0, s0;
    cellm_engine_stats(plain, &p0);
    cellm_engine_stats(spec, &s0);
    int rc = 0;
    /* The resample rule's text is not the plain run's: each round's must
     * be the first round's. */
    bool resample = o->accept == CELLM_SPEC_ACCEPT_RESAMPLE && o->temp > 0;
    round_out first;
    memset(&first, 0, sizeof first);
    for (int r = 0; r < o->reps && !rc; r++) {
        round_out a, b; /* plain, speculative */
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        if (r % 2 == 0) {
            rc = run_round(plain, w, sessions, o->n_predict, o->temp, &a);
            if (!rc) rc = run_round(spec, w, sessions, o->n_predict, o->temp, &b);
        } else {
            rc = run_round(spec, w, sessions, o->n_predict, o->temp, &b);
            if (!rc) rc = run_round(plain, w, sessions, o->n_predict, o->temp, &a);
        }
        if (!rc) {
            row->plain[r] = a.tps;
            row->spec[r] = b.tps;
            row->ratio[r] = a.tps > 0 ? b.tps / a.tps : 0;
            row->reps = r + 1;
            const round_out *ref = !resample ? &a : r > 0 ? &first : &b;
            for (int i = 0; i < SPEC_PROMPTS; i++) {
                row->tokens += b.n[i];
                if (ref->n[i] != b.n[i] ||
                    memcmp(ref->ids[i], b.ids[i], (size_t)b.n[i] * sizeof *b.ids[i]) != 0)
                    row->differed++;
            }
            row->drafted = b.st.n_draft_tokens - s0.n_draft_tokens;
            row->kept = b.st.n_draft_accepted - s0.n_draft_accepted;
            row->passes = b.st.n_spec_passes - s0.n_spec_passes;
            row->draft_steps = b.st.n_draft_steps - s0.n_draft_steps;
            row->steps_spec = b.st.n_steps - s0.n_steps;
            row->steps_plain = a.st.n_steps - p0.n_steps;
            row->threads = b.st.n_threads;
        }
        round_free(&a);
        if (resample && r == 0)
            first = b;
        else
            round_free(&b);
    }
    round_free(&first);
    return rc;
}

/* Every session count of one task: two engines for the most sessions,
 * the prompts cached in both by a warm-up, then the rounds of each count.
 * Appends to rows[*n_rows ..]. */
static int measure_task(const cellm_model *target, const cellm_engine_params *plain_p,
                        const cellm_engine_params *spec_p, const workload *w, const int *sessions,
                        int n_sessions, const bench_spec_opts *o, spec_row *rows, int *n_rows) {
    cellm_engine_params pp = *plain_p, sp = *spec_p;
    int most = 1;
    for (int i = 0; i < n_sessions; i++)
        if (sessions[i] > most) most = sessions[i];
    pp.max_seqs = sp.max_seqs = most;
    cellm_engine *plain = NULL, *spec = NULL;
    if (cellm_engine_create(target, &pp, &plain) != CELLM_OK ||
        cellm_engine_create(target, &sp, &spec) != CELLM_OK) {
        cli_error("bench: %s", cellm_last_error());
        cellm_engine_free(plain);
        return 1;
    }
    int rc = warm_up(plain, w, most);
    if (!rc) rc = warm_up(spec, w, most);
    for (int i = 0; i < n_sessions && !rc; i++) {
        spec_row *row = &rows[*n_rows];
        rc = measure(plain, spec, w, sessions[i], o, row);
        if (rc) break;
        if (!o->json) {
            if (*n_rows == 0)
                printf("| task | sessions | plain tok/s | range | speculative tok/s | range | "
                       "speed-up | range | accepted | tokens/pass | target passes saved | draft "
                       "passes/token | identical |\n"
                       "| --- | ---: | ---: | --- | ---: | --- | ---: | --- | ---: | ---: | ---: "
                       "| ---: | --- |\n");
            print_row(row);
            fflush(stdout);
        }
        (*n_rows)++;
    }
    cellm_engine_free(spec);
    cellm_engine_free(plain);
    return rc;
}

static const char *file_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

/* s as a JSON string. */
static void print_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            printf("\\n");
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

/* --spec-prompts: {"task": ["user message", ...], ...}, so another
 * engine can be given the very same chat requests. */
static int dump_prompts(const char *tasks) {
    printf("{");
    for (const char *t = tasks; *t;) {
        size_t tl = strcspn(t, ",");
        char task[16];
        workload w;
        snprintf(task, sizeof task, "%.*s", (int)(tl < sizeof task ? tl : sizeof task - 1), t);
        if (!workload_make(task, &w)) {
            cli_error("bench: --spec-task takes prose, edit or summary (not '%s')", task);
            return 2;
        }
        printf("%s\n  \"%s\": [", t == tasks ? "" : ",", w.name);
        for (int i = 0; i < SPEC_PROMPTS; i++) {
            printf("%s\n    ", i ? "," : "");
            print_json_string(w.text[i]);
        }
        printf("]");
        workload_free(&w);
        t += tl + (t[tl] == ',');
    }
    printf("\n}\n");
    return 0;
}

int bench_spec(const char *path, const char *name, const cellm_engine_params *ep,
               const bench_spec_opts *o) {
    if (o->dump) return dump_prompts(o->tasks);
    cellm_model *target = NULL, *draft = NULL;
    if (cellm_model_load(path, NULL, &target) != CELLM_OK ||
        (o->draft_path && cellm_model_load(o->draft_path, NULL, &draft) != CELLM_OK)) {
        cli_error("bench: %s", cellm_last_error());
        cellm_model_free(target);
        return 1;
    }
    cellm_engine_params plain_p = *ep, spec_p = *ep;
    /* The prompts are cached by the warm-up, so the rounds time generation. */
    plain_p.prefix_cache = spec_p.prefix_cache = 1;
    spec_p.draft_model = draft;
    spec_p.lookup_ngram = o->lookup;
    if (o->draft_max >= 0) spec_p.draft_max = o->draft_max;
    if (o->draft_min >= 0) spec_p.draft_min = o->draft_min;
    if (o->draft_p_min >= 0) spec_p.draft_p_min = o->draft_p_min;
    spec_p.draft_always = o->draft_always;
    spec_p.spec_accept = o->accept;
    int sessions[SPEC_PROMPTS], n_sessions = 0;
    for (const char *q = o->sessions; *q;) {
        char *end;
        long n = strtol(q, &end, 10);
        if (end == q || n < 1 || n > SPEC_PROMPTS || (*end && *end != ',') ||
            n_sessions == SPEC_PROMPTS) {
            cli_error("bench: with --draft/--lookup, sessions must be a list of at most %d "
                      "numbers 1..%d (the prompts of a task)",
                      SPEC_PROMPTS, SPEC_PROMPTS);
            cellm_model_free(draft);
            cellm_model_free(target);
            return 2;
        }
        sessions[n_sessions++] = (int)n;
        q = *end ? end + 1 : end;
    }
    spec_row rows[3 * SPEC_PROMPTS];
    int n_rows = 0, rc = 0, threads = 0;
    for (const char *t = o->tasks; *t && !rc;) {
        size_t tl = strcspn(t, ",");
        char task[16];
        workload w;
        snprintf(task, sizeof task, "%.*s", (int)(tl < sizeof task ? tl : sizeof task - 1), t);
        if (n_rows + n_sessions > (int)(sizeof rows / sizeof *rows) || !workload_make(task, &w)) {
            cli_error("bench: --spec-task takes up to three of prose, edit, summary (not '%s')",
                      task);
            rc = 2;
            break;
        }
        rc = measure_task(target, &plain_p, &spec_p, &w, sessions, n_sessions, o, rows, &n_rows);
        workload_free(&w);
        t += tl + (t[tl] == ',');
    }
    for (int i = 0; i < n_rows; i++) threads = rows[i].threads;
    const char *dname = o->draft_path ? file_name(o->draft_path) : "none";
    if (o->json && n_rows > 0) {
        printf("{\"model\": \"%s\", \"draft\": \"%s\", \"lookup\": %d, \"draft_max\": %d, "
               "\"draft_min\": %d, \"draft_p_min\": %.3f, \"draft_always\": %s, \"spec_accept\": "
               "\"%s\", "
               "\"temperature\": %.2f, \"threads\": %d, \"n_predict\": %d, "
               "\"prompts\": %d, \"rounds\": %d, \"results\": [",
               name, dname, spec_p.lookup_ngram, spec_p.draft_max, spec_p.draft_min,
               (double)spec_p.draft_p_min, spec_p.draft_always ? "true" : "false",
               o->accept ? "resample" : "exact", (double)o->temp, threads, o->n_predict,
               SPEC_PROMPTS, o->reps);
        for (int i = 0; i < n_rows; i++) print_row_json(&rows[i], i == 0);
        printf("\n]}\n");
    } else if (n_rows > 0) {
        char how[64] = "greedy";
        if (o->temp > 0)
            snprintf(how, sizeof how, "sampled at T %.2f (%s rule)", (double)o->temp,
                     o->accept ? "resample" : "exact");
        printf("\nmodel %s, draft %s%s, lookup %d, draft-max %d, draft-min %d, draft-p-min %.2f, "
               "%d threads; %d chat prompts a round, %s, up to %d tokens each; %d rounds, "
               "plain and speculative alternating, after a warm-up that caches the prompts.\n"
               "tok/s: generation after each request's first token; speed-up: median of the "
               "rounds' ratios; tokens/pass: (kept + checking passes) / checking passes; target "
               "passes saved: plain steps / speculative steps.\n",
               name, dname, spec_p.draft_always ? " (every step)" : "", spec_p.lookup_ngram,
               spec_p.draft_max, spec_p.draft_min, (double)spec_p.draft_p_min, threads,
               SPEC_PROMPTS, how, o->n_predict, o->reps);
    }
    for (int i = 0; i < n_rows; i++)
        if (rows[i].differed) {
            cli_error("bench: %d speculative completions of task %s at %d sessions differ from "
                      "%s: a bug (they must be identical)",
                      rows[i].differed, rows[i].task, rows[i].sessions,
                      o->accept && o->temp > 0 ? "the first round's" : "the plain run's");
            rc = 1;
        }
    cellm_model_free(draft);
    cellm_model_free(target);
    return rc;
}
