/*
 * cellm.h — the public C API of cellm, an on-device LLM inference and
 * serving engine. This is the only header an application includes.
 *
 * Conventions (they hold for every function below):
 *  - Handles are opaque. Every function that can fail returns cellm_status;
 *    CELLM_OK is 0. The message for the last failure is read from the handle
 *    (or from cellm_last_error() for calls that had no handle yet).
 *  - Strings returned by the library are owned by the library and stay valid
 *    until the next call on the same handle, unless a comment says otherwise.
 *  - Params structs are filled by their *_default_params() function first, so
 *    fields can be added in later versions without breaking callers.
 *  - The library never prints, never exits and never aborts on bad input.
 *    Diagnostics go through the log callback the application sets.
 */
#ifndef CELLM_H
#define CELLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CELLM_VERSION_MAJOR 0
#define CELLM_VERSION_MINOR 1
#define CELLM_VERSION_PATCH 0

/* Status codes. Every fallible call returns one. */
typedef enum cellm_status {
    CELLM_OK = 0,
    CELLM_ERR_INVALID_ARG, /* a NULL handle, an out-of-range parameter */
    CELLM_ERR_IO,          /* open, read, write, mmap failed */
    CELLM_ERR_FORMAT,      /* a malformed or truncated file */
    CELLM_ERR_UNSUPPORTED, /* a valid file using a feature cellm lacks */
    CELLM_ERR_NO_MEMORY,   /* an allocation failed or the budget is spent */
    CELLM_ERR_NOT_FOUND,   /* a key, tensor or model name does not exist */
    CELLM_ERR_CHECKSUM,    /* data does not match its recorded checksum */
    CELLM_ERR_NETWORK,     /* a model could not be fetched */
    CELLM_ERR_NOT_IMPLEMENTED,
    CELLM_ERR_INTERNAL
} cellm_status;

/* A short constant name for a status ("format error", ...). Never NULL. */
const char *cellm_status_str(cellm_status status);

/* The library version as "MAJOR.MINOR.PATCH". Static storage. */
const char *cellm_version(void);

/* Log levels for the log callback. */
typedef enum cellm_log_level {
    CELLM_LOG_DEBUG = 0,
    CELLM_LOG_INFO,
    CELLM_LOG_WARN,
    CELLM_LOG_ERROR
} cellm_log_level;

/* The application's log sink. `msg` is valid only during the call and has no
 * trailing newline. The callback may be called from any library thread. */
typedef void (*cellm_log_fn)(cellm_log_level level, const char *msg, void *user);

/* Sets the process-wide log sink (NULL: discard logs, the default).
 * Thread-safe. */
void cellm_set_log_callback(cellm_log_fn fn, void *user);

/* ------------------------------------------------------------------ errors */

/* The message of the last call that failed on the calling thread ("" when
 * none has). Every fallible function below sets it, also those that take a
 * handle, so a thread can always read why its own call failed. Owned by
 * the library; valid until the next failing call on this thread. */
const char *cellm_last_error(void);

/* ------------------------------------------------------------------ models */

/* A loaded model: its weights (mapped read-only from the file, never
 * copied), its tokenizer and its chat format. Immutable once loaded: any
 * number of engines and threads may use one model at once. */
typedef struct cellm_model cellm_model;

typedef struct cellm_model_params {
    /* How chat-message requests become prompt text (docs/templates.md):
     *  - NULL (the default): the model's own Jinja template (the GGUF key
     *    tokenizer.chat_template), rendered as Hugging Face transformers
     *    renders it, with bos_token/eos_token from the vocabulary and the
     *    assistant's turn opened; a file without a template gets the
     *    built-in format of its architecture (Gemma), else none;
     *  - "chatml", "gemma" or "llama3": that built-in format;
     *  - any other text containing "{{" or "{%": a Jinja template to use
     *    instead of the model's.
     * Copied by cellm_model_load. */
    const char *chat_template;
} cellm_model_params;

cellm_model_params cellm_model_default_params(void);

/* Loads the GGUF file at `path` into *out. The library takes paths only;
 * store names ("smollm2-135m") are resolved by the `cellm` command, not
 * here. `params` may be NULL for the defaults. Thread-safe. Errors:
 * CELLM_ERR_IO, CELLM_ERR_FORMAT, CELLM_ERR_UNSUPPORTED,
 * CELLM_ERR_NO_MEMORY; CELLM_ERR_INVALID_ARG for a chat_template that is
 * neither a built-in name nor a template that renders. A model whose own
 * template cannot be rendered still loads: its chat-message requests fail
 * with a message that names the template's fault and the fallback. Free with cellm_model_free()
 * after every engine that uses the model. */
cellm_status cellm_model_load(const char *path, const cellm_model_params *params,
                              cellm_model **out);

/* Frees a model (NULL is fine). Every engine made from it must be freed
 * first. */
void cellm_model_free(cellm_model *model);

/* Token ids of `text` (special tokens such as "<|im_start|>" recognised,
 * BOS added where the model wants it) into a new array *ids of *n ids;
 * free it with free(). Thread-safe. */
cellm_status cellm_tokenize(const cellm_model *model, const char *text, int32_t **ids, int32_t *n);

/* ----------------------------------------------------------------- engines */

/* An engine serves many requests on one model at once: one engine thread
 * runs steps, each a single forward pass over a flat batch that holds the
 * next token of every running request and chunks of waiting prompts
 * (continuous batching). Its memory (KV cache and activations) is
 * allocated once, at creation, within mem_budget_bytes; when the KV cache
 * runs out, requests wait in a queue, and the lowest-priority, most recent
 * running request is preempted (its cache freed, recomputed later), so the
 * engine never exceeds its budget. */
typedef struct cellm_engine cellm_engine;

/* How the KV cache stores K and V (per engine). Smaller types hold more
 * tokens of context in the same budget, at some cost in accuracy;
 * docs/benchmarks.md has bytes per token and perplexity for each. The
 * quantized types need head sizes that are multiples of 32 (the rotated
 * ones, q4_0h, k5v4h and their window types: powers of two up to 1024); other models get
 * CELLM_ERR_UNSUPPORTED. */
