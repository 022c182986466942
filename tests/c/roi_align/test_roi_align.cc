// mixprec_roi_align / mixprec_roi_align_backward on the CPU: a float64
// reference of the sampling grid on smooth (bilinear-exact) feature maps,
// FP16/BF16 == the FP32 kernel on the widened data rounded once, the CUDA
// backward's gather (run on the CPU) == the scatter bit for bit, results
// independent of the thread count, the edge rules, NaN boxes, and every
// error status with nothing written. Bit equality with torchvision itself is
// tested from Python (tests/python/test_roi_align.py).
#include <cmath>
#include <limits>

#include "internal.h"
#include "mixprec/roi_align.h"
#include "roi_align_check.h"
#include "roi_align_internal.h"
#include "test_util.h"

namespace {

// The CUDA backward's gather (mixprec__roi_gather, one pixel at a time) run
// on the CPU, compiled here rather than shipped in the library: same
// arguments as mixprec_roi_align_backward, one thread, its size checks only.
mixprec_status roi_align_backward_gather(const void *grad_output, mixprec_dtype grad_dtype,
                                         const int64_t *grad_strides, const void *rois,
                                         mixprec_dtype rois_dtype, int64_t n_rois, int64_t batch,
                                         int64_t channels, int64_t height, int64_t width,
                                         const mixprec_roi_align_params *p, void *grad_input,
                                         mixprec_dtype grad_input_dtype) {
  int64_t in_numel, out_numel;
  mixprec_status st = mixprec__roi_align_check(grad_input_dtype, batch, channels, height, width,
                                               rois_dtype, n_rois, p, grad_dtype, &in_numel,
                                               &out_numel);
  if (st != MIXPREC_OK) return st;
  if (out_numel == 0) n_rois = 0;
  const float scale = (float)p->spatial_scale;
  const int nc = MIXPREC__ROI_GATHER_C;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t c0 = 0; c0 < channels; c0 += nc)
      for (int64_t y = 0; y < height; y++)
        for (int64_t x = 0; x < width; x++) {
          float acc[MIXPREC__ROI_GATHER_C] = {0};
          const int n = channels - c0 < nc ? (int)(channels - c0) : nc;
          for (int64_t k = 0; k < n_rois; k++) {
            const mixprec__roi r = mixprec__roi_make(rois, rois_dtype, k, batch, p, scale);
            if (r.batch != b || !r.finite) continue;
            mixprec__roi_gather(&r, grad_output, grad_dtype,
                                k * grad_strides[0] + c0 * grad_strides[1], grad_strides[1], n,
                                grad_strides[2], grad_strides[3], p->pooled_height,
                                p->pooled_width, height, width, y, x, acc);
          }
          for (int cc = 0; cc < n; cc++)
            mixprec__store_f32(grad_input, grad_input_dtype,
                               ((b * channels + c0 + cc) * height + y) * width + x, acc[cc]);
        }
  return MIXPREC_OK;
}


using mpt::Buf;

const mixprec_dtype kDtypes[] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

struct Problem {
  int64_t n, c, h, w, k;
  std::vector<float> feat, rois;
};

// Random rois, some partly or wholly outside the map, some tiny, some
// degenerate, on random features.
Problem MakeProblem(std::mt19937 &rng, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k,
                    float scale) {
  Problem p{n, c, h, w, k, {}, {}};
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  p.feat.resize(size_t(n * c * h * w));
  for (auto &v : p.feat) v = g(rng);
  p.rois.resize(size_t(k * 5));
  for (int64_t i = 0; i < k; i++) {
    float *r = &p.rois[size_t(i * 5)];
    r[0] = float(int64_t(u(rng) * float(n)) % n);
    const float x = (u(rng) * 1.3f - 0.15f) * float(w) / scale, y = (u(rng) * 1.3f - 0.15f) * float(h) / scale;
    float bw = u(rng) * float(w) / scale * 0.6f, bh = u(rng) * float(h) / scale * 0.6f;
    if (i % 7 == 3) bw = bh = 0.3f;  // tiny
    if (i % 11 == 5) bw = -2.0f;     // inverted
    r[1] = x;
    r[2] = y;
    r[3] = x + bw;
    r[4] = y + bh;
  }
  return p;
}

