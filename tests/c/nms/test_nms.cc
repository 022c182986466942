// mixprec_nms / mixprec_batched_nms against an independent reference: the
// scalar loop of torchvision's CPU kernel (std::stable_sort, std::max/min,
// float IoU compared with the double threshold), on boxes widened with the
// reference converters. Every ISA path and thread count must give exactly
// the reference's indices, NaN and inf coordinates included.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "test_util.h"

namespace {

using mpt::Buf;

struct Options {
  double thr = 0.5;
  bool use_st = false;
  double st = 0.0;
  int64_t max_out = -1;
};

bool ScoreGreater(float a, float b) {  // torch.sort's descending order: NaN first
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
}

std::vector<int64_t> RefNms(const Buf &boxes, const Buf &scores, const std::vector<int64_t> *cls,
                            const Options &o) {
  const int64_t n = scores.numel();
  std::vector<int64_t> order;
  for (int64_t i = 0; i < n; i++)
    if (!o.use_st || double(scores.value(i)) > o.st) order.push_back(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ScoreGreater(scores.value(a), scores.value(b)); });
  std::vector<float> x1(n), y1(n), x2(n), y2(n), area(n);
  for (int64_t i = 0; i < n; i++) {
    x1[i] = boxes.value(4 * i);
    y1[i] = boxes.value(4 * i + 1);
    x2[i] = boxes.value(4 * i + 2);
    y2[i] = boxes.value(4 * i + 3);
    area[i] = (x2[i] - x1[i]) * (y2[i] - y1[i]);
  }
  std::vector<char> suppressed(n, 0);
  std::vector<int64_t> keep;
  for (size_t a = 0; a < order.size(); a++) {
    const int64_t i = order[a];
    if (suppressed[i]) continue;
    if (o.max_out >= 0 && int64_t(keep.size()) == o.max_out) break;
    keep.push_back(i);
    for (size_t b = a + 1; b < order.size(); b++) {
      const int64_t j = order[b];
      if (suppressed[j] || (cls && (*cls)[i] != (*cls)[j])) continue;
      const float xx1 = std::max(x1[i], x1[j]), yy1 = std::max(y1[i], y1[j]);
      const float xx2 = std::min(x2[i], x2[j]), yy2 = std::min(y2[i], y2[j]);
      const float w = std::max(0.0f, xx2 - xx1), h = std::max(0.0f, yy2 - yy1);
      const float inter = w * h;
      const float ovr = inter / (area[i] + area[j] - inter);
      if (ovr > o.thr) suppressed[j] = 1;
    }
  }
  return keep;
}

// Boxes in clusters (many overlaps) or spread out; scores with ties. With
// `specials`, some coordinates and scores are NaN/inf and some boxes are
// degenerate (points, inverted).
// With `y_only`, the specials touch only y coordinates (x stays finite, so
// the x-sorted pruned loop still runs) and a few boxes are very wide.
void MakeBoxes(std::mt19937 &rng, int64_t n, bool clustered, bool specials, Buf &boxes, Buf &scores,
               bool y_only = false) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t k = std::max<int64_t>(1, n / 30);
  std::vector<float> cx(k), cy(k);
  for (int64_t c = 0; c < k; c++) cx[c] = u(rng) * 1000, cy[c] = u(rng) * 1000;
  for (int64_t i = 0; i < n; i++) {
    float x, y, w, h;
    if (clustered) {
      const int64_t c = int64_t(rng() % uint32_t(k));
      x = cx[c] + g(rng) * 4, y = cy[c] + g(rng) * 4, w = 40 + g(rng) * 4, h = 40 + g(rng) * 4;
    } else {
      x = u(rng) * 1000, y = u(rng) * 1000, w = 1 + u(rng) * 150, h = 1 + u(rng) * 150;
    }
    float v[4] = {x, y, x + w, y + h};
    if (specials) {
      const uint32_t r = rng() % 100;
      const int c = y_only ? 1 + 2 * int(rng() % 2) : int(rng() % 4);
      if (r < 3) v[c] = std::numeric_limits<float>::quiet_NaN();
      else if (r < 5) v[c] = (rng() & 1) ? INFINITY : -INFINITY;
      else if (y_only && r < 7) v[0] -= 3000, v[2] += 3000;  // very wide
      else if (r < 10) v[2] = v[0], v[3] = v[1];  // point
      else if (r < 13) std::swap(v[0], v[2]);     // inverted
    }
    for (int c = 0; c < 4; c++) boxes.set_value(4 * i + c, v[c]);
    float s = (rng() % 4 == 0) ? float(rng() % 8) / 8.0f : u(rng);  // ties
    if (specials) {
      const uint32_t r = rng() % 100;
      if (r < 3) s = std::numeric_limits<float>::quiet_NaN();
      else if (r < 5) s = (rng() & 1) ? INFINITY : -INFINITY;
      else if (r < 8) s = -0.0f;
      else if (r < 11) s = 0.0f;
    }
    scores.set_value(i, s);
  }
}

