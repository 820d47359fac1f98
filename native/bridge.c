/*
 * bridge.c - streamtts's small C layer over llama.cpp's C API (llama.h).
 *
 * Why a bridge at all: the Python side feeds the backbone *embedding rows* (the
 * summed text + audio embeddings of MOSS-TTS-Delay), one row per stream and tick,
 * each with its own sequence id and position, and reads back the final hidden
 * state and a few logit columns of the rows it asked for. Doing that through
 * llama.h directly from ctypes would mean mirroring llama_batch and the (large,
 * version-dependent) parameter structs in Python. Here it is a handful of plain
 * functions with int32/float pointers.
 *
 * Rules this file keeps:
 *   - no allocation on the decode path: the llama_batch and every scratch array
 *     are sized for n_batch rows when the context is created; a decode points the
 *     batch at the caller's arrays (no copy of the embeddings);
 *   - never abort the process on bad input: every argument is validated, and the
 *     conditions llama.cpp would assert on (sequence positions that do not
 *     continue the KV cache, too many rows, ...) are rejected with a message;
 *   - every failure is a negative status code plus a message (stt_last_error for
 *     a context, an out buffer for stt_create), including the last ERROR line
 *     llama.cpp logged, captured by our log callback.
 *
 * Threading: one stt_ctx must be used by one thread at a time. Different
 * contexts may be used from different threads. The log capture is process-wide
 * and guarded by a mutex.
 */

#define _GNU_SOURCE /* dladdr */
#include <llama.h>
#include <ggml.h>
#include <ggml-backend.h>
#include <ggml-cpu.h>

#include <dlfcn.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stt.h"

#ifdef __linux__
#include <sched.h>
typedef cpu_set_t stt_cpus; /* a thread's CPUs (pinned threads, below) */
#else
typedef int stt_cpus;
#endif


#ifndef STT_LLAMA_SOURCE
#define STT_LLAMA_SOURCE "unknown source"
#endif

/* ---- status codes (returned as negative int32; 0 or a count means success) ---- */

enum {
    STT_OK        = 0,
    STT_E_INVALID = -1, /* bad argument, rejected before llama.cpp saw it; context unchanged */
    STT_E_NO_SLOT = -2, /* no room in the KV cache (llama_decode returned 1, or our check) */
    STT_E_ABORTED = -3, /* llama_decode returned 2 (abort callback) */
    STT_E_BATCH   = -4, /* llama_decode returned -1: llama.cpp rejected the batch */
    STT_E_FATAL   = -5, /* llama_decode returned < -1: compute failed */
    STT_E_OUTPUT  = -6, /* llama.cpp had no hidden state / logits for an output row */
    STT_E_MODEL   = -7, /* stt_create: the model file could not be loaded */
    STT_E_CONTEXT = -8, /* stt_create: the llama context could not be created */
    STT_E_NOMEM   = -9, /* allocation failed */
};

/* ---- creation parameters: stt_params, in stt.h ---- */
#define PLACE_MSG 2048 /* llama.cpp's placement lines of one load (see g_place) */

struct stt_ctx {
    struct llama_model   *model;
    struct llama_context *lctx;
    llama_memory_t        mem;
    ggml_threadpool_t     threadpool; /* NULL unless params.poll >= 0 */
    int32_t               main_cpu;   /* the CPU stt_pin_caller gives the decoding thread, -1: none */
    stt_cpus              caller_cpus; /* the decoding thread's CPUs before stt_pin_caller pinned it */
    int32_t               caller_pinned;

    int32_t n_embd, n_vocab, n_ctx, n_ctx_seq, n_seq_max, n_batch;
    int32_t n_threads_max; /* the most threads a decode may use (the threadpool's size) */
    int32_t kv_unified;
    int32_t embeddings_on; /* last value given to llama_set_embeddings */

    /* preallocated for n_batch rows; stt_decode only fills/points them */
    struct llama_batch batch;
    int32_t       *n_seq_id;  /* [n_batch], all 1 */
    llama_seq_id **seq_ptr;   /* [n_batch], pointers into the caller's seq_id array */
    int32_t       *out_rows;  /* [n_batch], batch row of each output of the last decode */
    int32_t        n_out;     /* outputs of the last successful decode */

    /* per-sequence scratch for the position check, [n_seq_max] each */
    int32_t  *seq_next;  /* position the next row of this sequence must have */
    int32_t  *seq_start; /* first cell position the sequence will hold after the batch */
    uint32_t *seq_mark;  /* == mark when the entry is valid for the current call */
    uint32_t  mark;

    int32_t *cols;  /* selected logit columns (NULL = all) */
    int32_t  n_cols;
    /* the selection as runs of consecutive columns: run r copies run_len[r] floats from
     * column run_src[r] to run_dst[r] (the fused heads' 32 x 1025 audio block is one run) */
    int32_t *run_src, *run_dst, *run_len;
    int32_t  n_runs;

    /* the outputs of a decode, looked up before they are copied (llama.cpp's lookups sync
     * the backend and are not for several threads): [n_batch] each */
    const float **hidden_rows, **logit_rows;
    stt_pool *pool; /* the tick's threads the copy is cut across (stt_set_pool), or NULL */

    char placement[PLACE_MSG]; /* llama.cpp's placement lines of this context's load */

    char err[1536];
};

/* ---- llama.cpp log capture ----------------------------------------------------------- */

/* The last few ERROR messages, oldest overwritten first. A failure usually logs a
 * chain ("gguf: invalid magic" -> "error loading model" -> "failed to load model");
 * the whole chain since the call started goes into the bridge's message. */
#define LOG_RING 6
#define LOG_MSG  512

static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;
static char            g_log_ring[LOG_RING][LOG_MSG];
static uint64_t        g_log_error_seq;      /* number of ERROR messages so far */
static int             g_log_prev_level;     /* level of the previous line (for CONT) */
static int             g_log_forward = 0;    /* STREAMTTS_LLAMA_LOG: 1 forward INFO+ to stderr, 2 also DEBUG */
static pthread_once_t  g_init_once = PTHREAD_ONCE_INIT;
/* While stt_create loads a model: llama.cpp's lines saying where it put the layers and how
 * big each buffer is ("offloaded 3/3 layers to GPU", "Vulkan0 model buffer size = ...");
 * stt_placement hands them to the caller, who reports the device from what llama.cpp did
 * rather than from what it asked for. One load at a time fills it (creates are rare). */
static char            g_place[PLACE_MSG];
static int             g_place_on;

