/* The batched engine's fused log-domain step (attnsvm.gd._fused): one pass per instance.
 *
 * For instance b, sequence i, tokens t (logits l_it = x_itᵀ W_b z_i, scores γ_it = Y_i a_it), a selected
 * token r = the first argmax of l_i·, δ_it = γ_it − γ_ir, the runner-up logit l'_i = max_{t≠r} l_it,
 * E_it = e^{l_it − l'_i} (t ≠ r), lse_i − l_ir = log1p(e^{l' − l_r} Σ_{t≠r} E_it), ψ_i = Σ_{t≠r} E_it δ_it,
 * m_i = l'_i − l_ir − (lse_i − l_ir) = log s_i at l':
 *
 *     Y_i f_i = γ_ir + e^{m_i} ψ_i                       (the margin, cancellation-free)
 *     c_it = E_it (e^{m_i} ψ_i − δ_it)  (t ≠ r),   c_ir = e^{−(lse_i − l_ir)} ψ_i
 *     log A_i = log|ℓ'(Y_i f_i)| + m_i,   w_it = −A_i c_it,
 *     G_b = Σ_i (Σ_t e^{log A_i − max_j log A_j} c_it x_it) z_iᵀ,   D_b = G_b/||G_b||,
 *     log||∇L(W_b)|| = max_j log A_j + log||G_b|| − log n
 *
 * (the engine's _direction_log, for the sequences whose selected token has no exact tie in score; log
 * weights beyond `split` are combined by parts, as there). The gradient is scaled by 2^−e,
 * 2^e ≤ max|G| < 2^(e+1), before its norm (exact). An instance is handed back (flag 1) to the eager
 * log-domain path, which decides it exactly, when any of its sequences has a token tied with r in score or
 * a non-finite logit or loss derivative, or when its scaled G is below g_tiny or does not clear the cheap
 * cancellation bound
 *     ||G|| > cancel_rtol·Σ_it |w_it| ||x_it|| ||z_i|| + cancel_factor·Σ_i e^{log|ℓ'_i| + log N_i + log_ve_i − offset}
 * (N_i = Σ_{u≠r} s_iu, as the eager path's _value_bound_log). Each instance is computed by one thread, in
 * one fixed order, at a place in its block that depends on the batch alone: results do not depend on how
 * the batch is split between threads.
 *
 * No fast-math: IEEE semantics for inf and NaN are relied on. Layouts, row-major, float64:
 * X (B, n, T, d), z (B, n, d), gamma and xz (B, n, T), xz_max and log_ve (B, n), W and D (B, d, d),
 * logits (B, n, T) out, log_norm (B,) out, flag (B,) out, margin (B, n) out (Y_i f_i, cancellation-free, for the
 * records), token (B, n) out (r, int64). Losses: 0 logistic (log|ℓ'(u)| = −softplus(u)),
 * 1 exponential (log|ℓ'(u)| = −u).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define ATTNSVM_FUSED_ABI 8
/* Instances per block. Blocks start at multiples of FUSED_BLOCK from instance 0 whatever the threads'
 * split (the caller cuts at block boundaries): an element's place in a vector loop, hence its arithmetic,
 * depends on the batch alone. */
#define FUSED_BLOCK 16

#ifdef ATTNSVM_MVEC
/* glibc's libmvec: vector exp and log (≤ 4 ulp by glibc's documentation), so that the loops over the
 * sequences of a block vectorize with them; without it (other platforms) the same loops call the scalar
 * functions. */
#pragma omp declare simd notinbranch
extern double exp(double);
#pragma omp declare simd notinbranch
extern double log(double);
#endif

#ifndef FUSED_D
#error "compile with -DFUSED_D=<d>, the feature dimension of the engine's data"
#endif

int attnsvm_fused_abi(void) { return ATTNSVM_FUSED_ABI; }
int attnsvm_fused_block(void) { return FUSED_BLOCK; }
int attnsvm_fused_d(void) { return FUSED_D; }
#ifdef _OPENMP
int attnsvm_fused_openmp(void) { return 1; }
#else
int attnsvm_fused_openmp(void) { return 0; }
#endif


