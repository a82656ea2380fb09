// AMD's matrix-core instruction of kernels/gpu/mfma.cuh on the emulator's HIP (wave 64)
// configuration, lane by lane: v_mfma_f32_16x16x16 bf16_1k and f16 against a float64 product,
// with each lane's registers packed by layouts written here independently of sim/mfma.h: once
// from AMD's CDNA3 ISA guide (the 16x16x16 dense layouts, as AMD's matrix instruction calculator
// prints them), once from rocWMMA's fragment layouts (library/include/rocwmma/internal/
// layout_impl.hpp: ColOrthoVW for A, RowOrthoVW for B and the accumulator, restated as a
// formula). Each test launches one 64-lane wave.
#include "mfma.cuh"

#include <math.h>
#include <stdint.h>

#include <random>
#include <vector>

#include <gtest/gtest.h>


namespace {

using namespace pagedattn_gpu;

// Which (row, col) of its tile each (lane, element) holds, for A (M x K), B (K x N) and C/D.
struct Layout {
  int (*a)(int lane, int i, int* col);
  int (*b)(int lane, int i, int* col);
  int (*c)(int lane, int i, int* col);
};

// AMD's ISA guide: A's lane l holds row l mod 16 and the four k values of block l div 16
// (register v0 bits 0-15, 16-31, then v1); B mirrors it with k as the row; D's lane l holds
// column l mod 16 and rows 4 (l div 16) .. +3, one a register.
int isa_a(int l, int i, int* col) { *col = (l / 16) * 4 + i; return l % 16; }
int isa_b(int l, int i, int* col) { *col = l % 16; return (l / 16) * 4 + i; }
int isa_c(int l, int i, int* col) { *col = l % 16; return (l / 16) * 4 + i; }

// rocWMMA: a fragment of BlockDim 16 and BlockK 16 on a 64-lane wave with vector width 4 has
// its BlockDim stride min(16, 64) = 16 lanes and its K stride 64 x 4 / 16 = 16, so lane l's base
// coordinate is (l % 16, (l / 16) x 4 mod 16) in (BlockDim, K) and its vector elements step
// along K. A is column-oriented (BlockDim = M: (m, k)); B and the accumulator are the row
// orientation (coordinates swapped: (k, n) and (m, n) with the lane along n).
int rocwmma_a(int l, int i, int* col) { *col = (l / 16 * 4) % 16 + i; return l % 16; }
int rocwmma_b(int l, int i, int* col) { *col = l % 16; return (l / 16 * 4) % 16 + i; }
int rocwmma_c(int l, int i, int* col) { *col = l % 16; return (l / 16 * 4) % 16 + i; }

template <typename... P, typename... A>
cudaError_t launch(void (*k)(P...), unsigned threads, int warp, A... a) {
  pa_sim::launcher(k, "test kernel", 1, threads, 0, nullptr, __FILE__, __LINE__, warp)(a...);
  return cudaGetLastError();
}

// Lane l passes a[2 l..], b[2 l..], c[4 l..] and writes its d to d[4 l..].
__global__ void run_mfma(int bf16, const uint32_t* a, const uint32_t* b, const float* c,
                         float* d) {
  const int l = static_cast<int>(threadIdx.x);
  float out[4];
  if (bf16) {
    mfma_16x16x16_bf16(out, a + 2 * l, b + 2 * l, c + 4 * l);
  } else {
    mfma_16x16x16_f16(out, a + 2 * l, b + 2 * l, c + 4 * l);
  }
  for (int i = 0; i < 4; ++i) d[4 * l + i] = out[i];
}

uint16_t to16(bool bf16, float v) {
  return bf16 ? pa_cpu::f32_to_bf16(v) : pa_cpu::f32_to_f16(v);
}
float from16(bool bf16, uint16_t h) {
  return bf16 ? pa_cpu::bf16_to_f32(h) : pa_cpu::f16_to_f32(h);
}

template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyDefault), cudaSuccess);
  return d;
}

