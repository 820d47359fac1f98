/*
 * sampler.c - the per-row token sampler of streamtts/core/sampling.py, compiled.
 *
 * Why: at GPU speeds the CPU side of a tick is mostly sampling 32 rows of 1025
 * logits per stream (issue #16). NumPy needs several passes per row (scale,
 * copy, partition, sort, exp, cumsum, compare, find the id); here each row is
 * read once, from wherever it lies (rows are given as offsets from one base
 * pointer, so strided views such as the fused heads' logits need no copy), and
 * the top-k candidates are kept with their ids.
 *
 * It is a second implementation of one specification, not a new one: the
 * operations, their order and their precision are those of sample_rows()
 * (float32 scaling and penalty, float64 softmax over the top-k in canonical
 * order - value descending, id ascending - inverse-CDF draw with the caller's
 * uniform). tests/kernels/test_conformance.py checks token for token against it.
 *
 * Thread safety: no global state; the caller owns every buffer.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "stt.h"

#define SMALL_K 256 /* candidates kept by insertion on the stack; above: sort */
#define MAX_W    1024 /* columns of a row (their greatest values kept on the stack) */
#define MAX_CAND (2 * MAX_W) /* candidates gathered on the stack; more: the slow path */

typedef struct {
    float   v;
    int32_t id;
} cand_t;