static void place_capture(const char *text) {
    if (!g_place_on || (strstr(text, "offloaded ") == NULL && strstr(text, " buffer size = ") == NULL)) return;
    size_t used = strlen(g_place);
    snprintf(g_place + used, PLACE_MSG - used, "%s", text);
}

static void stt_log_cb(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    if (text == NULL) return;
    pthread_mutex_lock(&g_log_mu);
    int eff = (level == GGML_LOG_LEVEL_CONT) ? g_log_prev_level : (int)level;
    if (eff == GGML_LOG_LEVEL_ERROR) {
        if (level == GGML_LOG_LEVEL_CONT && g_log_error_seq > 0) {
            char *cur = g_log_ring[(g_log_error_seq - 1) % LOG_RING];
            size_t used = strlen(cur);
            snprintf(cur + used, LOG_MSG - used, "%s", text);
        } else {
            snprintf(g_log_ring[g_log_error_seq % LOG_RING], LOG_MSG, "%s", text);
            g_log_error_seq++;
        }
    }
    g_log_prev_level = eff;
    place_capture(text);
    /* 1: INFO and above; 2: DEBUG too */
    if (g_log_forward >= 2 || (g_log_forward == 1 && eff != GGML_LOG_LEVEL_DEBUG)) {
        fputs(text, stderr);
    }
    pthread_mutex_unlock(&g_log_mu);
}

static uint64_t log_error_seq(void) {
    pthread_mutex_lock(&g_log_mu);
    uint64_t s = g_log_error_seq;
    pthread_mutex_unlock(&g_log_mu);
    return s;
}

/* Join the ERROR messages llama.cpp logged after `since` (at most the last LOG_RING,
 * trailing newlines dropped, "; " between them) into dst; returns how many. */
static int log_errors_since(uint64_t since, char *dst, size_t n) {
    int count = 0;
    if (n == 0) return 0;
    dst[0] = '\0';
    pthread_mutex_lock(&g_log_mu);
    uint64_t first = since;
    if (g_log_error_seq > LOG_RING && first < g_log_error_seq - LOG_RING) first = g_log_error_seq - LOG_RING;
    for (uint64_t k = first; k < g_log_error_seq; k++) {
        char msg[LOG_MSG];
        snprintf(msg, sizeof msg, "%s", g_log_ring[k % LOG_RING]);
        size_t len = strlen(msg);
        while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' ' || msg[len - 1] == '\r')) msg[--len] = '\0';
        if (len == 0) continue;
        size_t used = strlen(dst);
        snprintf(dst + used, n - used, "%s%s", count ? "; " : "", msg);
        count++;
    }
    pthread_mutex_unlock(&g_log_mu);
    return count;
}

/* The CPU backend's threadpool functions, looked up through its registry entry: in a
 * GGML_BACKEND_DL build (the wheel) the CPU backend is a module loaded at run time
 * (libggml-cpu-<variant>.so), not a library the bridge links against. */
typedef ggml_threadpool_t (*stt_tp_new_fn)(struct ggml_threadpool_params *);
typedef void (*stt_tp_free_fn)(ggml_threadpool_t);
static stt_tp_new_fn  g_tp_new;
static stt_tp_free_fn g_tp_free;
static char           g_cpu_backend[1024]; /* file of the CPU backend in use */

/* A GGML_BACKEND_DL build registers no backend by itself: load them (the best CPU variant
 * this CPU runs, GPU backends that initialise) from the bridge's own folder, where the build
 * puts them. A build with the backends linked in has the CPU device already. */
