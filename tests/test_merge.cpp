// merge_states: partial states over random disjoint key splits, computed with the float64
// reference, merged by the library and checked against the reference over the whole key set.
#include <cmath>
#include <cstring>
#include <limits>

#include "pagedattn_test_support.h"

using pat::status_is;

namespace {

class Merge : public pat::BackendTest {
 protected:
  // Poisons out and lse_out, merges (o1, l1) with (o2, l2) into them and downloads the result.
  ::testing::AssertionResult merge(pat::Tensor& out, pat::Tensor& lo, pat::Tensor& o1,
                                   pat::Tensor& l1, pat::Tensor& o2, pat::Tensor& l2) {
    out.poison_all();
    lo.poison_all();
    for (auto* x : {&o1, &o2, &out, &l1, &l2, &lo}) x->upload();
    const pagedattn_status st =
        pagedattn_merge_states(be, out.t(), lo.t(), o1.t(), l1.t(), o2.t(), l2.t(), nullptr);
    if (st != PAGEDATTN_OK)
      return ::testing::AssertionFailure() << pagedattn_status_string(st) << ": "
                                           << pat::last_error();
    out.download();
    lo.download();
    return ::testing::AssertionSuccess();
  }
};

}  // namespace

TEST_F(Merge, RandomSplitsMatchTheFullReference) {
  const uint64_t seed = pat::test_seed();
  SCOPED_TRACE(pat::seed_note(seed));
  std::mt19937_64 rng(seed);
  const pagedattn_dtype dts[] = {PAGEDATTN_DTYPE_FLOAT32, PAGEDATTN_DTYPE_FLOAT16,
                                 PAGEDATTN_DTYPE_BFLOAT16};
  for (int rep = 0; rep < 36; ++rep) {
    const pagedattn_dtype dt = dts[rep % 3];
    const int T = 1 + static_cast<int>(rng() % 9), H = 1 + static_cast<int>(rng() % 6);
    const int D = 8 * (1 + static_cast<int>(rng() % 32));
    const int nk = 1 + static_cast<int>(rng() % 60);
    const bool in_place = rep % 4 == 1, strided = rep % 4 == 2, with_lse = rep % 5 != 4;
    SCOPED_TRACE(std::string(pat::dtype_str(dt)) + " T=" + std::to_string(T) + " H=" +
                 std::to_string(H) + " D=" + std::to_string(D) + " keys=" + std::to_string(nk) +
                 (in_place ? " in-place" : "") + (strided ? " strided" : ""));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(static_cast<size_t>(T) * H * D), k(static_cast<size_t>(nk) * H * D),
        v(k.size());
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    // Random split of the keys; sometimes one side is empty (lse = -inf).
    std::vector<int> side(nk);
    const int mode = static_cast<int>(rng() % 6);
    for (int j = 0; j < nk; ++j) side[j] = mode == 0 ? 0 : mode == 1 ? 1 : static_cast<int>(rng() % 2);
    std::vector<float> k1, v1, k2, v2;
    for (int j = 0; j < nk; ++j) {
      auto& kk = side[j] ? k2 : k1;
      auto& vv = side[j] ? v2 : v1;
      kk.insert(kk.end(), &k[static_cast<size_t>(j) * H * D], &k[static_cast<size_t>(j + 1) * H * D]);
      vv.insert(vv.end(), &v[static_cast<size_t>(j) * H * D], &v[static_cast<size_t>(j + 1) * H * D]);
    }
    pat::RefParams p;
    p.H = H;
    p.Hkv = H;
    p.D = D;
    p.scale = 1.0 / std::sqrt(static_cast<double>(D));
    p.causal = false;
    std::vector<int64_t> qpos(T, 0);
    const size_t on = static_cast<size_t>(T) * H * D, ln = static_cast<size_t>(T) * H;
    std::vector<double> o1(on), l1(ln), o2(on), l2(ln), of(on), lf(ln);
    pat::ref_attend(p, T, q.data(), qpos.data(), static_cast<int64_t>(k1.size() / (H * D)), k1.data(),
                    v1.data(), o1.data(), l1.data());
    pat::ref_attend(p, T, q.data(), qpos.data(), static_cast<int64_t>(k2.size() / (H * D)), k2.data(),
                    v2.data(), o2.data(), l2.data());
    pat::ref_attend(p, T, q.data(), qpos.data(), nk, k.data(), v.data(), of.data(), lf.data());

    auto mk = [&](int64_t extra) {
      return std::unique_ptr<pat::Tensor>(new pat::Tensor(
          dev, dt, T, H, D, strided ? H * D + extra : 0, 0, strided ? 16 : 0));
    };
    auto t1 = mk(8), t2 = mk(24), tout = mk(40);
    auto mkl = [&](int64_t extra) {
      return pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, strided ? H + extra : 0);
    };
    auto tl1 = mkl(1), tl2 = mkl(5), tlo = mkl(2);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const size_t r = static_cast<size_t>(t) * H + h;
        // An empty state's output is arbitrary finite data that must not contribute.
        for (int d = 0; d < D; ++d) {
          t1->set(t, h, d, std::isinf(l1[r]) ? 7.0f : static_cast<float>(o1[r * D + d]));
          t2->set(t, h, d, std::isinf(l2[r]) ? -7.0f : static_cast<float>(o2[r * D + d]));
        }
        tl1->set(t, h, 0, static_cast<float>(l1[r]));
        tl2->set(t, h, 0, static_cast<float>(l2[r]));
      }
    tout->poison_all();
    tlo->poison_all();
    for (auto* x : {t1.get(), t2.get(), tout.get(), tl1.get(), tl2.get(), tlo.get()}) x->upload();
    pat::Tensor* out = in_place ? t1.get() : tout.get();
    pat::Tensor* lo = in_place ? tl2.get() : tlo.get();
    ASSERT_EQ(pagedattn_merge_states(be, out->t(), with_lse ? lo->t() : nullptr, t1->t(), tl1->t(),
                                     t2->t(), tl2->t(), nullptr),
              PAGEDATTN_OK)
        << pat::last_error();
    ASSERT_EQ(pagedattn_backend_synchronize(be, nullptr), PAGEDATTN_OK);
    out->download();
    lo->download();
    std::string why;
    if (!in_place) {
      EXPECT_TRUE(out->padding_untouched(&why)) << why;
      if (with_lse) {
        EXPECT_TRUE(lo->padding_untouched(&why)) << why;
      }
    }
    std::vector<float> got(on);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int d = 0; d < D; ++d) got[(static_cast<size_t>(t) * H + h) * D + d] = out->get(t, h, d);
    EXPECT_TRUE(pat::check_close("merged out", of, got, pat::tolerance(dt, dt)));
    if (with_lse) {
      for (size_t r = 0; r < ln; ++r) {
        const float gl = lo->get(static_cast<int64_t>(r / H), static_cast<int64_t>(r % H), 0);
        EXPECT_NEAR(gl, lf[r], 1e-5 * std::max(1.0, std::fabs(lf[r]))) << "lse row " << r;
      }
    }
  }
}

