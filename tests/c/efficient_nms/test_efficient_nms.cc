// mixprec_efficient_nms against an independent reference written from the
// header's contract: candidates (score > threshold, never NaN) by a
// std::stable_sort of the flat (N, C) scores, top-k, greedy NMS per class (or
// over all) with torchvision's float IoU, the first K kept. Every dtype,
// shared and class-specific boxes, ISA paths and thread counts; argument
// errors write nothing.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "test_util.h"

namespace {

using mpt::Buf;

struct Result {
  std::vector<uint32_t> boxes, scores;  // raw bits
  std::vector<int64_t> classes, indices, counts;
};

Result Ref(const Buf &boxes, bool class_boxes, const Buf &scores, int64_t B, int64_t N, int64_t C,
           const mixprec_detect_params &p) {
  const int64_t K = p.max_detections;
  Result r;
  r.boxes.assign(size_t(B * K * 4), 0u);
  r.scores.assign(size_t(B * K), 0u);
  r.classes.assign(size_t(B * K), -1);
  r.indices.assign(size_t(B * K), -1);
  r.counts.assign(size_t(B), 0);
  for (int64_t b = 0; b < B; b++) {
    std::vector<int64_t> cand;
    for (int64_t j = 0; j < N * C; j++) {
      const float s = scores.value(b * N * C + j);
      if (std::isnan(s) || (p.use_score_threshold && !(double(s) > p.score_threshold))) continue;
      cand.push_back(j);
    }
    std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) {
      return scores.value(b * N * C + x) > scores.value(b * N * C + y);
    });
    if (p.pre_nms_top_k > 0 && int64_t(cand.size()) > p.pre_nms_top_k) cand.resize(size_t(p.pre_nms_top_k));
    auto row = [&](int64_t j) { return class_boxes ? b * N * C + j : b * N + j / C; };
    std::vector<char> dead(cand.size(), 0);
    int64_t count = 0;
    for (size_t a = 0; a < cand.size() && count < K; a++) {
      if (dead[a]) continue;
      const int64_t i = cand[a], ri = row(i);
      const int64_t o = b * K + count++;
      for (int e = 0; e < 4; e++) r.boxes[size_t(4 * o + e)] = boxes.raw(4 * ri + e);
      r.scores[size_t(o)] = scores.raw(b * N * C + i);
      r.classes[size_t(o)] = i % C;
      r.indices[size_t(o)] = i / C;
      const float ax1 = boxes.value(4 * ri), ay1 = boxes.value(4 * ri + 1);
      const float ax2 = boxes.value(4 * ri + 2), ay2 = boxes.value(4 * ri + 3);
      const float aa = (ax2 - ax1) * (ay2 - ay1);
      for (size_t q = a + 1; q < cand.size(); q++) {
        const int64_t j = cand[q], rj = row(j);
        if (dead[q] || (!p.class_agnostic && i % C != j % C)) continue;
        const float bx1 = boxes.value(4 * rj), by1 = boxes.value(4 * rj + 1);
        const float bx2 = boxes.value(4 * rj + 2), by2 = boxes.value(4 * rj + 3);
        const float ba = (bx2 - bx1) * (by2 - by1);
        const float w = std::max(0.0f, std::min(ax2, bx2) - std::max(ax1, bx1));
        const float h = std::max(0.0f, std::min(ay2, by2) - std::max(ay1, by1));
        const float inter = w * h;
        if (inter / (aa + ba - inter) > p.iou_threshold) dead[q] = 1;
      }
    }
    r.counts[size_t(b)] = count;
  }
  return r;
}

void Make(std::mt19937 &rng, int64_t B, int64_t N, int64_t C, bool class_boxes, Buf &boxes, Buf &scores) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int64_t b = 0; b < B; b++) {
    const int64_t k = std::max<int64_t>(1, N / 20);
    std::vector<float> cx(k), cy(k);
    for (int64_t q = 0; q < k; q++) cx[q] = u(rng) * 600, cy[q] = u(rng) * 600;
    for (int64_t n = 0; n < N; n++) {
      const int64_t q = int64_t(rng() % uint32_t(k));
      const float x = cx[q] + g(rng) * 6, y = cy[q] + g(rng) * 6, w = 30 + u(rng) * 30, h = 30 + u(rng) * 30;
      for (int64_t c = 0; c < (class_boxes ? C : 1); c++) {
        const int64_t r = class_boxes ? (b * N + n) * C + c : b * N + n;
        const float d = class_boxes ? g(rng) * 2 : 0.0f;
        const float v[4] = {x + d, y - d, x + w, y + h + d};
        for (int e = 0; e < 4; e++) boxes.set_value(4 * r + e, v[e]);
      }
      for (int64_t c = 0; c < C; c++) {
        float s = (rng() % 3 == 0) ? float(rng() % 6) / 6.0f : u(rng);  // ties
        if (rng() % 50 == 0) s = NAN;
        scores.set_value((b * N + n) * C + c, s);
      }
    }
  }
}

