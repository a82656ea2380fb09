// The register-fragment tensor-core instructions of kernels/gpu/mma.cuh on the emulator, lane by
// lane: ldmatrix (x4, x2, .trans) against its documented layout, mma.sync m16n8k16 (bf16, f16)
// against a float64 product, the two composed as an attention kernel loads Q/P and V, and the
// divergences that abort. Each test launches one warp. The expected layouts are written here
// from the PTX ISA independently of sim/mma.h: register by register, or as the inverse map
// (which lane holds an element). Then the same instructions against CUTLASS's CuTe layouts
// for them, restated as tables and evaluated entry by entry.
#include "mma.cuh"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <algorithm>
#include <random>
#include <string>
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

// ---------------------------------------------------------------------------------------------
// The same instructions against CUTLASS's CuTe, whose layouts for them are used on hardware.
// A CuTe layout is a function: each mode a shape and a stride, a nested mode read
// colexicographically (its first sub-shape varies fastest), the result the sum of each
// coordinate times its stride. The atoms below map (thread, value) to an index; the tables
// restate their shapes and strides, and the tests evaluate them for every lane and value.

// One mode, flattened to at most three sub-modes, the first the fastest.
struct Mode {
  int n;
  int shape[3], stride[3];
  int size() const {
    int s = 1;
    for (int j = 0; j < n; ++j) s *= shape[j];
    return s;
  }
  int operator()(int i) const {
    int index = 0;
    for (int j = 0; j < n; ++j) {
      index += (i % shape[j]) * stride[j];
      i /= shape[j];
    }
    return index;
  }
};
// (thread, value) -> index: the thread mode's term plus the value mode's.
struct TvLayout {
  Mode thr, val;
  int operator()(int t, int v) const { return thr(t) + val(v); }
};

// CUTLASS include/cute/atom/mma_traits_sm80.hpp, MMA_Traits<SM80_16x8x16_F16F16F16F16_TN>,
// whose layouts SM80_16x8x16_F32F16F16F32_TN and SM80_16x8x16_F32BF16BF16F32_TN inherit.
// ThrID is the identity on 32 threads (thread = lane). Each layout gives the column-major
// index of a tile coordinate (CuTe's MMA convention):
//   A: (lane, v) -> m + 16 k in the 16 x 16 M x K tile   thr (4,8):(32,1)  val (2,2,2):(16,8,128)
//   B: (lane, v) -> n + 8 k in the 8 x 16 N x K tile     thr (4,8):(16,1)  val (2,2):(8,64)
//   C: (lane, v) -> m + 16 n in the 16 x 8 M x N tile    thr (4,8):(32,1)  val (2,2):(16,8)
// (C is the file's SM80_16x8_Row; D is laid out as C.) With t = lane % 4, g = lane / 4 and
// v = v0 + 2 v1 (+ 4 v2), that is:
//   A: m = g + 8 v1, k = 2 t + v0 + 8 v2;  B: n = g, k = 2 t + v0 + 8 v1;  C: m = g + 8 v1,
//   n = 2 t + v0.
// Value v is element v of the fragment as an array of its element type: for A and B (16-bit)
// register v / 2, the low half for even v; for C and D (float) register v.
const TvLayout kCuteA = {{2, {4, 8}, {32, 1}}, {3, {2, 2, 2}, {16, 8, 128}}};
const TvLayout kCuteB = {{2, {4, 8}, {16, 1}}, {2, {2, 2}, {8, 64}}};
const TvLayout kCuteC = {{2, {4, 8}, {32, 1}}, {2, {2, 2}, {16, 8}}};

// Tile coordinate (first, second) of (lane, v) under a column-major layout with `rows` rows.
struct Coord {
  int r, c;
};
Coord coord(const TvLayout& l, int rows, int lane, int v) {
  const int i = l(lane, v);
  return {i % rows, i / rows};
}

