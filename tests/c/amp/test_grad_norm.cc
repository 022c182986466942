// mixprec_grad_norm: the read-only twin of mixprec_unscale. Its found_inf,
// per-tensor norms and total must be mixprec_unscale's bit for bit (on every
// ISA, every chunk-data regime including float-sum overflow and NaN/inf), and
// no byte of any tensor may change.
#include <cmath>
#include <cstring>

#include "test_util.h"

#include "internal_api.h"

namespace {

using mpt::Buf;

const mixprec_dtype kDtypes[3] = {MIXPREC_F32, MIXPREC_F16, MIXPREC_BF16};

std::vector<Buf> make_list(std::mt19937 &rng, int count, bool wild) {
  const int64_t sizes[] = {0, 1, 7, 15, 16, 17, 127, 128, 129, 1000, 4097, 65535, 65536, 65537, 200003};
  std::vector<Buf> v;
  for (int i = 0; i < count; i++) {
    const int64_t n = sizes[rng() % 15];
    v.emplace_back(kDtypes[rng() % 3], n, (rng() & 1u) != 0);
    Buf &b = v.back();
    mpt::fill_random(b, rng, -30, b.dtype() == MIXPREC_F16 ? 14 : 20, wild);
    // Float block sums that overflow (values ~2^62), where the dtype allows.
    if (b.dtype() != MIXPREC_F16 && rng() % 3 == 0)
      for (int64_t j = 0; j < b.numel(); j += 1 + int64_t(rng() % 97))
        b.set_value(j, std::ldexp(1.5f, 62 + int(rng() % 2)));
  }
  return v;
}

struct Out {
  float found = 0.0f, total = 0.0f;
  std::vector<float> norms;
};

Out run(std::vector<Buf> &bufs, float inv, bool write) {
  std::vector<mixprec_tensor> ts;
  for (Buf &b : bufs) ts.push_back(b.tensor());
  Out o;
  o.norms.assign(bufs.size(), -1.0f);
  const mixprec_status st =
      write ? mixprec_unscale(ts.data(), int64_t(ts.size()), &inv, &o.found, o.norms.data(), &o.total)
            : mixprec_grad_norm(ts.data(), int64_t(ts.size()), &inv, &o.found, o.norms.data(), &o.total);
  EXPECT_EQ(st, MIXPREC_OK);
  return o;
}

bool same_bits(float a, float b) { return mpt::f32_bits(a) == mpt::f32_bits(b) || (a != a && b != b); }

TEST(GradNorm, EqualsUnscaleNormsAndWritesNothing) {
  mpt::GlobalStateGuard guard;
  for (mixprec_cpu_isa isa : mpt::supported_isas()) {
    ASSERT_EQ(mixprec_set_cpu_isa(isa), MIXPREC_OK);
    SCOPED_TRACE(mpt::isa_name(isa));
    std::mt19937 rng(mpt::kSeed + 500 + uint32_t(isa));
    for (int round = 0; round < 4; round++) {
      SCOPED_TRACE("round " + std::to_string(round));
      std::vector<Buf> in = make_list(rng, 40, round >= 2);
      if (round == 3) in[rng() % in.size()].set_raw(0, 0x7fc00000u);  // maybe a NaN (F32), else bits
      const float inv = round == 1 ? 3.0f : 1.0f / 1024.0f;
      std::vector<Buf> a = in, b = in;
      const Out ref = run(a, inv, true);
      const Out got = run(b, inv, false);
      EXPECT_EQ(got.found, ref.found);
      EXPECT_TRUE(same_bits(got.total, ref.total)) << got.total << " vs " << ref.total;
      for (size_t i = 0; i < in.size(); i++) {
        EXPECT_TRUE(same_bits(got.norms[i], ref.norms[i]))
            << "tensor " << i << ": " << got.norms[i] << " vs " << ref.norms[i];
        // Nothing written: every element keeps its bits.
        int64_t changed = 0;
        for (int64_t j = 0; j < in[i].numel(); j++) changed += b[i].raw(j) != in[i].raw(j);
        EXPECT_EQ(changed, 0) << "tensor " << i;
      }
    }
  }
}

TEST(GradNorm, ChunkKernelsAgreeWithTheUnscaleKernels) {
  // The read-only kernels directly, on one chunk each, against the in-place
  // kernel of the same ISA (blocks whose float sum overflows included).
  std::mt19937 rng(mpt::kSeed + 501);
  struct K {
    mixprec_cpu_isa isa;
    mixprec__unscale_chunk_fn w;
    mixprec__norm_chunk_fn r;
  };
  std::vector<K> ks = {{MIXPREC_ISA_SCALAR, mixprec__unscale_chunk_scalar, mixprec__norm_chunk_scalar}};
#if defined(MIXPREC_X86)
  ks.push_back({MIXPREC_ISA_AVX2, mixprec__unscale_chunk_avx2, mixprec__norm_chunk_avx2});
#endif
  for (const K &k : ks) {
    if (!mixprec_cpu_isa_supported(k.isa)) continue;
    for (mixprec_dtype d : kDtypes)
      for (int64_t n : {int64_t(1), int64_t(129), int64_t(4096 + 40), int64_t(65536)}) {
        Buf in(d, n, (rng() & 1u) != 0);
        mpt::fill_random(in, rng, -20, d == MIXPREC_F16 ? 14 : 20, false);
        if (d != MIXPREC_F16)
          for (int64_t j = 3; j < n; j += 41) in.set_value(j, std::ldexp(1.25f, 63));
        Buf w = in, r = in;
        int nf_w = 0, nf_r = 0;
        double sw = -1, sr = -2;
        k.w(w.data(), d, n, 0.5f, &nf_w, &sw);
        k.r(r.data(), d, n, 0.5f, &nf_r, &sr);
        EXPECT_EQ(nf_w, nf_r);
        EXPECT_EQ(std::memcmp(&sw, &sr, sizeof sw), 0)
            << mpt::isa_name(k.isa) << " " << mpt::dtype_name(d) << " n=" << n << ": " << sw << " vs " << sr;
        for (int64_t j = 0; j < n; j++) ASSERT_EQ(r.raw(j), in.raw(j));
      }
  }
}

TEST(GradNorm, SameErrorsAsUnscale) {
  Buf b(MIXPREC_F32, 10);
  mixprec_tensor t = b.tensor();
  const float inv = 1.0f;
  float found = 0.0f, total = 0.0f;
  EXPECT_EQ(mixprec_grad_norm(&t, -1, &inv, &found, nullptr, &total), MIXPREC_ERR_BAD_SIZE);
  EXPECT_EQ(mixprec_grad_norm(nullptr, 1, &inv, &found, nullptr, &total), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_grad_norm(&t, 1, nullptr, &found, nullptr, &total), MIXPREC_ERR_NULL_POINTER);
  EXPECT_EQ(mixprec_grad_norm(&t, 1, &inv, nullptr, nullptr, &total), MIXPREC_ERR_NULL_POINTER);
  mpt::poke_enum(&t.dtype, 9);
  EXPECT_EQ(mixprec_grad_norm(&t, 1, &inv, &found, nullptr, &total), MIXPREC_ERR_BAD_DTYPE);
  // Without norm outputs it is a pure non-finite check.
  Buf c(MIXPREC_BF16, 300);
  c.set_raw(299, 0x7f80u);
  mixprec_tensor u = c.tensor();
  EXPECT_EQ(mixprec_grad_norm(&u, 1, &inv, &found, nullptr, nullptr), MIXPREC_OK);
  EXPECT_EQ(found, 1.0f);
  EXPECT_EQ(c.raw(299), 0x7f80u);
}

}  // namespace