struct Run {
  Buf ob, os;
  std::vector<int64_t> classes, indices, counts;
  mixprec_status st;
};

Run Call(Buf &boxes, bool class_boxes, Buf &scores, int64_t B, int64_t N, int64_t C,
         const mixprec_detect_params &p) {
  const int64_t K = p.max_detections;
  Run r{Buf(boxes.dtype(), B * K * 4), Buf(scores.dtype(), B * K), {}, {}, {}, MIXPREC_OK};
  for (int64_t i = 0; i < B * K * 4; i++) r.ob.set_raw(i, 0x3c01u);  // poison
  for (int64_t i = 0; i < B * K; i++) r.os.set_raw(i, 0x3c01u);
  r.classes.assign(size_t(B * K), 77);
  r.indices.assign(size_t(B * K), 77);
  r.counts.assign(size_t(B), 77);
  r.st = mixprec_efficient_nms(boxes.data(), boxes.dtype(), class_boxes, scores.data(), scores.dtype(),
                               B, N, C, &p, r.ob.data(), r.os.data(), r.classes.data(),
                               r.indices.data(), r.counts.data());
  return r;
}

void ExpectSame(const Run &got, const Result &want) {
  ASSERT_EQ(got.st, MIXPREC_OK);
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_EQ(got.classes, want.classes);
  EXPECT_EQ(got.indices, want.indices);
  for (size_t i = 0; i < want.boxes.size(); i++) ASSERT_EQ(got.ob.raw(int64_t(i)), want.boxes[i]) << i;
  for (size_t i = 0; i < want.scores.size(); i++) ASSERT_EQ(got.os.raw(int64_t(i)), want.scores[i]) << i;
}

class Guard {
 public:
  ~Guard() {
    mixprec_set_cpu_isa(MIXPREC_ISA_AUTO);
    mixprec_set_num_threads(0);
  }
};

class EfficientNms : public ::testing::TestWithParam<mixprec_dtype> {};

