/* sampler.h - what sampler.c shares with the rest of the bridge (not exported). */
#ifndef STT_SAMPLER_H
#define STT_SAMPLER_H

#include <stdint.h>

/* One row of stt_sample_rows: returns the token, -1 for a bad row (NaN, +inf as its best
 * value, nothing above -inf), -2 when scratch was needed and missing. */
__attribute__((visibility("hidden"))) int64_t stt_sample_one(const float *row, int32_t n_cols,
    float t, int64_t top_k, double top_p, double u, const uint8_t *sn, float pen, void *scratch);

#endif