Buf Stored(mixprec_dtype dt, const std::vector<float> &v) {
  Buf b(dt, int64_t(v.size()));
  for (size_t i = 0; i < v.size(); i++) b.set_value(int64_t(i), v[i]);
  return b;
}

std::vector<float> Widened(const Buf &b) {
  std::vector<float> v(size_t(b.numel()));
  for (int64_t i = 0; i < b.numel(); i++) v[size_t(i)] = b.value(i);
  return v;
}

mixprec_roi_align_params Params(int64_t ph, int64_t pw, double scale, int64_t sr, int aligned) {
  mixprec_roi_align_params p = mixprec_roi_align_params_default(ph, pw);
  p.spatial_scale = scale;
  p.sampling_ratio = sr;
  p.aligned = aligned;
  return p;
}

Buf Forward(const Problem &pr, mixprec_dtype dt, mixprec_dtype rd,
            const mixprec_roi_align_params &p) {
  Buf in = Stored(dt, pr.feat), rois = Stored(rd, pr.rois);
  Buf out(dt, pr.k * pr.c * p.pooled_height * p.pooled_width);
  for (int64_t i = 0; i < out.numel(); i++) out.set_raw(i, 0x5555u);  // poison
  EXPECT_EQ(mixprec_roi_align(in.data(), dt, pr.n, pr.c, pr.h, pr.w, rois.data(), rd, pr.k, &p,
                              out.data(), dt),
            MIXPREC_OK);
  return out;
}

struct Cfg {
  int64_t ph, pw;
  double scale;
  int64_t sr;
  int aligned;
};
const Cfg kCfgs[] = {{7, 7, 0.25, 2, 0}, {7, 5, 0.5, -1, 0}, {14, 14, 0.125, 0, 1},
                     {3, 4, 1.0, 3, 1},  {2, 2, 1.0, -1, 1}, {1, 1, 0.5, 1, 0}};

}  // namespace

// The sampling grid in float64 on a map that bilinear interpolation
// reproduces exactly (f = a + b*x + c*y inside the map): the output is the
// mean of f at the clamped sample points, from the formulas written out
// independently (np.linspace-like centres of a grid x grid per bin).
TEST(RoiAlign, MatchesFloat64GridOnPlanarMap) {
  mpt::GlobalStateGuard guard;
  const int64_t H = 23, W = 31;
  std::vector<float> feat(size_t(H * W));
  for (int64_t y = 0; y < H; y++)
    for (int64_t x = 0; x < W; x++) feat[size_t(y * W + x)] = 0.5f + 0.25f * float(x) - 0.125f * float(y);
  const float rois[][5] = {{0, 2.5f, 3.25f, 20.0f, 15.5f}, {0, 0.0f, 0.0f, 30.0f, 22.0f},
                           {0, 10.0f, 10.0f, 10.5f, 10.25f}, {0, 5.0f, 1.0f, 28.0f, 21.0f}};
  for (int aligned = 0; aligned < 2; aligned++)
    for (int64_t sr : {int64_t(-1), int64_t(2), int64_t(3)}) {
      const mixprec_roi_align_params p = Params(5, 4, 1.0, sr, aligned);
      std::vector<float> out(4 * 5 * 4);
      ASSERT_EQ(mixprec_roi_align(feat.data(), MIXPREC_F32, 1, 1, H, W, rois, MIXPREC_F32, 4, &p,
                                  out.data(), MIXPREC_F32),
                MIXPREC_OK);
      for (int k = 0; k < 4; k++) {
        const double off = aligned ? 0.5 : 0.0;
        const double sx = rois[k][1] - off, sy = rois[k][2] - off;
        double rw = rois[k][3] - rois[k][1], rh = rois[k][4] - rois[k][2];
        if (!aligned) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
        const int gh = sr > 0 ? int(sr) : int(std::ceil(rh / 5)), gw = sr > 0 ? int(sr) : int(std::ceil(rw / 4));
        for (int ph = 0; ph < 5; ph++)
          for (int pw = 0; pw < 4; pw++) {
            double sum = 0;
            for (int iy = 0; iy < gh; iy++)
              for (int ix = 0; ix < gw; ix++) {
                double y = sy + (ph + (iy + 0.5) / gh) * rh / 5, x = sx + (pw + (ix + 0.5) / gw) * rw / 4;
                y = std::min(std::max(y, 0.0), double(H - 1));
                x = std::min(std::max(x, 0.0), double(W - 1));
                sum += 0.5 + 0.25 * x - 0.125 * y;
              }
            const double want = sum / std::max(gh * gw, 1);
            EXPECT_NEAR(out[size_t((k * 5 + ph) * 4 + pw)], want, 2e-5 * (1 + std::fabs(want)))
                << "roi " << k << " bin " << ph << "," << pw << " aligned " << aligned << " sr " << sr;
          }
      }
    }
}

