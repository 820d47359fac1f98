/*
 * embed.c - the step's input rows (Embedder.__call__ of streamtts/model/tables.py), compiled.
 *
 * Why: a step's embedding is one gather and sum per stream (the text row and 32 codebook
 * rows), but in NumPy it is five calls (gather the slots' ids, offset them, gather, gather,
 * reduce), and right after a backbone decode each of them runs cold: about 0.1 ms a step
 * on the CPU (issue #16). Here it is one call.
 *
 * The same arithmetic as the NumPy path, so the same bits: the text row (float16 tables
 * widened exactly to float32), then codebook 0..31 added one after another in float32,
 * element by element (NumPy's reduction over the non-contiguous axis does the same; no
 * -ffast-math, so the compiler keeps that order). tests/kernels/test_conformance.py compares both.
 *
 * Thread safety: no global state; the caller owns every buffer.
 */

#include <stdint.h>
#include <string.h>

#include "stt.h"

STT_API size_t stt_sizeof_embed(void) { return sizeof(stt_embed); }

/* IEEE half to float, exact (every half is a float). */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, f;
    if (exp == 0x1fu) {
        f = sign | 0x7f800000u | (man << 13); /* inf, nan */
    } else if (exp != 0) {
        f = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        f = sign; /* zero */
    } else { /* subnormal: normalise */
        exp = 113u;
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        f = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    float out;
    memcpy(&out, &f, sizeof out);
    return out;
}

/* out[b] (n_embd floats; rows out_stride apart) = the embedding of id row r_b = rows +
 * (slots ? slots[b] : b) * row_stride (n_rows rows): text id r_b[0], codes r_b[1..n_vq].
 * Returns 0; -1 (nothing written) when a slot is out of [0, n_rows), -2 when an id is out of
 * its table's range. */
STT_API int32_t stt_embed_rows(const stt_embed *e, const int64_t *slots, int32_t n_b, const int64_t *rows,
                               int64_t n_rows, int64_t row_stride, float *out, int64_t out_stride) {
    const int64_t H = e->n_embd, K = e->n_vq, A = e->audio_rows;
    for (int32_t b = 0; b < n_b; b++) {
        const int64_t s = slots ? slots[b] : b;
        if (s < 0 || s >= n_rows) return -1;
    }
    for (int32_t b = 0; b < n_b; b++) {
        const int64_t *r = rows + (slots ? slots[b] : b) * row_stride;
        if (r[0] < 0 || r[0] >= e->text_rows) return -2;
        for (int64_t k = 0; k < K; k++)
            if (r[1 + k] < 0 || r[1 + k] >= A) return -2;
    }
    for (int32_t b = 0; b < n_b; b++) {
        const int64_t *r = rows + (slots ? slots[b] : b) * row_stride;
        float *acc = out + b * out_stride;
        if (e->text_f16) {
            const uint16_t *t = (const uint16_t *)e->text + r[0] * H;
            for (int64_t h = 0; h < H; h++) acc[h] = half_to_float(t[h]);
        } else {
            memcpy(acc, (const float *)e->text + r[0] * H, (size_t)H * sizeof(float));
        }
        for (int64_t k = 0; k < K; k++) {
            const float *a = e->audio + (k * A + r[1 + k]) * H;
            for (int64_t h = 0; h < H; h++) acc[h] += a[h];
        }
    }
    return 0;
}

/* stt_embed_rows on chunks of `chunk` rows, run on a pool's threads: chunk c is rows
 * [c * chunk, min(n_b, (c + 1) * chunk)) of slots and out; its code lands in rcs[c];
 * returns how many are not 0. */
typedef struct {
    const stt_embed *e;
    const int64_t *slots;
    int32_t n_b, chunk;
    const int64_t *rows;
    int64_t n_rows, row_stride;
    float *out;
    int64_t out_stride;
} embed_call;

static int32_t embed_chunk(void *vp, int32_t c) {
    const embed_call *a = vp;
    const int64_t lo = (int64_t)c * a->chunk;
    const int32_t n = a->n_b - lo < a->chunk ? (int32_t)(a->n_b - lo) : a->chunk;
    return stt_embed_rows(a->e, a->slots ? a->slots + lo : NULL, n, a->rows, a->n_rows, a->row_stride,
                          a->out + lo * a->out_stride, a->out_stride);
}

STT_API int32_t stt_pool_embed_rows(stt_pool *p, int32_t chunk, int32_t *rcs, const stt_embed *e,
                                    const int64_t *slots, int32_t n_b, const int64_t *rows,
                                    int64_t n_rows, int64_t row_stride, float *out, int64_t out_stride) {
    if (chunk < 1 || n_b < 0) return -1;
    embed_call a = {e, slots, n_b, chunk, rows, n_rows, row_stride, out, out_stride};
    return stt_pool_run(p, (n_b + chunk - 1) / chunk, embed_chunk, &a, rcs);
}
