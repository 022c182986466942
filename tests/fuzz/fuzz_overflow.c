/* libFuzzer harness: mixprec_overflow_check() (overflow.h), the C entry
 * point of torch.ops.mixprec.overflow_check_ (mixprec.guard's forward check).
 *
 * One input = one call on lists of 0-6 output and 0-6 input tensors of mixed
 * dtypes and odd sizes (0 to past the 65536-element chunk and the 2^18
 * threading limit), each at an odd element offset inside a larger buffer (no
 * vector alignment), some of them views of one shared buffer (an in-place
 * module's input is its output), filled with raw bits, NaNs with payloads,
 * infinities of both signs, subnormals and each dtype's limits; a record of
 * 1-5 slots whose fields start at arbitrary earlier values (values only
 * grow). With the fault bit: negative counts and numels, unknown dtypes, NULL
 * lists / data / record, n_slots < 1, slots out of range. Checked:
 *   - the status is one the header documents for the input;
 *   - on an error the record is unchanged; the tensors are never written;
 *   - on success the record equals a scalar reference written here from the
 *     header's text (every element widened exactly, tested on its value:
 *     fields of other slots untouched, NONFINITE / INPUT_NONFINITE /
 *     FROM_FINITE set exactly as documented, AMAX the max of its old value
 *     and the largest finite magnitude), and the same bits on 1 and 2
 *     threads and on each ISA path this CPU has. */
#include "fuzz_common.h"

#define MAX_TENSORS 6
#define MAX_SLOTS 5

typedef struct call {
  int64_t n_out, n_in; /* counts as passed (may be negative) */
  int out_null, in_null, record_null;
  int n_alloc_out, n_alloc_in;
  mixprec_tensor out[MAX_TENSORS], in[MAX_TENSORS];
  int64_t n_slots, slot;
  float record[MAX_SLOTS * MIXPREC_OVERFLOW_SLOT];
} call;

/* The reference of one list, from fz_load (the exact widening): the largest
 * finite |v| (0 if none) and whether any element is inf/NaN. */
static void ref_scan(const mixprec_tensor *t, int n, float *amax, int *nonfinite) {
  float best = 0.0f;
  int bad = 0;
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < t[i].numel; j++) {
      const float v = fabsf(fz_load(t[i].data, t[i].dtype, j));
      if (!fz_finite(v))
        bad = 1;
      else if (v > best)
        best = v;
    }
  *amax = best;
  *nonfinite = bad;
}

/* A tensor's data: `numel` elements of `d` at an element offset of 0-7
 * inside a buffer with 0-7 elements to spare at the end (ASan sees the
 * buffer's end, not the tensor's). */
static void *place(fz *f, void **owned, int *n_owned, mixprec_dtype d, int64_t numel) {
  const int64_t lead = fz_range(f, 0, 7), tail = fz_range(f, 0, 7);
  const size_t es = fz_dsize(d);
  char *buf = (char *)fz_alloc((size_t)(lead + numel + tail) * es);
  owned[(*n_owned)++] = buf;
  fz_fill(f, buf, fz_dtype_ok(d) ? d : MIXPREC_F32, lead + numel + tail);
  return buf + lead * es;
}

static void describe(fz *f, mixprec_tensor *t, int n_alloc, int faults, int64_t *budget,
                     void **owned, int *n_owned, const mixprec_tensor *shared, int n_shared,
                     int *null_data) {
  for (int i = 0; i < n_alloc; i++) {
    mixprec_tensor *x = &t[i];
    const uint8_t how = fz_u8(f);
    if (n_shared > 0 && how < 48) { /* the same memory as an earlier tensor */
      const mixprec_tensor *s = &shared[how % n_shared];
      if (s->numel > 0 && s->data && fz_dtype_ok(s->dtype)) {
        const int64_t off = fz_range(f, 0, s->numel - 1);
        *x = *s;
        x->data = (char *)s->data + off * (int64_t)fz_dsize(s->dtype);
        x->numel = fz_range(f, 0, s->numel - off);
        continue;
      }
    }
    x->dtype = fz_dtype(f, faults);
    x->numel = fz_count(f, (int64_t)1 << 16);
    if (x->numel > *budget) x->numel = fz_range(f, 0, 7);
    *budget -= x->numel;
    const uint8_t tf = faults ? fz_u8(f) : 0;
    if (tf >= 250) {
      x->numel = -(int64_t)fz_range(f, 1, 3) - (tf == 255 ? (INT64_MAX - 8) : 0);
      x->data = NULL;
    } else if (tf >= 244 && x->numel > 0) {
      x->data = NULL;
      null_data[i] = 1;
    } else if (x->numel > 0 || (fz_u8(f) & 1)) {
      x->data = place(f, owned, n_owned, x->dtype, x->numel > 0 ? x->numel : 0);
    }
  }
}