/* e^a, or 0 where e^a is below the normal range (a < LN_MIN, just above ln 2^−1022 = −708.396…), NaN for
 * NaN. Where it flushes: a weight E_t below 2^−1022 of the runner-up's (1) and e^{l' − l_r}, e^m, e^{−|u|}
 * below 2^−1022 change no double they enter beyond the eager path's own subnormal rounding (x = 0 leaves
 * lse, s_r and m as they are; e^m ψ is below 2^−1022·T·max|δ| against |δ_t|, within a sequence's values
 * span ≤ 2^511, else the instance is not the kernel's); a sequence's factor e^{log A_i − top} is checked:
 * the terms it drops are bounded against ||G|| (stage 4). */
#define LN_MIN (-708.0)
static inline double exp_normal(double a) { return a < LN_MIN ? 0.0 : exp(a); }

/* out[k] = exp_normal(a[k]), k < K, as three loops through the scratch tmp: the vector exp takes a slow
 * special-case path for any lane outside its fast range (2× the saturated step), so its inputs are clamped
 * first; in one loop the compiler sees that the kept lanes have a ≥ LN_MIN and calls exp(a) itself.
 * a and out may be the same array. */
static inline void exp_normal_v(const double *a, double *out, double *restrict tmp, int64_t K) {
    for (int64_t k = 0; k < K; ++k) tmp[k] = a[k] < LN_MIN ? LN_MIN : a[k]; /* NaN stays NaN */
    for (int64_t k = 0; k < K; ++k) tmp[k] = exp(tmp[k]);
    for (int64_t k = 0; k < K; ++k) out[k] = a[k] < LN_MIN ? 0.0 : tmp[k];
}

/* log1p(x) for x ≥ 0 to a few ulps (Goldberg): log(1 + x)·x/((1 + x) − 1), x where 1 + x rounds to 1,
 * log x where 1 + x overflows; written with selects so that a loop over it vectorizes. */
static inline double log1p_pos(double x) {
    const double w = 1.0 + x;
    const double lw = log(w == INFINITY ? x : w);
    const double g = lw * (x / (w - 1.0));
    return w == 1.0 ? x : (w == INFINITY ? lw : g);
}

/* One block of instances. d is the compile-time constant FUSED_D: q, y and the d-long loops live in
 * registers and unroll. Sums over k are split into independent chains (the compiler may not reassociate a
 * floating-point sum). */