static void load_backends(void) {
    Dl_info info;
    if (ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU) == NULL) {
        char dir[1024] = "";
        if (dladdr((void *)&load_backends, &info) != 0 && info.dli_fname != NULL) {
            snprintf(dir, sizeof dir, "%s", info.dli_fname);
            char *slash = strrchr(dir, '/');
            if (slash != NULL) *slash = '\0'; else dir[0] = '\0';
        }
        ggml_backend_load_all_from_path(dir[0] != '\0' ? dir : NULL);
    }
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == NULL) return; /* stt_create says so when it needs the CPU threadpool */
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    g_tp_new  = (stt_tp_new_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
    g_tp_free = (stt_tp_free_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_free");
    if (g_tp_new != NULL && dladdr((void *)g_tp_new, &info) != 0 && info.dli_fname != NULL) {
        snprintf(g_cpu_backend, sizeof g_cpu_backend, "%s", info.dli_fname);
    }
}

static void stt_init_once(void) {
    const char *env = getenv("STREAMTTS_LLAMA_LOG");
    g_log_forward = (env != NULL && (env[0] == '1' || env[0] == '2')) ? env[0] - '0' : 0;
    llama_log_set(stt_log_cb, NULL); /* also sets ggml's callback */
    llama_backend_init();
    load_backends();
}

/* ---- small helpers --------------------------------------------------------------------- */

static void set_err(struct stt_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(struct stt_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

/* Append " (llama.cpp: <last error>)" to the context's message if llama.cpp logged one. */
static void append_llama_error(struct stt_ctx *c, uint64_t since) {
    char msg[1024];
    if (log_errors_since(since, msg, sizeof msg) > 0) {
        size_t used = strlen(c->err);
        snprintf(c->err + used, sizeof c->err - used, " (llama.cpp: %s)", msg);
    }
}

static void out_err(char *buf, int32_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void out_err(char *buf, int32_t len, const char *fmt, ...) {
    if (buf == NULL || len <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)len, fmt, ap);
    va_end(ap);
}

/* ---- parameters ---------------------------------------------------------------------- */

STT_API void stt_params_default(stt_params *p) {
    if (p == NULL) return;
    memset(p, 0, sizeof *p);
    p->struct_size     = (int32_t)sizeof *p;
    p->n_ctx           = 4096;
    p->n_batch         = 512;
    p->n_ubatch        = 0;
    p->n_seq_max       = 1;
    p->n_threads       = 0;
    p->n_threads_batch = 0;
    p->n_gpu_layers    = 0;
    p->type_k          = -1;
    p->type_v          = -1;
    p->flash_attn      = -1;
    p->kv_unified      = 0;
    p->embeddings      = 1;
    p->poll            = -1;
    p->use_mmap        = 1;
    p->pin_threads     = 0;
}

STT_API size_t stt_sizeof_params(void) { return sizeof(stt_params); }

/* The size check of the Python code before stt_sizeof_params (branches not merged yet load
 * this library too); nothing in this tree calls it: remove once none is left. */
STT_API int32_t stt_params_size(void) { return (int32_t)sizeof(stt_params); }

/* ---- pinned threads ---------------------------------------------------------------------- */

/* Why: llama.cpp's CPU threads meet at a spinning barrier after every op of the graph. A
 * worker the kernel wakes onto the core the decoding thread is spinning on waits there while
 * another core idles (it is "cache hot", so not moved at once): on a 2-vCPU machine 0.7-2 % of
 * two-thread decodes of the tiny demo model took 10-35 ms instead of 0.2 ms, both threads
 * taking turns on one core in 4 ms slices (docs/perf.md). Pinned to different cores they
 * cannot meet. */

#ifdef __linux__
/* Fill tpp's mask with the first n allowed CPUs (ggml gives workers 1..n-1 one each in order
 * and the decoding thread, worker 0, the n-th: *main_cpu). 0 when fewer than n are allowed. */
static int pin_mask(struct ggml_threadpool_params *tpp, int n, int32_t *main_cpu, stt_cpus *saved) {
    if (n < 2 || pthread_getaffinity_np(pthread_self(), sizeof *saved, saved) != 0) return 0;
    int cpus[GGML_MAX_N_THREADS];
    int k = 0;
    for (int cpu = 0; cpu < GGML_MAX_N_THREADS && cpu < CPU_SETSIZE && k < n; cpu++) {
        if (CPU_ISSET(cpu, saved)) cpus[k++] = cpu;
    }
    if (k < n) return 0;
    for (int i = 0; i < n; i++) tpp->cpumask[cpus[i]] = true;
    tpp->strict_cpu = true;
    *main_cpu = cpus[n - 1];
    return 1;
}

/* ggml pins the thread that creates a pool to worker 0's CPU: the creator is not the decoding
 * thread (that one calls stt_pin_caller), so it gets its CPUs back. */
static void unpin_creator(const stt_cpus *saved) {
    pthread_setaffinity_np(pthread_self(), sizeof *saved, saved);
}

static int32_t pin_caller(struct stt_ctx *c, int32_t on) {
    if (!on) {
        if (c->caller_pinned) pthread_setaffinity_np(pthread_self(), sizeof c->caller_cpus, &c->caller_cpus);
        c->caller_pinned = 0;
        return -1;
    }
    if (!c->caller_pinned &&
        pthread_getaffinity_np(pthread_self(), sizeof c->caller_cpus, &c->caller_cpus) != 0) return -1;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(c->main_cpu, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) return -1;
    c->caller_pinned = 1;
    return c->main_cpu;
}
#else
static int pin_mask(struct ggml_threadpool_params *tpp, int n, int32_t *main_cpu, stt_cpus *saved) {
    (void)tpp; (void)n; (void)main_cpu; (void)saved;
    return 0;
}
static void unpin_creator(const stt_cpus *saved) { (void)saved; }
static int32_t pin_caller(struct stt_ctx *c, int32_t on) { (void)c; (void)on; return -1; }
#endif

/* ---- create / free --------------------------------------------------------------------- */

STT_API void stt_free(struct stt_ctx *c);

/* Load the model and create a context. On failure returns NULL, sets *status (if not NULL)
 * to STT_E_INVALID / STT_E_MODEL / STT_E_CONTEXT / STT_E_NOMEM and writes a message to err. */
STT_API struct stt_ctx *stt_create(const char *model_path, const stt_params *p,
                                   int32_t *status, char *err, int32_t err_len) {
    int32_t dummy;
    if (status == NULL) status = &dummy;
    *status = STT_OK;
    if (err != NULL && err_len > 0) err[0] = '\0';
    pthread_once(&g_init_once, stt_init_once);

    if (model_path == NULL || p == NULL) {
        *status = STT_E_INVALID;
        out_err(err, err_len, "model_path and params must not be NULL");
        return NULL;
    }
    if (p->struct_size != (int32_t)sizeof(stt_params)) {
        *status = STT_E_INVALID;
        out_err(err, err_len, "stt_params size mismatch: caller %d bytes, library %d bytes "
                "(the Python side and the bridge are from different versions; rebuild with native/build.sh)",
                p->struct_size, (int)sizeof(stt_params));
        return NULL;
    }
    if (p->n_ctx < 1 || p->n_batch < 1 || p->n_seq_max < 1 ||
        p->n_seq_max > (int32_t)llama_max_parallel_sequences()) {
        *status = STT_E_INVALID;
        out_err(err, err_len, "invalid sizes: n_ctx=%d n_batch=%d n_seq_max=%d (need n_ctx >= 1, "
                "n_batch >= 1, 1 <= n_seq_max <= %d)", p->n_ctx, p->n_batch, p->n_seq_max,
                (int)llama_max_parallel_sequences());
        return NULL;
    }
    /* a type id must exist and not be one of the removed ones (block size 0) */
    const int bad_k = p->type_k >= GGML_TYPE_COUNT || (p->type_k >= 0 && ggml_blck_size((enum ggml_type)p->type_k) == 0);
    const int bad_v = p->type_v >= GGML_TYPE_COUNT || (p->type_v >= 0 && ggml_blck_size((enum ggml_type)p->type_v) == 0);
    if (p->flash_attn < -1 || p->flash_attn > 1 || bad_k || bad_v || p->poll > 100) {
        *status = STT_E_INVALID;
        out_err(err, err_len, "invalid option: flash_attn=%d type_k=%d type_v=%d poll=%d",
                p->flash_attn, p->type_k, p->type_v, p->poll);
        return NULL;
    }

    struct stt_ctx *c = calloc(1, sizeof *c);
    if (c == NULL) {
        *status = STT_E_NOMEM;
        out_err(err, err_len, "out of memory");
        return NULL;
    }
    c->main_cpu = -1;

    uint64_t log_mark = log_error_seq();
    char llama_msg[1024];
    pthread_mutex_lock(&g_log_mu);
    g_place[0] = '\0';
    g_place_on = 1;
    pthread_mutex_unlock(&g_log_mu);

    /* model */
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = p->n_gpu_layers;
    if (!p->use_mmap) mp.load_mode = LLAMA_LOAD_MODE_NONE; /* else llama.cpp's default */
    c->model = llama_model_load_from_file(model_path, mp);
    if (c->model == NULL) {
        *status = STT_E_MODEL;
        if (log_errors_since(log_mark, llama_msg, sizeof llama_msg)) {
            out_err(err, err_len, "failed to load model %s: %s", model_path, llama_msg);
        } else {
            out_err(err, err_len, "failed to load model %s", model_path);
        }
        stt_free(c);
        return NULL;
    }

    /* context */
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx      = (uint32_t)p->n_ctx;
    cp.n_batch    = (uint32_t)p->n_batch;
    cp.n_ubatch   = (uint32_t)(p->n_ubatch > 0 ? p->n_ubatch : p->n_batch);
    cp.n_seq_max  = (uint32_t)p->n_seq_max;
    if (p->n_threads > 0) cp.n_threads = p->n_threads;
    cp.n_threads_batch = p->n_threads_batch > 0 ? p->n_threads_batch : cp.n_threads;
    if (p->type_k >= 0) cp.type_k = (enum ggml_type)p->type_k;
    if (p->type_v >= 0) cp.type_v = (enum ggml_type)p->type_v;
    cp.flash_attn_type = (enum llama_flash_attn_type)p->flash_attn;
    cp.kv_unified   = p->kv_unified != 0;
    cp.embeddings   = p->embeddings != 0;
    cp.pooling_type = LLAMA_POOLING_TYPE_NONE; /* per-row hidden states, never pooled */
    cp.no_perf      = true;
    c->lctx = llama_init_from_model(c->model, cp);
    if (c->lctx == NULL) {
        *status = STT_E_CONTEXT;
        if (log_errors_since(log_mark, llama_msg, sizeof llama_msg)) {
            out_err(err, err_len, "failed to create a llama context for %s (n_ctx=%d n_batch=%d "
                    "n_seq_max=%d type_k=%d type_v=%d flash_attn=%d): %s", model_path, p->n_ctx,
                    p->n_batch, p->n_seq_max, p->type_k, p->type_v, p->flash_attn, llama_msg);
        } else {
            out_err(err, err_len, "failed to create a llama context for %s", model_path);
        }
        stt_free(c);
        return NULL;
    }
    c->embeddings_on = cp.embeddings ? 1 : 0;
    pthread_mutex_lock(&g_log_mu);
    snprintf(c->placement, sizeof c->placement, "%s", g_place);
    g_place_on = 0;
    pthread_mutex_unlock(&g_log_mu);

    c->n_threads_max = (int32_t)(cp.n_threads_batch > cp.n_threads ? cp.n_threads_batch : cp.n_threads);

    /* optional: our own CPU threadpool, so its polling level is ours to choose */
    if (p->poll >= 0) {
        int n_pool = (int)cp.n_threads;
        if ((int)cp.n_threads_batch > n_pool) n_pool = (int)cp.n_threads_batch;
        if (g_tp_new == NULL || g_tp_free == NULL) {
            *status = STT_E_CONTEXT;
            out_err(err, err_len, "no CPU backend with a threadpool (ggml_threadpool_new) was "
                    "loaded; is a libggml-cpu*.so next to the bridge?");
            stt_free(c);
            return NULL;
        }
        struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_pool);
        tpp.poll = (uint32_t)p->poll;
        stt_cpus creator;
        int pinned = p->pin_threads ? pin_mask(&tpp, n_pool, &c->main_cpu, &creator) : 0;
        c->threadpool = g_tp_new(&tpp);
        if (pinned) unpin_creator(&creator);
        if (c->threadpool == NULL) {
            *status = STT_E_CONTEXT;
            out_err(err, err_len, "failed to create a ggml threadpool of %d threads", n_pool);
            stt_free(c);
            return NULL;
        }
        /* one pool for both: a decode uses n_threads or n_threads_batch of its workers */
        llama_attach_threadpool(c->lctx, c->threadpool, c->threadpool);
    }

    c->mem        = llama_get_memory(c->lctx);
    c->n_embd     = llama_model_n_embd(c->model);
    c->n_vocab    = llama_vocab_n_tokens(llama_model_get_vocab(c->model));
    c->n_ctx      = (int32_t)llama_n_ctx(c->lctx);
    c->n_ctx_seq  = (int32_t)llama_n_ctx_seq(c->lctx);
    c->n_seq_max  = (int32_t)llama_n_seq_max(c->lctx);
    c->n_batch    = (int32_t)llama_n_batch(c->lctx);
    c->kv_unified = p->kv_unified != 0;
    if (c->n_batch > p->n_batch) c->n_batch = p->n_batch; /* never accept more than asked */
    if (c->mem == NULL) {
        *status = STT_E_CONTEXT;
        out_err(err, err_len, "the llama context of %s has no memory (KV cache)", model_path);
        stt_free(c);
        return NULL;
    }

    /* everything the decode path needs, once */
    size_t nb = (size_t)c->n_batch, ns = (size_t)c->n_seq_max;
    c->n_seq_id  = malloc(nb * sizeof *c->n_seq_id);
    c->seq_ptr   = malloc(nb * sizeof *c->seq_ptr);
    c->out_rows  = malloc(nb * sizeof *c->out_rows);
    c->hidden_rows = malloc(nb * sizeof *c->hidden_rows);
    c->logit_rows  = malloc(nb * sizeof *c->logit_rows);
    c->seq_next  = malloc(ns * sizeof *c->seq_next);
    c->seq_start = malloc(ns * sizeof *c->seq_start);
    c->seq_mark  = calloc(ns, sizeof *c->seq_mark);
    if (!c->n_seq_id || !c->seq_ptr || !c->out_rows || !c->seq_next || !c->seq_start || !c->seq_mark ||
        !c->hidden_rows || !c->logit_rows) {
        *status = STT_E_NOMEM;
        out_err(err, err_len, "out of memory");
        stt_free(c);
        return NULL;
    }
    for (size_t i = 0; i < nb; i++) c->n_seq_id[i] = 1;
    memset(&c->batch, 0, sizeof c->batch);
    c->batch.token    = NULL; /* embeddings, not token ids */
    c->batch.n_seq_id = c->n_seq_id;
    c->batch.seq_id   = c->seq_ptr;
    c->n_out = 0;
    return c;
}

/* Free everything; NULL is ignored. Order: context, then its threadpool, then the model. */
STT_API void stt_free(struct stt_ctx *c) {
    if (c == NULL) return;
    if (c->lctx != NULL) {
        if (c->threadpool != NULL) llama_detach_threadpool(c->lctx);
        llama_free(c->lctx);
    }
    if (c->threadpool != NULL) g_tp_free(c->threadpool);
    if (c->model != NULL) llama_model_free(c->model);
    free(c->n_seq_id);
    free(c->seq_ptr);
    free(c->out_rows);
    free(c->seq_next);
    free(c->seq_start);
    free(c->seq_mark);
    free(c->hidden_rows);
    free(c->logit_rows);
    free(c->cols);
    free(c->run_src);
    free(c->run_dst);
    free(c->run_len);
    free(c);
}

/* ---- decode ---------------------------------------------------------------------------- */

/* Check the rows before llama.cpp sees them. llama.cpp requires, per sequence, that the
 * batch's positions continue the cache (first = pos_max + 1) without gaps; we require the
 * stricter and simpler rule that a sequence's rows come in batch order at consecutive
 * positions. Also checks the per-sequence capacity when each sequence has its own cells. */
static int32_t validate_rows(struct stt_ctx *c, int32_t n_rows, const int32_t *pos,
                             const int32_t *seq_id) {
    c->mark++;
    if (c->mark == 0) { /* wrapped: make every entry stale */
        memset(c->seq_mark, 0, (size_t)c->n_seq_max * sizeof *c->seq_mark);
        c->mark = 1;
    }
    for (int32_t i = 0; i < n_rows; i++) {
        const int32_t s = seq_id[i];
        if (s < 0 || s >= c->n_seq_max) {
            set_err(c, "row %d: sequence id %d out of range [0, %d)", i, s, c->n_seq_max);
            return STT_E_INVALID;
        }
        if (pos[i] < 0) {
            set_err(c, "row %d: negative position %d (sequence %d)", i, pos[i], s);
            return STT_E_INVALID;
        }
        if (c->seq_mark[s] != c->mark) {
            /* first row of this sequence in the batch */
            const llama_pos pmax = llama_memory_seq_pos_max(c->mem, s);
            if (pmax >= 0 && pos[i] != pmax + 1) {
                set_err(c, "row %d: sequence %d continues at position %d, but its KV cache holds "
                        "positions up to %d (expected %d; seq_rm the sequence to restart it)",
                        i, s, pos[i], (int)pmax, (int)pmax + 1);
                return STT_E_INVALID;
            }
            c->seq_start[s] = pmax >= 0 ? llama_memory_seq_pos_min(c->mem, s) : pos[i];
            c->seq_mark[s]  = c->mark;
        } else if (pos[i] != c->seq_next[s]) {
            set_err(c, "row %d: sequence %d has position %d after position %d in the same batch "
                    "(positions of a sequence must be consecutive in batch order)",
                    i, s, pos[i], c->seq_next[s] - 1);
            return STT_E_INVALID;
        }
        c->seq_next[s] = pos[i] + 1;
        if (!c->kv_unified && pos[i] - c->seq_start[s] + 1 > c->n_ctx_seq) {
            set_err(c, "row %d: sequence %d is full: position %d would make it hold %d cells, "
                    "more than n_ctx_seq = %d (seq_rm it or use a larger n_ctx)",
                    i, s, pos[i], pos[i] - c->seq_start[s] + 1, c->n_ctx_seq);
            return STT_E_NO_SLOT;
        }
    }
    return STT_OK;
}

/* Decode n_rows embedding rows.
 *   embd     [n_rows * n_embd] float32, row-major
 *   pos      [n_rows] position of each row in its sequence
 *   seq_id   [n_rows] sequence of each row, in [0, n_seq_max)
 *   output   [n_rows] non-zero: return this row's hidden state / logits
 *   hidden_out  NULL, or [n_out * n_embd]: final hidden state (after the last RMSNorm) of
 *               each output row, in batch order. NULL turns llama.cpp's embeddings off for
 *               this call, so only the marked rows are computed through the output layer.
 *   logits_out  NULL, or [n_out * n_cols]: the selected logit columns of each output row
 *               (all n_vocab columns when no selection is set).
 * Returns the number of output rows (>= 0) or a negative status (message: stt_last_error).
 * A rejected call leaves the KV cache unchanged. */
STT_API int32_t stt_decode_ex(struct stt_ctx *c, int32_t n_rows, const float *embd,
                              const int32_t *pos, const int32_t *seq_id, const int8_t *output,
                              float *hidden_out, float *logits_out, int32_t out_capacity);

STT_API int32_t stt_decode(struct stt_ctx *c, int32_t n_rows, const float *embd,
                           const int32_t *pos, const int32_t *seq_id, const int8_t *output,
                           float *hidden_out, float *logits_out) {
    /* the caller vouches that its output buffers hold every marked row */
    return stt_decode_ex(c, n_rows, embd, pos, seq_id, output, hidden_out, logits_out, INT32_MAX);
}

/* Copying a decode's outputs into the caller's buffers: at 128 streams with the fused
 * heads 128 rows of 32 802 floats (17 MB) a tick, all of it on the engine thread before
 * sampling can start. Rows go whole (memcpy) or as runs of consecutive columns, and with a
 * pool (stt_set_pool) in chunks on the tick's threads. */
typedef struct {
    const struct stt_ctx *c;
    float *hidden_out, *logits_out;
    int32_t n_out, chunk;
} copy_call;

static int32_t copy_chunk(void *vp, int32_t ci) {
    const copy_call *a = vp;
    const struct stt_ctx *c = a->c;
    const int32_t lo = ci * a->chunk, hi = lo + a->chunk < a->n_out ? lo + a->chunk : a->n_out;
    for (int32_t j = lo; j < hi; j++) {
        if (a->hidden_out != NULL)
            memcpy(a->hidden_out + (size_t)j * (size_t)c->n_embd, c->hidden_rows[j], (size_t)c->n_embd * sizeof(float));
        if (a->logits_out == NULL) continue;
        const float *l = c->logit_rows[j];
        if (c->cols == NULL) {
            memcpy(a->logits_out + (size_t)j * (size_t)c->n_vocab, l, (size_t)c->n_vocab * sizeof(float));
            continue;
        }
        float *dst = a->logits_out + (size_t)j * (size_t)c->n_cols;
        for (int32_t r = 0; r < c->n_runs; r++)
            memcpy(dst + c->run_dst[r], l + c->run_src[r], (size_t)c->run_len[r] * sizeof(float));
    }
    return 0;
}

#define COPY_MIN_ROWS 32 /* below this, waking the pool costs more than the copy (tick_pool.py MIN_ROWS) */

static void copy_outputs(const struct stt_ctx *c, int32_t n_out, float *hidden_out, float *logits_out) {
    if (n_out <= 0 || (hidden_out == NULL && logits_out == NULL)) return;
    stt_pool *p = n_out >= COPY_MIN_ROWS ? c->pool : NULL; /* NULL: all on this thread */
    int32_t chunk = stt_pool_copy_chunk(p, n_out), rcs[STT_POOL_COPY_CHUNKS];
    copy_call a = {c, hidden_out, logits_out, n_out, chunk};
    stt_pool_run(p, (n_out + chunk - 1) / chunk, copy_chunk, &a, rcs);
}

/* The tick's threads (native/pool.c) stt_decode cuts its output copy across (NULL: none).
 * The pool must outlive its use here: set NULL before freeing it. */
STT_API void stt_set_pool(struct stt_ctx *c, stt_pool *pool) {
    if (c != NULL) c->pool = pool;
}

/* stt_decode with a bound on the output buffers: a batch marking more than out_capacity
 * rows as outputs is rejected before anything is decoded (when hidden_out or logits_out is
 * given), so a wrong output flag can never write past the caller's buffers. */
static int32_t decode_rows(struct stt_ctx *c, int32_t n_rows, const float *embd,
                           const int32_t *pos, const int32_t *seq_id, const int8_t *output,
                           float *hidden_out, float *logits_out, int32_t out_capacity,
                           float **lent);

STT_API int32_t stt_decode_ex(struct stt_ctx *c, int32_t n_rows, const float *embd,
                              const int32_t *pos, const int32_t *seq_id, const int8_t *output,
                              float *hidden_out, float *logits_out, int32_t out_capacity) {
    return decode_rows(c, n_rows, embd, pos, seq_id, output, hidden_out, logits_out, out_capacity, NULL);
}

/* stt_decode_ex that lends the logits rather than copying them, when it can: *lent is then
 * llama.cpp's own output rows (output j at *lent + j * n_vocab, as logits_out would hold
 * it), to be read (and written: the sampler masks a column in place) until the next decode
 * on this context. It can when the whole row is selected and llama.cpp holds the outputs
 * in batch order, one after another; otherwise *lent is NULL and the logits are copied into
 * logits_out as stt_decode_ex copies them. Why: with the fused heads on a GPU, 128 rows of
 * 32 802 floats (17 MB) a tick went from llama.cpp's buffer into the caller's before
 * sampling could start, a copy that memory bandwidth, not threads, bounds. */
STT_API int32_t stt_decode_lend(struct stt_ctx *c, int32_t n_rows, const float *embd,
                                const int32_t *pos, const int32_t *seq_id, const int8_t *output,
                                float *hidden_out, float *logits_out, int32_t out_capacity,
                                float **lent) {
    if (lent == NULL) return STT_E_INVALID;
    *lent = NULL;
    return decode_rows(c, n_rows, embd, pos, seq_id, output, hidden_out, logits_out, out_capacity, lent);
}

/* The outputs of the last decode's lookups as one block of whole rows, or NULL. */
static float *lendable(const struct stt_ctx *c, int32_t n_out) {
    const int whole = c->cols == NULL || (c->n_runs == 1 && c->run_src[0] == 0 && c->run_dst[0] == 0 &&
                                          c->run_len[0] == c->n_vocab);
    if (!whole || n_out < 1) return NULL;
    const float *base = c->logit_rows[0];
    for (int32_t j = 1; j < n_out; j++)
        if (c->logit_rows[j] != base + (size_t)j * (size_t)c->n_vocab) return NULL;
    return (float *)base; /* llama_get_logits_ith hands out float *: the rows are writable */
}

static int32_t decode_rows(struct stt_ctx *c, int32_t n_rows, const float *embd,
                           const int32_t *pos, const int32_t *seq_id, const int8_t *output,
                           float *hidden_out, float *logits_out, int32_t out_capacity,
                           float **lent) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    c->n_out = 0;
    if (n_rows < 1 || n_rows > c->n_batch) {
        set_err(c, "n_rows = %d, must be in [1, n_batch = %d]", n_rows, c->n_batch);
        return STT_E_INVALID;
    }
    if (embd == NULL || pos == NULL || seq_id == NULL || output == NULL) {
        set_err(c, "embd, pos, seq_id and output must not be NULL");
        return STT_E_INVALID;
    }
    int32_t rc = validate_rows(c, n_rows, pos, seq_id);
    if (rc != STT_OK) return rc;

    int32_t n_out = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        if (output[i]) c->out_rows[n_out++] = i;
    }
    if (n_out > out_capacity && (hidden_out != NULL || logits_out != NULL)) {
        set_err(c, "%d rows are marked as outputs but the output buffers have room for %d",
                n_out, out_capacity < 0 ? 0 : out_capacity);
        return STT_E_INVALID;
    }

    /* Hidden states need llama.cpp's embeddings mode, which marks every row as an output
     * (the output layer then runs for all rows). Only turn it on when it is needed. */
    const int32_t want_embd = (hidden_out != NULL && n_out > 0) ? 1 : 0;
    if (want_embd != c->embeddings_on) {
        llama_set_embeddings(c->lctx, want_embd != 0);
        c->embeddings_on = want_embd;
    }

    /* point the preallocated batch at the caller's arrays (llama.h has no const here,
     * llama.cpp only reads them) */
    for (int32_t i = 0; i < n_rows; i++) c->seq_ptr[i] = (llama_seq_id *)&seq_id[i];
    c->batch.n_tokens = n_rows;
    c->batch.embd     = (float *)embd;
    c->batch.pos      = (llama_pos *)pos;
    c->batch.logits   = (int8_t *)output;

    const uint64_t log_mark = log_error_seq();
    const int32_t ret = llama_decode(c->lctx, c->batch);
    if (ret != 0) {
        switch (ret) {
        case 1:
            set_err(c, "no KV cache slot for a batch of %d rows (n_ctx = %d, n_ctx_seq = %d; "
                    "free finished sequences with seq_rm or raise n_ctx)", n_rows, c->n_ctx,
                    c->n_ctx_seq);
            rc = STT_E_NO_SLOT;
            break;
        case 2:
            set_err(c, "decode aborted (llama_decode returned 2)");
            rc = STT_E_ABORTED;
            break;
        case -1:
            set_err(c, "llama.cpp rejected the batch (llama_decode returned -1)");
            rc = STT_E_BATCH;
            break;
        default:
            set_err(c, "llama_decode failed with code %d (compute error; rows already processed "
                    "stay in the KV cache - check seq_pos_max)", ret);
            rc = ret < 0 ? STT_E_FATAL : STT_E_BATCH;
            break;
        }
        append_llama_error(c, log_mark);
        return rc;
    }

    /* the outputs the caller asked for, in batch order: looked up here, copied after */
    for (int32_t j = 0; j < n_out; j++) {
        const int32_t row = c->out_rows[j];
        if (hidden_out != NULL) {
            c->hidden_rows[j] = llama_get_embeddings_ith(c->lctx, row);
            if (c->hidden_rows[j] == NULL) {
                set_err(c, "llama.cpp returned no hidden state for row %d", row);
                append_llama_error(c, log_mark);
                return STT_E_OUTPUT;
            }
        }
        if (logits_out != NULL) {
            c->logit_rows[j] = llama_get_logits_ith(c->lctx, row);
            if (c->logit_rows[j] == NULL) {
                set_err(c, "llama.cpp returned no logits for row %d", row);
                append_llama_error(c, log_mark);
                return STT_E_OUTPUT;
            }
        }
    }
    if (lent != NULL && logits_out != NULL) {
        *lent = lendable(c, n_out);
        if (*lent != NULL) logits_out = NULL; /* read where they lie: nothing to copy */
    }
    copy_outputs(c, n_out, hidden_out, logits_out);
    c->n_out = n_out;
    return n_out;
}