// FP16 / BF16 features (and rois) give the FP32 kernel's output on the
// widened values, rounded once; the same for the gradient.
TEST(RoiAlign, HalfEqualsFloatOnWidenedRoundedOnce) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 1);
  for (const Cfg &c : kCfgs) {
    Problem pr = MakeProblem(rng, 2, 5, 19, 26, 23, float(c.scale));
    const mixprec_roi_align_params p = Params(c.ph, c.pw, c.scale, c.sr, c.aligned);
    for (mixprec_dtype dt : {MIXPREC_F16, MIXPREC_BF16}) {
      Buf in = Stored(dt, pr.feat), rois = Stored(dt, pr.rois);
      Problem wide = pr;
      wide.feat = Widened(in);
      wide.rois = Widened(rois);
      Buf got = Forward(pr, dt, dt, p);
      Buf ref = Forward(wide, MIXPREC_F32, MIXPREC_F32, p);
      for (int64_t i = 0; i < got.numel(); i++)
        ASSERT_EQ(got.raw(i), Buf::narrow(dt, ref.value(i))) << "forward element " << i;

      const int64_t on = got.numel();
      std::vector<float> go{};
      go.resize(size_t(on));
      std::normal_distribution<float> g(0.0f, 1.0f);
      for (auto &v : go) v = g(rng);
      Buf gh = Stored(dt, go);
      const std::vector<float> gw = Widened(gh);
      const int64_t st[4] = {pr.c * c.ph * c.pw, c.ph * c.pw, c.pw, 1};
      Buf gi(dt, pr.n * pr.c * pr.h * pr.w);
      std::vector<float> gref(size_t(gi.numel()));
      ASSERT_EQ(mixprec_roi_align_backward(gh.data(), dt, st, rois.data(), dt, pr.k, pr.n, pr.c, pr.h,
                                           pr.w, &p, gi.data(), dt),
                MIXPREC_OK);
      ASSERT_EQ(mixprec_roi_align_backward(gw.data(), MIXPREC_F32, st, wide.rois.data(), MIXPREC_F32,
                                           pr.k, pr.n, pr.c, pr.h, pr.w, &p, gref.data(), MIXPREC_F32),
                MIXPREC_OK);
      for (int64_t i = 0; i < gi.numel(); i++)
        ASSERT_EQ(gi.raw(i), Buf::narrow(dt, gref[size_t(i)])) << "grad element " << i;
    }
  }
}