// Random A, B, C (A and B with distinct k patterns, so a k permutation of one operand shows),
// packed by `lay`; D from the emulator unpacked by `lay` against the float64 product.
void check(bool bf16, const Layout& lay, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  uint16_t ta[16][16], tb[16][16];
  float tc[16][16];
  for (int r = 0; r < 16; ++r) {
    for (int k = 0; k < 16; ++k) {
      ta[r][k] = to16(bf16, u(rng));
      tb[r][k] = to16(bf16, u(rng));
      tc[r][k] = u(rng);
    }
  }
  std::vector<uint32_t> a(128, 0), b(128, 0);
  std::vector<float> c(256), d(256, NAN);
  for (int l = 0; l < 64; ++l) {
    for (int i = 0; i < 4; ++i) {
      int col = 0;
      int row = lay.a(l, i, &col);
      a[2 * l + i / 2] |= static_cast<uint32_t>(ta[row][col]) << (16 * (i & 1));
      row = lay.b(l, i, &col);
      b[2 * l + i / 2] |= static_cast<uint32_t>(tb[row][col]) << (16 * (i & 1));
      row = lay.c(l, i, &col);
      c[4 * l + i] = tc[row][col];
    }
  }
  uint32_t* da = device_copy(a);
  uint32_t* db = device_copy(b);
  float* dc = device_copy(c);
  float* dd = device_copy(d);
  ASSERT_EQ(launch(run_mfma, 64, 64, bf16 ? 1 : 0, static_cast<const uint32_t*>(da),
                   static_cast<const uint32_t*>(db), static_cast<const float*>(dc), dd),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDefault), cudaSuccess);
  for (int l = 0; l < 64; ++l) {
    for (int i = 0; i < 4; ++i) {
      int n = 0;
      const int m = lay.c(l, i, &n);
      double want = tc[m][n], mag = fabs(tc[m][n]);
      for (int k = 0; k < 16; ++k) {
        const double p = double{from16(bf16, ta[m][k])} * from16(bf16, tb[k][n]);
        want += p;
        mag += fabs(p);
      }
      EXPECT_NEAR(d[4 * l + i], want, 1e-6 * mag + 1e-6) << "lane " << l << " element " << i;
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
}

// Both descriptions name every element of each tile exactly once, and they agree.
TEST(Mfma, LayoutsCoverTilesAndAgree) {
  const Layout isa{isa_a, isa_b, isa_c}, roc{rocwmma_a, rocwmma_b, rocwmma_c};
  for (const Layout* lay : {&isa, &roc}) {
    for (auto f : {lay->a, lay->b, lay->c}) {
      int seen[16][16] = {};
      for (int l = 0; l < 64; ++l) {
        for (int i = 0; i < 4; ++i) {
          int col = -1;
          const int row = f(l, i, &col);
          ASSERT_TRUE(row >= 0 && row < 16 && col >= 0 && col < 16);
          ++seen[row][col];
        }
      }
      for (auto& r : seen)
        for (int s : r) EXPECT_EQ(s, 1);
    }
  }
  for (int l = 0; l < 64; ++l) {
    for (int i = 0; i < 4; ++i) {
      int c1 = 0, c2 = 0;
      EXPECT_EQ(isa_a(l, i, &c1), rocwmma_a(l, i, &c2));
      EXPECT_EQ(c1, c2);
      EXPECT_EQ(isa_b(l, i, &c1), rocwmma_b(l, i, &c2));
      EXPECT_EQ(c1, c2);
      EXPECT_EQ(isa_c(l, i, &c1), rocwmma_c(l, i, &c2));
      EXPECT_EQ(c1, c2);
    }
  }
}

TEST(Mfma, Bf16AgainstIsaLayout) {
  for (uint32_t s = 1; s <= 4; ++s) check(true, {isa_a, isa_b, isa_c}, s);
}
TEST(Mfma, F16AgainstIsaLayout) {
  for (uint32_t s = 1; s <= 4; ++s) check(false, {isa_a, isa_b, isa_c}, s);
}
TEST(Mfma, Bf16AgainstRocwmmaLayout) {
  for (uint32_t s = 5; s <= 8; ++s) check(true, {rocwmma_a, rocwmma_b, rocwmma_c}, s);
}
TEST(Mfma, F16AgainstRocwmmaLayout) {
  for (uint32_t s = 5; s <= 8; ++s) check(false, {rocwmma_a, rocwmma_b, rocwmma_c}, s);
}

// One-hot operands pin each register half: A = e_(m,k), B = e_(k,n) gives D = C + e_(m,n),
// which a k permutation applied to both operands alike would not hide.
TEST(Mfma, OneHotPinsEachElement) {
  const bool bf16 = true;
  for (int k = 0; k < 16; ++k) {
    std::vector<uint32_t> a(128, 0), b(128, 0);
    std::vector<float> c(256, 0.0f), d(256, NAN);
    const int m = (k * 5) % 16, n = (k * 7 + 3) % 16;
    for (int l = 0; l < 64; ++l) {
      for (int i = 0; i < 4; ++i) {
        int col = 0;
        if (isa_a(l, i, &col) == m && col == k)
          a[2 * l + i / 2] |= static_cast<uint32_t>(to16(bf16, 1.0f)) << (16 * (i & 1));
        if (isa_b(l, i, &col) == k && col == n)
          b[2 * l + i / 2] |= static_cast<uint32_t>(to16(bf16, 1.0f)) << (16 * (i & 1));
      }
    }
    uint32_t* da = device_copy(a);
    uint32_t* db = device_copy(b);
    float* dc = device_copy(c);
    float* dd = device_copy(d);
    ASSERT_EQ(launch(run_mfma, 64, 64, 1, static_cast<const uint32_t*>(da),
                     static_cast<const uint32_t*>(db), static_cast<const float*>(dc), dd),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d.data(), dd, d.size() * sizeof(float), cudaMemcpyDefault),
              cudaSuccess);
    for (int l = 0; l < 64; ++l) {
      for (int i = 0; i < 4; ++i) {
        int col = 0;
        const int row = isa_c(l, i, &col);
        EXPECT_EQ(d[4 * l + i], row == m && col == n ? 1.0f : 0.0f) << "k " << k;
      }
    }
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
  }
}

}  // namespace