static void
fused_block(int64_t b0, int64_t b1, int64_t B, int64_t n, int64_t T, const int64_t d,
            const double *restrict X, const double *restrict z, const double *restrict gammaT,
            const double *restrict xzT, const double *restrict xz_max, const double *restrict log_ve,
            const double *restrict ve_c, const double *restrict W, int loss, double cancel_rtol,
            double cancel_factor, double log_n, double g_tiny, double split, double *restrict D,
            double *restrict log_norm, double *restrict logitsT, int8_t *restrict flag,
            double *restrict margin, int64_t *restrict token, double *restrict buf) {
    const int64_t Bn = B * n, dd = d * d, p0 = b0 * n, P = (b1 - b0) * n;
    /* per-sequence scratch, (P,) each, and c (T, P) */
    double *restrict lr = buf, *restrict rr = lr + P, *restrict g_r = rr + P, *restrict l1 = g_r + P;
    double *restrict sum_nr = l1 + P, *restrict psi = sum_nr + P, *restrict m_s = psi + P;
    double *restrict ll_s = m_s + P, *restrict log_a = ll_s + P, *restrict fac = log_a + P;
    double *restrict s_r = fac + P, *restrict em_s = s_r + P, *restrict badv = em_s + P;
    double *restrict big = badv + P; /* (P,): 1 where the log weight is beyond split */
    double *restrict c = big + P;    /* (T, P) */
    double *restrict Y = c + T * P;  /* (n, d): y_i of one instance */
    double *restrict Wt = Y + n * d; /* (d, d): W_bᵀ */
    double *restrict tmp = Wt + d * d; /* (T, P): exp_normal_v's scratch */
    double q[d], y[d];
    const double LN2 = 0.69314718055994530942;

    /* stage 1, per sequence: q = W_b z_i and the logits l_it = x_itᵀ q, into logitsT (T, B, n) */
    /* W_bᵀ: q = Σ_j z_ij (column j of W_b), a vector operation per j */
    for (int64_t p = 0; p < P; ++p) {
        const int64_t gp = p0 + p;
        if (p % n == 0) {
            const double *restrict Wb = W + (gp / n) * dd;
            for (int64_t k = 0; k < d; ++k)
                for (int64_t j = 0; j < d; ++j) Wt[j * d + k] = Wb[k * d + j];
        }
        const double *restrict zi = z + gp * d;
        const double *restrict Xi = X + gp * T * d;
        for (int64_t k = 0; k < d; ++k) q[k] = 0.0;
        for (int64_t j = 0; j < d; ++j) {
            const double zj = zi[j];
            for (int64_t k = 0; k < d; ++k) q[k] += zj * Wt[j * d + k];
        }
        int64_t t = 0;
        for (; t + 4 <= T; t += 4) { /* four tokens at once: four independent chains */
            const double *restrict x = Xi + t * d;
            double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
            for (int64_t k = 0; k < d; ++k) {
                s0 += x[k] * q[k];
                s1 += x[d + k] * q[k];
                s2 += x[2 * d + k] * q[k];
                s3 += x[3 * d + k] * q[k];
            }
            logitsT[t * Bn + gp] = s0;
            logitsT[(t + 1) * Bn + gp] = s1;
            logitsT[(t + 2) * Bn + gp] = s2;
            logitsT[(t + 3) * Bn + gp] = s3;
        }
        for (; t < T; ++t) {
            const double *restrict x = Xi + t * d;
            double s = 0.0;
            for (int64_t k = 0; k < d; ++k) s += x[k] * q[k];
            logitsT[t * Bn + gp] = s;
        }
    }
    /* stage 2, vectorized over the block's sequences: the selected token r (first maximiser), its score,
       the runner-up l' among the others, E, Σ E, ψ, the margin and the log weights */
    const double *restrict L = logitsT + p0, *restrict Gm = gammaT + p0;
    for (int64_t p = 0; p < P; ++p) {
        const double v = L[p];
        lr[p] = v;
        rr[p] = 0.0;
        badv[p] = (v - v != 0.0) ? 1.0 : 0.0; /* not finite (a count of defects: nonzero = hand back) */
    }
    for (int64_t t = 1; t < T; ++t)
        for (int64_t p = 0; p < P; ++p) {
            const double v = L[t * Bn + p], lo = lr[p], ro = rr[p], bo = badv[p];
            const int up = v > lo;
            badv[p] = bo + ((v - v != 0.0) ? 1.0 : 0.0);
            lr[p] = up ? v : lo;
            rr[p] = up ? (double)t : ro;
        }
    for (int64_t p = 0; p < P; ++p) g_r[p] = 0.0, l1[p] = -INFINITY;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t p = 0; p < P; ++p) {
            const double gv = Gm[t * Bn + p], go = g_r[p];
            g_r[p] = rr[p] == (double)t ? gv : go;
        }
    for (int64_t t = 0; t < T; ++t)
        for (int64_t p = 0; p < P; ++p) {
            const int other = rr[p] != (double)t;
            const double v = L[t * Bn + p], gv = Gm[t * Bn + p], lo = l1[p], bo = badv[p];
            l1[p] = (other & (v > lo)) ? v : lo;
            /* a token tied in score with r: the eager path's masked form decides */
            badv[p] = bo + ((other & (gv - g_r[p] == 0.0)) ? 1.0 : 0.0);
        }
    for (int64_t p = 0; p < P; ++p) sum_nr[p] = 0.0, psi[p] = 0.0;
    for (int64_t t = 0; t < T; ++t)
        for (int64_t p = 0; p < P; ++p) c[t * P + p] = L[t * Bn + p] - l1[p];
    for (int64_t k = 0; k < T * P; ++k) c[k] = c[k] < 0.0 ? c[k] : 0.0; /* r's (≥ 0) is unused */
    exp_normal_v(c, c, tmp, T * P);
    for (int64_t t = 0; t < T; ++t)
        for (int64_t p = 0; p < P; ++p) {
            const double e = c[t * P + p], gv = Gm[t * Bn + p];
            const double E = rr[p] != (double)t ? e : 0.0;
            c[t * P + p] = E;
            sum_nr[p] += E;
            psi[p] += E * (gv - g_r[p]);
        }
    /* per sequence, in short loops (each vectorizes, with one transcendental function):
       lse − l_r = log1p(x), x = e^{l' − l_r} Σ E; s_r = e^{−lse} = 1/(1 + x) (to ~1 ulp, better than
       e^{−log1p x} for large x); m = l' − l_r − (lse − l_r); e^m = e^{l' − l_r}·s_r while e^{l' − l_r} is
       normal, else e^m; the margin u = γ_r + e^m ψ and log|ℓ'(u)| (−softplus(u) or −u) */
    for (int64_t p = 0; p < P; ++p) em_s[p] = l1[p] - lr[p];
    exp_normal_v(em_s, em_s, tmp, P); /* e1, for now */
    for (int64_t p = 0; p < P; ++p) {
        const double x = em_s[p] * sum_nr[p];
        s_r[p] = 1.0 / (1.0 + x);
        m_s[p] = l1[p] - lr[p] - log1p_pos(x);
    }
    exp_normal_v(m_s, ll_s, tmp, P); /* e^m directly, for now */
    for (int64_t p = 0; p < P; ++p) {
        const double e1 = em_s[p];
        const double em = e1 >= 0x1p-1022 ? e1 * s_r[p] : ll_s[p];
        em_s[p] = em;
        fac[p] = g_r[p] + em * psi[p]; /* u, for now */
    }
    for (int64_t p = 0; p < P; ++p) {
        margin[p0 + p] = fac[p];
        token[p0 + p] = (int64_t)rr[p];
    }
    for (int64_t p = 0; p < P; ++p) ll_s[p] = -fabs(fac[p]);
    exp_normal_v(ll_s, ll_s, tmp, P); /* e^{−|u|}, for now */
    for (int64_t p = 0; p < P; ++p) {
        const double u = fac[p];
        const double sp = (u > 0.0 ? u : 0.0) + log1p_pos(ll_s[p]); /* softplus(u) */
        ll_s[p] = loss == 1 ? -u : -sp;                             /* log|ℓ'(u)| */
    }
    for (int64_t p = 0; p < P; ++p) {
        const double ll = ll_s[p], m = m_s[p];
        double size = fabs(ll) - m;
        size = (size != size || size == INFINITY) ? 0.0 : size;
        /* ℓ' beyond float64, T = 1 (l' = −inf): handed back; log weights beyond split: by parts (stage 3) */
        const int defect = !(ll < INFINITY) | (l1[p] == -INFINITY);
        badv[p] += defect ? 1.0 : 0.0;
        big[p] = size > split ? 1.0 : 0.0;
        log_a[p] = xz_max[p0 + p] > 0.0 ? ll + m : -INFINITY; /* a dead sequence sets no scale */
    }
    for (int64_t t = 0; t < T; ++t)
        for (int64_t p = 0; p < P; ++p) {
            const double cr = s_r[p] * psi[p];
            const double co = (em_s[p] * psi[p] - (Gm[t * Bn + p] - g_r[p])) * c[t * P + p];
            c[t * P + p] = rr[p] == (double)t ? cr : co;
        }
    /* stage 3, per instance: its largest log weight, each sequence's factor e^{log A_i − top} */
    for (int64_t bl = 0; bl < b1 - b0; ++bl) {
        double top = -INFINITY;
        int bad = 0;
        for (int64_t i = 0; i < n; ++i) {
            top = log_a[bl * n + i] > top ? log_a[bl * n + i] : top;
            bad |= badv[bl * n + i] != 0.0;
        }
        flag[b0 + bl] = (int8_t)bad;
        for (int64_t i = 0; i < n; ++i) fac[bl * n + i] = top; /* the instance's top, for the loop below */
    }
    for (int64_t p = 0; p < P; ++p) {
        const double top_safe = fac[p] - fac[p] == 0.0 ? fac[p] : 0.0;
        fac[p] = log_a[p] - top_safe;
        badv[p] = top_safe; /* kept: the instance's top (finite) */
    }
    exp_normal_v(fac, fac, tmp, P);
    /* An instance with a log weight |log|ℓ'_i|| − m_i beyond split: log A_i − top by parts, as the eager
       path: the plain sum log|ℓ'_i| + m_i rounds its O(1) part to the ulp of the larger (sequences sharing a
       log weight of −7e13 kept their relative size only to e^{±0.02}). Around the first largest sequence
       j, rel_i = (m_i − m_j) + (log|ℓ'_i| − log|ℓ'_j|) (differences of log weights: exact where equal), then
       the largest rel subtracted, so that the top sequence's factor is 1. */
    for (int64_t bl = 0; bl < b1 - b0; ++bl) {
        const int64_t q0 = bl * n;
        int any_big = 0;
        for (int64_t i = 0; i < n; ++i) any_big |= big[q0 + i] != 0.0;
        if (!any_big) continue;
        int64_t j = 0;
        for (int64_t i = 1; i < n; ++i)
            if (log_a[q0 + i] > log_a[q0 + j]) j = i;
        double top_rel = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
            const int64_t p = q0 + i;
            const double rel = (m_s[p] - m_s[q0 + j]) + (ll_s[p] - ll_s[q0 + j]);
            fac[p] = isfinite(log_a[p]) ? rel : -INFINITY; /* rel, for now */
            top_rel = fac[p] > top_rel ? fac[p] : top_rel;
        }
        const double shift = isfinite(top_rel) ? top_rel : 0.0;
        for (int64_t i = 0; i < n; ++i) fac[q0 + i] = exp_normal(fac[q0 + i] - shift);
    }
    /* stage 4, per instance: G = Σ_i y_i z_iᵀ, y_i = Σ_t (fac_i c_it) x_it, its scale, norm and refusals */
    for (int64_t bl = 0; bl < b1 - b0; ++bl) {
        const int64_t b = b0 + bl;
        if (flag[b]) continue;
        double *restrict Db = D + b * dd;
        double level = 0.0;
        /* Σ_t |c_it| ||x_it|| ||z_i|| over the live sequences whose factor e^{log A_i − top} is below 2^−1022
           (exp_normal gave 0): their terms are below 2^−1022 of that, checked against ||G|| below */
        double dropped = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const int64_t p = bl * n + i, gp = p0 + p;
            const double f = fac[p];
            const double *restrict Xi = X + gp * T * d;
            double *restrict yi = Y + i * d;
            for (int64_t k = 0; k < d; ++k) yi[k] = 0.0;
            if (f == 0.0 && log_a[p] > -INFINITY) {
                for (int64_t t = 0; t < T; ++t) dropped += fabs(c[t * P + p]) * xzT[t * Bn + gp];
                continue;
            }
            for (int64_t t = 0; t < T; ++t) {
                const double w = c[t * P + p] * f;
                const double *restrict x = Xi + t * d;
                for (int64_t k = 0; k < d; ++k) yi[k] += w * x[k];
                level += fabs(w) * xzT[t * Bn + gp];
            }
        }
        /* G = Σ_i y_i z_iᵀ, row by row: each row accumulated in registers over the sequences, stored once */
        const double *restrict zb = z + (p0 + bl * n) * d;
        for (int64_t k = 0; k < d; ++k) {
            for (int64_t j = 0; j < d; ++j) y[j] = 0.0;
            for (int64_t i = 0; i < n; ++i) {
                const double yik = Y[i * d + k];
                for (int64_t j = 0; j < d; ++j) y[j] += yik * zb[i * d + j];
            }
            for (int64_t j = 0; j < d; ++j) Db[k * d + j] = y[j];
        }
        /* max|G| over eight lanes (independent chains); NaN or inf anywhere is handed back */
        double mx[8] = {0, 0, 0, 0, 0, 0, 0, 0}, nans[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 8 <= dd; k += 8)
            for (int j = 0; j < 8; ++j) {
                const double a = fabs(Db[k + j]);
                mx[j] = a > mx[j] ? a : mx[j];
                nans[j] += a - a; /* 0, or NaN for NaN and inf */
            }
        for (int j = 0; k < dd; ++k, ++j) {
            const double a = fabs(Db[k]);
            mx[j] = a > mx[j] ? a : mx[j];
            nans[j] += a - a;
        }
        double gmax = mx[0], nan_sum = 0.0;
        for (int j = 0; j < 8; ++j) {
            gmax = mx[j] > gmax ? mx[j] : gmax;
            nan_sum += nans[j];
        }
        if (nan_sum != 0.0 || !(gmax >= g_tiny)) { flag[b] = 1; continue; }
        int e;
        frexp(gmax, &e);
        /* 2^−e is a double for every e here (gmax ≥ g_tiny = 2^−1000, < 2^1024): the products are the
           correctly rounded x·2^−e, as ldexp's; eight partial sums of squares (independent chains) */
        const double scale = ldexp(1.0, -e);
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (k = 0; k + 8 <= dd; k += 8)
            for (int j = 0; j < 8; ++j) {
                Db[k + j] *= scale;
                acc[j] += Db[k + j] * Db[k + j];
            }
        for (int j = 0; k < dd; ++k, ++j) {
            Db[k] *= scale;
            acc[j] += Db[k] * Db[k];
        }
        const double nrm = sqrt(((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])));
        /* the values' rounding bound Σ_i e^{log|ℓ'_i| + log N_i + log_ve_i − offset}, offset = top + e ln 2,
           N_i = e^{m_i} Σ_{t≠r} E_it: that is fac_i·Σ_{t≠r} E_it·ve_i·2^−e where fac_i and ve_i are normal
           (an underflow of that product is below 2^−1022 against ||G|| ≥ ½), else from the logarithms */
        const double top_safe = badv[bl * n];
        const double offset = top_safe + e * LN2;
        double ve = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const int64_t p = bl * n + i;
            const double f = fac[p], vc = ve_c[p0 + p];
            if (f >= 0x1p-1022 && vc >= 0x1p-1022 && vc < INFINITY)
                ve += (f * sum_nr[p]) * (vc * scale);
            else
                /* below 2^−1022 (flushed): against ||G|| ≥ ½ it cannot move the comparison */
                ve += exp_normal(ll_s[p] + (m_s[p] + log(sum_nr[p])) + log_ve[p0 + p] - offset);
        }
        if (!(nrm > level * cancel_rtol * scale + cancel_factor * ve)) { flag[b] = 1; continue; }
        /* the flushed sequences' terms, < 2^−1022·dropped in G's units, must be below 2^−60 of ||G||: far
           below its rounding (else the eager path, which keeps them as subnormals, decides) */
        if (!(dropped * 0x1p-1022 * scale <= 0x1p-60 * nrm)) { flag[b] = 1; continue; }
        const double inv = 1.0 / nrm;
        for (k = 0; k < dd; ++k) Db[k] *= inv;
        log_norm[b] = top_safe + log(nrm) + e * LN2 - log_n;
    }
}