TEST_F(Merge, BothEmptyGivesZeroAndMinusInfinity) {
  pat::Tensor o1(dev, PAGEDATTN_DTYPE_FLOAT16, 2, 3, 16), o2(dev, PAGEDATTN_DTYPE_FLOAT16, 2, 3, 16),
      out(dev, PAGEDATTN_DTYPE_FLOAT16, 2, 3, 16);
  auto l1 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, 2, 3);
  auto l2 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, 2, 3);
  auto lo = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, 2, 3);
  for (int t = 0; t < 2; ++t)
    for (int h = 0; h < 3; ++h) {
      for (int d = 0; d < 16; ++d) {
        o1.set(t, h, d, 3.0f);
        o2.set(t, h, d, -5.0f);
      }
      // Row 0: both empty; row 1: only the second state.
      l1->set(t, h, 0, -INFINITY);
      l2->set(t, h, 0, t == 0 ? -INFINITY : 0.5f);
    }
  ASSERT_TRUE(merge(out, *lo, o1, *l1, o2, *l2));
  for (int h = 0; h < 3; ++h) {
    for (int d = 0; d < 16; ++d) {
      EXPECT_EQ(out.get(0, h, d), 0.0f) << "both empty: out must be 0";
      EXPECT_EQ(out.get(1, h, d), -5.0f) << "only the second state counts";
    }
    EXPECT_TRUE(std::isinf(lo->get(0, h, 0)) && lo->get(0, h, 0) < 0);
    EXPECT_FLOAT_EQ(lo->get(1, h, 0), 0.5f);
  }
}

