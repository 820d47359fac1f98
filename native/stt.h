/*
 * stt.h - what the bridge's C files share: the export macro, every struct the Python side
 * mirrors (streamtts/model/_llama.py, a ctypes Structure each), their size functions, and
 * the row sampler that delay.c calls.
 *
 * Why one header: a struct defined once cannot differ between the file that fills it and
 * the one that reads it, and each struct's size is exported (stt_sizeof_<name>, defined by
 * the file that uses it) so the Python side compares its mirror at load and names the
 * struct that changed instead of reading scrambled fields.
 */
#ifndef STT_H
#define STT_H

#include <stddef.h>
#include <stdint.h>

#define STT_API __attribute__((visibility("default")))
#define STT_HIDDEN __attribute__((visibility("hidden")))

/* ---- bridge.c: creation parameters ----
 * All fields are int32 so the Python mirror cannot get the layout wrong; struct_size
 * catches a Python/C version mismatch at stt_create. */
typedef struct stt_params {
    int32_t struct_size;     /* must be sizeof(stt_params) */
    int32_t n_ctx;           /* total KV cells, all sequences together */
    int32_t n_batch;         /* max rows per stt_decode */
    int32_t n_ubatch;        /* physical batch; <= 0: same as n_batch */
    int32_t n_seq_max;       /* number of sequences (streams) */
    int32_t n_threads;       /* threads for single-row decodes; <= 0: llama.cpp default */
    int32_t n_threads_batch; /* threads for multi-row decodes; <= 0: same as n_threads */
    int32_t n_gpu_layers;    /* layers to offload; < 0 = all */
    int32_t type_k;          /* ggml_type of the K cache; < 0: llama.cpp default (f16) */
    int32_t type_v;          /* ggml_type of the V cache; < 0: llama.cpp default (f16) */
    int32_t flash_attn;      /* -1 auto, 0 disabled, 1 enabled */
    int32_t kv_unified;      /* 1: one KV buffer shared by all sequences */
    int32_t embeddings;      /* initial llama_set_embeddings state (each decode sets it anyway) */
    int32_t poll;            /* < 0: llama.cpp's default CPU threads; 0..100: attach our own
                                ggml threadpool with this polling level (0 = workers sleep
                                between decodes instead of spinning) */
    int32_t use_mmap;        /* 1: memory-map the model file (llama.cpp default) */
    int32_t pin_threads;     /* 1 (Linux, poll >= 0, 2+ threads, as many CPUs allowed): each
                                worker of our threadpool keeps one CPU of those the creating
                                thread may use and stt_pin_caller gives the decoding thread
                                the next, so llama.cpp's threads never share a core */
} stt_params;

/* ---- delay.c: the arrays of a DelayStates (capacity entries each; seen: capacity x 2 x
 * n_audio bytes, the penalty histories of codebook 0 and of codebooks 1..n_vq-1 pooled) and
 * the constants its step needs ---- */
typedef struct {
    int32_t capacity, n_vq, n_audio, pair_swapped;
    int64_t pad, gen_slot, delay_slot, audio_start, audio_end, im_end, audio_pad_code;
    uint64_t text_salt, audio_salt; /* counter_uniforms' per-stream constants */
    int64_t *audio_length, *delayed_length, *time_step;
    uint8_t *is_audio, *is_stopping, *audio_ended;
    uint64_t *seed;
    float *text_temperature;
    int64_t *text_top_k;
    double *text_top_p;
    float *audio_temperature;
    int64_t *audio_top_k;
    double *audio_top_p;
    float *audio_penalty;
    uint8_t *seen;
    uint8_t *mark; /* capacity bytes, all zero between calls: the distinct-slots check */
} stt_delay_states;

/* ---- frames.c: a FrameAssembler's arrays: ring (capacity x n_vq x n_vq) and count ---- */
typedef struct {
    int32_t capacity, n_vq;
    int64_t pad;
    int64_t *ring, *count;
} stt_frames;

/* ---- embed.c: an Embedder's tables: text (text_rows x n_embd, float16 or float32) and the
 * codebooks' stacked (n_vq * audio_rows x n_embd, float32) ---- */
typedef struct {
    int64_t n_embd, text_rows, n_vq, audio_rows;
    int32_t text_f16;
    const void *text;
    const float *audio;
} stt_embed;

/* sizeof of each struct above, as this build lays it out */
STT_API size_t stt_sizeof_params(void);       /* bridge.c */
STT_API size_t stt_sizeof_delay_states(void); /* delay.c */
STT_API size_t stt_sizeof_frames(void);       /* frames.c */
STT_API size_t stt_sizeof_embed(void);        /* embed.c */

/* ---- sampler.c: one row of stt_sample_rows (not exported): returns the token, -1 for a
 * bad row (NaN, +inf as its best value, nothing above -inf), -2 when scratch was needed
 * and missing ---- */
STT_HIDDEN int64_t stt_sample_one(const float *row, int32_t n_cols, float t, int64_t top_k,
                                  double top_p, double u, const uint8_t *sn, float pen,
                                  void *scratch);

/* ---- pool.c: the tick's threads. A chunk function runs chunk c of a call and returns its code (0 = done);
 * stt_pool_run runs chunks [0, n_chunks) on the pool's threads and the caller's, writes each
 * chunk's code to rcs[c] and returns how many were not 0. p may be NULL (all on the caller). */
typedef struct stt_pool stt_pool;
STT_API stt_pool *stt_pool_new(int32_t n_threads); /* n_threads in all, the caller's included */
STT_API void stt_pool_free(stt_pool *p);
STT_API int32_t stt_pool_threads(const stt_pool *p);
typedef int32_t (*stt_chunk_fn)(void *arg, int32_t c);
STT_HIDDEN int32_t stt_pool_run(stt_pool *p, int32_t n_chunks, stt_chunk_fn fn, void *arg, int32_t *rcs);
/* Rows per chunk for a copy of n rows on p's threads (memory-bound: about four chunks a
 * thread), so a copy has at most STT_POOL_COPY_CHUNKS chunks. p may be NULL (one thread). */
#define STT_POOL_MAX_THREADS 64
#define STT_POOL_COPY_CHUNKS (4 * STT_POOL_MAX_THREADS)
STT_HIDDEN int32_t stt_pool_copy_chunk(const stt_pool *p, int32_t n);

#endif