typedef enum cellm_kv_type {
    CELLM_KV_F16 = 0,  /* 16-bit floats (default) */
    CELLM_KV_Q8_0 = 1, /* 8-bit codes, one f16 scale per 32: 34 bytes per 32 values */
    CELLM_KV_Q4_0 = 2, /* 4-bit codes, one f16 scale per 32: 18 bytes per 32 values */
    /* Q4_0 after a fixed randomized Hadamard rotation of each head, which
     * spreads outlier channels over the head before the 4-bit rounding;
     * the same 18 bytes per 32 values as q4_0. */
    CELLM_KV_Q4_0H = 3,
    /* Rotated like q4_0h, keys (which suffer most from rounding) in 5-bit
     * Q5_0 blocks, values in 4-bit Q4_0: 22 + 18 bytes per 32 keys and 32
     * values, 5.0 bits a value with the scales. */
    CELLM_KV_K5V4H = 4,
    /* The window types: rows stored as q4_0h (k5v4h), and each sequence
     * keeps f16 copies of its first 16 positions (the attention sink) and
     * of its latest 48; a query reads the sink and its own and the
     * previous block of 16 positions in f16, older ones compressed. Most
     * of 4-bit KV's loss is in the recent positions, so this buys most of
     * it back, for 80 f16 positions a layer per sequence (the copies, and
     * one of a cached block so that prefixes stay shareable). Keys are
     * also centred and balanced per channel from statistics the engine
     * takes at creation (a pass over a built-in text of 512 tokens). CPU
     * only. */
    CELLM_KV_Q4_0HW = 5,
    CELLM_KV_K5V4HW = 6,
    /* Window types with 3-bit rows (8 levels, one f16 scale per 32: 14
     * bytes per 32 values, 3.5 bits a value): both K and V (q3_0hw), or
     * 4-bit keys and 3-bit values (k4v3hw, 4.0 bits). */
    CELLM_KV_Q3_0HW = 7,
    CELLM_KV_K4V3HW = 8,
    /* A window type whose keys are rounded per channel, as KIVI does:
     * once a block of 16 positions has been written, each channel of each
     * head gets a minimum and a step over the block's 16 keys (4-bit codes,
     * 7 bits of channel metadata under two f16 a head: 4.47 bits a key value
     * at head size 64, 4.45 at 256), values as q4_0hw (4.5 bits). Keys
     * have outlier channels that per-position rounding smears over the
     * head; docs/benchmarks.md measures what this buys. */
    CELLM_KV_K4CV4HW = 9
} cellm_kv_type;

/* The power/QoS policy: how hard the engine works, traded against heat and
 * battery. Fewer threads and rests between steps make every request
 * slower, never different: a request's tokens do not depend on the thread
 * count (batch invariance). A phone app lowers it when the device reports
 * thermal pressure or low battery, and raises it again after. */
typedef struct cellm_qos {
    /* Compute threads in use, 1..the engine's n_threads (the pool is made
     * once, at creation; the threads not in use sleep). 0 (default): all. */
    int n_threads;
    /* Pacing: at least this many microseconds from the start of one step to
     * the start of the next (a cap on steps per second); 0..10,000,000.
     * Default 0: no minimum. */
    int32_t min_step_us;
    /* Pacing: the share of time spent computing, 0.01..1. After a step that
     * took t seconds the engine rests t (1 - duty_cycle) / duty_cycle
     * (0.5: rest as long as it worked). Default 1: no rest. With both set,
     * the longer rest applies. */
    float duty_cycle;
} cellm_qos;

