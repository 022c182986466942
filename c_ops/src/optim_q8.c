/* The Q8 map's tables for the vector kernels (optim_common.h,
 * mixprec__q8_tabs), computed once from optim_math.h's scalar functions. */
#include "optim_common.h"

/* The rank of the code of y >= 0 (the codes in the order of their values)
 * and its inverse (optim_math.h's code order: signed 0..127 then +1.0 at
 * 0x80; unsigned 0, the magnitudes 2..255, then 1.0 at 1). */
static int q8_rank(float y, int is_signed) {
  const int c = mixprec__q8_encode(y, 1.0f, is_signed);
  if (is_signed) return c == 0x80 ? 128 : c;
  return c == 0 ? 0 : c == 1 ? 255 : c - 1;
}

static uint8_t q8_code_of_rank(int r, int is_signed) {
  if (is_signed) return (uint8_t)(r == 128 ? 0x80 : r);
  return (uint8_t)(r == 0 ? 0 : r == 255 ? 1 : r + 1);
}

static float q8_next(float y, int up) {
  const uint32_t u = mixprec__sr_float_bits(y);
  return mixprec__opt_from_bits(up ? u + 1u : u - 1u);
}

/* The least float y >= 0 whose code ranks r or more ([note: q8 thresholds]):
 * from the midpoint of the values of ranks r - 1 and r, stepped one float
 * at a time to the exact boundary of the scalar encode. */
static float q8_threshold(int r, int is_signed) {
  float y = MIXPREC__FMUL(MIXPREC__FADD(mixprec__q8_decode(q8_code_of_rank(r - 1, is_signed), is_signed),
                                        mixprec__q8_decode(q8_code_of_rank(r, is_signed), is_signed)),
                          0.5f);
  if (q8_rank(y, is_signed) >= r) {
    while (y > 0.0f && q8_rank(q8_next(y, 0), is_signed) >= r) y = q8_next(y, 0);
  } else {
    while (q8_rank(y, is_signed) < r) y = q8_next(y, 1);
  }
  return y;
}

static void q8_tabs_init(mixprec__q8_tabs *t, int is_signed) {
  memset(t, 0, sizeof *t);
  for (int j = 0; j < 8; j++) {
    t->base[j] = 1;
    t->search[j] = j >= 1 && j <= 6 ? (float)mixprec__q8_lower(j) : 0.0f;
  }
  t->search[7] = mixprec__opt_from_bits(0x7fc00000u);
  for (int L = is_signed ? 0 : 1; L <= (is_signed ? 6 : 7); L++) {
    const mixprec__q8_decade c = mixprec__q8_decade_of(is_signed ? L : L - 1, L);
    t->dec_step[L] = c.step;
    t->dec_first[L] = c.first;
    t->dz_step[(127 + L) & 15] = c.step;
    t->dz_first[(127 + L) & 15] = c.first;
  }
  if (!is_signed) t->dz_first[15] = 1.0f; /* code 1 (L = 0): 0 * 0 + 1 */
  for (int d = 0; d <= 6; d++) {
    const int L = is_signed ? d : d + 1;
    const mixprec__q8_decade c = mixprec__q8_decade_of(d, L);
    t->lower[d] = c.lower;
    t->inv_step[d] = c.inv_step;
    t->step[d] = c.step;
    t->first[d] = c.first;
    t->jmax[d] = (float)((1 << L) - 1);
    t->base[d] = 1 << L;
    if (d > 0) t->below[d] = mixprec__q8_mag((uint32_t)(1 << L) - 1u, is_signed);
  }
  const int top = is_signed ? 128 : 255;
  for (int r = 1; r <= top; r++) t->thr[r] = q8_threshold(r, is_signed);
  /* The search tables (NB halving steps over ranks 0 .. 2^NB - 1). */
  const int NB = is_signed ? 7 : 8, last = (1 << NB) - 1;
#define T(k) t->thr[(k) < last ? (k) : last]
  for (int a = 0; a < 3; a++)
    for (int R = 0; R < 16; R++) t->bs_r[a][R] = T(R * (1 << (NB - 4)) + (1 << (NB - 2 - a)));
  for (int j = 0; j < 16; j++) t->bs16[j] = T(j * (1 << (NB - 4)) + (1 << (NB - 5)));
  for (int j = 0; j < 32; j++) t->bs32[j] = T(j * (1 << (NB - 5)) + (1 << (NB - 6)));
  for (int j = 0; j < 64; j++) t->bs64[j] = T(j * (1 << (NB - 6)) + (1 << (NB - 7)));
  if (!is_signed)
    for (int j = 0; j < 128; j++) t->bs128[j] = T(j * 2 + 1);
#undef T
}

static mixprec__q8_tabs g_tabs[2];
static int g_state[2]; /* 0: not computed, 1: being computed, 2: ready */

const mixprec__q8_tabs *mixprec__q8_tabs_get(int is_signed) {
  const int s = is_signed != 0;
  if (__atomic_load_n(&g_state[s], __ATOMIC_ACQUIRE) != 2) {
    int expected = 0;
    if (__atomic_compare_exchange_n(&g_state[s], &expected, 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      q8_tabs_init(&g_tabs[s], s);
      __atomic_store_n(&g_state[s], 2, __ATOMIC_RELEASE);
    } else {
      while (__atomic_load_n(&g_state[s], __ATOMIC_ACQUIRE) != 2) {
      } /* another thread computes them (microseconds) */
    }
  }
  return &g_tabs[s];
}