class IsaGuard {
 public:
  ~IsaGuard() {
    mixprec_set_cpu_isa(MIXPREC_ISA_AUTO);
    mixprec_set_num_threads(0);
  }
};

std::vector<mixprec_cpu_isa> Isas() {
  std::vector<mixprec_cpu_isa> v = {MIXPREC_ISA_SCALAR};
  for (mixprec_cpu_isa i : {MIXPREC_ISA_AVX2, MIXPREC_ISA_AVX512})
    if (mixprec_cpu_isa_supported(i)) v.push_back(i);
  return v;
}

std::vector<int64_t> RunNms(const Buf &boxes_c, const Buf &scores_c, const std::vector<int64_t> *cls,
                         bool cls32, const Options &o, int64_t *count_out = nullptr) {
  Buf &boxes = const_cast<Buf &>(boxes_c);
  Buf &scores = const_cast<Buf &>(scores_c);
  mixprec_nms_params p = mixprec_nms_params_default();
  p.iou_threshold = o.thr;
  p.use_score_threshold = o.use_st;
  p.score_threshold = o.st;
  p.max_output = o.max_out;
  const int64_t n = scores.numel();
  const int64_t cap = mixprec_nms_capacity(n, &p);
  std::vector<int64_t> keep(size_t(cap) + 1, 12345);  // poisoned, one guard entry
  int64_t count = -7;
  mixprec_status st;
  if (cls) {
    std::vector<int32_t> c32(cls->begin(), cls->end());
    st = mixprec_batched_nms(boxes.data(), boxes.dtype(), scores.data(), scores.dtype(),
                             cls32 ? (const void *)c32.data() : (const void *)cls->data(),
                             cls32 ? MIXPREC_I32 : MIXPREC_I64, n, &p, keep.data(), &count);
  } else {
    st = mixprec_nms(boxes.data(), boxes.dtype(), scores.data(), scores.dtype(), n, &p,
                     keep.data(), &count);
  }
  EXPECT_EQ(st, MIXPREC_OK);
  EXPECT_GE(count, 0);
  EXPECT_LE(count, cap);
  for (int64_t k = count; k < cap; k++) EXPECT_EQ(keep[size_t(k)], -1) << "padding at " << k;
  EXPECT_EQ(keep[size_t(cap)], 12345) << "wrote past the capacity";
  if (count_out) *count_out = count;
  keep.resize(size_t(std::max<int64_t>(count, 0)));
  return keep;
}

class NmsParity : public ::testing::TestWithParam<mixprec_dtype> {};

TEST_P(NmsParity, EveryIsaEqualsTorchvisionLoop) {
  IsaGuard guard;
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 401 + unsigned(dt));
  for (int64_t n : {0, 1, 2, 7, 8, 9, 17, 100, 1000, 1024, 2500}) {
    for (int variant = 0; variant < 6; variant++) {
      const bool clustered = variant & 1, specials = variant >= 2, y_only = variant >= 4;
      Buf boxes(dt, 4 * n, n % 2 == 1), scores(dt, n);
      MakeBoxes(rng, n, clustered, specials, boxes, scores, y_only);
      for (double thr : {0.0, 1.0 / 3.0, 0.5, 0.7, 1.0, 2.0}) {
        Options o;
        o.thr = thr;
        const std::vector<int64_t> want = RefNms(boxes, scores, nullptr, o);
        for (mixprec_cpu_isa isa : Isas()) {
          ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
          EXPECT_EQ(RunNms(boxes, scores, nullptr, false, o), want)
              << mpt::dtype_name(dt) << " n=" << n << " variant=" << variant << " thr=" << thr
              << " isa=" << mpt::isa_name(isa);
        }
      }
    }
  }
}

