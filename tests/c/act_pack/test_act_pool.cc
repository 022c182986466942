// mixprec_act_pool_encode / _decode ([note: pool codes] in mixprec/act_pack.h)
// against a 2-D max pool written here: its indices (h * W + w of each output
// element's largest input, first on ties) are coded as the window offset
// (kh * kW + kw) and decoded back exactly, contiguous and channels-last,
// with and without dilation, 1 and 2 threads past the threading limit;
// corrupted indices (outside the window, negative, off the dilation grid)
// give 255 and are counted; bad arguments write nothing.
#include <cstring>
#include <vector>

#include "test_util.h"

namespace {

struct Geom {
  int64_t kH, kW, sH, sW, pH, pW, dH, dW;
};

// Indices of max_pool2d over C planes of H x W, laid out as (C, HO, WO)
// (contiguous) or (HO, WO, C) (channels-last); returns HO, WO.
std::vector<int64_t> ref_pool(std::mt19937 &rng, int64_t C, int64_t H, int64_t W, const Geom &g,
                              bool channels_last, int64_t *HO, int64_t *WO) {
  *HO = (H + 2 * g.pH - g.dH * (g.kH - 1) - 1) / g.sH + 1;
  *WO = (W + 2 * g.pW - g.dW * (g.kW - 1) - 1) / g.sW + 1;
  std::normal_distribution<float> gauss;
  std::vector<float> x(size_t(C * H * W));
  for (auto &v : x) v = gauss(rng);
  std::vector<int64_t> idx(size_t(C * *HO * *WO));
  for (int64_t c = 0; c < C; c++)
    for (int64_t ho = 0; ho < *HO; ho++)
      for (int64_t wo = 0; wo < *WO; wo++) {
        int64_t best = -1;
        for (int64_t kh = 0; kh < g.kH; kh++)
          for (int64_t kw = 0; kw < g.kW; kw++) {
            const int64_t h = ho * g.sH - g.pH + kh * g.dH, w = wo * g.sW - g.pW + kw * g.dW;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            if (best < 0 || x[size_t(c * H * W + h * W + w)] > x[size_t(c * H * W + best)])
              best = h * W + w;
          }
        const int64_t pos = channels_last ? (ho * *WO + wo) * C + c : (c * *HO + ho) * *WO + wo;
        idx[size_t(pos)] = best;
      }
  return idx;
}

// The code of index v at output (ho, wo) by search: the window position
// (kh, kw) inside the plane's columns (h >= 0, 0 <= w < W) whose h * W + w
// is v; 255 if none.
int ref_code(int64_t v, int64_t ho, int64_t wo, const int64_t *g) {
  if (v >= (int64_t(1) << 52)) return 255;  // the header: no plane is that large
  for (int64_t kh = 0; kh < g[1]; kh++)
    for (int64_t kw = 0; kw < g[2]; kw++) {
      const int64_t h = ho * g[3] - g[5] + kh * g[7], w = wo * g[4] - g[6] + kw * g[8];
      if (h >= 0 && w >= 0 && w < g[0] && h * g[0] + w == v) return int(kh * g[2] + kw);
    }
  return 255;
}

const Geom kGeoms[] = {{3, 3, 2, 2, 1, 1, 1, 1}, {2, 2, 2, 2, 0, 0, 1, 1}, {3, 3, 1, 1, 1, 1, 2, 2},
                       {5, 3, 3, 2, 2, 1, 1, 1}, {15, 15, 15, 15, 0, 0, 1, 1}};

TEST(ActPool, RealPoolIndicesRoundTrip) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 950);
  for (const Geom &g : kGeoms)
    for (bool cl : {false, true})
      for (int64_t C : {int64_t{3}, int64_t{40}}) {
        const int64_t H = 37 + C, W = 61;
        int64_t HO = 0, WO = 0;
        const std::vector<int64_t> idx = ref_pool(rng, C, H, W, g, cl, &HO, &WO);
        const int64_t n = int64_t(idx.size());
        const int64_t s_wo = cl ? C : 1, s_ho = cl ? WO * C : WO;
        const int64_t geom[9] = {W, g.kH, g.kW, g.sH, g.sW, g.pH, g.pW, g.dH, g.dW};
        for (int threads : {1, 2}) {
          mixprec_set_num_threads(threads);
          std::vector<uint8_t> codes(size_t(n), 0xa5);
          int64_t inexact = -1;
          ASSERT_EQ(mixprec_act_pool_encode(idx.data(), n, HO, WO, s_ho, s_wo, geom, codes.data(),
                                            &inexact),
                    MIXPREC_OK);
          EXPECT_EQ(inexact, 0);
          for (int64_t i = 0; i < n; i++) ASSERT_LT(codes[size_t(i)], g.kH * g.kW) << i;
          std::vector<int64_t> back(size_t(n), -7);
          ASSERT_EQ(mixprec_act_pool_decode(codes.data(), n, HO, WO, s_ho, s_wo, geom, back.data()),
                    MIXPREC_OK);
          ASSERT_EQ(back, idx) << "k" << g.kH << "x" << g.kW << " cl " << cl << " C " << C;
        }
      }
}

