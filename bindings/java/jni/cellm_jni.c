/*
 * cellm_jni.c — the JNI glue under the Java binding (bindings/java/src,
 * package org.cellm): the native methods of org.cellm.Native, over the
 * public header only. Built into libcellm_jni, which holds the library too,
 * so an app ships this one shared object.
 *
 * Rules it keeps:
 *  - No native failure escapes as a crash: every failing call throws
 *    org.cellm.CellmException with the cellm_status and the library's
 *    message, and every JNI call that can fail is checked.
 *  - Strings cross as UTF-8 byte arrays (Java encodes and decodes them), not
 *    through GetStringUTFChars, whose "modified UTF-8" differs from UTF-8
 *    for emoji and NUL.
 *  - Callbacks come on the engine thread, which the JVM did not start: it is
 *    attached (as a daemon) on its first callback and detached when it
 *    exits, through a pthread key's destructor.
 *  - Each request is a jreq that holds a global reference to its Java
 *    Generation; cellm_request_free, which returns only after the last
 *    callback, comes before the reference is deleted and the jreq freed.
 *  - Calls that wait for the engine (await, frees) are refused from inside
 *    a callback, where waiting would deadlock the engine thread.
 */
#include <jni.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cellm.h"

static JavaVM *g_vm;
static jclass g_exc_class;   /* org.cellm.CellmException */
static jmethodID g_exc_ctor; /* CellmException(int status, byte[] utf8Message) */
static jmethodID g_on_piece; /* Generation.onNativePiece(byte[]) */
static jmethodID g_on_done;  /* Generation.onNativeDone(int, int, int, int, int) */
static pthread_key_t g_detach_key;

/* jreqs allocated and not yet freed (each holds one global reference): the
 * test checks it is back to 0 once everything is closed. */
static atomic_long g_live_requests;

/* Set while this thread runs a request callback. */
static _Thread_local int tl_in_callback;

/* One request: what its callbacks need. `req` is set once cellm_submit has
 * returned; a cancel asked before that is remembered in `cancelled`. */
typedef struct jreq {
    _Atomic(cellm_request *) req;
    atomic_int cancelled;
    jobject gen; /* global reference to the org.cellm.Generation */
} jreq;

/* ---------------------------------------------------------------- errors */

/* Throws CellmException(status, msg) unless an exception is already pending
 * (an OutOfMemoryError from the JVM, which then reaches Java instead). */
static void throw_msg(JNIEnv *env, int status, const char *msg) {
    if ((*env)->ExceptionCheck(env)) return;
    size_t len = strlen(msg);
    jbyteArray bytes = (*env)->NewByteArray(env, (jsize)len);
    if (!bytes) return;
    (*env)->SetByteArrayRegion(env, bytes, 0, (jsize)len, (const jbyte *)msg);
    jobject exc = (*env)->NewObject(env, g_exc_class, g_exc_ctor, (jint)status, bytes);
    if (exc) (*env)->Throw(env, (jthrowable)exc);
}

/* Throws for a failed cellm call, with the calling thread's last error. */
static void throw_status(JNIEnv *env, cellm_status st) {
    const char *msg = cellm_last_error();
    throw_msg(env, (int)st, msg && *msg ? msg : cellm_status_str(st));
}

/* True (and throws) when called from a callback, where `what` must not be. */
static int refuse_in_callback(JNIEnv *env, const char *what) {
    if (!tl_in_callback) return 0;
    char msg[160];
    snprintf(msg, sizeof msg,
             "%s cannot be called from a TokenListener (it runs on the engine thread); call "
             "cancel() there instead",
             what);
    throw_msg(env, CELLM_ERR_INVALID_ARG, msg);
    return 1;
}

/* A NUL-terminated copy of a byte array (UTF-8 text) in *out (NULL for a
 * null array). Returns 0 and throws on a NUL byte inside or no memory. */