TEST_P(NmsParity, BatchedEveryIsaAndThreadCount) {
  IsaGuard guard;
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 402 + unsigned(dt));
  for (int64_t n : {1, 50, 3000}) {
    for (int64_t n_cls : {1, 3, 80}) {
      Buf boxes(dt, 4 * n), scores(dt, n);
      MakeBoxes(rng, n, n_cls != 80, n_cls != 1, boxes, scores, n_cls == 80);
      std::vector<int64_t> cls(static_cast<size_t>(n)), wide(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; i++) {
        cls[size_t(i)] = int64_t(rng() % uint32_t(n_cls)) - 1;
        // The same classes spread over the whole int64 range (no dense table).
        wide[size_t(i)] = cls[size_t(i)] * (INT64_MAX / 100) + 12345;
      }
      Options o;
      const std::vector<int64_t> want = RefNms(boxes, scores, &cls, o);
      for (mixprec_cpu_isa isa : Isas()) {
        ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
        for (int threads : {1, 2, 3}) {
          mixprec_set_num_threads(threads);
          EXPECT_EQ(RunNms(boxes, scores, &cls, false, o), want) << n << " " << n_cls << " " << threads;
          EXPECT_EQ(RunNms(boxes, scores, &cls, true, o), want) << "int32 classes";
          EXPECT_EQ(RunNms(boxes, scores, &wide, false, o), want) << "wide class ids";
        }
      }
    }
  }
}