// Past the threading limit (2^17 elements), contiguous and channels-last:
// the same codes on 1 and 2 threads, and the corrupted elements counted.
TEST(ActPool, LargeAndCorrupted) {
  mpt::GlobalStateGuard guard;
  std::mt19937 rng(mpt::kSeed + 951);
  const Geom g = {3, 3, 2, 2, 1, 1, 1, 1};
  for (bool cl : {false, true}) {
    int64_t HO = 0, WO = 0;
    std::vector<int64_t> idx = ref_pool(rng, 48, 112, 112, g, cl, &HO, &WO);
    const int64_t n = int64_t(idx.size()), C = 48;
    ASSERT_GT(n, int64_t(1) << 17);
    int64_t corrupted = 0;
    for (int64_t i = 0; i < n; i += 997) {
      switch (rng() % 3) {
        case 0: idx[size_t(i)] = rng() % 2 ? -1 - int64_t(rng() % 5) : (int64_t(1) << 52) + 3; break;
        case 1: idx[size_t(i)] += 3; break;         // three columns right: outside
        default: idx[size_t(i)] += 112 * 3; break;  // three rows down: outside
      }
      corrupted++;
    }
    const int64_t s_wo = cl ? C : 1, s_ho = cl ? WO * C : WO;
    const int64_t geom[9] = {112, 3, 3, 2, 2, 1, 1, 1, 1};
    std::vector<uint8_t> first;
    for (int threads : {1, 2}) {
      mixprec_set_num_threads(threads);
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      int64_t inexact = -1;
      ASSERT_EQ(mixprec_act_pool_encode(idx.data(), n, HO, WO, s_ho, s_wo, geom, codes.data(),
                                        &inexact),
                MIXPREC_OK);
      EXPECT_EQ(inexact, corrupted);
      for (int64_t i = 0; i < n; i++)
        ASSERT_EQ(codes[size_t(i)], ref_code(idx[size_t(i)], (i / s_ho) % HO, (i / s_wo) % WO, geom))
            << i;
      if (first.empty()) first = codes;
      else ASSERT_EQ(codes, first);
    }
  }
}

