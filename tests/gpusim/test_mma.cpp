// The register-fragment tensor-core instructions of kernels/gpu/mma.cuh on the emulator, lane by
// lane: ldmatrix (x4, x2, .trans) against its documented layout, mma.sync m16n8k16 (bf16, f16)
// against a float64 product, the two composed as an attention kernel loads Q/P and V, and the
// divergences that abort. Each test launches one warp. The expected layouts are written here
// from the PTX ISA independently of sim/mma.h: register by register, or as the inverse map
// (which lane holds an element).
#include "mma.cuh"

#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace {

using namespace pagedattn_gpu;

template <typename... P, typename... A>
cudaError_t launch(void (*k)(P...), unsigned threads, size_t smem, int warp, A... a) {
  pa_sim::launcher(k, "test kernel", 1, threads, smem, nullptr, __FILE__, __LINE__, warp)(a...);
  return cudaGetLastError();
}

// Device memory is host memory here; these copy a host vector in and out.
template <typename T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), h.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyDefault), cudaSuccess);
  return d;
}
template <typename T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDefault), cudaSuccess);
  return h;
}

uint32_t pack(uint16_t lo, uint16_t hi) { return lo | static_cast<uint32_t>(hi) << 16; }
uint16_t half_at(uint32_t reg, int h) { return static_cast<uint16_t>(reg >> (16 * h)); }

enum Form { kX4, kX2, kX4Trans, kX2Trans };

// Copies `fill` (n values) into shared memory; then lane l loads with `form` from the row at
// element offset rows[l] (no address where negative) and writes its registers to out[4 l ..].
__global__ void load_rows(const uint16_t* fill, int n, const int* rows, int form, uint32_t* out) {
  PA_DYNAMIC_SHARED(16, smem);
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += 32) s[i] = fill[i];
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x);
  const void* p = rows[lane] < 0 ? nullptr : s + rows[lane];
  uint32_t r[4] = {0, 0, 0, 0};
  if (form == kX4) ldmatrix_x4(r, p);
  if (form == kX2) ldmatrix_x2(r, p);
  if (form == kX4Trans) ldmatrix_x4_trans(r, p);
  if (form == kX2Trans) ldmatrix_x2_trans(r, p);
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

void check_ldmatrix(Form form) {
  const int count = (form == kX4 || form == kX4Trans) ? 4 : 2;
  const bool trans = form == kX4Trans || form == kX2Trans;
  // 256 rows of 8 values, all distinct; the lanes name 32 of them in a shuffled order, so the
  // rows of one matrix lie at unrelated, non-contiguous offsets.
  const int n = 256 * 8;
  std::vector<uint16_t> fill(n);
  for (int i = 0; i < n; ++i) fill[i] = static_cast<uint16_t>(i * 40503u + 12345u);
  std::vector<int> slot(256);
  for (int i = 0; i < 256; ++i) slot[i] = i;
  std::mt19937 rng(7 + form);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<int> rows(32, -1);  // x2: lanes 16..31 pass no address (theirs are ignored)
  for (int l = 0; l < 8 * count; ++l) rows[l] = slot[l] * 8;

  uint16_t* dfill = device_copy(fill);
  int* drows = device_copy(rows);
  uint32_t* dout = device_copy(std::vector<uint32_t>(128, 0));
  ASSERT_EQ(launch(load_rows, 32, n * sizeof(uint16_t), 32, dfill, n, drows,
                   static_cast<int>(form), dout),
            cudaSuccess);
  const std::vector<uint32_t> out = host_copy(dout, 128);

  // Lanes 8m..8m+7 supply rows 0..7 of matrix m. Lane 4 i + j / 2 holds element (i, j) of
  // each matrix (its register m; j even in the low half); .trans stores the matrix transposed,
  // so element (row, col) of what was read lands where (col, row) would.
  int checked = 0;
  for (int m = 0; m < count; ++m)
    for (int row = 0; row < 8; ++row)
      for (int col = 0; col < 8; ++col) {
        const uint16_t v = fill[rows[8 * m + row] + col];
        const int i = trans ? col : row, j = trans ? row : col;
        const int lane = 4 * i + j / 2;
        EXPECT_EQ(half_at(out[lane * 4 + m], j % 2), v)
            << "matrix " << m << " row " << row << " col " << col << " (lane " << lane << ")";
        ++checked;
      }
  // Every half of every register written is one element: the map covers them all.
  EXPECT_EQ(checked, 32 * count * 2);
  for (int l = 0; l < 32; ++l)
    for (int m = count; m < 4; ++m) EXPECT_EQ(out[l * 4 + m], 0u) << "lane " << l;
  cudaFree(dfill);
  cudaFree(drows);
  cudaFree(dout);
}