TEST_P(NmsParity, ScoreThresholdAndMaxOutput) {
  IsaGuard guard;
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(mpt::kSeed + 403 + unsigned(dt));
  const int64_t n = 1200;
  Buf boxes(dt, 4 * n), scores(dt, n);
  MakeBoxes(rng, n, true, true, boxes, scores);
  std::vector<int64_t> cls(static_cast<size_t>(n));
  for (auto &c : cls) c = rng() % 5;
  for (bool use_st : {false, true}) {
    for (double st : {-double(INFINITY), 0.25, 0.5, 0.9}) {
      for (int64_t mo : {-1, 0, 1, 5, 100, 5000}) {
        Options o;
        o.thr = 0.45, o.use_st = use_st, o.st = st, o.max_out = mo;
        for (mixprec_cpu_isa isa : Isas()) {
          ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
          EXPECT_EQ(RunNms(boxes, scores, nullptr, false, o), RefNms(boxes, scores, nullptr, o));
          EXPECT_EQ(RunNms(boxes, scores, &cls, false, o), RefNms(boxes, scores, &cls, o));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NmsParity,
                         ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                         [](const auto &info) { return std::string(mpt::dtype_name(info.param)); });

TEST(Nms, HalfCoordinatesDoNotOverflow) {
  // 400 x 400 boxes: areas and intersection above FP16's 65504. In FP32 the
  // near-duplicate is suppressed; the far box is kept.
  Buf boxes(MIXPREC_F16, 12), scores(MIXPREC_F16, 3);
  const float v[12] = {0, 0, 400, 400, 10, 10, 410, 410, 60000, 60000, 65000, 65000};
  for (int i = 0; i < 12; i++) boxes.set_value(i, v[i]);
  for (int i = 0; i < 3; i++) scores.set_value(i, 0.9f - 0.1f * float(i));
  EXPECT_EQ(RunNms(boxes, scores, nullptr, false, Options()), (std::vector<int64_t>{0, 2}));
}

TEST(Nms, DocumentedOrderOfSpecialScores) {
  Buf boxes(MIXPREC_F32, 20), scores(MIXPREC_F32, 5);
  for (int i = 0; i < 5; i++) {
    const float b[4] = {10.0f * float(i), 0, 10.0f * float(i) + 5, 5};
    for (int c = 0; c < 4; c++) boxes.set_value(4 * i + c, b[c]);
  }
  const float s[5] = {0.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY};
  for (int i = 0; i < 5; i++) scores.set_value(i, s[i]);
  EXPECT_EQ(RunNms(boxes, scores, nullptr, false, Options()), (std::vector<int64_t>{2, 3, 0, 1, 4}));
  Options o;
  o.use_st = true;
  o.st = -INFINITY;  // NaN > -inf is false: dropped; -inf > -inf too
  EXPECT_EQ(RunNms(boxes, scores, nullptr, false, o), (std::vector<int64_t>{3, 0, 1}));
}

TEST(Nms, Statuses) {
  float boxes[8] = {0, 0, 1, 1, 0, 0, 1, 1};
  float scores[2] = {1, 2};
  int64_t cls[2] = {0, 0};
  int64_t keep[3] = {99, 99, 99}, count = 99;
  mixprec_nms_params p = mixprec_nms_params_default();
  auto nms = [&](const void *b, const void *s, int64_t n, const mixprec_nms_params *pp, int64_t *k,
                 int64_t *c) { return mixprec_nms(b, MIXPREC_F32, s, MIXPREC_F32, n, pp, k, c); };
  EXPECT_EQ(nms(nullptr, scores, 2, &p, keep, &count), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(nms(boxes, nullptr, 2, &p, keep, &count), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(nms(boxes, scores, 2, nullptr, keep, &count), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(nms(boxes, scores, 2, &p, nullptr, &count), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(nms(boxes, scores, 2, &p, keep, nullptr), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(nms(boxes, scores, -1, &p, keep, &count), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(nms(boxes, scores, int64_t(1) << 31, &p, keep, &count), MIXPREC_ERR_BAD_SIZE);
  mixprec_nms_params bad = p;
  bad.iou_threshold = -0.1;
  EXPECT_EQ(nms(boxes, scores, 2, &bad, keep, &count), MIXPREC_ERR_BAD_ARGUMENT);
  bad.iou_threshold = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(nms(boxes, scores, 2, &bad, keep, &count), MIXPREC_ERR_BAD_ARGUMENT);
  bad = p;
  bad.use_score_threshold = 1;
  bad.score_threshold = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(nms(boxes, scores, 2, &bad, keep, &count), MIXPREC_ERR_BAD_ARGUMENT);
  // 3: not a dtype, yet inside the enum's value range (0..3), so passing
  // it by value is defined C++ (7 would trip UBSan's enum check).
  const mixprec_dtype bad_dtype = static_cast<mixprec_dtype>(3);
  EXPECT_EQ(mixprec_nms(boxes, bad_dtype, scores, MIXPREC_F32, 2, &p, keep, &count),
            MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_nms(boxes, MIXPREC_F32, scores, bad_dtype, 2, &p, keep, &count),
            MIXPREC_ERR_BAD_DTYPE);
  EXPECT_EQ(mixprec_batched_nms(boxes, MIXPREC_F32, scores, MIXPREC_F32, nullptr, MIXPREC_I64, 2,
                                &p, keep, &count),
            MIXPREC_ERR_NULL_POINTER);
  // An index dtype outside the enum (whose range is 0..1): a C caller can
  // pass any int, C++ cannot hold one in the enum, so call through the C
  // ABI with an int (enums are int-sized and passed as int).
  using BatchedNmsInt = mixprec_status (*)(const void *, mixprec_dtype, const void *, mixprec_dtype,
                                           const void *, int, int64_t, const mixprec_nms_params *,
                                           int64_t *, int64_t *);
  const auto batched_nms_int = reinterpret_cast<BatchedNmsInt>(&mixprec_batched_nms);
  EXPECT_EQ(batched_nms_int(boxes, MIXPREC_F32, scores, MIXPREC_F32, cls, 9, 2, &p, keep, &count),
            MIXPREC_ERR_BAD_DTYPE);
  // Nothing written on any error.
  EXPECT_EQ(keep[0], 99);
  EXPECT_EQ(count, 99);
  // n == 0: pointers may be NULL; keep needs no room.
  EXPECT_EQ(nms(nullptr, nullptr, 0, &p, nullptr, &count), MIXPREC_OK);
  EXPECT_EQ(count, 0);
  // Capacity: max_output caps it.
  p.max_output = 1;
  EXPECT_EQ(mixprec_nms_capacity(2, &p), 1);
  EXPECT_EQ(nms(boxes, scores, 2, &p, keep, &count), MIXPREC_OK);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(keep[0], 1);
  EXPECT_EQ(keep[1], 99);
  EXPECT_EQ(mixprec_nms_capacity(-1, &p), -1);
  EXPECT_EQ(mixprec_nms_capacity(5, nullptr), -1);
}

}  // namespace