// Comparisons made and disagreements found, with the first disagreement described.
struct Tally {
  int compared = 0, wrong = 0;
  std::string first;
  // Counts one comparison; true when it is the first disagreement (the caller describes it).
  bool add(bool ok) {
    ++compared;
    return !ok && wrong++ == 0;
  }
  void merge(const Tally& o) {
    if (wrong == 0 && o.wrong) first = o.first;
    compared += o.compared;
    wrong += o.wrong;
  }
};
std::string describe(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string describe(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// Whether a layout reaches every index below lanes x values exactly once.
bool one_to_one(const TvLayout& l, int values) {
  std::vector<int> hits(32 * values, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int v = 0; v < values; ++v) {
      const int i = l(lane, v);
      if (i < 0 || i >= 32 * values || hits[i]++) return false;
    }
  return true;
}

// sim/mma.h's fragment maps (frag::a_row ...), which its mma.sync rebuilds the tiles with,
// against the given layouts: one comparison per (lane, element), row and column both.
Tally fragment_maps_against(const TvLayout& la, const TvLayout& lb, const TvLayout& lc) {
  namespace frag = pa_sim::frag;
  Tally t;
  for (int lane = 0; lane < 32; ++lane) {
    for (int v = 0; v < 8; ++v) {
      const Coord mk = coord(la, 16, lane, v);
      if (t.add(frag::a_row(lane, v) == mk.r && frag::a_col(lane, v) == mk.c))
        t.first = describe("lane %d a%d: CuTe A(%d, %d), sim A(%d, %d)", lane, v, mk.r, mk.c,
                           frag::a_row(lane, v), frag::a_col(lane, v));
    }
    for (int v = 0; v < 4; ++v) {
      const Coord nk = coord(lb, 8, lane, v);  // B's (k, n) is CuTe's (n, k)
      if (t.add(frag::b_row(lane, v) == nk.c && frag::b_col(lane, v) == nk.r))
        t.first = describe("lane %d b%d: CuTe B(k %d, n %d), sim B(k %d, n %d)", lane, v, nk.c,
                           nk.r, frag::b_row(lane, v), frag::b_col(lane, v));
    }
    for (int v = 0; v < 4; ++v) {
      const Coord mn = coord(lc, 16, lane, v);
      if (t.add(frag::c_row(lane, v) == mn.r && frag::c_col(lane, v) == mn.c))
        t.first = describe("lane %d c%d: CuTe C(%d, %d), sim C(%d, %d)", lane, v, mn.r, mn.c,
                           frag::c_row(lane, v), frag::c_col(lane, v));
    }
  }
  return t;
}

// Row-major tiles: A 16 x 16 (m, k), B 16 x 8 (k, n), C 16 x 8 (m, n).
struct Tiles {
  std::vector<uint16_t> a, b;
  std::vector<float> c;
};

// Packs the tiles into fragments by the given layouts, runs the emulator's mma.sync and
// compares each lane's D values with the float64 product at the coordinates lc gives them:
// equal when exact, else within the float32 bound. One comparison per (lane, D element).
Tally mma_against(bool bf16, const Tiles& x, const TvLayout& la, const TvLayout& lb,
                  const TvLayout& lc, bool exact) {
  const Inputs in{bf16};
  std::vector<uint32_t> fa(32 * 4, 0), fb(32 * 2, 0);
  std::vector<float> fc(32 * 4);
  for (int lane = 0; lane < 32; ++lane) {
    for (int v = 0; v < 8; ++v) {
      const Coord mk = coord(la, 16, lane, v);
      fa[lane * 4 + v / 2] |= static_cast<uint32_t>(x.a[mk.r * 16 + mk.c]) << (16 * (v % 2));
    }
    for (int v = 0; v < 4; ++v) {
      const Coord nk = coord(lb, 8, lane, v);
      fb[lane * 2 + v / 2] |= static_cast<uint32_t>(x.b[nk.c * 8 + nk.r]) << (16 * (v % 2));
    }
    for (int v = 0; v < 4; ++v) {
      const Coord mn = coord(lc, 16, lane, v);
      fc[lane * 4 + v] = x.c[mn.r * 8 + mn.c];
    }
  }
  uint32_t* da = device_copy(fa);
  uint32_t* db = device_copy(fb);
  float* dc = device_copy(fc);
  float* dd = device_copy(std::vector<float>(128, 0.f));
  EXPECT_EQ(launch(mma_fragments, 32, 0, 32, da, db, dc, dd, bf16 ? 1 : 0), cudaSuccess);
  const std::vector<float> fd = host_copy(dd, 128);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);

  const Reference ref = reference(in, x.a, x.b, x.c, 16, 8, 16);
  Tally t;
  for (int lane = 0; lane < 32; ++lane)
    for (int v = 0; v < 4; ++v) {
      const Coord mn = coord(lc, 16, lane, v);
      const int e = mn.r * 8 + mn.c;
      const double got = fd[lane * 4 + v];
      if (t.add(exact ? got == ref.d[e] : fabs(got - ref.d[e]) <= ref.bound[e]))
        t.first = describe("%s lane %d d%d = %.9g, CuTe puts D(%d, %d) = %.9g there",
                           bf16 ? "bf16" : "f16", lane, v, got, mn.r, mn.c, ref.d[e]);
    }
  return t;
}

// Index-coded probes, exact in both input types and in float32. C(m, n) = 512 (8 m + n + 1).
// probe_a(j): A(m, k) = 16 m + k + 1, B(k, n) = 1 where k = 8 j + n: D(m, n) = A(m, 8 j + n) + C,
// so the two probes show each of A's 256 elements in exactly one D element.
// probe_b: A the identity, B(k, n) = 8 k + n + 1: D(m, n) = B(m, n) + C, each of B's 128.
Tiles coded_c(Tiles x) {
  x.c.resize(16 * 8);
  for (int i = 0; i < 16 * 8; ++i) x.c[i] = 512.f * static_cast<float>(i + 1);
  return x;
}
Tiles probe_a(const Inputs& in, int j) {
  Tiles x{std::vector<uint16_t>(256), std::vector<uint16_t>(128), {}};
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) x.a[m * 16 + k] = in.bits(static_cast<float>(16 * m + k + 1));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) x.b[k * 8 + n] = in.bits(k == 8 * j + n ? 1.f : 0.f);
  return coded_c(x);
}
Tiles probe_b(const Inputs& in) {
  Tiles x{std::vector<uint16_t>(256), std::vector<uint16_t>(128), {}};
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) x.a[m * 16 + k] = in.bits(m == k ? 1.f : 0.f);
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 8; ++n) x.b[k * 8 + n] = in.bits(static_cast<float>(8 * k + n + 1));
  return coded_c(x);
}
Tiles random_tiles(const Inputs& in, uint32_t seed) {
  std::mt19937 rng(seed);
  Tiles x;
  x.a = random_tile(in, 256, rng);
  x.b = random_tile(in, 128, rng);
  x.c = random_floats(128, rng);
  return x;
}