typedef struct cellm_engine_params {
    int n_threads;            /* compute threads; 0 (default): cores, at most 4 */
    size_t mem_budget_bytes;  /* KV cache + activations (+ pictures); default 256 MiB */
    int32_t max_batch_tokens; /* rows in one step (decode tokens + prompt chunks); default 256
                                 (under process_budget_bytes, at most this) */
    int32_t max_seqs;         /* requests running at once; default 16 */
    int32_t max_ctx;          /* positions per request; 0 (default): the model's, at most 4096 */
    cellm_kv_type kv_type;    /* default CELLM_KV_F16 */
    /* 1 (default): the prefix cache. Full blocks of 16 computed positions
     * stay in the KV cache, indexed by their tokens (and all the tokens
     * before them), after their request ends, until the budget needs the
     * room (least recently used first); a request whose tokens start with
     * a cached prefix (a shared system prompt, an earlier turn of a chat)
     * takes those blocks instead of computing them. The output does not
     * change. 0: off. Models whose layers all use a sliding window have no
     * prefix cache. */
    int prefix_cache;
    cellm_qos qos; /* the policy it starts with (default: all threads, no pacing) */
    /* 0 (default): the engine runs its own thread, which runs a step
     * whenever there is work. 1: no engine thread; the app runs each
     * step with cellm_engine_step() on a thread of its choice (a game
     * loop, a worker it already has). Callbacks then run on the thread
     * that steps. cellm_wait, cellm_request_free of an unfinished request,
     * cellm_session_free during a turn and cellm_engine_trim run steps on
     * the calling thread until what they wait for has happened, so they
     * cannot hang for want of a stepper. The QoS pacing is the app's to do
     * (the engine does not rest between steps it is asked to run). */
    int manual_steps;
    /* The phone memory mode. 0 (default): off, and mem_budget_bytes is the
     * engine's budget. Otherwise a cap, in bytes, on the memory of the whole
     * process for this model and engine (a phone app gets about 512 MiB):
     * the model's mapped file, counted whole as if every page were resident;
     * its tables (tokenizer, template); an allowance for code, the C
     * library and thread stacks; what the GPU's drivers leave resident
     * once the devices are listed (none with CELLM_DEVICE_CPU, which lists
     * none; measured where the OS tells, as on Linux and Android); the
     * samplers' scratch, one a thread; max_seqs requests' token arrays and
     * grammar rows; the activations; and the KV pool, which gets
     * everything left (mem_budget_bytes is ignored). Where that does not
     * hold max_seqs sequences of max_ctx positions at once, the engine
     * halves max_batch_tokens (smaller activations; prompts computed in
     * smaller chunks, the same output), down to 64 rows or one decode row
     * a sequence, and logs the step it took; failing that, creation fails
     * with CELLM_ERR_NO_MEMORY and a message with the figures and what
     * would fit. So under this cap no request is ever preempted for
     * memory. */
    size_t process_budget_bytes;
    /* Speculative decoding: each decoding request guesses some tokens
     * ahead and the model checks them all in one forward pass, keeping the
     * guesses that equal what it would have chosen itself, then the token
     * it chooses after them. The text is the same, token for token, as
     * without speculation, greedy or sampled with the same seed (the
     * engine is batch-invariant, and the sampler draws each kept token in
     * the same state as a plain run would); only the speed changes. The
     * guesses come from a draft model, from earlier text, or both (the
     * draft where the earlier text has no match).
     *
     * draft_model: a smaller model with the same vocabulary and
     * architecture family (NULL, default: none). It must outlive the
     * engine. Its KV cache is a second paged pool inside the same budget
     * (process_budget_bytes counts its file too), its passes run on the
     * same threads before each step, and its cache is the first thing
     * given up under memory pressure. A draft whose vocabulary or family
     * differs from the model's fails creation (CELLM_ERR_INVALID_ARG), as
     * does one that does not fit the budget (CELLM_ERR_NO_MEMORY). */
    const cellm_model *draft_model;
    /* Prompt lookup: guesses are the tokens that followed the latest
     * earlier occurrence of the last n tokens of the prompt and text so
     * far, for n from lookup_ngram down to 2 (a single token is too weak a
     * match; 1 with lookup_ngram 1) (0, default: off). Strong when the
     * answer copies its input (editing, code, summaries). */
    int32_t lookup_ngram;
    /* At most this many guesses per request and step, 1..64 (default 8);
     * each request adapts its own count to how many were kept lately. */
    int32_t draft_max;
    /* Fewer guesses than this are not worth checking: the request decodes
     * plainly that step (default 1). */
    int32_t draft_min;
    /* The draft model stops guessing at a token it gives less than this
     * probability, 0..1 (default 0.5). */
    float draft_p_min;
    /* The most rows a step's decoding requests feed, pending tokens and
     * guesses together: guesses stop there, handed out in queue order.
     * On a CPU a pass over more than a few rows is compute-bound, so a
     * guess that costs a row in a full step costs more than it saves
     * (docs/benchmarks.md, "Speculative decoding"). 0 (default): 1 +
     * draft_max, what one request alone may use; with as many sessions
     * decoding, none guesses. */
    int32_t spec_step_rows;
    /* How the guesses of a sampled request are checked
     * (cellm_spec_accept). CELLM_SPEC_ACCEPT_EXACT (0, default): as
     * above, the draft guesses greedily and a guess is kept while it
     * equals the token the plain run draws there: the plain run's text.
     * CELLM_SPEC_ACCEPT_RESAMPLE: the standard rule of speculative
     * sampling (Leviathan et al., Chen et al.): the draft samples its
     * guess x from its own distribution q (the request's temperature,
     * top-k, top-p and min-p over the draft's logits, at most 64
     * tokens), the model keeps it with probability min(1, p(x) / q(x))
     * and otherwise draws from max(0, p - q) renormalised, p being what
     * the request's sampler draws from. The tokens follow the model's own
     * distribution exactly and more guesses are kept, but the text is not
     * the plain run's. Its random numbers are keyed by the seed and the
     * position, and a request's guesses do not wait on other requests'
     * (spec_step_rows does not cut them), so a seed gives the same text
     * alone or among other requests and on any thread count while memory
     * suffices (a request preempted, or whose draft cache is given up,
     * guesses differently). Greedy requests and requests with a grammar
     * use the exact rule either way. */
    int32_t spec_accept;
    /* A draft pass costs a good part of a pass of the model (on two cores
     * a Q4_0 draft of a Q8_0 model of the same size nearly a whole one),
     * so a draft that guesses well too rarely makes decoding slower. 0
     * (default): the engine measures what a generated token has cost
     * lately with the draft's passes and without them (the steps in which
     * it guessed nothing tell the second), runs the draft only while it
     * pays, and tries it again now and then while it does not: from after
     * 16 steps to after 256 as trials keep losing. Non-zero: the draft
     * runs in every step where a request could use its guesses. Either
     * way the text is the same; only the speed changes. */
    int32_t draft_always;
    /* Where the forward pass runs (cellm_device). CELLM_DEVICE_AUTO (0,
     * default): a GPU through Vulkan where the library has the Vulkan
     * backend and finds a usable GPU, else the CPU (a Vulkan device that
     * is a CPU emulation, such as Mesa's lavapipe, is never picked by
     * AUTO); when it falls back it says why once, through the log
     * callback. CELLM_DEVICE_CPU: the CPU. CELLM_DEVICE_VULKAN: the first
     * Vulkan device (a GPU before an emulation), or creation fails with
     * CELLM_ERR_UNSUPPORTED and a message saying why. The scheduler, the
     * prefix cache, sessions and sampling are the same on every device. */
    int32_t device;
    /* For a model that takes pictures (one with an "<image>" token): the
     * memory its requests' pictures may hold at once, inside the budget
     * (mem_budget_bytes, or process_budget_bytes in the phone mode), taken
     * from what the KV cache would get. A request copies its pictures'
     * rows at submit (n_embd floats each: 2.25 KiB a row for SmolVLM-256M,
     * 8 KiB for SmolVLM-2.2B) and gives them back when it ends. A request
     * whose pictures alone need more is refused with CELLM_ERR_NO_MEMORY;
     * so is one that would take the total over while other requests hold
     * theirs (submit it again once one of them ends). 0 (default): 16 MiB
     * (7,281 rows of SmolVLM-256M, 2,048 of SmolVLM-2.2B). Models without
     * pictures reserve nothing. */
    size_t image_budget_bytes;
    /* Partial offload, for a model the GPU's memory does not hold: on a
     * Vulkan device, the last gpu_layers layers and the classifier run on
     * the GPU and the embedding and the layers before them on the CPU,
     * whose KV blocks stay in host memory; each step hands the residual
     * stream from the CPU to the GPU once. 0 (default), or the model's
     * layer count or more: every layer on the GPU, or, when the model's
     * weights, KV cache and activations would not fit nine tenths of the
     * GPU's device-local memory, the most layers that do (logged; none:
     * AUTO runs on the CPU and VULKAN fails). Ignored on the CPU
     * (device CELLM_DEVICE_CPU, or AUTO falling back). The draft model of
     * speculative decoding runs whole on the engine's device. */
    int32_t gpu_layers;
} cellm_engine_params;

/* cellm_engine_params.device. */
typedef enum cellm_device {
    CELLM_DEVICE_AUTO = 0,
    CELLM_DEVICE_CPU = 1,
    CELLM_DEVICE_VULKAN = 2
} cellm_device;

/* cellm_engine_params.spec_accept. */
typedef enum cellm_spec_accept {
    CELLM_SPEC_ACCEPT_EXACT = 0,
    CELLM_SPEC_ACCEPT_RESAMPLE = 1
} cellm_spec_accept;

cellm_engine_params cellm_engine_default_params(void);

/* Creates an engine on `model` (which must outlive it) and starts its
 * engine thread. `params` may be NULL for the defaults. Thread-safe.
 * Errors: CELLM_ERR_INVALID_ARG (a parameter out of range),
 * CELLM_ERR_NO_MEMORY (the budget does not hold the activations for
 * max_batch_tokens plus at least one KV block, or allocation failed),
 * CELLM_ERR_UNSUPPORTED (kv_type does not suit the model's head sizes). */
cellm_status cellm_engine_create(const cellm_model *model, const cellm_engine_params *params,
                                 cellm_engine **out);

/* Runs one step of an engine created with manual_steps: takes in new
 * requests, cancellations, trims and session frees, then runs one forward
 * pass over the next batch (if any request has work) and streams its
 * tokens through the callbacks, on the calling thread. *more (may be NULL)
 * becomes 1 when requests still have work (0 when none has), i.e. the app should call
 * again. Thread-safe: steps from several threads run one at a time.
 * Errors: CELLM_ERR_INVALID_ARG for an engine with its own thread, or a
 * call from one of the engine's callbacks. */