static int copy_text(JNIEnv *env, jbyteArray a, const char *what, char **out) {
    *out = NULL;
    if (!a) return 1;
    jsize n = (*env)->GetArrayLength(env, a);
    char *s = malloc((size_t)n + 1);
    if (!s) {
        throw_msg(env, CELLM_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    (*env)->GetByteArrayRegion(env, a, 0, n, (jbyte *)s);
    s[n] = '\0';
    if (memchr(s, '\0', (size_t)n)) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s contains a NUL character", what);
        free(s);
        throw_msg(env, CELLM_ERR_INVALID_ARG, msg);
        return 0;
    }
    *out = s;
    return 1;
}

/* Copies of the byte arrays in `arr` (a byte[][]), *n of them, into a new
 * array *out; frees with free_texts. Returns 0 and throws on failure. */
static int copy_texts(JNIEnv *env, jobjectArray arr, const char *what, char ***out, int32_t *n) {
    *out = NULL;
    *n = 0;
    if (!arr) return 1;
    jsize len = (*env)->GetArrayLength(env, arr);
    char **v = calloc(len > 0 ? (size_t)len : 1, sizeof *v);
    if (!v) {
        throw_msg(env, CELLM_ERR_NO_MEMORY, "out of memory");
        return 0;
    }
    for (jsize i = 0; i < len; i++) {
        jbyteArray a = (jbyteArray)(*env)->GetObjectArrayElement(env, arr, i);
        int ok = a != NULL && copy_text(env, a, what, &v[i]);
        if (a) (*env)->DeleteLocalRef(env, a);
        if (!ok) {
            if (!a) throw_msg(env, CELLM_ERR_INVALID_ARG, "a null string in a list");
            for (jsize j = 0; j < i; j++) free(v[j]);
            free(v);
            return 0;
        }
    }
    *out = v;
    *n = (int32_t)len;
    return 1;
}

static void free_texts(char **v, int32_t n) {
    for (int32_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

static jbyteArray new_bytes(JNIEnv *env, const char *s, size_t n) {
    jbyteArray a = (*env)->NewByteArray(env, (jsize)n);
    if (a) (*env)->SetByteArrayRegion(env, a, 0, (jsize)n, (const jbyte *)s);
    return a;
}

/* ------------------------------------------------------------- callbacks */

static void detach_thread(void *vm) {
    (*(JavaVM *)vm)->DetachCurrentThread((JavaVM *)vm);
}

/* The JNIEnv of the calling thread, attaching it (as a daemon, so it never
 * holds the JVM open) when the JVM does not know it yet; NULL on failure. */
static JNIEnv *callback_env(void) {
    JNIEnv *env = NULL;
    if ((*g_vm)->GetEnv(g_vm, (void **)&env, JNI_VERSION_1_6) == JNI_OK) return env;
    JavaVMAttachArgs args = {JNI_VERSION_1_6, "cellm-engine", NULL};
#ifdef __ANDROID__
    if ((*g_vm)->AttachCurrentThreadAsDaemon(g_vm, &env, &args) != JNI_OK) return NULL;
#else
    if ((*g_vm)->AttachCurrentThreadAsDaemon(g_vm, (void **)&env, &args) != JNI_OK) return NULL;
#endif
    pthread_setspecific(g_detach_key, g_vm);
    return env;
}

static void jreq_cancel(jreq *r) {
    atomic_store(&r->cancelled, 1);
    cellm_request *req = atomic_load(&r->req);
    if (req) cellm_cancel(req);
}

/* A Java exception from a callback (the Java side catches the listener's,
 * so this is the JVM's own, such as OutOfMemoryError): it must not stay
 * pending on the engine thread; the request is cancelled instead. */
static void callback_check(JNIEnv *env, jreq *r) {
    if ((*env)->ExceptionCheck(env)) {
        (*env)->ExceptionClear(env);
        jreq_cancel(r);
    }
}

static void on_piece(const char *piece, size_t len, void *user) {
    jreq *r = user;
    JNIEnv *env = callback_env();
    if (!env) {
        jreq_cancel(r);
        return;
    }
    tl_in_callback = 1;
    jbyteArray a = new_bytes(env, piece, len);
    if (a) {
        (*env)->CallVoidMethod(env, r->gen, g_on_piece, a);
        (*env)->DeleteLocalRef(env, a);
    }
    callback_check(env, r);
    tl_in_callback = 0;
}

static void on_done(const cellm_result *res, void *user) {
    jreq *r = user;
    JNIEnv *env = callback_env();
    if (!env) return;
    tl_in_callback = 1;
    (*env)->CallVoidMethod(env, r->gen, g_on_done, (jint)res->finish_reason, (jint)res->status,
                           (jint)res->n_prompt_tokens, (jint)res->n_completion_tokens,
                           (jint)res->n_cached_tokens);
    if ((*env)->ExceptionCheck(env)) (*env)->ExceptionClear(env);
    tl_in_callback = 0;
}

/* ------------------------------------------------------------ the natives */

static jbyteArray n_version(JNIEnv *env, jclass cls) {
    (void)cls;
    const char *v = cellm_version();
    return new_bytes(env, v, strlen(v));
}

static jlong n_model_load(JNIEnv *env, jclass cls, jbyteArray path, jbyteArray tpl) {
    (void)cls;
    char *p = NULL, *t = NULL;
    cellm_model *m = NULL;
    if (!path) {
        throw_msg(env, CELLM_ERR_INVALID_ARG, "the model path is null");
        return 0;
    }
    if (copy_text(env, path, "the model path", &p) &&
        copy_text(env, tpl, "the chat template", &t)) {
        cellm_model_params mp = cellm_model_default_params();
        mp.chat_template = t;
        cellm_status st = cellm_model_load(p, &mp, &m);
        if (st != CELLM_OK) throw_status(env, st);
    }
    free(p);
    free(t);
    return (jlong)(intptr_t)m;
}

static void n_model_free(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    if (refuse_in_callback(env, "Model.close()")) return;
    cellm_model_free((cellm_model *)(intptr_t)h);
}

static jlong n_engine_create(JNIEnv *env, jclass cls, jlong model, jint threads, jlong budget,
                             jint max_ctx, jint max_seqs) {
    (void)cls;
    cellm_engine_params p = cellm_engine_default_params();
    p.n_threads = threads;
    if (budget < 0) {
        throw_msg(env, CELLM_ERR_INVALID_ARG, "the memory budget is negative");
        return 0;
    }
    if (budget > 0) p.mem_budget_bytes = (size_t)budget;
    p.max_ctx = max_ctx;
    if (max_seqs != 0) p.max_seqs = max_seqs;
    cellm_engine *e = NULL;
    cellm_status st = cellm_engine_create((const cellm_model *)(intptr_t)model, &p, &e);
    if (st != CELLM_OK) throw_status(env, st);
    return (jlong)(intptr_t)e;
}

static void n_engine_free(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    if (refuse_in_callback(env, "Engine.close()")) return;
    cellm_engine_free((cellm_engine *)(intptr_t)h);
}

static jlong n_engine_trim(JNIEnv *env, jclass cls, jlong h, jint level) {
    (void)cls;
    size_t released = 0;
    cellm_status st =
        cellm_engine_trim((cellm_engine *)(intptr_t)h, (cellm_trim_level)level, &released);
    if (st != CELLM_OK) throw_status(env, st);
    return (jlong)released;
}

/* Sampling and limits from the Java GenerationOptions, flattened:
 * ints = {maxTokens, topK}, floats = {temperature, topP, minP,
 * repeatPenalty}. */
static int read_options(JNIEnv *env, jintArray ints, jfloatArray floats, jlong seed,
                        cellm_sampling *s, int32_t *max_tokens) {
    if (!ints || !floats || (*env)->GetArrayLength(env, ints) != 2 ||
        (*env)->GetArrayLength(env, floats) != 4) {
        throw_msg(env, CELLM_ERR_INVALID_ARG, "malformed generation options");
        return 0;
    }
    jint iv[2];
    jfloat fv[4];
    (*env)->GetIntArrayRegion(env, ints, 0, 2, iv);
    (*env)->GetFloatArrayRegion(env, floats, 0, 4, fv);
    *max_tokens = iv[0];
    s->top_k = iv[1];
    s->temperature = fv[0];
    s->top_p = fv[1];
    s->min_p = fv[2];
    s->repeat_penalty = fv[3];
    s->seed = (uint64_t)seed;
    return 1;
}

/* Submits a request for `gen`: a prompt, messages (roles[i], contents[i])
 * or, with `session`, a turn whose user message is `prompt`. Returns the
 * jreq (0 after throwing). */
static jlong n_submit(JNIEnv *env, jclass cls, jlong engine, jlong session, jobject gen,
                      jbyteArray prompt, jobjectArray roles, jobjectArray contents, jintArray ints,
                      jfloatArray floats, jlong seed, jobjectArray stop) {
    (void)cls;
    char *text = NULL, **role = NULL, **content = NULL, **stops = NULL;
    int32_t n_role = 0, n_content = 0, n_stop = 0;
    cellm_chat_message *msgs = NULL;
    jreq *r = NULL;
    jlong out = 0;
    cellm_request_params p = session
                                 ? cellm_session_request_params((cellm_session *)(intptr_t)session)
                                 : cellm_request_default_params();
    if (!gen) {
        throw_msg(env, CELLM_ERR_INVALID_ARG, "no Generation");
        return 0;
    }
    if (!read_options(env, ints, floats, seed, &p.sampling, &p.max_tokens) ||
        !copy_text(env, prompt, "the prompt", &text) ||
        !copy_texts(env, roles, "a role", &role, &n_role) ||
        !copy_texts(env, contents, "a message", &content, &n_content) ||
        !copy_texts(env, stop, "a stop string", &stops, &n_stop))
        goto done;
    if (n_role != n_content) {
        throw_msg(env, CELLM_ERR_INVALID_ARG, "roles and contents differ in number");
        goto done;
    }
    if (n_role > 0) {
        msgs = calloc((size_t)n_role, sizeof *msgs);
        if (!msgs) {
            throw_msg(env, CELLM_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        for (int32_t i = 0; i < n_role; i++) msgs[i] = (cellm_chat_message){role[i], content[i]};
        p.messages = msgs;
        p.n_messages = n_role;
    }
    if (!session) p.prompt = text;
    p.stop = (const char *const *)stops;
    p.n_stop = n_stop;
    r = calloc(1, sizeof *r);
    if (!r || !(r->gen = (*env)->NewGlobalRef(env, gen))) {
        throw_msg(env, CELLM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    atomic_init(&r->req, NULL);
    atomic_init(&r->cancelled, 0);
    atomic_fetch_add(&g_live_requests, 1);
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = r;
    cellm_request *req = NULL;
    cellm_status st = session
                          ? cellm_session_send((cellm_session *)(intptr_t)session, text, &p, &req)
                          : cellm_submit((cellm_engine *)(intptr_t)engine, &p, &req);
    if (st != CELLM_OK) {
        throw_status(env, st);
        goto done;
    }
    atomic_store(&r->req, req);
    /* A callback that cancelled before the handle was known. */
    if (atomic_load(&r->cancelled)) cellm_cancel(req);
    out = (jlong)(intptr_t)r;
    r = NULL;
done:
    if (r) {
        if (r->gen) {
            (*env)->DeleteGlobalRef(env, r->gen);
            atomic_fetch_sub(&g_live_requests, 1);
        }
        free(r);
    }
    free(msgs);
    free(text);
    free_texts(role, n_role);
    free_texts(content, n_content);
    free_texts(stops, n_stop);
    return out;
}

static void n_cancel(JNIEnv *env, jclass cls, jlong h) {
    (void)env;
    (void)cls;
    if (h) jreq_cancel((jreq *)(intptr_t)h);
}

/* Waits for the request; returns {finish_reason, status, n_prompt_tokens,
 * n_completion_tokens, n_cached_tokens}. */
static jintArray n_await(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    if (refuse_in_callback(env, "Generation.await()")) return NULL;
    jreq *r = (jreq *)(intptr_t)h;
    cellm_result res;
    cellm_status st = cellm_wait(atomic_load(&r->req), &res);
    if (st != CELLM_OK) {
        throw_status(env, st);
        return NULL;
    }
    jint v[5] = {(jint)res.finish_reason, (jint)res.status, res.n_prompt_tokens,
                 res.n_completion_tokens, res.n_cached_tokens};
    jintArray a = (*env)->NewIntArray(env, 5);
    if (a) (*env)->SetIntArrayRegion(env, a, 0, 5, v);
    return a;
}

static jbyteArray n_request_error(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    const char *msg = cellm_request_error(atomic_load(&((jreq *)(intptr_t)h)->req));
    return new_bytes(env, msg, strlen(msg));
}

static void n_request_free(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    if (refuse_in_callback(env, "Generation.close()")) return;
    jreq *r = (jreq *)(intptr_t)h;
    if (!r) return;
    cellm_request_free(atomic_load(&r->req)); /* no callback of it runs after this */
    (*env)->DeleteGlobalRef(env, r->gen);
    free(r);
    atomic_fetch_sub(&g_live_requests, 1);
}

static jlong n_live_requests(JNIEnv *env, jclass cls) {
    (void)env;
    (void)cls;
    return (jlong)atomic_load(&g_live_requests);
}

static jlong n_session_create(JNIEnv *env, jclass cls, jlong engine, jbyteArray system,
                              jintArray ints, jfloatArray floats, jlong seed) {
    (void)cls;
    cellm_session_params p = cellm_session_default_params();
    char *sys = NULL;
    cellm_session *s = NULL;
    if (read_options(env, ints, floats, seed, &p.sampling, &p.max_tokens) &&
        copy_text(env, system, "the system prompt", &sys)) {
        p.system = sys;
        cellm_status st = cellm_session_create((cellm_engine *)(intptr_t)engine, &p, &s);
        if (st != CELLM_OK) throw_status(env, st);
    }
    free(sys);
    return (jlong)(intptr_t)s;
}

static void n_session_free(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    if (refuse_in_callback(env, "ChatSession.close()")) return;
    cellm_session_free((cellm_session *)(intptr_t)h);
}

/* The conversation as {role0, content0, role1, content1, ...}. */
static jobjectArray n_session_messages(JNIEnv *env, jclass cls, jlong h) {
    (void)cls;
    const cellm_chat_message *m;
    int32_t n;
    cellm_status st = cellm_session_messages((cellm_session *)(intptr_t)h, &m, &n);
    if (st != CELLM_OK) {
        throw_status(env, st);
        return NULL;
    }
    jclass bytes_class = (*env)->FindClass(env, "[B");
    if (!bytes_class) return NULL;
    jobjectArray out = (*env)->NewObjectArray(env, 2 * n, bytes_class, NULL);
    for (int32_t i = 0; out && i < 2 * n; i++) {
        const char *s = i % 2 ? m[i / 2].content : m[i / 2].role;
        jbyteArray a = new_bytes(env, s, strlen(s));
        if (!a) return NULL;
        (*env)->SetObjectArrayElement(env, out, i, a);
        (*env)->DeleteLocalRef(env, a);
    }
    return out;
}

static const JNINativeMethod g_natives[] = {
    {"version", "()[B", (void *)n_version},
    {"modelLoad", "([B[B)J", (void *)n_model_load},
    {"modelFree", "(J)V", (void *)n_model_free},
    {"engineCreate", "(JIJII)J", (void *)n_engine_create},
    {"engineFree", "(J)V", (void *)n_engine_free},
    {"engineTrim", "(JI)J", (void *)n_engine_trim},
    {"submit", "(JJLorg/cellm/Generation;[B[[B[[B[I[FJ[[B)J", (void *)n_submit},
    {"cancel", "(J)V", (void *)n_cancel},
    {"await", "(J)[I", (void *)n_await},
    {"requestError", "(J)[B", (void *)n_request_error},
    {"requestFree", "(J)V", (void *)n_request_free},
    {"liveRequests", "()J", (void *)n_live_requests},
    {"sessionCreate", "(J[B[I[FJ)J", (void *)n_session_create},
    {"sessionFree", "(J)V", (void *)n_session_free},
    {"sessionMessages", "(J)[[B", (void *)n_session_messages},
};

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM *vm, void *reserved) {
    (void)reserved;
    JNIEnv *env;
    if ((*vm)->GetEnv(vm, (void **)&env, JNI_VERSION_1_6) != JNI_OK) return JNI_ERR;
    g_vm = vm;
    jclass exc = (*env)->FindClass(env, "org/cellm/CellmException");
    jclass gen = (*env)->FindClass(env, "org/cellm/Generation");
    jclass nat = (*env)->FindClass(env, "org/cellm/Native");
    if (!exc || !gen || !nat) return JNI_ERR;
    g_exc_class = (*env)->NewGlobalRef(env, exc);
    g_exc_ctor = (*env)->GetMethodID(env, exc, "<init>", "(I[B)V");
    g_on_piece = (*env)->GetMethodID(env, gen, "onNativePiece", "([B)V");
    g_on_done = (*env)->GetMethodID(env, gen, "onNativeDone", "(IIIII)V");
    if (!g_exc_class || !g_exc_ctor || !g_on_piece || !g_on_done) return JNI_ERR;
    if ((*env)->RegisterNatives(env, nat, g_natives,
                                (jint)(sizeof g_natives / sizeof g_natives[0])) != 0)
        return JNI_ERR;
    if (pthread_key_create(&g_detach_key, detach_thread) != 0) return JNI_ERR;
    return JNI_VERSION_1_6;
}