// Any index, dilated and strided geometries: each code is the search's
// (an index off the dilation grid, outside the window, in another row or
// negative is 255), and the count of 255s is *inexact.
TEST(ActPool, AnyIndexMatchesSearch) {
  std::mt19937 rng(mpt::kSeed + 952);
  const int64_t geoms[][9] = {{20, 3, 3, 1, 1, 2, 2, 2, 2}, {17, 5, 3, 3, 2, 2, 1, 1, 1},
                              {9, 2, 4, 2, 3, 1, 0, 3, 1}};
  for (const auto &geom : geoms) {
    const int64_t HO = 11, WO = 7, n = 3 * HO * WO;
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (auto &v : idx) v = int64_t(rng() % 500) - 40;
    std::vector<uint8_t> codes(static_cast<size_t>(n));
    int64_t inexact = -1;
    ASSERT_EQ(mixprec_act_pool_encode(idx.data(), n, HO, WO, WO, 1, geom, codes.data(), &inexact),
              MIXPREC_OK);
    int64_t want = 0;
    for (int64_t i = 0; i < n; i++) {
      const int c = ref_code(idx[size_t(i)], (i / WO) % HO, i % WO, geom);
      ASSERT_EQ(codes[size_t(i)], c) << "element " << i << " index " << idx[size_t(i)];
      want += c == 255;
    }
    std::vector<int64_t> back(static_cast<size_t>(n), -5);
    ASSERT_EQ(mixprec_act_pool_decode(codes.data(), n, HO, WO, WO, 1, geom, back.data()),
              MIXPREC_OK);
    for (int64_t i = 0; i < n; i++)
      if (codes[size_t(i)] != 255) ASSERT_EQ(back[size_t(i)], idx[size_t(i)]) << i;
    EXPECT_GT(want, 0);
    EXPECT_LT(want, n);
    EXPECT_EQ(inexact, want);
  }
}

TEST(ActPool, BadArgumentsWriteNothing) {
  const int64_t geom[9] = {8, 3, 3, 2, 2, 1, 1, 1, 1};
  std::vector<int64_t> idx(16, 0);
  std::vector<uint8_t> codes(16, 0x5a);
  int64_t inexact = 77;
  auto enc = [&](int64_t n, int64_t HO, int64_t WO, const int64_t *gm, uint8_t *c, int64_t *ie) {
    return mixprec_act_pool_encode(idx.data(), n, HO, WO, WO, 1, gm, c, ie);
  };
  EXPECT_EQ(enc(-1, 4, 4, geom, codes.data(), &inexact), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(enc(16, 0, 4, geom, codes.data(), &inexact), MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(enc(16, 4, 4, nullptr, codes.data(), &inexact), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(enc(16, 4, 4, geom, nullptr, &inexact), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(enc(16, 4, 4, geom, codes.data(), nullptr), MIXPREC_ERR_NULL_POINTER);
  for (int k = 0; k < 9; k++) {
    int64_t bad[9];
    std::memcpy(bad, geom, sizeof bad);
    bad[k] = k == 5 || k == 6 ? -1 : 0;
    EXPECT_EQ(enc(16, 4, 4, bad, codes.data(), &inexact), MIXPREC_ERR_BAD_ARGUMENT) << k;
  }
  const int64_t big[9] = {8, 16, 16, 1, 1, 0, 0, 1, 1};  // 256 offsets: 255 would be one
  EXPECT_EQ(enc(16, 4, 4, big, codes.data(), &inexact), MIXPREC_ERR_BAD_ARGUMENT);
  for (uint8_t c : codes) ASSERT_EQ(c, 0x5a);
  EXPECT_EQ(inexact, 77);
  std::vector<int64_t> out(16, -3);
  EXPECT_EQ(mixprec_act_pool_decode(codes.data(), 16, 4, 4, 4, 0, geom, out.data()),
            MIXPREC_ERR_BAD_ARGUMENT);
  EXPECT_EQ(mixprec_act_pool_decode(nullptr, 16, 4, 4, 4, 1, geom, out.data()),
            MIXPREC_ERR_NULL_POINTER);
  for (int64_t v : out) ASSERT_EQ(v, -3);
  EXPECT_EQ(mixprec_act_pool_decode(nullptr, 0, 4, 4, 4, 1, geom, nullptr), MIXPREC_OK);
}

}  // namespace