cellm_status cellm_engine_step(cellm_engine *engine, int *more);

/* Stops the engine thread and frees the engine (NULL is fine). Requests
 * still running or waiting finish as CELLM_FINISH_CANCELLED first (their
 * done callbacks run). Every request and session handle must be freed
 * before this call. Must not be called from a callback. */
void cellm_engine_free(cellm_engine *engine);

/* Changes the power/QoS policy while the engine runs: from the start of
 * its next step (a rest under the old policy ends at once). Thread-safe,
 * callable from callbacks. Errors: CELLM_ERR_INVALID_ARG (a field out of
 * its range; the engine keeps its policy). */
cellm_status cellm_engine_set_qos(cellm_engine *engine, const cellm_qos *qos);

/* The policy in force (n_threads as set: 0 means all). Thread-safe. */
cellm_status cellm_engine_get_qos(cellm_engine *engine, cellm_qos *out);

/* How much to give back under memory pressure; each level does what the
 * ones before it do, and more. */
typedef enum cellm_trim_level {
    /* The pages of free KV blocks go back to the OS (they come back, as
     * zeros, when next used), and with them the prefix cache's blocks
     * that no request or session holds. Costs page faults later, and the
     * recompute of prefixes that were cached. */
    CELLM_TRIM_LIGHT = 1,
    /* Also the KV blocks that sessions keep between turns are dropped:
     * their next turn recomputes the conversation. */
    CELLM_TRIM_MODERATE = 2,
    /* Also every running request is preempted: its KV blocks go back to
     * the OS and it waits in the queue, to be recomputed when it is
     * readmitted (its text does not change). The engine then resumes:
     * lower the QoS policy or cancel requests to keep it small. */
    CELLM_TRIM_CRITICAL = 3
} cellm_trim_level;

/* Releases memory for the OS's low-memory warnings. A suggested mapping:
 * Android onTrimMemory RUNNING_MODERATE or UI_HIDDEN -> LIGHT; RUNNING_LOW
 * or BACKGROUND -> MODERATE; RUNNING_CRITICAL or COMPLETE -> CRITICAL; an
 * iOS memory warning -> MODERATE (CRITICAL when it repeats). The engine
 * thread does it between two steps; this waits until it is done and puts
 * the bytes given back to the OS in *released (may be NULL; calls at the
 * same time may share one trim and its count). From a callback it cannot
 * wait: the trim is done after the current step and *released is 0.
 * cellm_stats.bytes_kv_resident and bytes_released show the effect.
 * Thread-safe. Errors: CELLM_ERR_INVALID_ARG (an unknown level). */
cellm_status cellm_engine_trim(cellm_engine *engine, cellm_trim_level level, size_t *released);

/* A snapshot of the engine's state, for metrics. */
typedef struct cellm_stats {
    size_t bytes_in_use;      /* activations + KV blocks in use + pictures' rows held */
    size_t bytes_activations; /* fixed, allocated at creation */
    size_t bytes_kv_total;    /* the KV cache pool */
    int32_t blocks_total, blocks_used, blocks_free; /* KV blocks of 16 positions */
    int32_t n_running, n_waiting;                   /* requests */
    uint64_t n_steps, n_preemptions;
    uint64_t n_prompt_tokens, n_completion_tokens; /* computed since creation */
    double prompt_tokens_per_s;                    /* over the last second or so of work */
    double completion_tokens_per_s;
    uint64_t n_sampled;    /* tokens chosen by the samplers since creation */
    double sample_seconds; /* engine-thread time spent choosing them */
    /* Memory as the OS sees it: the KV pool is mapped at creation but
     * costs memory only once blocks are used, until a trim gives their
     * pages back. */
    size_t bytes_kv_resident; /* estimate: KV blocks used since their pages were given back */
    size_t bytes_released;    /* given back to the OS by cellm_engine_trim since creation */
    uint64_t n_trims;
    /* KV blocks sessions keep between turns (part of blocks_used; a block
     * forked sessions share counts once for each). */
    int32_t blocks_kept;
    int32_t blocks_cached;    /* prefix-cache blocks no one holds (part of blocks_free) */
    uint64_t n_prefix_tokens; /* prompt positions taken from the prefix cache since creation */
    int32_t n_sessions_kept;  /* sessions with kept blocks */
    int32_t n_threads;        /* compute threads in use (the QoS policy) */
    double rest_seconds;      /* engine-thread time spent resting by the QoS pacing */
    /* Speculative decoding since creation: tokens guessed, guesses kept,
     * and checking passes (a request's rows in one step that carried
     * guesses). Kept guesses + passes = tokens those passes produced, so
     * (n_draft_accepted + n_spec_passes) / n_spec_passes is the tokens
     * per pass of the model, and n_draft_accepted / n_draft_tokens the
     * acceptance rate. */
    uint64_t n_draft_tokens, n_draft_accepted, n_spec_passes;
    uint64_t n_draft_steps; /* forward passes of the draft model */
    /* Structured output: engine-thread time spent masking the vocabulary
     * with grammars and advancing their states (part of sample_seconds),
     * and the tokens so chosen. */
    double grammar_seconds;
    uint64_t n_grammar_tokens;
    /* Of those, the tokens the grammar refused at first draw, for which
     * the whole vocabulary was masked (and the time that took, part of
     * grammar_seconds). */
    uint64_t n_grammar_masks;
    double grammar_mask_seconds;
    /* Pictures (cellm_engine_params.image_budget_bytes): the room the
     * engine keeps for their rows (0 for a model without pictures), and
     * what requests hold now (part of bytes_in_use). */
    size_t bytes_images_total, bytes_images_in_use;
} cellm_stats;

/* Fills *out. Thread-safe; a consistent snapshot as of the last step. */
cellm_status cellm_engine_stats(cellm_engine *engine, cellm_stats *out);

/* The first error a step of the engine met ("" if none: the usual case),
 * such as a failed forward pass; the requests of that step finished with
 * CELLM_FINISH_ERROR and the engine went on serving the others. Owned by
 * the engine; once set it never changes. */
const char *cellm_engine_error(const cellm_engine *engine);

/* ---------------------------------------------------------------- requests */

/* One generation: a prompt in, text out through callbacks. */
typedef struct cellm_request cellm_request;

typedef enum cellm_finish_reason {
    CELLM_FINISH_NONE = 0,  /* not finished yet */
    CELLM_FINISH_STOP,      /* a stop token (EOS, end of turn, one of stop_tokens) or string */
    CELLM_FINISH_LENGTH,    /* max_tokens, the context, or a KV budget one request outgrew */
    CELLM_FINISH_CANCELLED, /* cellm_cancel, cellm_request_free or cellm_engine_free */
    CELLM_FINISH_ERROR      /* see result.status and cellm_request_error() */
} cellm_finish_reason;