/* Select the logit columns stt_decode copies (n = 0 or cols = NULL: all n_vocab columns).
 * Not for the hot path: it allocates. */
STT_API int32_t stt_set_logit_columns(struct stt_ctx *c, const int32_t *cols, int32_t n) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (n < 0 || (n > 0 && cols == NULL)) {
        set_err(c, "invalid column selection (n = %d)", n);
        return STT_E_INVALID;
    }
    for (int32_t k = 0; k < n; k++) {
        if (cols[k] < 0 || cols[k] >= c->n_vocab) {
            set_err(c, "logit column %d (index %d) out of range [0, %d)", cols[k], k, c->n_vocab);
            return STT_E_INVALID;
        }
    }
    int32_t *copy = NULL, *rs = NULL, *rd = NULL, *rl = NULL, n_runs = 0;
    if (n > 0) {
        copy = malloc((size_t)n * sizeof *copy);
        rs = malloc((size_t)n * sizeof *rs);
        rd = malloc((size_t)n * sizeof *rd);
        rl = malloc((size_t)n * sizeof *rl);
        if (copy == NULL || rs == NULL || rd == NULL || rl == NULL) {
            free(copy), free(rs), free(rd), free(rl);
            set_err(c, "out of memory");
            return STT_E_NOMEM;
        }
        memcpy(copy, cols, (size_t)n * sizeof *copy);
        for (int32_t k = 0; k < n; k++) { /* runs of consecutive columns */
            if (n_runs && cols[k] == rs[n_runs - 1] + rl[n_runs - 1]) {
                rl[n_runs - 1]++;
            } else {
                rs[n_runs] = cols[k], rd[n_runs] = k, rl[n_runs] = 1;
                n_runs++;
            }
        }
    }
    free(c->cols), free(c->run_src), free(c->run_dst), free(c->run_len);
    c->cols = copy;
    c->n_cols = n;
    c->run_src = rs, c->run_dst = rd, c->run_len = rl;
    c->n_runs = n_runs;
    return STT_OK;
}

