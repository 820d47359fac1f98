/*
 * pool.c - the tick's threads: one call of a row kernel cut into chunks of rows that the
 * caller and a few worker threads take in turn.
 *
 * Why (issue 28): with a GPU's 64-128 streams the CPU work after each decode (sampling 32
 * codebooks a stream, the state machine, the step's embedding sums) is the largest part of
 * a tick on one core. Rows are independent, so a step's rows can run on several cores. A
 * Python thread pool cut them before, but each of its threads needed the GIL to take a range
 * and again to hand it back, behind the asyncio and decode threads: on two cores the step
 * did not get faster. Here one call releases the GIL once and the chunks never touch Python.
 *
 * Chunks, not one range a thread: the chunks are taken from a shared counter, so when a
 * worker is late (its core busy with the codec's thread) the caller takes its chunks instead
 * of waiting for it. A chunk's rows come out the same whoever runs it (each row has its own
 * counter-based random draws), so the cut changes no output.
 *
 * Workers sleep on a condition variable between calls (no spinning: on a small machine the
 * codec's thread needs the other cores between ticks). One pool serves one caller thread at
 * a time (the engine's); stt_pool_run is not reentrant.
 */

#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "stt.h"

struct stt_pool {
    int32_t n_workers;
    pthread_t threads[STT_POOL_MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t work; /* a new call (gen moved) or stop */
    pthread_cond_t idle; /* a call's last chunk done, or a worker left a call */
    uint64_t gen;        /* calls so far; a worker joins each call once */
    int stop;
    int32_t busy;        /* workers inside a call: the next call waits until none is */
    /* the current call, set under mu before gen moves */
    stt_chunk_fn fn;
    void *arg;
    int32_t n_chunks;
    int32_t *rcs;
    atomic_int next; /* the next chunk to take */
    atomic_int done; /* chunks finished */
};

/* Take and run chunks of the call until none is left. */
static void take_chunks(stt_pool *p, stt_chunk_fn fn, void *arg, int32_t n, int32_t *rcs) {
    for (;;) {
        int c = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (c >= n) return;
        rcs[c] = fn(arg, c);
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == n) {
            pthread_mutex_lock(&p->mu); /* the caller may be asleep waiting for this one */
            pthread_cond_broadcast(&p->idle);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker(void *vp) {
    stt_pool *p = vp;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        stt_chunk_fn fn = p->fn;
        void *arg = p->arg;
        int32_t n = p->n_chunks, *rcs = p->rcs;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        take_chunks(p, fn, arg, n, rcs);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_broadcast(&p->idle);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

STT_API stt_pool *stt_pool_new(int32_t n_threads) {
    if (n_threads < 1 || n_threads > STT_POOL_MAX_THREADS) return NULL;
    stt_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->idle, NULL);
    atomic_init(&p->next, 0);
    atomic_init(&p->done, 0);
    /* the workers take no signals: Python's handlers run on its main thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int32_t i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) break;
        pthread_setname_np(p->threads[i], "streamtts-tick");
        p->n_workers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (p->n_workers != n_threads - 1) {
        stt_pool_free(p);
        return NULL;
    }
    return p;
}

STT_API void stt_pool_free(stt_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_workers; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->idle);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

STT_API int32_t stt_pool_threads(const stt_pool *p) { return p ? p->n_workers + 1 : 1; }

STT_HIDDEN int32_t stt_pool_copy_chunk(const stt_pool *p, int32_t n) {
    const int32_t per = 4 * stt_pool_threads(p);
    const int32_t chunk = (n + per - 1) / per;
    return chunk < 1 ? 1 : chunk;
}

STT_HIDDEN int32_t stt_pool_run(stt_pool *p, int32_t n_chunks, stt_chunk_fn fn, void *arg, int32_t *rcs) {
    if (!p || p->n_workers == 0 || n_chunks < 2) {
        for (int32_t c = 0; c < n_chunks; c++) rcs[c] = fn(arg, c);
    } else {
        pthread_mutex_lock(&p->mu);
        while (p->busy) pthread_cond_wait(&p->idle, &p->mu); /* a late worker still in the last call */
        p->fn = fn;
        p->arg = arg;
        p->n_chunks = n_chunks;
        p->rcs = rcs;
        atomic_store_explicit(&p->next, 0, memory_order_relaxed);
        atomic_store_explicit(&p->done, 0, memory_order_relaxed);
        p->gen++;
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
        take_chunks(p, fn, arg, n_chunks, rcs);
        if (atomic_load_explicit(&p->done, memory_order_acquire) < n_chunks) {
            pthread_mutex_lock(&p->mu); /* a worker still runs a chunk it took */
            while (atomic_load_explicit(&p->done, memory_order_acquire) < n_chunks)
                pthread_cond_wait(&p->idle, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
    }
    int32_t failed = 0;
    for (int32_t c = 0; c < n_chunks; c++) failed += rcs[c] != 0;
    return failed;
}

/* dst row j = src row idx[j] (n_floats floats each; strides in floats), j in [0, n), cut
 * across the pool's threads: a copy of decode outputs as the bridge makes it (bench's
 * zero-cost backbone). Returns 0; -1 for an index below 0. */
typedef struct {
    int32_t n, chunk;
    const float *src;
    int64_t src_stride;
    const int64_t *idx;
    float *dst;
    int64_t dst_stride, n_floats;
} gather_call;

static int32_t gather_chunk(void *vp, int32_t c) {
    const gather_call *a = vp;
    const int32_t lo = c * a->chunk, hi = lo + a->chunk < a->n ? lo + a->chunk : a->n;
    for (int32_t j = lo; j < hi; j++) {
        if (a->idx[j] < 0) return -1;
        memcpy(a->dst + j * a->dst_stride, a->src + a->idx[j] * a->src_stride, (size_t)a->n_floats * sizeof(float));
    }
    return 0;
}

STT_API int32_t stt_pool_gather_rows(stt_pool *p, int32_t n, const float *src, int64_t src_stride,
                                     const int64_t *idx, float *dst, int64_t dst_stride, int64_t n_floats) {
    int32_t chunk = stt_pool_copy_chunk(p, n), rcs[STT_POOL_COPY_CHUNKS];
    gather_call a = {n, chunk, src, src_stride, idx, dst, dst_stride, n_floats};
    return stt_pool_run(p, (n + chunk - 1) / chunk, gather_chunk, &a, rcs) ? -1 : 0;
}