typedef struct cellm_result {
    cellm_finish_reason finish_reason;
    cellm_status status; /* CELLM_OK unless finish_reason is CELLM_FINISH_ERROR */
    int32_t n_prompt_tokens;
    int32_t n_completion_tokens;
    int32_t n_preemptions;   /* times the request was preempted and recomputed */
    int32_t n_cached_tokens; /* prompt tokens not computed: kept by the session from earlier
                                turns, or found in the prefix cache */
    double queue_ms;         /* submit to first step that ran it */
    double first_token_ms;   /* submit to first completion token */
    double total_ms;         /* submit to finish */
    int32_t stop_token;      /* CELLM_FINISH_STOP on a token: that token; else -1 */
    int32_t stop_index;      /* CELLM_FINISH_STOP on a string: its index in params.stop; else -1 */
} cellm_result;

/* Called on the engine thread with each piece of text as it is made:
 * whole UTF-8 characters, `piece` not NUL-terminated and valid only during
 * the call. Keep it short: every request of the engine waits for it. It may
 * call cellm_cancel (any request) and cellm_submit, not cellm_wait. */
typedef void (*cellm_piece_fn)(const char *piece, size_t len, void *user);

/* Called once on the engine thread when the request finishes, however it
 * finishes (also after a cancel); `result` is valid only during the call.
 * After it returns, no callback of the request runs again. Same rules as
 * cellm_piece_fn. */
typedef void (*cellm_done_fn)(const cellm_result *result, void *user);

typedef struct cellm_chat_message {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
} cellm_chat_message;

/* A bias added to one token's logit before sampling (OpenAI's logit_bias,
 * llama.cpp's --logit-bias). */
typedef struct cellm_logit_bias {
    int32_t token; /* a token id of the model's vocabulary */
    float bias;    /* added to the logit; -INFINITY bans the token */
} cellm_logit_bias;

#define CELLM_MAX_LOGIT_BIAS 1024 /* entries of cellm_sampling.logit_bias */

/* How the next token is chosen; docs/sampling.md gives the order of the
 * steps. The defaults (cellm_request_default_params) are greedy decoding
 * with every penalty off. */
typedef struct cellm_sampling {
    float temperature; /* <= 0: greedy (the default) */
    int32_t top_k;     /* keep the k most likely tokens; <= 0: off */
    float top_p;       /* keep the fewest tokens holding this much probability; >= 1: off */
    float min_p;       /* drop tokens below min_p x the best one's probability; <= 0: off */
    uint64_t seed;     /* the same seed gives the same text, alone or batched */
    float typical_p;   /* locally typical sampling; >= 1: off (the default, 1) */
    /* Penalties look at a window of the sequence's last repeat_last_n
     * tokens, prompt included (as llama.cpp does). */
    float repeat_penalty;    /* CTRL style: positive logits / it, negative ones x it; 1: off */
    int32_t repeat_last_n;   /* window length; default 64; 0: no window; -1: the whole context */
    float presence_penalty;  /* subtracted once from each token in the window; 0: off */
    float frequency_penalty; /* subtracted per occurrence in the window; 0: off */
    /* Added to the logits before anything else. Copied at submit; tokens
     * must be in the vocabulary, biases numbers or -INFINITY. */
    const cellm_logit_bias *logit_bias;
    int32_t n_logit_bias; /* 0..CELLM_MAX_LOGIT_BIAS */
    /* The n-gram loop guard: when ngram_guard = n > 0, a token that would
     * complete an n-gram already seen ngram_guard_repeats times in the
     * window is banned, which stops the loops small models fall into.
     * Needs repeat_last_n >= n. Default off (0). With sampling, 4 with 2
     * repeats is the mild choice: 3 also bans a third use of a name or a
     * number from the prompt (docs/sampling.md measures both). */
    int32_t ngram_guard;
    int32_t ngram_guard_repeats; /* default 2 */
} cellm_sampling;

/* ----------------------------------------------------------- logprobs */

#define CELLM_MAX_TOP_LOGPROBS 20 /* cellm_request_params.top_logprobs at most */

/* A token and its log-probability (natural log). */
typedef struct cellm_top_logprob {
    int32_t token;
    float logprob;
} cellm_top_logprob;

/* The log-probability of one token of a request, and the most likely
 * alternatives at its position. The values are the model's own
 * distribution: log-softmax of the raw logits of the position before it,
 * taken before the logit bias, the penalties, the n-gram guard,
 * temperature and the truncations (top-k, top-p, min-p, typical-p), so
 * they do not depend on the sampling parameters. Computed the same way on
 * every CPU (a fixed order of double sums, cellm's own exp and log), and,
 * like the tokens, bit-identical whatever else is in the batch and however
 * many threads run. */
typedef struct cellm_token_logprob {
    int32_t token;
    int32_t pos;   /* its index in the request's tokens: the prompt's first, then the completion */
    int is_prompt; /* 1: a prompt token (prompt_logprobs); 0: a completion token */
    float logprob; /* <= 0; NAN for the first prompt token, which nothing precedes */
    int32_t n_top; /* entries in top: top_logprobs (0 for the first prompt token) */
    /* The n_top most likely tokens at this position, most likely first
     * (ties: the lower id first); the token itself may be among them, with
     * the same logprob bit for bit. Valid only during the callback. */
    const cellm_top_logprob *top;
} cellm_token_logprob;

/* Called on the engine thread with each token's log-probability, in the
 * order of the tokens: the prompt's (with prompt_logprobs) as their
 * positions are computed, then each completion token just before its text
 * goes to on_piece. A stop token that ends the request (EOS, end of turn,
 * stop_tokens) is not part of the completion and gets none, except with
 * prompt_logprobs, where it is the last report (is_prompt 0, pos the
 * completion's length past the prompt), as OpenAI's legacy completions
 * list "<|endoftext|>" and lm-evaluation-harness expects; the tokens of
 * a stop string do (their text is withheld). `lp` is valid only during
 * the call. Same rules as cellm_piece_fn. */
typedef void (*cellm_logprob_fn)(const cellm_token_logprob *lp, void *user);

/* ------------------------------------------------------ structured output */

/* A compiled grammar that constrains what a request may generate
 * (cellm_request_params.grammar): every completion token keeps the text a
 * prefix of a sentence of the grammar, and the end of text (EOS, end of
 * turn, stop_tokens) comes only where the sentence is whole. Immutable and
 * thread-safe once made; a request holds its own reference, so the caller
 * may free the grammar right after cellm_submit. docs/grammar.md gives the
 * dialect and the limits. */
typedef struct cellm_grammar cellm_grammar;

/* Compiles GBNF text (llama.cpp's dialect; the start rule is `root`).
 * CELLM_ERR_FORMAT, with cellm_last_error() naming the line and column or
 * the rule: a syntax error, an undefined rule, a left-recursive rule, a
 * rule that can never finish (an empty language), a grammar too large. */