/* Columns each logits_out row of stt_decode holds. */
STT_API int32_t stt_n_logit_columns(const struct stt_ctx *c) {
    if (c == NULL) return STT_E_INVALID;
    return c->cols != NULL ? c->n_cols : c->n_vocab;
}

/* Copy the full logits row (n_vocab floats) of output i of the last successful decode. */
STT_API int32_t stt_copy_logits_row(struct stt_ctx *c, int32_t i, float *dst) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (dst == NULL) {
        set_err(c, "dst must not be NULL");
        return STT_E_INVALID;
    }
    if (i < 0 || i >= c->n_out) {
        set_err(c, "output %d out of range: the last decode returned %d outputs", i, c->n_out);
        return STT_E_INVALID;
    }
    const uint64_t log_mark = log_error_seq();
    const float *l = llama_get_logits_ith(c->lctx, c->out_rows[i]);
    if (l == NULL) {
        set_err(c, "llama.cpp returned no logits for output %d", i);
        append_llama_error(c, log_mark);
        return STT_E_OUTPUT;
    }
    memcpy(dst, l, (size_t)c->n_vocab * sizeof(float));
    return STT_OK;
}

/* ---- KV cache ---------------------------------------------------------------------------- */

/* Remove the cells of sequence seq at positions >= p0, every cell when p0 <= 0 (they become
 * free for any sequence). */