static fz_allowed list_errors(const mixprec_tensor *t, int64_t n, int list_null) {
  fz_allowed e = 0;
  if (n < 0) return FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (n > 0 && list_null) return FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  for (int64_t i = 0; i < n; i++) {
    if (t[i].numel < 0) e |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
    if (!fz_dtype_ok(t[i].dtype)) e |= FZ_BIT(MIXPREC_ERR_BAD_DTYPE);
    if (t[i].numel > 0 && !t[i].data) e |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  }
  return e;
}

static mixprec_status run(const call *c, float *record) {
  memcpy(record, c->record, sizeof c->record);
  return mixprec_overflow_check(c->out_null ? NULL : c->out, c->n_out, c->in_null ? NULL : c->in,
                                c->n_in, c->record_null ? NULL : record, c->n_slots, c->slot);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  FZ_OPEN(f, c, op);
  const int faults = fz_faults(op, 0xe0);
  c.n_alloc_out = (int)fz_range(&f, 0, MAX_TENSORS);
  c.n_alloc_in = (int)fz_range(&f, 0, MAX_TENSORS);
  c.n_out = c.n_alloc_out;
  c.n_in = c.n_alloc_in;
  c.n_slots = fz_range(&f, 1, MAX_SLOTS);
  c.slot = fz_range(&f, 0, c.n_slots - 1);

  void *owned[2 * MAX_TENSORS];
  int n_owned = 0, null_out[MAX_TENSORS] = {0}, null_in[MAX_TENSORS] = {0};
  int64_t budget = (int64_t)1 << 19; /* past the 2^18 parallel limit, both lists together */
  describe(&f, c.out, c.n_alloc_out, faults, &budget, owned, &n_owned, NULL, 0, null_out);
  /* Inputs may be views of the outputs (an in-place module). */
  describe(&f, c.in, c.n_alloc_in, faults, &budget, owned, &n_owned, c.out, c.n_alloc_out, null_in);

  /* Earlier calls' values: zero, or flags / magnitudes already recorded. */
  const uint8_t prior = fz_u8(&f);
  for (int i = 0; i < MAX_SLOTS * MIXPREC_OVERFLOW_SLOT; i++) {
    const int field = i % MIXPREC_OVERFLOW_SLOT;
    if (prior < 128 || field >= 4) continue; /* scratch fields stay zero (header) */
    const uint8_t b = fz_u8(&f);
    c.record[i] = field == MIXPREC_OVERFLOW_AMAX ? (b & 1 ? fabsf((float)fz_param(&f, 0.0, 70000.0)) : 0.0f)
                                                 : (b < 64 ? 1.0f : 0.0f);
  }
  if (!fz_finite(c.record[c.slot * MIXPREC_OVERFLOW_SLOT + MIXPREC_OVERFLOW_AMAX]))
    c.record[c.slot * MIXPREC_OVERFLOW_SLOT + MIXPREC_OVERFLOW_AMAX] = 0.0f;

  fz_allowed errors = 0;
  const uint8_t fm = faults ? fz_u8(&f) : 0;
  if (fm & 1) {
    static const int64_t bad[] = {-1, -7, INT64_MIN};
    c.n_out = bad[fz_u8(&f) % 3];
  }
  if (fm & 2) {
    static const int64_t bad[] = {-1, -3, INT64_MIN};
    c.n_in = bad[fz_u8(&f) % 3];
  }
  c.out_null = (fm & 4) != 0;
  c.in_null = (fm & 8) != 0;
  c.record_null = (fm & 16) != 0;
  if (fm & 32) c.n_slots = -(int64_t)fz_range(&f, 0, 2);
  if (fm & 64) c.slot = fz_u8(&f) & 1 ? -(int64_t)fz_range(&f, 1, 3) : c.n_slots + fz_range(&f, 0, 2);
  /* A NULL list with a zero count is allowed (header). */
  if (c.out_null && c.n_out == 0) c.out_null = fz_u8(&f) & 1;
  if (c.in_null && c.n_in == 0) c.in_null = fz_u8(&f) & 1;

  if (c.record_null) errors |= FZ_BIT(MIXPREC_ERR_NULL_POINTER);
  if (c.n_slots < 1) errors |= FZ_BIT(MIXPREC_ERR_BAD_SIZE);
  if (c.n_slots >= 1 && (c.slot < 0 || c.slot >= c.n_slots)) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  if (c.n_slots < 1 && c.slot < 0) errors |= FZ_BIT(MIXPREC_ERR_BAD_ARGUMENT);
  errors |= list_errors(c.out, c.n_out, c.out_null);
  errors |= list_errors(c.in, c.n_in, c.in_null);

  /* The tensors' bytes before the call (they are never written). */
  void *snap[2 * MAX_TENSORS];
  size_t snap_bytes[2 * MAX_TENSORS];
  const mixprec_tensor *all[2 * MAX_TENSORS];
  int n_all = 0;
  for (int i = 0; i < c.n_alloc_out; i++) all[n_all++] = &c.out[i];
  for (int i = 0; i < c.n_alloc_in; i++) all[n_all++] = &c.in[i];
  for (int i = 0; i < n_all; i++) {
    const mixprec_tensor *t = all[i];
    snap_bytes[i] = t->data && t->numel > 0 && fz_dtype_ok(t->dtype) ? (size_t)t->numel * fz_dsize(t->dtype) : 0;
    snap[i] = snap_bytes[i] ? fz_dup(t->data, snap_bytes[i]) : NULL;
  }

  FZ_CONFIGS(cfg, n_cfg);
  float first[MAX_SLOTS * MIXPREC_OVERFLOW_SLOT], rec[MAX_SLOTS * MIXPREC_OVERFLOW_SLOT];
  mixprec_status st0 = MIXPREC_OK;
  FZ_FOR_EACH_CONFIG(cfg, n_cfg, k) {
    const mixprec_status st = run(&c, k == 0 ? first : rec);
    if (k == 0) {
      st0 = st;
      fz_check_status("mixprec_overflow_check", st, errors);
    } else {
      FZ_CHECK(st == st0, "status %d on %s/%d threads, %d on %s/%d threads", (int)st,
               fz_isa_name(cfg[k].isa), cfg[k].threads, (int)st0, fz_isa_name(cfg[0].isa),
               cfg[0].threads);
      fz_same("record", rec, first, sizeof rec, cfg[k], cfg[0]);
    }
    for (int i = 0; i < n_all; i++)
      if (snap_bytes[i] && memcmp(snap[i], all[i]->data, snap_bytes[i]) != 0)
        FZ_FAIL("tensor %d of the call was written", i);
    if (st != MIXPREC_OK) fz_unchanged("record", c.record, k == 0 ? first : rec, sizeof c.record, st);
  }

  if (st0 == MIXPREC_OK) {
    float want[MAX_SLOTS * MIXPREC_OVERFLOW_SLOT];
    memcpy(want, c.record, sizeof want);
    float amax = 0.0f, in_amax = 0.0f;
    int out_bad = 0, in_bad = 0;
    ref_scan(c.out, (int)c.n_out, &amax, &out_bad);
    ref_scan(c.in, (int)c.n_in, &in_amax, &in_bad);
    float *w = want + c.slot * MIXPREC_OVERFLOW_SLOT;
    if (amax > w[MIXPREC_OVERFLOW_AMAX]) w[MIXPREC_OVERFLOW_AMAX] = amax;
    if (out_bad) {
      w[MIXPREC_OVERFLOW_NONFINITE] = 1.0f;
      w[in_bad ? MIXPREC_OVERFLOW_INPUT_NONFINITE : MIXPREC_OVERFLOW_FROM_FINITE] = 1.0f;
    }
    for (int i = 0; i < MAX_SLOTS * MIXPREC_OVERFLOW_SLOT; i++)
      FZ_CHECK(fz_bits(first[i]) == fz_bits(want[i]),
               "record[%d] (slot %d field %d) = %a, reference %a (outputs: non-finite %d, amax %a; "
               "inputs: non-finite %d; slot %lld of %lld)", i, i / MIXPREC_OVERFLOW_SLOT,
               i % MIXPREC_OVERFLOW_SLOT, (double)first[i], (double)want[i], out_bad, (double)amax,
               in_bad, (long long)c.slot, (long long)c.n_slots);
  }

  for (int i = 0; i < n_all; i++) free(snap[i]);
  for (int i = 0; i < n_owned; i++) free(owned[i]);
  return 0;
}