cellm_status cellm_grammar_from_gbnf(const char *text, size_t len, cellm_grammar **out);

/* The grammar of OpenAI's json_object mode: one JSON object. */
cellm_status cellm_grammar_json_object(cellm_grammar **out);

/* Compiles a JSON Schema (UTF-8 JSON text) to a grammar of the JSON texts
 * that validate against it; docs/grammar.md lists the keywords honoured.
 * CELLM_ERR_FORMAT naming the problem (bad JSON, an unsupported keyword
 * value, an unresolvable $ref, a schema too large). */
cellm_status cellm_grammar_from_json_schema(const char *schema, size_t len, cellm_grammar **out);

/* Drops the caller's reference. */
void cellm_grammar_free(cellm_grammar *g);

/* ------------------------------------------------------------ tool calls */

#define CELLM_MAX_TOOLS 128 /* functions in one tools_json */

/* The grammar of a reply that is nothing but tool calls, in the format of
 * the model's family (read from its chat template: Hermes/Qwen
 * <tool_call> blocks, Llama 3 JSON, Mistral [TOOL_CALLS], else a bare
 * JSON call; the generic <tool_call> blocks for a template without tool
 * support): calls of the function `name` (NULL: of any tool in
 * tools_json), each with arguments valid for the function's `parameters`
 * JSON Schema; one call, or with `parallel` one or more. For OpenAI's
 * tool_choice "required" and a named function. CELLM_ERR_INVALID_ARG,
 * cellm_last_error() naming the tool: malformed tools, an unknown name,
 * a schema the compiler refuses. */
cellm_status cellm_grammar_tool_calls(const cellm_model *model, const char *tools_json,
                                      const char *name, int parallel, cellm_grammar **out);

/* Finds the tool calls in a model's reply text[0..len): Hermes/Qwen
 * <tool_call>{json}</tool_call> blocks, Llama 3 {"name", "parameters"}
 * (after <|python_tag|> or alone), Mistral [TOOL_CALLS][...], or a bare
 * JSON call or array of calls. *out gets a new NUL-terminated JSON
 * object (free it with free()): {"content": the text outside the calls
 * or null, "tool_calls": [{"name": "...", "arguments": "<JSON object as
 * a string>"}, ...]}. A reply with no call, a malformed call, or (with
 * tools_json, which may be NULL) a call of a function not among the
 * tools has "tool_calls": [] and all its text as content. Errors:
 * CELLM_ERR_INVALID_ARG (malformed tools_json), CELLM_ERR_NO_MEMORY.
 * Thread-safe. */
cellm_status cellm_tool_calls_parse(const char *text, size_t len, const char *tools_json,
                                    char **out);

#define CELLM_MAX_STOP_STRINGS 16 /* entries of cellm_request_params.stop */
#define CELLM_MAX_STOP_LEN 256    /* bytes of one stop string */

typedef struct cellm_image_embed cellm_image_embed; /* see "images" below */

#define CELLM_MAX_IMAGES 64        /* pictures in one request */
#define CELLM_MAX_IMAGE_ROWS 16384 /* their rows together, in one request */

typedef struct cellm_request_params {
    /* The input: exactly one of these three. A prompt is text continued as
     * is (special tokens recognised, BOS added where the model wants it);
     * messages are rendered with the model's chat template (see
     * cellm_model_params) with the assistant's turn opened; tokens are used
     * as given. */
    const char *prompt;
    const cellm_chat_message *messages;
    int32_t n_messages;
    const int32_t *tokens;
    int32_t n_tokens;

    cellm_sampling sampling;
    /* Completion tokens at most; < 0: until the context is full; 0: none
     * (the prompt is computed, for prompt_logprobs). Default 256. */
    int32_t max_tokens;
    const int32_t *stop_tokens; /* besides EOS (and the end-of-turn tokens for messages) */
    int32_t n_stop_tokens;      /* at most 16 */
    /* Stop strings (OpenAI's `stop`, llama.cpp's reverse prompts), copied
     * at submit: generation ends when one appears in the text, also across
     * token boundaries, and no byte of it reaches on_piece (the text ends
     * just before it; the tokens that made it are still counted). At most
     * CELLM_MAX_STOP_STRINGS, each 1..CELLM_MAX_STOP_LEN bytes. */
    const char *const *stop;
    int32_t n_stop;
    int32_t priority; /* higher runs first and is preempted last; default 0 */

    cellm_piece_fn on_piece; /* may be NULL */
    cellm_done_fn on_done;   /* may be NULL */
    void *user;              /* passed to all three callbacks */

    /* Log-probabilities, through on_logprob (see cellm_token_logprob).
     * Off by default; a request that asks for none costs nothing more.
     * logprobs = 1: each completion token's. top_logprobs: that many
     * alternatives per token, 0..CELLM_MAX_TOP_LOGPROBS. prompt_logprobs
     * = 1: also each prompt token's given the tokens before it (what
     * evaluation harnesses score). Those positions are then computed
     * rather than taken from the prefix cache, in chunks of at most the
     * engine's logit rows per step (max_seqs without speculation), and
     * not for a session's turn (CELLM_ERR_INVALID_ARG). Both need
     * on_logprob. */
    int logprobs;
    int32_t top_logprobs;
    int prompt_logprobs;
    cellm_logprob_fn on_logprob;

    /* Structured output: NULL, or a grammar the completion must follow
     * (see cellm_grammar). The request takes its own reference. */
    const cellm_grammar *grammar;

    /* Tool calls (docs/serve.md, "Tool calls"). messages_json: instead of
     * `messages`, the conversation as a JSON array of OpenAI chat
     * messages, which may hold assistant messages with `tool_calls` and
     * `role: "tool"` results (with `tool_call_id` and `name`); content a
     * string or null. tools_json: NULL, or a JSON array of OpenAI tool
     * objects ({"type": "function", "function": {"name", "description",
     * "parameters"}}, at most CELLM_MAX_TOOLS), for `messages` or
     * messages_json. The model's chat template renders both when it reads
     * `tools`; for one that does not, the tools go into a generic system
     * prompt that asks for <tool_call> blocks. Read at submit. Force a
     * call with cellm_grammar_tool_calls; find the calls in the reply with
     * cellm_tool_calls_parse. */
    const char *messages_json;
    const char *tools_json;

    /* Pictures (see cellm_image_encode): images[0 .. n_images), whose rows
     * replace, in order, the prompt's image tokens (the model's "<image>").
     * With `messages`, write "<image>" in a message's content where each
     * picture goes: the model's template lays it out and the library
     * expands it (cellm_image_prompt); with a prompt or tokens, put
     * cellm_image_prompt's text there yourself. The prompt must hold
     * exactly as many image tokens as the pictures have rows together,
     * each picture of the model's width, else CELLM_ERR_INVALID_ARG. The
     * rows are copied at submit: the caller may free its embeddings as
     * soon as cellm_submit returns. At most CELLM_MAX_IMAGES pictures and
     * CELLM_MAX_IMAGE_ROWS rows a request (the prompt's length bounds
     * them too). The prefix cache keys an image's rows by the content of
     * its embeddings, so the same picture in a repeated prompt is found
     * there and another picture is not. Not for a session's turn, nor
     * with messages_json or tools_json (CELLM_ERR_UNSUPPORTED); n_images
     * 0 (the default): none. */
    const cellm_image_embed *const *images;
    int32_t n_images;
} cellm_request_params;