// The CUDA backward's per-pixel gather equals the scatter bit for bit, for
// every dtype, config, and strided (expanded) gradients.
TEST(RoiAlign, GatherEqualsScatter) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 2);
  for (const Cfg &c : kCfgs)
    for (mixprec_dtype dt : kDtypes) {
      Problem pr = MakeProblem(rng, 3, 11, 17, 21, 29, float(c.scale));
      const mixprec_roi_align_params p = Params(c.ph, c.pw, c.scale, c.sr, c.aligned);
      Buf rois = Stored(dt, pr.rois);
      for (int expanded = 0; expanded < 2; expanded++) {
        const int64_t on = expanded ? pr.c : pr.k * pr.c * c.ph * c.pw;
        std::vector<float> go{};
      go.resize(size_t(on));
        std::normal_distribution<float> g(0.0f, 1.0f);
        for (auto &v : go) v = g(rng);
        Buf gh = Stored(dt, go);
        const int64_t st[4] = {expanded ? 0 : pr.c * c.ph * c.pw, expanded ? 1 : c.ph * c.pw,
                               expanded ? 0 : c.pw, expanded ? 0 : 1};
        Buf a(dt, pr.n * pr.c * pr.h * pr.w), b(dt, pr.n * pr.c * pr.h * pr.w);
        ASSERT_EQ(mixprec_roi_align_backward(gh.data(), dt, st, rois.data(), dt, pr.k, pr.n, pr.c,
                                             pr.h, pr.w, &p, a.data(), dt),
                  MIXPREC_OK);
        ASSERT_EQ(roi_align_backward_gather(gh.data(), dt, st, rois.data(), dt, pr.k, pr.n,
                                                     pr.c, pr.h, pr.w, &p, b.data(), dt),
                  MIXPREC_OK);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < a.numel(); i++) {
          ASSERT_EQ(a.raw(i), b.raw(i)) << "element " << i << " dtype " << dt;
          nonzero += a.value(i) != 0.0f;
        }
        EXPECT_GT(nonzero, a.numel() / 25);  // a real share of the map received gradient
      }
    }
}

TEST(RoiAlign, ThreadCountDoesNotChangeResults) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 3);
  Problem pr = MakeProblem(rng, 2, 40, 50, 60, 90, 0.25f);
  const mixprec_roi_align_params p = Params(7, 7, 0.25, -1, 1);
  for (mixprec_dtype dt : kDtypes) {
    mixprec_set_num_threads(1);
    Buf one = Forward(pr, dt, MIXPREC_F32, p);
    mixprec_set_num_threads(2);
    Buf two = Forward(pr, dt, MIXPREC_F32, p);
    for (int64_t i = 0; i < one.numel(); i++) ASSERT_EQ(one.raw(i), two.raw(i));
    std::vector<float> go(size_t(one.numel()), 0.0f);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (auto &v : go) v = g(rng);
    Buf gh = Stored(dt, go);
    const int64_t st[4] = {pr.c * 49, 49, 7, 1};
    Buf a(dt, pr.n * pr.c * pr.h * pr.w), b(dt, pr.n * pr.c * pr.h * pr.w);
    mixprec_set_num_threads(1);
    ASSERT_EQ(mixprec_roi_align_backward(gh.data(), dt, st, pr.rois.data(), MIXPREC_F32, pr.k, pr.n,
                                         pr.c, pr.h, pr.w, &p, a.data(), dt),
              MIXPREC_OK);
    mixprec_set_num_threads(2);
    ASSERT_EQ(mixprec_roi_align_backward(gh.data(), dt, st, pr.rois.data(), MIXPREC_F32, pr.k, pr.n,
                                         pr.c, pr.h, pr.w, &p, b.data(), dt),
              MIXPREC_OK);
    for (int64_t i = 0; i < a.numel(); i++) ASSERT_EQ(a.raw(i), b.raw(i));
  }
}

