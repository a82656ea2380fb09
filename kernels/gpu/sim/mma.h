// mma.h — the register-fragment tensor-core instructions, lane by lane: mma.sync m16n8k16
// (f16/bf16 inputs, f32 accumulators) and ldmatrix m8n8 .b16 (x1, x2, x4, optional .trans).
// Each is one warp gather (block.cpp: all lanes, one site, full mask), after which every lane
// rebuilds what it needs from the lanes' registers or row addresses by the layouts of the PTX
// ISA ("Matrix Fragments for mma.m16n8k16 with floating point type", "ldmatrix") and keeps its
// own registers. Warp size 32 only: these instructions do not exist on a 64-lane wave.
// kernels/gpu/mma.cuh calls these under PA_SIM; tests/gpusim/test_mma.cpp checks the layouts.
#ifndef PAGEDATTN_GPUSIM_MMA_H
#define PAGEDATTN_GPUSIM_MMA_H

#include <stdint.h>
#include <string.h>

#include "halfs.h"

namespace pa_sim {
namespace frag {

// The documented m16n8k16 fragment layouts: element i of a lane's fragment lies at (row, col)
// of its tile, two 16-bit elements per 32-bit register, element 2j in the low half of
// register j. groupID = lane >> 2, threadID_in_group = lane % 4.
// A, 16x16 (M x K, .row): a0..a7; rows groupID (+8 for a2, a3, a6, a7), columns
// 2 * threadID_in_group + (i & 1) (+8 for a4..a7).
inline int a_row(int lane, int i) { return (lane >> 2) + ((i & 2) ? 8 : 0); }
inline int a_col(int lane, int i) { return (lane & 3) * 2 + (i & 1) + ((i & 4) ? 8 : 0); }
// B, 16x8 (K x N, .col): b0..b3; rows (k) 2 * threadID_in_group + (i & 1) (+8 for b2, b3),
// column (n) groupID.
inline int b_row(int lane, int i) { return (lane & 3) * 2 + (i & 1) + ((i & 2) ? 8 : 0); }
inline int b_col(int lane, int /*i*/) { return lane >> 2; }
// C and D, 16x8 float: c0..c3; rows groupID (+8 for c2, c3), columns
// 2 * threadID_in_group + (i & 1).
inline int c_row(int lane, int i) { return (lane >> 2) + ((i & 2) ? 8 : 0); }
inline int c_col(int lane, int i) { return (lane & 3) * 2 + (i & 1); }

// The 16-bit element i of a fragment of 32-bit registers.
inline uint16_t half_of(const uint32_t* regs, int i) {
  return static_cast<uint16_t>(regs[i >> 1] >> ((i & 1) * 16));
}

}  // namespace frag

// The instructions name the whole warp (.sync.aligned, no mask); a 64-lane wave has none.
inline void require_warp32(const char* what, const char* file, int line, const char* fn) {
  if (warp_size() != 32) kernel_abort(what, file, line, fn);
}

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: D = A * B + C. The lanes'
// fragments are gathered, the tiles rebuilt by the layouts above, and each lane computes its own
// four elements of D. Products of two f16 or two bf16 values are exact in float32 (11 + 11 and
// 8 + 8 significant bits; bf16 barring overflow and underflow), so each fmaf in k order from C
// rounds only the sum: the hardware's own accumulation order and rounding are not modeled.
inline void mma_m16n8k16(bool bf16, float d[4], const uint32_t a[4], const uint32_t b[2],
                         const float c[4], const char* file, int line, const char* fn) {
  require_warp32("mma.sync needs a 32-lane warp (warp size 64 here)", file, line, fn);
  if (profiling()) note_op(Op::kMma);
  struct Regs {
    uint32_t a[4], b[2];
    float c[4];
  };
  Regs mine;
  memcpy(mine.a, a, sizeof mine.a);
  memcpy(mine.b, b, sizeof mine.b);
  memcpy(mine.c, c, sizeof mine.c);
  Regs all[32];
  warp_gather(&mine, sizeof mine, all, sizeof(Regs), 0xffffffffu, file, line, fn);
  uint16_t ta[16][16], tb[16][8];
  float tc[16][8];
  for (int l = 0; l < 32; ++l) {
    for (int i = 0; i < 8; ++i)
      ta[frag::a_row(l, i)][frag::a_col(l, i)] = frag::half_of(all[l].a, i);
    for (int i = 0; i < 4; ++i)
      tb[frag::b_row(l, i)][frag::b_col(l, i)] = frag::half_of(all[l].b, i);
    for (int i = 0; i < 4; ++i) tc[frag::c_row(l, i)][frag::c_col(l, i)] = all[l].c[i];
  }
  auto value = [bf16](uint16_t h) { return bf16 ? pa_cpu::bf16_to_f32(h) : pa_cpu::f16_to_f32(h); };
  const int lane = lane_id();
  for (int i = 0; i < 4; ++i) {
    const int r = frag::c_row(lane, i), n = frag::c_col(lane, i);
    float s = tc[r][n];
    for (int k = 0; k < 16; ++k) s = fmaf(value(ta[r][k]), value(tb[k][n]), s);
    d[i] = s;
  }
}

// ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16: lanes 8m..8m+7 name rows 0..7 of
// matrix m (count 1, 2 or 4; the other lanes' addresses are ignored), each row 8 contiguous
// 16-bit elements at a 16-byte-aligned address in shared memory. Register m of lane l holds
// row l / 4, columns 2 * (l % 4) and 2 * (l % 4) + 1 of matrix m (the lower column in the low
// half); .trans gives the same of the transposed matrix. The rows are read at the gather, while
// every lane waits there.
inline void ldmatrix_m8n8(uint32_t* r, int count, bool trans, const void* row, const char* file,
                          int line, const char* fn) {
  require_warp32("ldmatrix needs a 32-lane warp (warp size 64 here)", file, line, fn);
  const int lane = lane_id();
  const bool supplies = lane < 8 * count;
  if (supplies) {
    const char* p = static_cast<const char*>(row);
    const char* smem = dynamic_smem();
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      kernel_abort("ldmatrix row address not 16-byte aligned", file, line, fn);
    }
    if (!smem || p < smem || p + 16 > smem + dynamic_smem_bytes()) {
      kernel_abort("ldmatrix row address outside the block's shared memory", file, line, fn);
    }
    if (profiling()) note_access(Access::kLdmatrix, 3, p, 16, file, line);
  }
  uint16_t rows[32][8];  // row j of matrix m is rows[8 * m + j]
  warp_gather(row, supplies ? 16 : 0, rows, sizeof rows[0], 0xffffffffu, file, line, fn);
  const int g = lane >> 2, t = lane & 3;
  for (int m = 0; m < count; ++m) {
    const uint16_t(*mat)[8] = rows + 8 * m;
    const uint16_t lo = trans ? mat[2 * t][g] : mat[g][2 * t];
    const uint16_t hi = trans ? mat[2 * t + 1][g] : mat[g][2 * t + 1];
    r[m] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
}

}  // namespace pa_sim

#endif  // PAGEDATTN_GPUSIM_MMA_H