STT_API int32_t stt_seq_rm(struct stt_ctx *c, int32_t seq, int32_t p0) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (seq < 0 || seq >= c->n_seq_max) {
        set_err(c, "sequence id %d out of range [0, %d)", seq, c->n_seq_max);
        return STT_E_INVALID;
    }
    if (!llama_memory_seq_rm(c->mem, seq, p0 > 0 ? p0 : -1, -1)) {
        set_err(c, "llama.cpp could not remove sequence %d from position %d", seq, p0 > 0 ? p0 : 0);
        return STT_E_FATAL;
    }
    c->n_out = 0;
    return STT_OK;
}

/* Largest position sequence seq holds, -1 when empty, into *pos_out. */
STT_API int32_t stt_seq_pos_max(struct stt_ctx *c, int32_t seq, int32_t *pos_out) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (pos_out == NULL || seq < 0 || seq >= c->n_seq_max) {
        set_err(c, "sequence id %d out of range [0, %d)", seq, c->n_seq_max);
        return STT_E_INVALID;
    }
    *pos_out = llama_memory_seq_pos_max(c->mem, seq);
    return STT_OK;
}

/* Bytes a snapshot of sequence seq's KV cells takes (llama_state_seq_get_size), into *size_out. */
STT_API int32_t stt_seq_state_size(struct stt_ctx *c, int32_t seq, uint64_t *size_out) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (size_out == NULL || seq < 0 || seq >= c->n_seq_max) {
        set_err(c, "sequence id %d out of range [0, %d)", seq, c->n_seq_max);
        return STT_E_INVALID;
    }
    *size_out = (uint64_t)llama_state_seq_get_size(c->lctx, seq);
    return STT_OK;
}