/* Instances [b0, b1) (b0 a multiple of FUSED_BLOCK), block by block, for d = FUSED_D (the library is
 * compiled once per d: the d-long loops then unroll and keep q and y in registers, about twice as fast as
 * with d a variable). Built with OpenMP, the blocks are shared out over torch's own OpenMP threads (the
 * process has one libgomp: the library links the one torch loaded), statically; each block is computed by
 * one thread in one order either way. Returns 0; −1 when scratch memory could not be allocated, −2 for
 * another d (nothing written then). */
int attnsvm_fused_log_direction(int64_t b0, int64_t b1, int64_t B, int64_t n, int64_t T, int64_t d,
                                const double *X, const double *z, const double *gammaT, const double *xzT,
                                const double *xz_max, const double *log_ve, const double *ve_c,
                                const double *W, int loss, double cancel_rtol, double cancel_factor,
                                double log_n, double g_tiny, double split, double *D, double *log_norm,
                                double *logitsT, int8_t *flag, double *margin, int64_t *token) {
    if (d != FUSED_D) return -2;
    const size_t per = (size_t)(FUSED_BLOCK * n * (2 * T + 14) + n * d + d * d);
    const int64_t blocks = (b1 - b0 + FUSED_BLOCK - 1) / FUSED_BLOCK;
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    double *buf = malloc(sizeof(double) * per * (size_t)threads);
    if (buf == NULL) return -1;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t j = 0; j < blocks; ++j) {
#ifdef _OPENMP
        double *mine = buf + per * (size_t)omp_get_thread_num();
#else
        double *mine = buf;
#endif
        const int64_t c0 = b0 + j * FUSED_BLOCK;
        const int64_t c1 = c0 + FUSED_BLOCK < b1 ? c0 + FUSED_BLOCK : b1;
        fused_block(c0, c1, B, n, T, FUSED_D, X, z, gammaT, xzT, xz_max, log_ve, ve_c, W, loss, cancel_rtol,
                    cancel_factor, log_n, g_tiny, split, D, log_norm, logitsT, flag, margin, token, mine);
    }
    free(buf);
    return 0;
}
