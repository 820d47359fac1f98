/*
 * frames.c - FrameAssembler.push of streamtts/core/frames.py, compiled.
 *
 * Why: the push is a few loads and stores per stream, but in NumPy it is about fifteen
 * calls, and right after a backbone decode (which streams the model's weights through
 * the caches) each of them runs cold: 0.1-0.15 ms a step on the CPU (issue #16). Here it
 * is one call.
 *
 * The same specification as the NumPy push: codebook k of frame f arrives in row f + k;
 * a slot's ring holds its last n_vq rows (row r at ring position r % n_vq); the push of
 * row n - 1 completes frame f = n - n_vq, whose code k lies at ring position (f + k) % n_vq.
 * tests/kernels/test_conformance.py runs both side by side.
 *
 * Thread safety: no global state; the caller owns every buffer.
 */

#include <stdint.h>

#include "stt.h"

STT_API size_t stt_sizeof_frames(void) { return sizeof(stt_frames); }

/* Push row b of `rows` (n_vq codes; rows b apart by row_stride elements) to slots[b]
 * (distinct); frame b of frames_out (n_vq codes, contiguous) gets the frame it completed
 * (all pad when none), index[b] its number (-1: none yet), ready[b] 1 when it exists and is
 * not all pad. Returns the number of ready frames, or -1 (nothing changed) when a slot is
 * out of range. */
STT_API int32_t stt_frames_push(const stt_frames *fa, const int64_t *slots, int32_t n_b,
                                const int64_t *rows, int64_t row_stride, int64_t *frames_out,
                                uint8_t *ready, int64_t *index) {
    const int64_t K = fa->n_vq, pad = fa->pad;
    for (int32_t b = 0; b < n_b; b++)
        if (slots[b] < 0 || slots[b] >= fa->capacity) return -1;
    int32_t n_ready = 0;
    for (int32_t b = 0; b < n_b; b++) {
        const int64_t s = slots[b], r = fa->count[s];
        int64_t *ring = fa->ring + s * K * K;
        const int64_t *row = rows + b * row_stride;
        int64_t *dst = ring + (r % K) * K;
        for (int64_t k = 0; k < K; k++) dst[k] = row[k];
        fa->count[s] = r + 1;
        const int64_t f = r + 1 - K;
        int64_t *frame = frames_out + (int64_t)b * K;
        int any = 0;
        if (f >= 0) {
            for (int64_t k = 0; k < K; k++) {
                frame[k] = ring[((f + k) % K) * K + k];
                any |= frame[k] != pad;
            }
        } else {
            for (int64_t k = 0; k < K; k++) frame[k] = pad;
        }
        index[b] = f >= 0 ? f : -1;
        ready[b] = (uint8_t)any;
        n_ready += any;
    }
    return n_ready;
}
