/*
 * delay.c - DelayStates.step of streamtts/core/delay_state.py, compiled.
 *
 * Why: with one stream on a CPU the step's own work is a few microseconds of arithmetic
 * inside about a hundred NumPy and ctypes calls (the counter RNG twice, two sampler calls,
 * masks and state updates): 0.2-0.5 ms a step, 2-3 % of a small model's decode (issue #16).
 * Here the whole step is one call.
 *
 * It is a second implementation of one specification, not a new one: the same counter
 * uniforms (splitmix64 over seed, step, column, stream), the same per-row sampler
 * (sampler.c's, which is sample_rows compiled) on the same values, the same state
 * updates in the same order. tests/kernels/test_conformance.py runs both side by side and
 * compares every row and every state array.
 *
 * Not here: rows that need the full text vocabulary (a stream outside audio mode). Then
 * nothing is done and the caller steps in Python (the step returns 1 before changing
 * anything).
 *
 * Thread safety: no global state; the caller owns every buffer (one states per thread).
 */

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "stt.h"

#define NONE (-1) /* delayed_length: no delay flush in progress */

STT_API size_t stt_sizeof_delay_states(void) { return sizeof(stt_delay_states); }

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t mix(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
}

/* The key of counter_uniforms' row (seed, counter) for a stream's salt. */
static inline uint64_t row_key(uint64_t seed, uint64_t counter, uint64_t salt) {
    return mix(mix(seed ^ salt) ^ mix(counter + GOLDEN));
}

/* counter_uniforms' column col (1-based) of a row key: top 53 bits, exact in a double. */
static inline double uniform(uint64_t key, uint64_t col) {
    return (double)(mix(key + col * GOLDEN) >> 11) * (1.0 / 9007199254740992.0);
}

/* The codebooks of slot s sampled this step: [*from, *to), empty for a stopped stream
 * (codebook k is sampled when delayed_length <= k < audio_length). */
static inline void sampled_range(const stt_delay_states *st, int64_t s, int64_t *from, int64_t *to) {
    int64_t al = st->audio_length[s], dl = st->delayed_length[s];
    *from = dl > 0 ? dl : 0;
    *to = st->is_stopping[s] ? *from : (al < st->n_vq ? al : st->n_vq);
}

/* Rows of `seen` per slot: codebook 0's penalty history, and that of codebooks 1..n_vq-1
 * pooled (the checkpoint's sample_token). The Python side asks, so that a bridge built before
 * the pooled history is refused rather than indexed past its `seen`. */
STT_API int32_t stt_delay_seen_rows(void) { return 2; }

/*
 * Advance streams slots[0..n_b) one step, as DelayStates.step. pair: n_b rows of
 * [gen slot, delay slot] logits, pair_stride floats apart. audio: row (b, k) of n_audio
 * floats at audio + b * audio_b_stride + k * audio_k_stride; its pad column is set to -inf
 * (as the Python step does). out: n_b x (1 + n_vq), the rows produced. scratch: as
 * stt_sample_rows'. bad: n_b bytes, set for the batch rows that failed.
 * Returns 0 (done), 1 (a stream needs the full text logits: nothing done), 2 (slots out of
 * range or repeated: nothing done), 3 (text of the marked rows not samplable), 4 (audio of
 * the marked rows not samplable), -1 (scratch needed and missing). Only 0 changes state.
 */