/* Snapshot sequence seq's KV cells (positions, K and V) into dst; *written = bytes used.
 * The prefix cache keeps these to start later sequences without recomputing the prefix. */
STT_API int32_t stt_seq_state_get(struct stt_ctx *c, int32_t seq, uint8_t *dst, uint64_t capacity,
                                  uint64_t *written) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (seq < 0 || seq >= c->n_seq_max) {
        set_err(c, "sequence id %d out of range [0, %d)", seq, c->n_seq_max);
        return STT_E_INVALID;
    }
    if (dst == NULL || written == NULL) {
        set_err(c, "null buffer");
        return STT_E_INVALID;
    }
    const uint64_t log_mark = log_error_seq();
    const size_t n = llama_state_seq_get_data(c->lctx, dst, (size_t)capacity, seq);
    if (n == 0) {
        set_err(c, "llama.cpp could not snapshot sequence %d into %llu bytes", seq,
                (unsigned long long)capacity);
        append_llama_error(c, log_mark);
        return STT_E_FATAL;
    }
    *written = (uint64_t)n;
    return STT_OK;
}

/* Load a snapshot made by stt_seq_state_get into sequence seq, which must be empty. */
STT_API int32_t stt_seq_state_set(struct stt_ctx *c, int32_t seq, const uint8_t *src, uint64_t size) {
    if (c == NULL) return STT_E_INVALID;
    c->err[0] = '\0';
    if (seq < 0 || seq >= c->n_seq_max) {
        set_err(c, "sequence id %d out of range [0, %d)", seq, c->n_seq_max);
        return STT_E_INVALID;
    }
    if (src == NULL || size == 0) {
        set_err(c, "empty snapshot");
        return STT_E_INVALID;
    }
    if (llama_memory_seq_pos_max(c->mem, seq) >= 0) {
        set_err(c, "sequence %d is not empty (seq_rm it before loading a snapshot)", seq);
        return STT_E_INVALID;
    }
    const uint64_t log_mark = log_error_seq();
    if (llama_state_seq_set_data(c->lctx, src, (size_t)size, seq) == 0) {
        set_err(c, "llama.cpp could not load a %llu-byte snapshot into sequence %d (no room in "
                "its KV cache, or the snapshot is from another model)", (unsigned long long)size, seq);
        append_llama_error(c, log_mark);
        llama_memory_seq_rm(c->mem, seq, -1, -1); /* leave it empty, not half-loaded */
        return STT_E_NO_SLOT;
    }
    return STT_OK;
}