// The two probes of A, the probe of B and one random product: 4 x 128 D elements.
Tally mma_against_cute(bool bf16) {
  const Inputs in{bf16};
  Tally t;
  t.merge(mma_against(bf16, probe_a(in, 0), kCuteA, kCuteB, kCuteC, true));
  t.merge(mma_against(bf16, probe_a(in, 1), kCuteA, kCuteB, kCuteC, true));
  t.merge(mma_against(bf16, probe_b(in), kCuteA, kCuteB, kCuteC, true));
  t.merge(mma_against(bf16, random_tiles(in, bf16 ? 21 : 22), kCuteA, kCuteB, kCuteC, false));
  return t;
}

// CUTLASS include/cute/atom/copy_traits_sm75.hpp: Copy_Traits of SM75_U32x{1,2,4}_LDSM_N
// (ldmatrix .x1/.x2/.x4) and SM75_U16x{2,4,8}_LDSM_T (the same with .trans). ThrID is the
// identity on 32 lanes. Both layouts map (lane, value) to a bit of one reference: the 8 x count
// rows the instruction reads, stacked matrix by matrix (matrix m: rows 8 m .. 8 m + 7), 128
// bits a row, bit b in row b / 128, element (b % 128) / 16, bit b % 16 of that element.
//   SrcLayout: value v of a lane is bit v of the 16 bytes at the address the lane gives
//   (stride 0 over lanes 8 count and up: their rows repeat those of lane % (8 count)).
//   DstLayout: value v of a lane is bit v % 32 of its destination register v / 32.
struct LdsmAtom {
  const char* name;
  int count;
  bool trans;
  TvLayout src, dst;
};
const LdsmAtom kCuteLdsm[] = {
    {"SM75_U32x1_LDSM_N", 1, false,
     {{2, {8, 4}, {128, 0}}, {1, {128}, {1}}}, {{1, {32}, {32}}, {1, {32}, {1}}}},
    {"SM75_U32x2_LDSM_N", 2, false,
     {{2, {16, 2}, {128, 0}}, {1, {128}, {1}}}, {{1, {32}, {32}}, {2, {32, 2}, {1, 1024}}}},
    {"SM75_U32x4_LDSM_N", 4, false,
     {{1, {32}, {128}}, {1, {128}, {1}}}, {{1, {32}, {32}}, {2, {32, 4}, {1, 1024}}}},
    {"SM75_U16x2_LDSM_T", 1, true,
     {{2, {8, 4}, {128, 0}}, {1, {128}, {1}}}, {{2, {4, 8}, {256, 16}}, {2, {16, 2}, {1, 128}}}},
    {"SM75_U16x4_LDSM_T", 2, true,
     {{2, {16, 2}, {128, 0}}, {1, {128}, {1}}},
     {{2, {4, 8}, {256, 16}}, {3, {16, 2, 2}, {1, 128, 1024}}}},
    {"SM75_U16x8_LDSM_T", 4, true,
     {{1, {32}, {128}}, {1, {128}, {1}}},
     {{2, {4, 8}, {256, 16}}, {3, {16, 2, 4}, {1, 128, 1024}}}},
};