TEST(GpuSimMma, LdmatrixX4) { check_ldmatrix(kX4); }
TEST(GpuSimMma, LdmatrixX2) { check_ldmatrix(kX2); }
TEST(GpuSimMma, LdmatrixX4Trans) { check_ldmatrix(kX4Trans); }
TEST(GpuSimMma, LdmatrixX2Trans) { check_ldmatrix(kX2Trans); }

// 16-bit values exactly representable in the input type, of mixed sign and magnitude.
struct Inputs {
  bool bf16;
  uint16_t bits(float f) const { return bf16 ? pa_cpu::f32_to_bf16(f) : pa_cpu::f32_to_f16(f); }
  float value(uint16_t h) const { return bf16 ? pa_cpu::bf16_to_f32(h) : pa_cpu::f16_to_f32(h); }
};
std::vector<uint16_t> random_tile(const Inputs& in, int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::uniform_int_distribution<int> e(-3, 3);
  std::vector<uint16_t> t(n);
  for (uint16_t& h : t) h = in.bits(ldexpf(u(rng), e(rng)));
  return t;
}
std::vector<float> random_floats(int n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  std::vector<float> t(n);
  for (float& f : t) f = u(rng);
  return t;
}

// Accumulates in place from the fragments given, as a FlashAttention kernel does.
__global__ void mma_fragments(const uint32_t* a, const uint32_t* b, const float* c, float* d,
                              int bf16) {
  const int lane = static_cast<int>(threadIdx.x);
  uint32_t ra[4], rb[2];
  float acc[4];
  for (int i = 0; i < 4; ++i) ra[i] = a[lane * 4 + i];
  for (int i = 0; i < 2; ++i) rb[i] = b[lane * 2 + i];
  for (int i = 0; i < 4; ++i) acc[i] = c[lane * 4 + i];
  if (bf16) {
    mma_m16n8k16_bf16(acc, ra, rb, acc);
  } else {
    mma_m16n8k16_f16(acc, ra, rb, acc);
  }
  for (int i = 0; i < 4; ++i) d[lane * 4 + i] = acc[i];
}

// d = a (M x K) * b (K x N) + c, all row-major, in float64, with the bound of float32
// accumulation: 16 roundings, each at most 2^-24 of a partial sum bounded by |c| + sum |a b|.
struct Reference {
  std::vector<double> d, bound;
};
Reference reference(const Inputs& in, const std::vector<uint16_t>& a,
                    const std::vector<uint16_t>& b, const std::vector<float>& c, int M, int N,
                    int K) {
  Reference r{std::vector<double>(M * N), std::vector<double>(M * N)};
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = c[i * N + j], mag = fabs(s);
      for (int k = 0; k < K; ++k) {
        const double p = double(in.value(a[i * K + k])) * in.value(b[k * N + j]);
        s += p;
        mag += fabs(p);
      }
      r.d[i * N + j] = s;
      r.bound[i * N + j] = ldexp(mag, -20);
    }
  return r;
}