/* canonical order: value descending, id ascending (qsort comparator, large k only) */
static int cand_cmp(const void *pa, const void *pb) {
    const cand_t *a = pa, *b = pb;
    if (a->v > b->v) return -1;
    if (a->v < b->v) return 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The value sample_rows sees for column j: logit / scale, then the repetition
 * penalty where seen (positive values divided, others multiplied). */
static inline float scaled(const float *row, int32_t j, float scale, const uint8_t *seen, float pen) {
    float x = row[j] / scale;
    if (seen && seen[j]) x = x > 0.0f ? x / pen : x * pen;
    return x;
}

/* Greedy: first index of the maximum; -1 for a row with NaN or nothing above -inf. */
static int64_t argmax_row(const float *row, int32_t v, const uint8_t *seen, float pen) {
    int32_t best = 0;
    float bv = scaled(row, 0, 1.0f, seen, pen);
    if (bv != bv) return -1;
    for (int32_t j = 1; j < v; j++) {
        float x = scaled(row, j, 1.0f, seen, pen);
        if (x != x) return -1;
        if (x > bv) {
            bv = x;
            best = j;
        }
    }
    return bv > -INFINITY ? best : -1;
}

/* Insert (x, id) into the k-long canonical list c holding n entries (n < k, or x
 * better than the last); returns the new count. Equal values keep the earlier
 * (smaller) id ahead, since ids arrive in ascending order. */
static inline int32_t insert(cand_t *c, int32_t n, int32_t k, float x, int32_t id) {
    int32_t at = n < k ? n++ : k - 1;
    while (at > 0 && c[at - 1].v < x) {
        c[at] = c[at - 1];
        at--;
    }
    c[at].v = x;
    c[at].id = id;
    return n;
}

/* Top-k (k <= SMALL_K) of the values as sample_rows sees them (scaled, penalised) in
 * canonical order; returns 0, or -1 for a NaN. Exact for any input, and slower: every
 * value is divided. */
static int top_scaled(const float *row, int32_t v, int32_t k, float scale, const uint8_t *seen,
                      float pen, cand_t *c) {
    int32_t n = 0;
    for (int32_t j = 0; j < v; j++) {
        float x = scaled(row, j, scale, seen, pen);
        if (x != x) return -1;
        if (n < k || x > c[k - 1].v) n = insert(c, n, k, x, j);
    }
    return 0;
}

/* Per column of the row seen as rows of w values (c, c + w, c + 2w, ...; the last
 * partial row included): the greatest value m1[c], the first row it is found in r1[c],
 * and the second greatest m2[c] (equal to m1[c] when that occurs twice). Two passes of
 * the same operation on w lanes each (they vectorise; one pass with nested selects
 * does not). Returns 1 if the row holds a NaN. Needs v >= w. */
static int column_top2(const float *restrict row, int32_t v, int32_t w, float *restrict m1,
                       float *restrict m2, int32_t *restrict r1) {
    int nan = 0;
    for (int32_t c = 0; c < w; c++) m1[c] = -INFINITY;
    for (int32_t j0 = 0; j0 < v; j0 += w) {
        const float *b = row + j0;
        int32_t len = v - j0 < w ? v - j0 : w;
        for (int32_t c = 0; c < len; c++) {
            float x = b[c], a = m1[c];
            nan |= x != x;
            m1[c] = x > a ? x : a;
        }
    }
    if (nan) return 1;
    int32_t big = v / w + 1; /* "not found yet" */
    for (int32_t c = 0; c < w; c++) {
        m2[c] = -INFINITY;
        r1[c] = big;
    }
    for (int32_t j0 = 0, r = 0; j0 < v; j0 += w, r++) {
        const float *b = row + j0;
        int32_t len = v - j0 < w ? v - j0 : w;
        for (int32_t c = 0; c < len; c++) {
            float x = b[c], a = m1[c], s = m2[c];
            int32_t ri = r1[c];
            int first = (x == a) & (ri == big);
            r1[c] = first ? r : ri;
            float cand = first ? -INFINITY : x; /* a lesser value, or the greatest again */
            m2[c] = cand > s ? cand : s;
        }
    }
    return 0;
}

#define LANES 8 /* lane-wise accumulators: loops the compiler vectorises without fast-math */

static int32_t count_at_least(const float *m, int32_t n, float t) {
    int32_t cl[LANES] = {0};
    for (int32_t q = 0; q < n; q += LANES)
        for (int32_t l = 0; l < LANES; l++) cl[l] += m[q + l] >= t;
    int32_t c = 0;
    for (int32_t l = 0; l < LANES; l++) c += cl[l];
    return c;
}

/* A value t such that at least k of m[0..n) are >= t, and few more (k <= n; n a
 * multiple of LANES; no NaN): bisection between the least finite and the greatest
 * value, each step one vectorised count. (Any t with k values at or above it is
 * correct; closer to the k-th largest is cheaper afterwards. A selection algorithm
 * costs more here: it mispredicts.) -inf when the values give no finite bound. */
static float kth_bound(const float *m, int32_t n, int32_t k) {
    float hl[LANES], ll[LANES];
    for (int32_t l = 0; l < LANES; l++) {
        hl[l] = -INFINITY;
        ll[l] = INFINITY;
    }
    for (int32_t q = 0; q < n; q += LANES) {
        for (int32_t l = 0; l < LANES; l++) {
            float x = m[q + l];
            hl[l] = x > hl[l] ? x : hl[l];
            ll[l] = x > -INFINITY && x < ll[l] ? x : ll[l]; /* least finite value */
        }
    }
    float hi = hl[0], lo = ll[0];
    for (int32_t l = 1; l < LANES; l++) {
        hi = hl[l] > hi ? hl[l] : hi;
        lo = ll[l] < lo ? ll[l] : lo;
    }
    if (!isfinite(lo) || !isfinite(hi) || count_at_least(m, n, lo) < k) return -INFINITY;
    if (count_at_least(m, n, hi) >= k) return hi;
    for (int step = 0; step < 7; step++) { /* count(>= lo) >= k > count(>= hi) */
        float mid = lo + (hi - lo) * 0.5f;
        if (!(mid > lo && mid < hi)) break;
        if (count_at_least(m, n, mid) >= k) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Top-k (k <= SMALL_K) of row / scale in canonical order without dividing or sorting the
 * whole row. The row is cut into w columns; the k-th largest column maximum is a value
 * with at least k values >= it, so the top-k lie at or above it. Division is monotone,
 * so that bound carries over to the quotients, lowered to the smallest value with the
 * same quotient (rounding can make values equal, and then ids decide). The values at or
 * above it are gathered, divided and ranked. Returns 0 done, -1 NaN, 1 use top_scaled. */
static int top_fast(const float *row, int32_t v, int32_t k, float scale, cand_t *c) {
    int32_t w = 128;
    while (w < MAX_W && v / w > 32) w *= 2; /* about 8-32 values per column (long rows: more) */
    if (v < 4 * w || k * 2 > w) return 1;  /* short rows: insertion is as fast */
    float m1[MAX_W], m2[MAX_W];
    int32_t r1[MAX_W];
    if (column_top2(row, v, w, m1, m2, r1)) return -1;
    float thr = kth_bound(m1, w, k);
    if (thr == -INFINITY) return 1; /* no finite bound (+inf, masked columns): the slow way */
    if (scale != 1.0f) {
        float st = thr / scale;
        for (int steps = 0;; steps++) {
            float below = nextafterf(thr, -INFINITY);
            if (!(below / scale >= st) || below == thr) break;
            if (steps == 64) return 1; /* a huge scale or infinities: the slow way */
            thr = below;
        }
    }
    /* Each column's greatest value is a candidate if it reaches thr; a column whose
     * second value reaches it too is read again whole (rare). Branch-free appends. */
    float gv[MAX_CAND];
    int32_t gi[MAX_CAND], again[MAX_W];
    int32_t n = 0, n_again = 0;
    for (int32_t col = 0; col < w; col++) {
        gv[n] = m1[col];
        gi[n] = col + r1[col] * w;
        n += m1[col] >= thr;
        again[n_again] = col;
        n_again += m2[col] >= thr;
    }
    int32_t per_col = (v + w - 1) / w;
    for (int32_t a = 0; a < n_again; a++) {
        int32_t col = again[a], skip = col + r1[col] * w;
        if (n + per_col > MAX_CAND) return 1; /* many equal values (e.g. -inf): the slow way */
        for (int32_t j = col; j < v; j += w) {
            float x = row[j];
            gv[n] = x;
            gi[n] = j;
            n += (x >= thr) & (j != skip);
        }
    }
    for (int32_t q = 0; q < n; q++) gv[q] = gv[q] / scale;
    /* Each candidate's place in canonical order is the number of candidates before it:
     * a branch-free count the compiler vectorises (a sort would mispredict). */
    for (int32_t i = 0; i < n; i++) {
        float vi = gv[i];
        int32_t ii = gi[i], r = 0;
        for (int32_t j = 0; j < n; j++) r += (gv[j] > vi) | ((gv[j] == vi) & (gi[j] < ii));
        if (r < k) {
            c[r].v = vi;
            c[r].id = ii;
        }
    }
    return 0;
}

/* Top-k for large k: every value with its id, sorted; c has room for v entries. */
static int top_sorted(const float *row, int32_t v, float scale, const uint8_t *seen, float pen,
                      cand_t *c) {
    for (int32_t j = 0; j < v; j++) {
        float x = scaled(row, j, scale, seen, pen);
        if (x != x) return -1;
        c[j].v = x;
        c[j].id = j;
    }
    qsort(c, (size_t)v, sizeof(cand_t), cand_cmp);
    return 0;
}

/* Softmax over the k candidates (float64, as sample_rows), top-p within them, one
 * draw with u in [0, 1). Returns the position among the candidates, -1 if the best
 * value is not finite. w has room for k values. */
static int32_t draw(const cand_t *c, int32_t k, double top_p, double u, double *w) {
    double mx = (double)c[0].v;
    if (!isfinite(mx)) return -1;
    double acc = 0.0;
    int32_t n_pos = 0;
    for (int32_t q = 0; q < k; q++) {
        double e = exp((double)c[q].v - mx);
        n_pos += e > 0.0;
        acc += e;
        w[q] = acc; /* cumulative */
    }
    if (top_p < 1.0 && k > 1) {
        double total = w[k - 1];
        int32_t keep = 1;
        for (int32_t q = 0; q < k - 1; q++) keep += w[q] / total <= top_p;
        if (keep < n_pos) n_pos = keep;
    }
    int32_t last = n_pos - 1;
    double x = u * w[last];
    int32_t j = 0;
    for (int32_t q = 0; q < k; q++) j += w[q] <= x;
    return j < last ? j : last;
}

/* One row (see stt_sample_rows); sn/pen: the row's seen bytes and penalty (sn NULL: no
 * penalty). Returns the token, -1 for a bad row, -2 when scratch was needed and missing. */
int64_t stt_sample_one(const float *row, int32_t n_cols, float t, int64_t top_k, double top_p,
                       double u, const uint8_t *sn, float pen, void *scratch) {
    if (!(t > 0.0f)) return argmax_row(row, n_cols, sn, pen);
    cand_t small[SMALL_K];
    double w_small[SMALL_K];
    int32_t k = (top_k <= 0 || top_k > n_cols) ? n_cols : (int32_t)top_k;
    cand_t *c = small;
    double *w = w_small;
    int rc;
    if (k <= SMALL_K) {
        rc = sn ? 1 : top_fast(row, n_cols, k, t, c);
        if (rc == 1) rc = top_scaled(row, n_cols, k, t, sn, pen, c);
    } else {
        if (!scratch) return -2;
        c = (cand_t *)scratch;
        w = (double *)(c + n_cols);
        rc = top_sorted(row, n_cols, t, sn, pen, c);
    }
    int32_t pos = rc == 0 ? draw(c, k, top_p, u, w) : -1;
    return pos < 0 ? -1 : c[pos].id;
}

/*
 * Sample one token per row. Row i is the n_cols floats at base + offsets[i]
 * (element offsets), read only. Per row: temperature (> 0 samples, else greedy),
 * top_k (<= 0 or > n_cols: all), top_p (>= 1: off), u in [0, 1). seen (n_rows x
 * n_cols bytes) and penalty (n_rows) are both NULL or both given. scratch: NULL,
 * or room for n_cols (cand_t = 8 bytes) + n_cols doubles, needed only when some
 * top_k is above 256 (or off). Writes out[i]; a row with NaN, +inf as its best
 * value or nothing above -inf gets bad[i] = 1 (out[i] = -1).
 * Returns the number of bad rows, or -1 when scratch was needed and missing.
 */
STT_API int32_t stt_sample_rows(const float *base, const int64_t *offsets, int32_t n_rows,
                                int32_t n_cols, const float *temperature, const int64_t *top_k,
                                const double *top_p, const double *u, const uint8_t *seen,
                                const float *penalty, void *scratch, int64_t *out, uint8_t *bad) {
    int32_t n_bad = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        const uint8_t *sn = NULL;
        float pen = 1.0f;
        if (seen && penalty && penalty[i] != 1.0f) {
            sn = seen + (int64_t)i * n_cols;
            pen = penalty[i];
        }
        int64_t tok = stt_sample_one(base + offsets[i], n_cols, temperature[i], top_k[i], top_p[i],
                                     u[i], sn, pen, scratch);
        if (tok == -2) return -1;
        out[i] = tok;
        bad[i] = tok < 0;
        n_bad += tok < 0;
    }
    return n_bad;
}