// Lane l loads ldmatrix .x{count} (.trans) from the row at element offset rows[l] of shared
// memory filled with `fill`, and writes its four registers (zero beyond count) to out[4 l ..].
// mma.cuh has no .x1 wrapper: .x1 calls the emulator's instruction directly.
__global__ void ldmatrix_count(const uint16_t* fill, int n, const int* rows, int count, int trans,
                               uint32_t* out) {
  PA_DYNAMIC_SHARED(16, smem);
  uint16_t* s = reinterpret_cast<uint16_t*>(smem);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += 32) s[i] = fill[i];
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x);
  const void* p = s + rows[lane];
  uint32_t r[4] = {0, 0, 0, 0};
  if (count == 1) {
    ::pa_sim::ldmatrix_m8n8(r, 1, trans != 0, p, __FILE__, __LINE__, __func__);
  } else if (count == 2) {
    if (trans) {
      ldmatrix_x2_trans(r, p);
    } else {
      ldmatrix_x2(r, p);
    }
  } else {
    if (trans) {
      ldmatrix_x4_trans(r, p);
    } else {
      ldmatrix_x4(r, p);
    }
  }
  for (int m = 0; m < 4; ++m) out[lane * 4 + m] = r[m];
}

// Places the reference rows at shuffled rows of shared memory, gives each lane the address of
// the row its SrcLayout's value 0 lies in, and compares every 16-bit half of every destination
// register with the element DstLayout names, found through SrcLayout: one comparison per
// (lane, half), 64 x count in all.
Tally ldmatrix_against(const LdsmAtom& at, uint32_t seed) {
  const int slots = 64, n = slots * 8, elements = 64 * at.count;
  std::vector<uint16_t> fill(n);
  for (int i = 0; i < n; ++i) fill[i] = static_cast<uint16_t>(i * 40503u + 12345u);  // distinct
  std::vector<int> slot(slots);
  for (int i = 0; i < slots; ++i) slot[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(slot.begin(), slot.end(), rng);
  std::vector<int> rows(32);
  for (int lane = 0; lane < 32; ++lane) rows[lane] = slot[at.src(lane, 0) / 128] * 8;

  // Reference element -> shared-memory element, from every lane's SrcLayout values: bits
  // 16 h .. 16 h + 15 of a lane's row are its row's element h.
  Tally t;
  std::vector<int> where(elements, -1);
  for (int lane = 0; lane < 32; ++lane)
    for (int h = 0; h < 8; ++h) {
      const int b = at.src(lane, 16 * h), e = b / 16, mem = rows[lane] + h;
      if (b % 16 != 0 || e < 0 || e >= elements || (where[e] >= 0 && where[e] != mem)) {
        if (t.add(false))
          t.first = describe("%s: SrcLayout lane %d value %d", at.name, lane, 16 * h);
        continue;
      }
      where[e] = mem;
    }

  uint16_t* dfill = device_copy(fill);
  int* drows = device_copy(rows);
  uint32_t* dout = device_copy(std::vector<uint32_t>(128, 0));
  EXPECT_EQ(launch(ldmatrix_count, 32, n * sizeof(uint16_t), 32, dfill, n, drows, at.count,
                   at.trans ? 1 : 0, dout),
            cudaSuccess);
  const std::vector<uint32_t> out = host_copy(dout, 128);
  cudaFree(dfill);
  cudaFree(drows);
  cudaFree(dout);

  for (int lane = 0; lane < 32; ++lane) {
    for (int h = 0; h < 2 * at.count; ++h) {
      const int b = at.dst(lane, 16 * h), e = b / 16;
      const uint16_t got = half_at(out[lane * 4 + h / 2], h % 2);
      const bool known = b % 16 == 0 && e >= 0 && e < elements && where[e] >= 0;
      if (t.add(known && got == fill[where[e]]))
        t.first = describe("%s lane %d register %d %s half: %#06x, CuTe names row %d element %d "
                           "(%#06x)", at.name, lane, h / 2, h % 2 ? "high" : "low", got,
                           b / 128, (b % 128) / 16, known ? fill[where[e]] : 0);
    }
    for (int m = at.count; m < 4; ++m) EXPECT_EQ(out[lane * 4 + m], 0u) << at.name;
  }
  return t;
}

// The tables describe functions of the right sizes, one-to-one where CuTe's are (every
// fragment element and every destination bit once; each source row once over 8 x count
// lanes), with each 16-bit element's bits contiguous: a mistyped stride shows here.
TEST(GpuSimMmaCute, TablesAreWellFormed) {
  const struct {
    const TvLayout* l;
    int values;
  } mma[] = {{&kCuteA, 8}, {&kCuteB, 4}, {&kCuteC, 4}};
  for (const auto& o : mma) {
    EXPECT_EQ(o.l->thr.size(), 32);
    EXPECT_EQ(o.l->val.size(), o.values);
    EXPECT_TRUE(one_to_one(*o.l, o.values));
  }
  for (const LdsmAtom& at : kCuteLdsm) {
    EXPECT_EQ(at.src.thr.size(), 32) << at.name;
    EXPECT_EQ(at.src.val.size(), 128) << at.name;
    EXPECT_EQ(at.dst.thr.size(), 32) << at.name;
    EXPECT_EQ(at.dst.val.size(), 32 * at.count) << at.name;
    EXPECT_TRUE(one_to_one(at.dst, 32 * at.count)) << at.name;
    std::vector<int> row_of(8 * at.count, -1);
    for (int lane = 0; lane < 32; ++lane) {
      const int b0 = at.src(lane, 0);
      EXPECT_EQ(b0 % 128, 0) << at.name << " lane " << lane;
      for (int v = 0; v < 128; ++v) EXPECT_EQ(at.src(lane, v), b0 + v) << at.name;
      const int row = b0 / 128, supplier = lane % (8 * at.count);
      ASSERT_LT(row, 8 * at.count) << at.name;
      if (lane == supplier) {
        EXPECT_EQ(row_of[row], -1) << at.name << " row " << row << " twice";
        row_of[row] = lane;
      } else {
        EXPECT_EQ(at.src(lane, 0), at.src(supplier, 0)) << at.name << " lane " << lane;
      }
      for (int h = 0; h < 2 * at.count; ++h) {
        EXPECT_EQ(at.dst(lane, 16 * h) % 16, 0) << at.name;
        for (int j = 1; j < 16; ++j)
          EXPECT_EQ(at.dst(lane, 16 * h + j), at.dst(lane, 16 * h) + j) << at.name;
      }
    }
  }
}

// sim/mma.h's fragment maps equal CuTe's layouts entry by entry: 256 + 128 + 128.
TEST(GpuSimMmaCute, FragmentMapsMatchCute) {
  const Tally t = fragment_maps_against(kCuteA, kCuteB, kCuteC);
  EXPECT_EQ(t.wrong, 0) << t.first;
  EXPECT_EQ(t.compared, 512);
  printf("CuTe SM80_16x8x16 A/B/C layouts vs frag maps: %d entries, %d differ\n", t.compared,
         t.wrong);
}

// mma.sync on fragments packed by CuTe's layouts gives D where CuTe's CLayout says: 512 D
// elements a type (256 show one A element each, 128 one B element each, 128 a random product).
TEST(GpuSimMmaCute, MmaBf16MatchesCute) {
  const Tally t = mma_against_cute(true);
  EXPECT_EQ(t.wrong, 0) << t.first;
  EXPECT_EQ(t.compared, 512);
  printf("CuTe SM80_16x8x16_F32BF16BF16F32_TN vs mma.sync: %d entries, %d differ\n", t.compared,
         t.wrong);
}
TEST(GpuSimMmaCute, MmaF16MatchesCute) {
  const Tally t = mma_against_cute(false);
  EXPECT_EQ(t.wrong, 0) << t.first;
  EXPECT_EQ(t.compared, 512);
  printf("CuTe SM80_16x8x16_F32F16F16F32_TN vs mma.sync: %d entries, %d differ\n", t.compared,
         t.wrong);
}

// Every ldmatrix form against its CuTe atom: 64 + 128 + 256 halves each way, 896 in all.
TEST(GpuSimMmaCute, LdmatrixMatchesCute) {
  Tally all;
  uint32_t seed = 31;
  for (const LdsmAtom& at : kCuteLdsm) {
    const Tally t = ldmatrix_against(at, seed++);
    EXPECT_EQ(t.wrong, 0) << t.first;
    EXPECT_EQ(t.compared, 64 * at.count) << at.name;
    printf("CuTe %s vs ldmatrix .x%d%s: %d entries, %d differ\n", at.name, at.count,
           at.trans ? ".trans" : "", t.compared, t.wrong);
    all.merge(t);
  }
  EXPECT_EQ(all.compared, 896);
}

// The comparisons fail on a wrong layout: copies of CuTe's with one mistake each.
TEST(GpuSimMmaCute, ComparisonsCatchWrongLayouts) {
  TvLayout a_rows_cols = kCuteA;  // registers a[1] and a[2] exchanged: m + 8 for k + 8
  a_rows_cols.val.stride[1] = 128;
  a_rows_cols.val.stride[2] = 8;
  TvLayout b_halves = kCuteB;  // b0's high half and b1's low half exchanged
  b_halves.val.stride[0] = 64;
  b_halves.val.stride[1] = 8;
  TvLayout c_pairs = kCuteC;  // c1 and c2 exchanged: (g + 8, 2 t) for (g, 2 t + 1)
  c_pairs.val.stride[0] = 8;
  c_pairs.val.stride[1] = 16;
  const Inputs in{true};
  const int caught[] = {
      fragment_maps_against(a_rows_cols, kCuteB, kCuteC).wrong,
      fragment_maps_against(kCuteA, b_halves, kCuteC).wrong,
      fragment_maps_against(kCuteA, kCuteB, c_pairs).wrong,
      mma_against(true, probe_a(in, 0), a_rows_cols, kCuteB, kCuteC, true).wrong,
      mma_against(true, probe_b(in), kCuteA, b_halves, kCuteC, true).wrong,
      mma_against(true, probe_a(in, 0), kCuteA, kCuteB, c_pairs, true).wrong,
  };
  for (int w : caught) EXPECT_GT(w, 0);

  // A and B permuted alike in k (k bits 0 and 3 exchanged): D cannot show it, as
  // kernels/gpu/sim/README.md says; the fragment maps do.
  TvLayout a_k = kCuteA, b_k = kCuteB;
  a_k.val.stride[0] = 128;
  a_k.val.stride[2] = 16;
  b_k.val.stride[0] = 64;
  b_k.val.stride[1] = 8;
  const int k_by_d = mma_against(true, random_tiles(in, 5), a_k, b_k, kCuteC, false).wrong;
  const int k_by_maps = fragment_maps_against(a_k, b_k, kCuteC).wrong;
  EXPECT_EQ(k_by_d, 0);
  EXPECT_GT(k_by_maps, 0);

  LdsmAtom no_transpose = kCuteLdsm[5];  // .x4.trans read as .x4
  no_transpose.dst = kCuteLdsm[2].dst;
  LdsmAtom registers = kCuteLdsm[2];  // .x4 registers 1 and 2 exchanged
  registers.dst.val = {3, {32, 2, 2}, {1, 2048, 1024}};
  LdsmAtom suppliers = kCuteLdsm[2];  // lanes 8..15 and 16..23 exchanged as row suppliers
  suppliers.src.thr = {3, {8, 2, 2}, {128, 2048, 1024}};
  const int ldsm_caught[] = {ldmatrix_against(no_transpose, 41).wrong,
                             ldmatrix_against(registers, 42).wrong,
                             ldmatrix_against(suppliers, 43).wrong};
  for (int w : ldsm_caught) EXPECT_GT(w, 0);
  printf("wrong layouts caught (entries differing): maps A %d B %d C %d; mma.sync A %d B %d "
         "C %d; ldmatrix no .trans %d, registers %d, suppliers %d; A and B alike in k: D %d, "
         "maps %d\n",
         caught[0], caught[1], caught[2], caught[3], caught[4], caught[5], ldsm_caught[0],
         ldsm_caught[1], ldsm_caught[2], k_by_d, k_by_maps);
}

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