TEST_F(Merge, NonFiniteLseGivesNaN) {
  // docs/semantics.md section 5: a NaN or +inf log-sum-exp on either side (also beside an empty
  // state) gives NaN out and lse_out, as float64 gives; a NaN inside o of a state that counts
  // reaches its column only.
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float l1v[] = {kNaN, -INFINITY, INFINITY, 0.25f, 0.25f};
  const float l2v[] = {0.5f, kNaN, -INFINITY, kNaN, 0.5f};
  const int T = 5, H = 2, D = 16;
  pat::Tensor o1(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D), o2(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D),
      out(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D);
  auto l1 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
  auto l2 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
  auto lo = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        o1.set(t, h, d, t == 4 && d == 3 ? kNaN : 1.0f);
        o2.set(t, h, d, 2.0f);
      }
      l1->set(t, h, 0, l1v[t]);
      l2->set(t, h, 0, l2v[t]);
    }
  ASSERT_TRUE(merge(out, *lo, o1, *l1, o2, *l2));
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < D; ++d) {
        const float x = out.get(t, h, d);
        if (t < 4 || d == 3)
          EXPECT_TRUE(std::isnan(x)) << "row " << t << " dim " << d << ": " << x << ", want NaN";
        else
          EXPECT_TRUE(std::isfinite(x)) << "row " << t << " dim " << d << ": " << x;
      }
      const float gl = lo->get(t, h, 0);
      if (t < 4)
        EXPECT_TRUE(std::isnan(gl)) << "lse row " << t << ": " << gl << ", want NaN";
      else
        EXPECT_NEAR(gl, std::log(std::exp(0.25) + std::exp(0.5)), 1e-5) << "lse row " << t;
    }
}

TEST_F(Merge, Refusals) {
  const int T = 3, H = 2, D = 16;
  pat::Tensor o1(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D), o2(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D),
      out(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, D), o_f16(dev, PAGEDATTN_DTYPE_FLOAT16, T, H, D),
      o_rows(dev, PAGEDATTN_DTYPE_FLOAT32, T + 1, H, D), o_dim(dev, PAGEDATTN_DTYPE_FLOAT32, T, H, 8);
  auto l1 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
  auto l2 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
  auto lo = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H);
  auto l_f16 = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT16, T, H);
  auto l_heads = pat::Tensor::make2d(dev, PAGEDATTN_DTYPE_FLOAT32, T, H + 1);
  out.poison_all();
  lo->poison_all();
  for (auto* x : {&o1, &o2, &out, l1.get(), l2.get(), lo.get()}) x->upload();
  auto unchanged = [&]() -> ::testing::AssertionResult {
    std::vector<uint8_t> a = out.buf().host(), b = lo->buf().host();
    out.download();
    lo->download();
    if (a != out.buf().host() || b != lo->buf().host())
      return ::testing::AssertionFailure() << "out or lse_out written by a refused merge";
    return ::testing::AssertionSuccess();
  };
  auto m = [&](pagedattn_tensor* o, pagedattn_tensor* l, pagedattn_tensor* a, pagedattn_tensor* la,
               pagedattn_tensor* b, pagedattn_tensor* lb) {
    return pagedattn_merge_states(be, o, l, a, la, b, lb, nullptr);
  };
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o_f16.t(), l1->t(), o2.t(), l2->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR, "dtype"));
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o_rows.t(), l1->t(), o2.t(), l2->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR));
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o1.t(), l1->t(), o_dim.t(), l2->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR));
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o1.t(), l_f16->t(), o2.t(), l2->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR));
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o1.t(), l1->t(), o2.t(), l_heads->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR));
  EXPECT_TRUE(status_is(m(out.t(), l_heads->t(), o1.t(), l1->t(), o2.t(), l2->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR));
  pagedattn_tensor bad_stride = *o2.t();
  int64_t st[3] = {H * D * 2, D * 2, 2};
  bad_stride.strides = st;
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o1.t(), l1->t(), &bad_stride, l2->t()),
                        PAGEDATTN_ERROR_BAD_TENSOR, "stride"));
  pagedattn_tensor wrong_dev = *o2.t();
  wrong_dev.device.device_type = dev.device_type == PAGEDATTN_DEVICE_CPU ? PAGEDATTN_DEVICE_CUDA
                                                                          : PAGEDATTN_DEVICE_CPU;
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o1.t(), l1->t(), &wrong_dev, l2->t()),
                        PAGEDATTN_ERROR_WRONG_DEVICE));
  EXPECT_TRUE(status_is(m(nullptr, lo->t(), o1.t(), l1->t(), o2.t(), l2->t()),
                        PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), nullptr, l1->t(), o2.t(), l2->t()),
                        PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(m(out.t(), lo->t(), o1.t(), l1->t(), o2.t(), nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(status_is(pagedattn_merge_states(nullptr, out.t(), lo->t(), o1.t(), l1->t(), o2.t(),
                                               l2->t(), nullptr),
                        PAGEDATTN_ERROR_NULL_POINTER));
  EXPECT_TRUE(unchanged());
}