void check_mma(bool bf16, uint32_t seed) {
  const Inputs in{bf16};
  std::mt19937 rng(seed);
  const std::vector<uint16_t> A = random_tile(in, 16 * 16, rng);  // 16 x 16, row-major
  const std::vector<uint16_t> B = random_tile(in, 16 * 8, rng);   // 16 (k) x 8 (n), row-major
  const std::vector<float> C = random_floats(16 * 8, rng);

  // The documented fragments, register by register (g = groupID = lane / 4,
  // t = threadID_in_group = lane % 4; the next column, or k, in the high half):
  //   a[0] A(g, 2t)  a[1] A(g + 8, 2t)  a[2] A(g, 2t + 8)  a[3] A(g + 8, 2t + 8)
  //   b[0] B(2t, g)  b[1] B(2t + 8, g)  (the high half: k + 1)
  //   c[0], c[1] C(g, 2t), C(g, 2t + 1)  c[2], c[3] C(g + 8, 2t), C(g + 8, 2t + 1); D alike
  std::vector<uint32_t> fa(32 * 4), fb(32 * 2);
  std::vector<float> fc(32 * 4);
  const int up[4] = {0, 8, 0, 8}, right[4] = {0, 0, 8, 8};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 4; ++j) {
      const int row = g + up[j], col = 2 * t + right[j];
      fa[lane * 4 + j] = pack(A[row * 16 + col], A[row * 16 + col + 1]);
    }
    for (int j = 0; j < 2; ++j) {
      const int k = 2 * t + 8 * j;
      fb[lane * 2 + j] = pack(B[k * 8 + g], B[(k + 1) * 8 + g]);
    }
    for (int j = 0; j < 4; ++j) fc[lane * 4 + j] = C[(g + 8 * (j / 2)) * 8 + 2 * t + j % 2];
  }
  uint32_t* da = device_copy(fa);
  uint32_t* db = device_copy(fb);
  float* dc = device_copy(fc);
  float* dd = device_copy(std::vector<float>(128, 0.f));
  ASSERT_EQ(launch(mma_fragments, 32, 0, 32, da, db, dc, dd, bf16 ? 1 : 0), cudaSuccess);
  const std::vector<float> fd = host_copy(dd, 128);

  const Reference ref = reference(in, A, B, C, 16, 8, 16);
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 4; ++j) {
      const int e = (g + 8 * (j / 2)) * 8 + 2 * t + j % 2;
      EXPECT_NEAR(fd[lane * 4 + j], ref.d[e], ref.bound[e])
          << (bf16 ? "bf16" : "f16") << " seed " << seed << " D(" << e / 8 << ", " << e % 8
          << ") from lane " << lane << " d[" << j << "]";
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
}

TEST(GpuSimMma, MmaM16n8k16Bf16) {
  for (uint32_t seed : {1u, 2u, 3u}) check_mma(true, seed);
}
TEST(GpuSimMma, MmaM16n8k16F16) {
  for (uint32_t seed : {1u, 2u, 3u}) check_mma(false, seed);
}

// Attention's loads: A (16 x 16, as Q or P) and V (16 keys x 16 columns) row-major in shared
// memory with padded rows; ldmatrix_x4 gives A's fragment, ldmatrix_x4_trans the B fragments
// of V's two 8-column tiles, and out = A V + C (16 x 16, row-major). ldmatrix_x2_trans must
// give the first tile's B fragment again (x2[lane * 2 ..]).
__global__ void load_and_multiply(const uint16_t* a, const uint16_t* v, const float* c,
                                  float* out, uint32_t* x2, int bf16) {
  constexpr int lda = 24, ldv = 40;  // 48- and 80-byte rows: 16-byte aligned, not contiguous
  PA_DYNAMIC_SHARED(16, smem);
  uint16_t* sa = reinterpret_cast<uint16_t*>(smem);
  uint16_t* sv = sa + 16 * lda;
  const int lane = static_cast<int>(threadIdx.x);
  for (int i = lane; i < 256; i += 32) {
    sa[(i / 16) * lda + i % 16] = a[i];
    sv[(i / 16) * ldv + i % 16] = v[i];
  }
  __syncthreads();
  uint32_t fa[4], fb[4], fb0[2];
  ldmatrix_x4(fa, sa + (lane % 16) * lda + (lane / 16) * 8);
  ldmatrix_x4_trans(fb, sv + (lane % 16) * ldv + (lane / 16) * 8);
  ldmatrix_x2_trans(fb0, sv + (lane % 16) * ldv);
  x2[lane * 2] = fb0[0];
  x2[lane * 2 + 1] = fb0[1];
  const int g = lane / 4, t = lane % 4;
  for (int nt = 0; nt < 2; ++nt) {
    float acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = c[(g + (j & 2) * 4) * 16 + nt * 8 + 2 * t + (j & 1)];
    if (bf16) {
      mma_m16n8k16_bf16(acc, fa, fb + 2 * nt, acc);
    } else {
      mma_m16n8k16_f16(acc, fa, fb + 2 * nt, acc);
    }
    for (int j = 0; j < 4; ++j) out[(g + (j & 2) * 4) * 16 + nt * 8 + 2 * t + (j & 1)] = acc[j];
  }
}