// A roi with a non-finite coordinate: NaN outputs, no gradient; the other
// rois are unaffected.
TEST(RoiAlign, NonFiniteBoxGivesNaNAndNoGradient) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 4);
  Problem pr = MakeProblem(rng, 1, 3, 12, 12, 3, 1.0f);
  Problem clean = pr;
  clean.k = 2;
  clean.rois.resize(10);
  pr.rois[10 + 3] = std::numeric_limits<float>::quiet_NaN();
  const mixprec_roi_align_params p = Params(2, 2, 1.0, 2, 0);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    pr.rois[10 + 3] = bad;
    Buf out = Forward(pr, MIXPREC_F32, MIXPREC_F32, p);
    Buf ref = Forward(clean, MIXPREC_F32, MIXPREC_F32, p);
    for (int64_t i = 0; i < ref.numel(); i++) EXPECT_EQ(out.raw(i), ref.raw(i));
    for (int64_t i = ref.numel(); i < out.numel(); i++) EXPECT_TRUE(out.is_nan(i));
    std::vector<float> go(size_t(out.numel()), 1.0f), gi(144 * 3), gref(144 * 3);
    const int64_t st[4] = {12, 4, 2, 1};
    ASSERT_EQ(mixprec_roi_align_backward(go.data(), MIXPREC_F32, st, pr.rois.data(), MIXPREC_F32, 3, 1,
                                         3, 12, 12, &p, gi.data(), MIXPREC_F32),
              MIXPREC_OK);
    ASSERT_EQ(mixprec_roi_align_backward(go.data(), MIXPREC_F32, st, clean.rois.data(), MIXPREC_F32, 2,
                                         1, 3, 12, 12, &p, gref.data(), MIXPREC_F32),
              MIXPREC_OK);
    for (size_t i = 0; i < gi.size(); i++) EXPECT_EQ(gi[i], gref[i]);
  }
}