STT_API int32_t stt_delay_step(const stt_delay_states *st, const int64_t *slots, int32_t n_b,
                               const float *pair, int64_t pair_stride, float *audio,
                               int64_t audio_b_stride, int64_t audio_k_stride, int64_t *out,
                               void *scratch, uint8_t *bad) {
    const int32_t K = st->n_vq, A = st->n_audio, W = 1 + K;
    int32_t rc = 0;
    for (int32_t b = 0; b < n_b; b++) { /* distinct and in range */
        int64_t s = slots[b];
        if (s < 0 || s >= st->capacity || st->mark[s]) {
            rc = 2;
            n_b = b; /* clear only the marks set so far */
            break;
        }
        st->mark[s] = 1;
    }
    for (int32_t b = 0; b < n_b; b++) st->mark[slots[b]] = 0;
    if (rc) return rc;
    for (int32_t b = 0; b < n_b; b++) { /* a free text row outside audio mode: Python's */
        int64_t s = slots[b], dl = st->delayed_length[s];
        int free = !st->is_stopping[s] && !(dl >= 0 && dl <= K);
        if (free && !st->is_audio[s]) return 1;
    }

    /* text: forced, or sampled from the pair (ids in ascending order, as the full-vocabulary
     * argmax and the canonical candidate order see them) */
    const int64_t lo = st->pair_swapped ? st->delay_slot : st->gen_slot;
    const int64_t hi = st->pair_swapped ? st->gen_slot : st->delay_slot;
    const int delay_col = st->pair_swapped ? 0 : 1;
    int32_t n_bad = 0;
    int any_audio = 0;
    for (int32_t b = 0; b < n_b; b++) {
        int64_t s = slots[b], dl = st->delayed_length[s], *row = out + (int64_t)b * W, from, to;
        bad[b] = 0;
        row[0] = st->pad;
        if (st->is_stopping[s]) continue;
        sampled_range(st, s, &from, &to);
        any_audio |= to > from;
        if (dl >= 0 && dl < K) {
            row[0] = st->delay_slot;
        } else if (dl == K) {
            row[0] = st->audio_end;
        } else {
            const float *p = pair + (int64_t)b * pair_stride;
            float lg[2] = {st->pair_swapped ? p[1] : p[0], st->pair_swapped ? p[0] : p[1]};
            uint64_t ts = (uint64_t)st->time_step[s];
            if (ts == 0) lg[delay_col] = -INFINITY;
            double u = uniform(row_key(st->seed[s], ts, st->text_salt), 1);
            int64_t tok = stt_sample_one(lg, 2, st->text_temperature[s], st->text_top_k[s],
                                         st->text_top_p[s], u, NULL, 1.0f, scratch);
            if (tok < 0) {
                bad[b] = 1;
                n_bad++;
            } else {
                row[0] = tok == 0 ? lo : hi;
            }
        }
    }
    if (n_bad) return 3;

    /* audio: the sampled codebooks (sampled_range); the others stay audio_pad_code */
    for (int32_t b = 0; b < n_b; b++) {
        int64_t s = slots[b], *row = out + (int64_t)b * W + 1, from, to;
        float *lg_b = audio + (int64_t)b * audio_b_stride;
        if (any_audio) /* the Python step masks the pad column of every row */
            for (int32_t k = 0; k < K; k++) lg_b[k * audio_k_stride + st->audio_pad_code] = -INFINITY;
        sampled_range(st, s, &from, &to);
        uint64_t key = row_key(st->seed[s], (uint64_t)st->time_step[s], st->audio_salt);
        float pen = st->audio_penalty[s];
        for (int32_t k = 0; k < K; k++) {
            if (k < from || k >= to) {
                row[k] = st->audio_pad_code;
                continue;
            }
            /* the checkpoint's sample_token: codebook 0's history, or 1..K-1's pooled */
            const uint8_t *sn = pen != 1.0f ? st->seen + ((int64_t)s * 2 + (k > 0)) * A : NULL;
            int64_t tok = stt_sample_one(lg_b + k * audio_k_stride, A, st->audio_temperature[s],
                                         st->audio_top_k[s], st->audio_top_p[s],
                                         uniform(key, (uint64_t)k + 1), sn, pen, scratch);
            if (tok == -2) return -1;
            if (tok < 0) {
                bad[b] = 1;
                n_bad += 1;
            }
            row[k] = tok;
        }
    }
    if (n_bad) return 4;

    /* updates (contract section 4 step 4), as the Python step orders them */
    for (int32_t b = 0; b < n_b; b++) {
        int64_t s = slots[b], *row = out + (int64_t)b * W, text = row[0], from, to;
        int64_t al = st->audio_length[s], dl = st->delayed_length[s];
        int active = !st->is_stopping[s];
        sampled_range(st, s, &from, &to);
        for (int64_t k = from; k < to; k++) st->seen[((int64_t)s * 2 + (k > 0)) * A + row[1 + k]] = 1;
        int forced_end = active && dl == K;
        int is_start = text == st->audio_start;
        int is_end = active && text == st->audio_end;
        int grow = active && (is_start || text == st->gen_slot || text == st->delay_slot);
        al += grow;
        if (is_end) al = 0;
        if (active && dl == NONE && text == st->delay_slot) dl = 0;
        if (active && dl != NONE) dl += 1;
        if (dl > K) dl = NONE;
        st->audio_length[s] = al;
        st->delayed_length[s] = dl;
        st->is_audio[s] = (st->is_audio[s] && !forced_end) || (active && is_start);
        st->is_stopping[s] = !active || text == st->im_end;
        st->audio_ended[s] = is_end;
        st->time_step[s] += active;
    }
    return 0;
}

/* stt_delay_step on chunks of `chunk` rows, run on a pool's threads: chunk c is rows
 * [c * chunk, min(n_b, (c + 1) * chunk)), its row b's scratch scratch_row bytes into
 * scratch (so chunks share nothing). Each chunk's code (as stt_delay_step's) lands in
 * rcs[c]; returns how many are not 0. A chunk that returned 1 changed nothing: the caller
 * steps it in Python. The slots must be distinct across chunks (each checks its own). */
typedef struct {
    const stt_delay_states *st;
    const int64_t *slots;
    int32_t n_b, chunk;
    const float *pair;
    int64_t pair_stride;
    float *audio;
    int64_t audio_b_stride, audio_k_stride;
    int64_t *out;
    uint8_t *scratch;
    int64_t scratch_row;
    uint8_t *bad;
} delay_call;

static int32_t delay_chunk(void *vp, int32_t c) {
    const delay_call *a = vp;
    const int64_t lo = (int64_t)c * a->chunk;
    const int32_t n = a->n_b - lo < a->chunk ? (int32_t)(a->n_b - lo) : a->chunk;
    return stt_delay_step(a->st, a->slots + lo, n, a->pair + lo * a->pair_stride, a->pair_stride,
                          a->audio + lo * a->audio_b_stride, a->audio_b_stride, a->audio_k_stride,
                          a->out + lo * (1 + a->st->n_vq), a->scratch + lo * a->scratch_row,
                          a->bad + lo);
}

STT_API int32_t stt_pool_delay_step(stt_pool *p, int32_t chunk, int32_t *rcs, const stt_delay_states *st,
                                    const int64_t *slots, int32_t n_b, const float *pair,
                                    int64_t pair_stride, float *audio, int64_t audio_b_stride,
                                    int64_t audio_k_stride, int64_t *out, void *scratch,
                                    int64_t scratch_row, uint8_t *bad) {
    if (chunk < 1 || n_b < 0 || !scratch) return -1;
    delay_call a = {st, slots, n_b, chunk, pair, pair_stride, audio, audio_b_stride,
                    audio_k_stride, out, scratch, scratch_row, bad};
    return stt_pool_run(p, (n_b + chunk - 1) / chunk, delay_chunk, &a, rcs);
}