cellm_request_params cellm_request_default_params(void);

/* Queues a request; *out gets its handle, which the caller owns and frees
 * with cellm_request_free(). The library copies what `params` points to
 * before returning. Thread-safe: any thread may submit at any time, also
 * from a callback. Tokenizing happens here, on the caller's thread.
 * Errors: CELLM_ERR_INVALID_ARG (no input or more than one, an empty or
 * over-long prompt, a bad token id, a sampling parameter, logit bias or
 * stop string out of range, images that do not match the prompt's image
 * tokens or the model's width), CELLM_ERR_UNSUPPORTED (messages for a
 * model whose chat template cellm cannot render, images for a model
 * without an <image> token), CELLM_ERR_FORMAT (the chat
 * template failed on these messages; the message names the construct
 * and its position), CELLM_ERR_NO_MEMORY (the prompt alone needs more KV
 * blocks than the engine has). */
cellm_status cellm_submit(cellm_engine *engine, const cellm_request_params *params,
                          cellm_request **out);

/* Asks the request to stop. It finishes as CELLM_FINISH_CANCELLED at the
 * start of the engine's next step (its KV blocks return to the pool then),
 * unless it has finished already. Thread-safe, callable from callbacks. */
cellm_status cellm_cancel(cellm_request *request);

/* Blocks until the request has finished and its done callback has
 * returned; copies the result to *result (may be NULL). Thread-safe; must
 * not be called from a callback. */
cellm_status cellm_wait(cellm_request *request, cellm_result *result);

/* Completion token ids so far, in *ids (owned by the request) and *n. Call
 * after cellm_wait (or from the request's own callbacks); valid until the
 * request is freed. */
cellm_status cellm_request_tokens(cellm_request *request, const int32_t **ids, int32_t *n);

/* Message of the request's error ("" unless it finished with
 * CELLM_FINISH_ERROR). Owned by the request; read it after cellm_wait. */
const char *cellm_request_error(const cellm_request *request);

/* Releases the caller's handle (NULL is fine). A request that has not
 * finished is cancelled first and this waits for it to finish, so no
 * callback of it runs after this returns. From a callback of the same
 * engine it does not wait: the request is cancelled, and freed when it
 * finishes. */
void cellm_request_free(cellm_request *request);

/* ------------------------------------------ model facts and text (serve) */

/* What a server or front-end shows about a model. Plain data, copied out. */
typedef struct cellm_model_info {
    char name[128];      /* general.name from the file, or "" */
    char arch[32];       /* "llama", "gemma3", ... */
    int32_t n_vocab;     /* token ids are 0..n_vocab-1 */
    int32_t n_ctx_train; /* the context the model was trained for; 0: unknown */
    int32_t bos, eos;    /* -1 when the model has none */
} cellm_model_info;

/* Fills *out. Thread-safe. */
cellm_status cellm_model_get_info(const cellm_model *model, cellm_model_info *out);

/* Flags of cellm_tokenize_ex. */
enum {
    CELLM_TOKENIZE_ADD_SPECIAL = 1u << 0,  /* add BOS (and EOS) where the model wants them */
    CELLM_TOKENIZE_PARSE_SPECIAL = 1u << 1 /* "<|im_start|>" in the text is its control token */
};

/* Like cellm_tokenize, for text[0..len) (any bytes; need not be
 * NUL-terminated) with the given flags. *ids is a new array the caller
 * frees with free() (NULL when *n is 0). Thread-safe. */
cellm_status cellm_tokenize_ex(const cellm_model *model, const char *text, size_t len,
                               unsigned flags, int32_t **ids, int32_t *n);

/* The text of ids[0..n) into a new NUL-terminated string *text (*len bytes
 * without the NUL; free it with free()). With `special`, control tokens
 * show as their text ("<|im_end|>"); without, they decode to nothing.
 * Errors: CELLM_ERR_INVALID_ARG for an id out of range. Thread-safe. */
cellm_status cellm_detokenize(const cellm_model *model, const int32_t *ids, int32_t n, int special,
                              char **text, size_t *len);

/* Positions one request may use in `engine` (prompt and completion). */
int32_t cellm_engine_n_ctx(const cellm_engine *engine);

/* ---------------------------------------------------------------- sessions */

/* A chat session: a conversation on one engine that keeps the KV cache of
 * its earlier turns, so a new message computes only its own tokens (and
 * those of the template around it) instead of the whole conversation.
 * Each turn is a request like any other (the same callbacks, result,
 * cancel, wait and free); the assistant's reply is added to the session's
 * history when the request finishes. The next turn renders the whole
 * history with the model's chat template and reuses the kept KV as far as
 * its tokens agree with the new rendering (a template that rewrites
 * earlier turns, or a reply cut by a stop string, costs a recompute from
 * the first token that differs). Kept blocks count against the engine's
 * budget; when blocks run short the engine drops them, least recently used
 * session first and before preempting any request (the next turn then
 * recomputes), and cellm_engine_trim drops them from CELLM_TRIM_MODERATE.
 *
 * A session runs one turn at a time. Its calls are not thread-safe against
 * each other: one thread at a time uses a session (any thread; the engine
 * thread's access is synchronised inside). */
typedef struct cellm_session cellm_session;

typedef struct cellm_session_params {
    const char *system;      /* the system message, copied; NULL (default): none */
    cellm_sampling sampling; /* each turn's sampling by default; logit_bias is copied */
    int32_t max_tokens;      /* each reply's limit by default; 256 */
} cellm_session_params;

cellm_session_params cellm_session_default_params(void);

/* Creates an empty session on `engine` (which must outlive it). `params`
 * may be NULL for the defaults. Thread-safe. Errors: CELLM_ERR_INVALID_ARG,
 * CELLM_ERR_UNSUPPORTED (the model has no chat template cellm can render),
 * CELLM_ERR_NO_MEMORY. */
cellm_status cellm_session_create(cellm_engine *engine, const cellm_session_params *params,
                                  cellm_session **out);

/* Request params for the session's next turn: the defaults of
 * cellm_request_default_params() with the session's sampling and
 * max_tokens. Set callbacks, stops or priority on it and pass it to
 * cellm_session_send. Its logit_bias points into the session. */