TEST_P(EfficientNms, MatchesReference) {
  Guard guard;
  std::mt19937 rng(1234 + int(GetParam()));
  for (bool class_boxes : {false, true}) {
    for (auto [B, N, C] : {std::tuple<int64_t, int64_t, int64_t>{3, 200, 5}, {1, 700, 3}, {5, 40, 12}}) {
      Buf boxes(GetParam(), B * N * (class_boxes ? C : 1) * 4), scores(GetParam(), B * N * C);
      Make(rng, B, N, C, class_boxes, boxes, scores);
      for (int agn : {0, 1}) {
        for (auto [thr, top_k, k] : {std::tuple<double, int64_t, int64_t>{0.3, 300, 50}, {-1, -1, 5000}, {0.8, 7, 3}}) {
          mixprec_detect_params p = mixprec_detect_params_default();
          p.use_score_threshold = thr >= 0;
          p.score_threshold = thr;
          p.pre_nms_top_k = top_k;
          p.max_detections = k;
          p.class_agnostic = agn;
          p.iou_threshold = 0.45;
          const Result want = Ref(boxes, class_boxes, scores, B, N, C, p);
          for (mixprec_cpu_isa isa : {MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2}) {
            if (!mixprec_cpu_isa_supported(isa)) continue;
            ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
            for (int threads : {1, 2, 3}) {
              mixprec_set_num_threads(threads);
              ExpectSame(Call(boxes, class_boxes, scores, B, N, C, p), want);
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, EfficientNms, ::testing::Values(MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16),
                         [](const auto &info) { return std::string(mpt::dtype_name(info.param)); });

// Strided layouts read in place give the contiguous call's results: a YOLO
// head (B, 4 + C, N) channels first (the class-rows path), padded strides
// (the element-by-element path), and centre coding, whose decoded float32
// corners are checked against the contiguous call on those corners.
Run CallStrided(Buf &boxes, Buf &scores, mixprec_dtype bd, mixprec_dtype sd,
                const mixprec_detect_layout &l, int64_t B, int64_t N, int64_t C,
                const mixprec_detect_params &p) {
  const int64_t K = p.max_detections;
  Run r{Buf(bd, B * K * 4), Buf(sd, B * K), {}, {}, {}, MIXPREC_OK};
  for (int64_t i = 0; i < B * K * 4; i++) r.ob.set_raw(i, 0x3c01u);
  for (int64_t i = 0; i < B * K; i++) r.os.set_raw(i, 0x3c01u);
  r.classes.assign(size_t(B * K), 77);
  r.indices.assign(size_t(B * K), 77);
  r.counts.assign(size_t(B), 77);
  r.st = mixprec_efficient_nms_strided(boxes.data(), bd, scores.data(), sd, &l, B, N, C, &p,
                                       r.ob.data(), r.os.data(), r.classes.data(),
                                       r.indices.data(), r.counts.data());
  return r;
}

void ExpectSameRun(const Run &got, const Run &want, mixprec_dtype bd, bool round_boxes) {
  ASSERT_EQ(got.st, MIXPREC_OK);
  ASSERT_EQ(want.st, MIXPREC_OK);
  EXPECT_EQ(got.counts, want.counts);
  EXPECT_EQ(got.classes, want.classes);
  EXPECT_EQ(got.indices, want.indices);
  Buf one(bd, 1);
  for (int64_t i = 0; i < want.ob.numel(); i++) {
    if (round_boxes) one.set_value(0, want.ob.value(i));
    ASSERT_EQ(got.ob.raw(i), round_boxes ? one.raw(0) : want.ob.raw(i)) << i;
  }
  for (int64_t i = 0; i < want.os.numel(); i++) ASSERT_EQ(got.os.raw(i), want.os.raw(i)) << i;
}

TEST_P(EfficientNms, StridedLayouts) {
  Guard guard;
  const mixprec_dtype dt = GetParam();
  std::mt19937 rng(99 + int(dt));
  const int64_t B = 3, N = 301, C = 7, S = (4 + C) * N;
  Buf boxes(dt, B * N * 4), scores(dt, B * N * C);
  Make(rng, B, N, C, false, boxes, scores);
  // The head: corners as stored, and centre-coded values of the same boxes.
  Buf head(dt, B * S), chead(dt, B * S), padded_b(dt, B * N * 8), padded_s(dt, B * N * C * 2);
  Buf decoded(MIXPREC_F32, B * N * 4);
  for (int64_t b = 0; b < B; b++)
    for (int64_t n = 0; n < N; n++) {
      float v[4];
      for (int e = 0; e < 4; e++) v[e] = boxes.value((b * N + n) * 4 + e);
      const float cv[4] = {0.5f * (v[0] + v[2]), 0.5f * (v[1] + v[3]), v[2] - v[0], v[3] - v[1]};
      for (int e = 0; e < 4; e++) {
        head.set_raw(b * S + e * N + n, boxes.raw((b * N + n) * 4 + e));
        chead.set_value(b * S + e * N + n, cv[e]);
        padded_b.set_raw((b * N + n) * 8 + 2 * e, boxes.raw((b * N + n) * 4 + e));
      }
      // Decoded as the header says, from the values the head stores.
      float sv[4];
      for (int e = 0; e < 4; e++) sv[e] = chead.value(b * S + e * N + n);
      const float hw = sv[2] * 0.5f, hh = sv[3] * 0.5f;
      const float dv[4] = {sv[0] - hw, sv[1] - hh, sv[0] + hw, sv[1] + hh};
      for (int e = 0; e < 4; e++) decoded.set_value((b * N + n) * 4 + e, dv[e]);
      for (int64_t c = 0; c < C; c++) {
        const uint32_t raw = scores.raw((b * N + n) * C + c);
        head.set_raw(b * S + (4 + c) * N + n, raw);
        chead.set_raw(b * S + (4 + c) * N + n, raw);
        padded_s.set_raw(((b * N + n) * C + c) * 2, raw);
      }
    }
  Buf head_scores(dt, B * S - 4 * N), chead_scores(dt, B * S - 4 * N);
  for (int64_t i = 0; i < B * S - 4 * N; i++) {
    head_scores.set_raw(i, head.raw(i + 4 * N));
    chead_scores.set_raw(i, chead.raw(i + 4 * N));
  }
  mixprec_detect_layout yolo;
  yolo.box_strides[0] = S, yolo.box_strides[1] = 1, yolo.box_strides[2] = 0, yolo.box_strides[3] = N;
  yolo.score_strides[0] = S, yolo.score_strides[1] = 1, yolo.score_strides[2] = N;
  yolo.box_coding = MIXPREC_BOX_CORNER;
  mixprec_detect_layout centre = yolo;
  centre.box_coding = MIXPREC_BOX_CENTER;
  mixprec_detect_layout pad;
  pad.box_strides[0] = N * 8, pad.box_strides[1] = 8, pad.box_strides[2] = 0, pad.box_strides[3] = 2;
  pad.score_strides[0] = N * C * 2, pad.score_strides[1] = C * 2, pad.score_strides[2] = 2;
  pad.box_coding = MIXPREC_BOX_CORNER;
  for (int agn : {0, 1})
    for (auto [thr, top_k, k] : {std::tuple<double, int64_t, int64_t>{0.3, 300, 50}, {-1, -1, 3000}}) {
      mixprec_detect_params p = mixprec_detect_params_default();
      p.use_score_threshold = thr >= 0, p.score_threshold = thr;
      p.pre_nms_top_k = top_k, p.max_detections = k, p.class_agnostic = agn, p.iou_threshold = 0.5;
      const auto want = Call(boxes, false, scores, B, N, C, p);
      const auto want_c = Call(decoded, false, scores, B, N, C, p);
      for (mixprec_cpu_isa isa : {MIXPREC_ISA_SCALAR, MIXPREC_ISA_AVX2}) {
        if (!mixprec_cpu_isa_supported(isa)) continue;
        ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
        for (int threads : {1, 2}) {
          mixprec_set_num_threads(threads);
          ExpectSameRun(CallStrided(head, head_scores, dt, dt, yolo, B, N, C, p), want, dt, false);
          ExpectSameRun(CallStrided(padded_b, padded_s, dt, dt, pad, B, N, C, p), want, dt, false);
          ExpectSameRun(CallStrided(chead, chead_scores, dt, dt, centre, B, N, C, p), want_c, dt,
                        true);
        }
      }
    }
}

TEST(EfficientNmsArgs, BadLayoutsWriteNothing) {
  Buf boxes(MIXPREC_F32, 2 * 4 * 4), scores(MIXPREC_F32, 2 * 4 * 3);
  std::mt19937 rng(8);
  Make(rng, 2, 4, 3, false, boxes, scores);
  mixprec_detect_params p = mixprec_detect_params_default();
  p.max_detections = 4;
  auto bad = [&](const mixprec_detect_layout *l, mixprec_status want) {
    std::vector<uint32_t> ob(2 * 4 * 4, 5u), os(2 * 4, 5u);
    std::vector<int64_t> oc(2 * 4, 5), oi(2 * 4, 5), cnt(2, 5);
    EXPECT_EQ(mixprec_efficient_nms_strided(boxes.data(), MIXPREC_F32, scores.data(), MIXPREC_F32, l,
                                            2, 4, 3, &p, ob.data(), os.data(), oc.data(), oi.data(),
                                            cnt.data()),
              want);
    for (auto v : ob) EXPECT_EQ(v, 5u);
    for (auto v : os) EXPECT_EQ(v, 5u);
    for (auto v : oc) EXPECT_EQ(v, 5);
    for (auto v : oi) EXPECT_EQ(v, 5);
    for (auto v : cnt) EXPECT_EQ(v, 5);
  };
  const mixprec_detect_layout ok = mixprec_detect_layout_contiguous(4, 3, 0);
  bad(nullptr, MIXPREC_ERR_NULL_POINTER);
  mixprec_detect_layout l = ok;
  l.box_coding = 2;
  bad(&l, MIXPREC_ERR_BAD_ARGUMENT);
  l = ok, l.box_strides[3] = -1;
  bad(&l, MIXPREC_ERR_BAD_ARGUMENT);
  l = ok, l.score_strides[0] = -4;
  bad(&l, MIXPREC_ERR_BAD_ARGUMENT);
  l = ok, l.score_strides[0] = INT64_MAX / 2 + 1;
  bad(&l, MIXPREC_ERR_BAD_SIZE);
  l = ok, l.box_strides[1] = INT64_MAX / 3;
  bad(&l, MIXPREC_ERR_BAD_SIZE);
}

TEST(EfficientNmsArgs, ErrorsWriteNothing) {
  Buf boxes(MIXPREC_F32, 2 * 4 * 4), scores(MIXPREC_F32, 2 * 4 * 3);
  std::mt19937 rng(7);
  Make(rng, 2, 4, 3, false, boxes, scores);
  auto bad = [&](mixprec_detect_params p, mixprec_status want, int64_t B = 2, int64_t N = 4, int64_t C = 3,
                 mixprec_dtype sd = MIXPREC_F32, bool null_out = false) {
    const int64_t K = p.max_detections > 0 && p.max_detections < 100 ? p.max_detections : 1;
    std::vector<uint32_t> ob(size_t(2 * K * 4), 5u), os(size_t(2 * K), 5u);
    std::vector<int64_t> oc(size_t(2 * K), 5), oi(size_t(2 * K), 5), cnt(2, 5);
    EXPECT_EQ(mixprec_efficient_nms(boxes.data(), MIXPREC_F32, 0, scores.data(), sd, B, N, C, &p, ob.data(),
                                    os.data(), oc.data(), oi.data(), null_out ? nullptr : cnt.data()),
              want);
    for (auto v : ob) EXPECT_EQ(v, 5u);
    for (auto v : oc) EXPECT_EQ(v, 5);
    for (auto v : cnt) EXPECT_EQ(v, 5);
  };
  mixprec_detect_params p = mixprec_detect_params_default();
  p.max_detections = 4;
  mixprec_detect_params q = p;
  q.max_detections = 0;
  bad(q, MIXPREC_ERR_BAD_ARGUMENT);
  q = p, q.pre_nms_top_k = 0;
  bad(q, MIXPREC_ERR_BAD_ARGUMENT);
  q = p, q.iou_threshold = NAN;
  bad(q, MIXPREC_ERR_BAD_ARGUMENT);
  q = p, q.iou_threshold = -1;
  bad(q, MIXPREC_ERR_BAD_ARGUMENT);
  q = p, q.use_score_threshold = 1, q.score_threshold = NAN;
  bad(q, MIXPREC_ERR_BAD_ARGUMENT);
  bad(p, MIXPREC_ERR_BAD_SIZE, -1);
  bad(p, MIXPREC_ERR_BAD_SIZE, 2, int64_t(1) << 30, 4);  // N * C > INT32_MAX
  bad(p, MIXPREC_ERR_BAD_DTYPE, 2, 4, 3, mixprec_dtype(9));
  bad(p, MIXPREC_ERR_NULL_POINTER, 2, 4, 3, MIXPREC_F32, true);
  EXPECT_EQ(mixprec_efficient_nms(nullptr, MIXPREC_F32, 0, nullptr, MIXPREC_F32, 0, 4, 3, &p, nullptr, nullptr,
                                  nullptr, nullptr, nullptr),
            MIXPREC_OK);  // an empty batch needs no pointers
}

// No candidate (no classes, or no n) whatever the other size is, even
// INT64_MAX (found by fuzz_efficient_nms: the contiguous layout's products,
// n * 4 or 4 * classes, wrapped negative and the call was refused with
// BAD_ARGUMENT); every image gets a count of 0, with or without per-class
// boxes, on an empty batch too.
TEST(EfficientNmsArgs, NoCandidateForAnyOtherSize) {
  mixprec_detect_params p = mixprec_detect_params_default();
  p.max_detections = 3;
  const int64_t sizes[][2] = {{0, 0}, {5, 0}, {INT64_MAX, 0}, {0, 7}, {0, INT64_MAX}};
  for (const auto &nc : sizes) {
    for (int class_boxes = 0; class_boxes < 2; class_boxes++) {
      for (int64_t B : {int64_t(0), int64_t(2)}) {
        SCOPED_TRACE("n " + std::to_string(nc[0]) + " classes " + std::to_string(nc[1]) + " class_boxes " +
                     std::to_string(class_boxes) + " B " + std::to_string(B));
        std::vector<float> ob(2 * 3 * 4, 5.0f), os(2 * 3, 5.0f);
        std::vector<int64_t> oc(2 * 3, 5), oi(2 * 3, 5), cnt(2, 5);
        float dummy = 0.0f;
        EXPECT_EQ(mixprec_efficient_nms(&dummy, MIXPREC_F32, class_boxes, &dummy, MIXPREC_F32, B, nc[0], nc[1],
                                        &p, ob.data(), os.data(), oc.data(), oi.data(), cnt.data()),
                  MIXPREC_OK);
        for (int64_t b = 0; b < 2; b++) EXPECT_EQ(cnt[size_t(b)], b < B ? 0 : 5);
      }
    }
  }
}

}  // namespace