void check_load_and_multiply(bool bf16) {
  const Inputs in{bf16};
  std::mt19937 rng(bf16 ? 11 : 12);
  const std::vector<uint16_t> A = random_tile(in, 256, rng), V = random_tile(in, 256, rng);
  const std::vector<float> C = random_floats(256, rng);
  uint16_t* da = device_copy(A);
  uint16_t* dv = device_copy(V);
  float* dc = device_copy(C);
  float* dout = device_copy(std::vector<float>(256, 0.f));
  uint32_t* dx2 = device_copy(std::vector<uint32_t>(64, 0));
  const size_t smem = (16 * 24 + 16 * 40) * sizeof(uint16_t);
  ASSERT_EQ(launch(load_and_multiply, 32, smem, 32, da, dv, dc, dout, dx2, bf16 ? 1 : 0),
            cudaSuccess);
  const std::vector<float> out = host_copy(dout, 256);
  const std::vector<uint32_t> x2 = host_copy(dx2, 64);

  const Reference ref = reference(in, A, V, C, 16, 16, 16);
  for (int e = 0; e < 256; ++e) {
    EXPECT_NEAR(out[e], ref.d[e], ref.bound[e])
        << (bf16 ? "bf16" : "f16") << " O(" << e / 16 << ", " << e % 16 << ")";
  }
  // The first tile's B fragment, b[j] = V(2t + 8j, g) | V(2t + 8j + 1, g) << 16.
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 2; ++j) {
      const int k = 2 * t + 8 * j;
      EXPECT_EQ(x2[lane * 2 + j], pack(V[k * 16 + g], V[(k + 1) * 16 + g])) << "lane " << lane;
    }
  }
  cudaFree(da);
  cudaFree(dv);
  cudaFree(dc);
  cudaFree(dout);
  cudaFree(dx2);
}

TEST(GpuSimMma, LdmatrixFeedsMmaBf16) { check_load_and_multiply(true); }
TEST(GpuSimMma, LdmatrixFeedsMmaF16) { check_load_and_multiply(false); }

// Lane 3 leaves before the warp's ldmatrix.
__global__ void lane_exits(int) {
  PA_DYNAMIC_SHARED(16, smem);
  if (threadIdx.x == 3) return;
  uint32_t r[4];
  ldmatrix_x4(r, smem + (threadIdx.x % 8) * 16);
}

// The two half-warps reach mma.sync at different lines.
__global__ void split_mma(int) {
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float acc[4] = {0, 0, 0, 0};
  if (threadIdx.x < 16) {
    mma_m16n8k16_bf16(acc, a, b, acc);
  } else {
    mma_m16n8k16_bf16(acc, a, b, acc);
  }
}

__global__ void misaligned_row(int) {
  PA_DYNAMIC_SHARED(16, smem);
  uint32_t r[2];
  ldmatrix_x2(r, smem + 8);
}

__global__ void mma_on_wave64(int) {
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float acc[4] = {0, 0, 0, 0};
  mma_m16n8k16_f16(acc, a, b, acc);
}

TEST(GpuSimMmaDeathTest, DivergenceAborts) {
  EXPECT_DEATH(launch(lane_exits, 32, 256, 32, 0),
               "thread 3 exited while its warp waits at .*test_mma.cpp:[0-9]+");
  EXPECT_DEATH(launch(split_mma, 32, 0, 32, 0),
               "warp divergence: thread [0-9]+ waits at .*test_mma.cpp:[0-9]+, thread [0-9]+ at "
               ".*test_mma.cpp:[0-9]+");
}

TEST(GpuSimMmaDeathTest, MisuseAborts) {
  EXPECT_DEATH(launch(misaligned_row, 32, 256, 32, 0),
               "ldmatrix row address not 16-byte aligned at .*test_mma.cpp:[0-9]+");
  EXPECT_DEATH(launch(mma_on_wave64, 64, 0, 64, 0),
               "mma.sync needs a 32-lane warp .* at .*test_mma.cpp:[0-9]+");
}

}  // namespace