/* ---- getters ------------------------------------------------------------------------------- */

STT_API int32_t stt_n_embd(const struct stt_ctx *c)    { return c ? c->n_embd : STT_E_INVALID; }
STT_API int32_t stt_n_vocab(const struct stt_ctx *c)   { return c ? c->n_vocab : STT_E_INVALID; }
STT_API int32_t stt_n_ctx(const struct stt_ctx *c)     { return c ? c->n_ctx : STT_E_INVALID; }
STT_API int32_t stt_n_ctx_seq(const struct stt_ctx *c) { return c ? c->n_ctx_seq : STT_E_INVALID; }
STT_API int32_t stt_n_seq_max(const struct stt_ctx *c) { return c ? c->n_seq_max : STT_E_INVALID; }
STT_API int32_t stt_n_batch(const struct stt_ctx *c)   { return c ? c->n_batch : STT_E_INVALID; }
STT_API int32_t stt_n_threads(const struct stt_ctx *c) {
    return c ? llama_n_threads(c->lctx) : STT_E_INVALID;
}
STT_API int32_t stt_n_threads_batch(const struct stt_ctx *c) {
    return c ? llama_n_threads_batch(c->lctx) : STT_E_INVALID;
}
/* The threads of a one-row decode and of a multi-row one (llama_set_n_threads), each 1 to
 * the most the context was made with (its threadpool has no more workers). The engine
 * chooses them from measured decodes (streamtts/engine/thread_tuner.py). */
STT_API int32_t stt_set_n_threads(struct stt_ctx *c, int32_t n_threads, int32_t n_threads_batch) {
    if (c == NULL || n_threads < 1 || n_threads_batch < 1 || n_threads > c->n_threads_max ||
        n_threads_batch > c->n_threads_max) {
        return STT_E_INVALID;
    }
    llama_set_n_threads(c->lctx, n_threads, n_threads_batch);
    return STT_OK;
}
STT_API int32_t stt_n_threads_max(const struct stt_ctx *c) {
    return c ? c->n_threads_max : STT_E_INVALID;
}
STT_API int32_t stt_has_threadpool(const struct stt_ctx *c) {
    return c ? (c->threadpool != NULL) : STT_E_INVALID;
}
/* on: pin the calling thread (the one that decodes) to the CPU our pinned threadpool left
 * for it, and return that CPU; -1 when the pool is not pinned or the kernel refused.
 * off: give it back the CPUs it had before (-1). The same thread calls both. */
STT_API int32_t stt_pin_caller(struct stt_ctx *c, int32_t on) {
    if (c == NULL) return STT_E_INVALID;
    return c->main_cpu < 0 ? -1 : pin_caller(c, on);
}

/* llama.cpp's log lines of this context's load that say where the layers and buffers went
 * (see g_place), newline-separated. */
STT_API const char *stt_placement(const struct stt_ctx *c) {
    return c ? c->placement : "";
}

/* Message of the last failed call on this context ("" after a success). */
STT_API const char *stt_last_error(const struct stt_ctx *c) {
    return c ? c->err : "no context (NULL handle)";
}

/* The last ERROR line llama.cpp logged in this process (copied into buf); returns 1 if
 * there was one, else 0. For calls outside the bridge (llama_model_quantize). */
STT_API int32_t stt_llama_last_error(char *buf, int32_t len) {
    if (buf == NULL || len <= 0) return STT_E_INVALID;
    uint64_t seq = log_error_seq();
    return log_errors_since(seq > 0 ? seq - 1 : 0, buf, (size_t)len) > 0 ? 1 : 0;
}

/* llama.cpp / ggml versions and where the source came from. */
static char           g_version[320];
static pthread_once_t g_version_once = PTHREAD_ONCE_INIT;
static void stt_version_once(void) {
    snprintf(g_version, sizeof g_version, "llama.cpp %s (ggml %s, commit %s; %s)", llama_version(),
             ggml_version(), ggml_commit(), STT_LLAMA_SOURCE);
}
STT_API const char *stt_version(void) {
    pthread_once(&g_version_once, stt_version_once);
    return g_version;
}

/* Forward llama.cpp's log lines to stderr: 0 none, 1 INFO and above, 2 DEBUG too. The
 * default comes from STREAMTTS_LLAMA_LOG. ERROR lines are captured for messages either way. */
STT_API void stt_set_log_forward(int32_t level) {
    pthread_once(&g_init_once, stt_init_once);
    pthread_mutex_lock(&g_log_mu);
    g_log_forward = level < 0 ? 0 : (level > 2 ? 2 : level);
    pthread_mutex_unlock(&g_log_mu);
}

/* The file of the CPU backend in use ("" when none is loaded): libggml-cpu.so in a build
 * with the backends linked in, libggml-cpu-<variant>.so (haswell, skylakex, ...) in a
 * GGML_BACKEND_DL build, where ggml picked the best variant this CPU runs. */
STT_API const char *stt_cpu_backend(void) {
    pthread_once(&g_init_once, stt_init_once);
    return g_cpu_backend;
}

/* llama.cpp's system info line (CPU features, backends). */
STT_API const char *stt_system_info(void) {
    pthread_once(&g_init_once, stt_init_once);
    return llama_print_system_info();
}