// Errors: the status, and nothing written.
TEST(RoiAlign, ErrorsWriteNothing) {
  mpt::GlobalStateGuard guard;
  std::vector<float> feat(2 * 3 * 8 * 8, 1.0f), out(4 * 3 * 4, 7.0f);
  std::vector<float> rois = {0, 1, 1, 5, 5, 1, 0, 0, 7, 7};
  const std::vector<float> before = out;
  mixprec_roi_align_params p = mixprec_roi_align_params_default(2, 2);
  auto run = [&](const std::vector<float> &r, int64_t k, int64_t n, int64_t h, const mixprec_roi_align_params *pp) {
    return mixprec_roi_align(feat.data(), MIXPREC_F32, n, 3, h, 8, r.data(), MIXPREC_F32, k, pp,
                             out.data(), MIXPREC_F32);
  };
  EXPECT_EQ(run(rois, 2, 2, 8, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(run(rois, -1, 2, 8, &p), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(run(rois, 2, 2, 0, &p), MIXPREC_ERR_BAD_SIZE);  // rois on an empty map
  std::vector<float> bad = rois;
  for (float b : {2.0f, -1.0f, 7.5f, std::numeric_limits<float>::quiet_NaN()}) {
    bad[5] = b;
    EXPECT_EQ(run(bad, 2, 2, 8, &p), MIXPREC_ERR_BAD_ARGUMENT) << b;
  }
  bad[5] = 1.9f;  // truncated to 1, as torchvision
  mixprec_roi_align_params q = p;
  q.pooled_height = -1;
  EXPECT_EQ(run(rois, 2, 2, 8, &q), MIXPREC_ERR_BAD_ARGUMENT);
  q = p;
  q.spatial_scale = std::numeric_limits<double>::infinity();
  EXPECT_EQ(run(rois, 2, 2, 8, &q), MIXPREC_ERR_BAD_ARGUMENT);
  q.spatial_scale = 1e300;  // finite, but not as a float
  EXPECT_EQ(run(rois, 2, 2, 8, &q), MIXPREC_ERR_BAD_ARGUMENT);
  q = p;
  q.sampling_ratio = int64_t(1) << 40;
  EXPECT_EQ(run(rois, 2, 2, 8, &q), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_roi_align(feat.data(), (mixprec_dtype)9, 2, 3, 8, 8, rois.data(), MIXPREC_F32, 2,
                              &p, out.data(), MIXPREC_F32),
            MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(out, before);
  const int64_t st[4] = {12, 4, 2, 1}, neg[4] = {12, 4, -2, 1};
  std::vector<float> gi(2 * 3 * 64, 5.0f);
  const std::vector<float> gbefore = gi;
  bad[5] = 2.0f;
  EXPECT_EQ(mixprec_roi_align_backward(out.data(), MIXPREC_F32, st, bad.data(), MIXPREC_F32, 2, 2, 3,
                                       8, 8, &p, gi.data(), MIXPREC_F32),
            MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_roi_align_backward(out.data(), MIXPREC_F32, neg, rois.data(), MIXPREC_F32, 2, 2,
                                       3, 8, 8, &p, gi.data(), MIXPREC_F32),
            MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_roi_align_backward(out.data(), MIXPREC_F32, nullptr, rois.data(), MIXPREC_F32, 2,
                                       2, 3, 8, 8, &p, gi.data(), MIXPREC_F32),
            MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(gi, gbefore);
  int64_t first = 0;
  bad[0] = 0.0f;
  EXPECT_EQ(mixprec_roi_align_first_bad_roi(bad.data(), MIXPREC_F32, 2, 2, &first), MIXPREC_OK);
  EXPECT_EQ(first, 1);
}

// Empty cases are fine and write what they should: no rois -> nothing
// (forward) and an all-zero gradient; pooled size 0 -> nothing.
TEST(RoiAlign, EmptyCases) {
  mpt::GlobalStateGuard guard;
  std::vector<float> feat(3 * 8 * 8, 1.0f), gi(3 * 64, 9.0f);
  mixprec_roi_align_params p = mixprec_roi_align_params_default(2, 2);
  EXPECT_EQ(mixprec_roi_align(feat.data(), MIXPREC_F32, 1, 3, 8, 8, nullptr, MIXPREC_F32, 0, &p,
                              nullptr, MIXPREC_F32),
            MIXPREC_OK);
  const int64_t st[4] = {12, 4, 2, 1};
  EXPECT_EQ(mixprec_roi_align_backward(nullptr, MIXPREC_F32, st, nullptr, MIXPREC_F32, 0, 1, 3, 8, 8,
                                       &p, gi.data(), MIXPREC_F32),
            MIXPREC_OK);
  for (float v : gi) EXPECT_EQ(v, 0.0f);
  p.pooled_height = 0;
  float rois[5] = {0, 1, 1, 4, 4};
  EXPECT_EQ(mixprec_roi_align(feat.data(), MIXPREC_F32, 1, 3, 8, 8, rois, MIXPREC_F32, 1, &p, nullptr,
                              MIXPREC_F32),
            MIXPREC_OK);
}

// The AVX2 forward (8 channels per vector, gathers) gives the scalar path's
// bits for every dtype, including the blocks that end at the input's last
// plane (scalar there) and channel remainders.
TEST(RoiAlign, Avx2EqualsScalar) {
  mpt::GlobalStateGuard guard;
  if (!mixprec_cpu_isa_supported(MIXPREC_ISA_AVX2)) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(mpt::kSeed + 5);
  for (const Cfg &c : kCfgs)
    for (mixprec_dtype dt : kDtypes) {
      Problem pr = MakeProblem(rng, 3, 27, 21, 18, 31, float(c.scale));
      for (int64_t k = 0; k < pr.k; k++) pr.rois[size_t(k * 5)] = float(k % 3);
      const mixprec_roi_align_params p = Params(c.ph, c.pw, c.scale, c.sr, c.aligned);
      ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_SCALAR), MIXPREC_OK);
      Buf a = Forward(pr, dt, dt, p);
      ASSERT_EQ(mixprec_set_cpu_isa(MIXPREC_ISA_AVX2), MIXPREC_OK);
      Buf b = Forward(pr, dt, dt, p);
      for (int64_t i = 0; i < a.numel(); i++) ASSERT_EQ(a.raw(i), b.raw(i)) << "element " << i << " dtype " << dt;
    }
}