cellm_request_params cellm_session_request_params(const cellm_session *session);

/* Adds the user message `content` (copied) to the conversation and submits
 * the assistant's reply as a request: *out as from cellm_submit (the
 * caller owns it and frees it with cellm_request_free). `params` may be
 * NULL for cellm_session_request_params(session); its input fields
 * (prompt, messages, tokens) must be empty, since the session supplies the
 * conversation. When the request finishes, the text it streamed becomes
 * the assistant's message in the history; a turn that fails, or is
 * cancelled before its first token, leaves the history as it was.
 * Errors: those of cellm_submit (the history is then unchanged), and
 * CELLM_ERR_INVALID_ARG when the previous turn has not finished or the
 * conversation no longer fits the engine's context (max_ctx). */
cellm_status cellm_session_send(cellm_session *session, const char *content,
                                const cellm_request_params *params, cellm_request **out);

/* The conversation so far (system message first, if any), in *msgs (owned
 * by the session, valid until the next cellm_session_send or free) and *n.
 * Not while a turn runs (CELLM_ERR_INVALID_ARG), except from that turn's
 * done callback, where the reply is already in. */
cellm_status cellm_session_messages(cellm_session *session, const cellm_chat_message **msgs,
                                    int32_t *n);

/* A new session *out with the history, sampling and max_tokens of
 * `session` whose kept KV shares the blocks of `session` (no copy: a block
 * is copied only when one of the two writes into it), so both continue the
 * same conversation from here, each in its own way. Not while a turn of
 * `session` runs, nor from a callback of its engine. Thread-safe against
 * other sessions. Errors: CELLM_ERR_INVALID_ARG, CELLM_ERR_NO_MEMORY. */
cellm_status cellm_session_fork(cellm_session *session, cellm_session **out);

/* Saves the session to the file at `path` (replaced as a whole: written
 * aside, then renamed): its history, the tokens of its kept KV and the KV
 * blocks themselves, with the model's identity, the engine's KV layout and
 * a SHA-256 checksum, so that cellm_session_restore can resume the
 * conversation without recomputing it (after the app was killed, say).
 * A session whose kept KV was dropped saves its history only. Not while a
 * turn runs, nor from a callback. Errors: CELLM_ERR_INVALID_ARG,
 * CELLM_ERR_IO, CELLM_ERR_NO_MEMORY. */
cellm_status cellm_session_save(cellm_session *session, const char *path);

/* Creates *out from a file cellm_session_save wrote: the history and the
 * kept KV come from the file, the sampling and max_tokens from `params`
 * (NULL: defaults; its `system` is ignored). A file saved from another
 * model or by an engine with another KV layout, or one that is damaged or
 * truncated, is refused with a message that says which. Not from a
 * callback. Errors: CELLM_ERR_IO (cannot read), CELLM_ERR_CHECKSUM
 * (damaged or truncated), CELLM_ERR_FORMAT (not a session file, or one
 * from another model or KV layout),
 * CELLM_ERR_NO_MEMORY (also when the KV cache cannot hold the blocks now),
 * CELLM_ERR_INVALID_ARG, CELLM_ERR_UNSUPPORTED (no chat template). */
cellm_status cellm_session_restore(cellm_engine *engine, const char *path,
                                   const cellm_session_params *params, cellm_session **out);

/* Frees the session (NULL is fine) and gives its kept KV blocks back to the
 * engine. A turn still running is cancelled first and this waits for it
 * (from a callback it does not wait: the session is freed when its turn
 * has finished). The turn's request handle stays the caller's to free. */
void cellm_session_free(cellm_session *session);

/* ------------------------------------------------------------------ images */

/* A vision projector (llama.cpp's `mmproj` GGUF file) that turns pictures
 * into embeddings for a text model: SmolVLM / Idefics3's SigLIP encoder and
 * pixel-shuffle connector. Decoding image files is the application's job:
 * the library takes RGB8 pixels. Its weights are mapped, not copied. */
typedef struct cellm_mmproj cellm_mmproj;

typedef struct cellm_mmproj_params {
    int n_threads; /* threads that encode a picture; 0: 2 */
} cellm_mmproj_params;

cellm_mmproj_params cellm_mmproj_default_params(void);

/* Loads the projector at `path` for `model` (its embeddings must have the
 * model's width; NULL skips that check). Errors: CELLM_ERR_IO,
 * CELLM_ERR_FORMAT (malformed, or a text model's file given as the
 * projector), CELLM_ERR_UNSUPPORTED (another projector type),
 * CELLM_ERR_INVALID_ARG (a projector made for a model of another width).
 * Free with cellm_mmproj_free() before the model. */
cellm_status cellm_mmproj_load(const char *path, const cellm_model *model,
                               const cellm_mmproj_params *params, cellm_mmproj **out);

void cellm_mmproj_free(cellm_mmproj *mm);

/* A picture's embeddings: the rows that replace its image tokens in the
 * prompt, in order (the tiles row by row, then the whole picture), each
 * n_embd floats. Owned by the caller: free with cellm_image_embed_free(). */
struct cellm_image_embed {
    int32_t n_frames;         /* rows * cols tiles + the global image */
    int32_t rows, cols;       /* the tile grid; 0 x 0 for a picture of one tile */
    int32_t tokens_per_frame; /* image tokens each frame gives */
    int32_t n_tokens;         /* n_frames * tokens_per_frame */
    int32_t n_embd;           /* the text model's width */
    float *embd;              /* n_tokens x n_embd */
};

/* Encodes `pixels` (RGB8, `width` x `height`, rows of 3 * width bytes) as
 * the model's image processor prepares it (resize, tiles and a global
 * image, normalisation). Calls on one projector are serialised; use one
 * projector per thread to encode in parallel. Errors: CELLM_ERR_INVALID_ARG
 * (NULL pixels, a side outside 1..8192), CELLM_ERR_NO_MEMORY. */
cellm_status cellm_image_encode(cellm_mmproj *mm, const uint8_t *pixels, int32_t width,
                                int32_t height, cellm_image_embed **out);

void cellm_image_embed_free(cellm_image_embed *e);

/* The prompt text that stands for picture `e` where a chat template
 * writes "<image>", as Idefics3's processor expands it: per tile
 * "<fake_token_around_image><row_R_col_C>" and tokens_per_frame
 * "<image>" tokens, a newline after each row of tiles, then
 * "\n<fake_token_around_image><global-img>", the global image's
 * "<image>" tokens and "<fake_token_around_image>". Tokenized with
 * special tokens parsed, it has exactly e->n_tokens image tokens, whose
 * rows are e->embd in order. *text is new; free() it. */
cellm_status cellm_image_prompt(const cellm_image_embed *e, char **text);

#ifdef __cplusplus
}
#endif

#endif /* CELLM_H */
