// mfma.h — AMD's matrix-core instruction, lane by lane: v_mfma_f32_16x16x16f16 and
// v_mfma_f32_16x16x16bf16_1k (CDNA2 gfx90a, CDNA3 gfx942; f16/bf16 inputs, f32 accumulators).
// One wave gather (block.cpp: all 64 lanes, one site), after which every lane rebuilds the tiles
// from the lanes' registers by the layouts of AMD's CDNA ISA guides ("Matrix fused multiply
// add", the 16x16x16 dense layouts) and keeps its own four accumulators. Wave size 64 only.
// kernels/gpu/mfma.cuh calls this under PA_SIM; tests/gpusim/test_mfma.cpp checks the layouts.
#ifndef PAGEDATTN_GPUSIM_MFMA_H
#define PAGEDATTN_GPUSIM_MFMA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "halfs.h"

namespace pa_sim {
namespace mfma_frag {

// The 16x16x16 layouts on a wave of 64: lane l, element (register half) i = 0..3 of its
// four 16-bit inputs (two 32-bit registers, element 2j in the low half of register j).
// A, 16x16 (M x K): row l % 16, column 4 * (l / 16) + i.
inline int a_row(int lane, int /*i*/) { return lane & 15; }
inline int a_col(int lane, int i) { return 4 * (lane >> 4) + i; }
// B, 16x16 (K x N): row (k) 4 * (l / 16) + i, column (n) l % 16.
inline int b_row(int lane, int i) { return 4 * (lane >> 4) + i; }
inline int b_col(int lane, int /*i*/) { return lane & 15; }
// C and D, 16x16 float, four registers: row 4 * (l / 16) + i, column l % 16.
inline int c_row(int lane, int i) { return 4 * (lane >> 4) + i; }
inline int c_col(int lane, int /*i*/) { return lane & 15; }

inline uint16_t half_of(const uint32_t* regs, int i) {
  return static_cast<uint16_t>(regs[i >> 1] >> ((i & 1) * 16));
}

}  // namespace mfma_frag

// D = A * B + C over 16x16x16, each lane naming its two registers of A, two of B and four of C.
// As in mma.h, the products are exact in float32 and each fmaf in k order from C rounds only the
// sum; the hardware's accumulation order is not modeled.
inline void mfma_16x16x16(bool bf16, float d[4], const uint32_t a[2], const uint32_t b[2],
                          const float c[4], const char* file, int line, const char* fn) {
  if (warp_size() != 64) {
    kernel_abort("v_mfma needs a 64-lane wave (CDNA; warp size 32 here)", file, line, fn);
  }
  if (profiling()) note_op(Op::kMfma);
  struct Regs {
    uint32_t a[2], b[2];
    float c[4];
  };
  Regs mine;
  memcpy(mine.a, a, sizeof mine.a);
  memcpy(mine.b, b, sizeof mine.b);
  memcpy(mine.c, c, sizeof mine.c);
  Regs all[64];
  warp_gather(&mine, sizeof mine, all, sizeof(Regs), 0xffffffffu, file, line, fn);
  uint16_t ta[16][16], tb[16][16];
  float tc[16][16];
  for (int l = 0; l < 64; ++l) {
    for (int i = 0; i < 4; ++i) {
      ta[mfma_frag::a_row(l, i)][mfma_frag::a_col(l, i)] = mfma_frag::half_of(all[l].a, i);
      tb[mfma_frag::b_row(l, i)][mfma_frag::b_col(l, i)] = mfma_frag::half_of(all[l].b, i);
      tc[mfma_frag::c_row(l, i)][mfma_frag::c_col(l, i)] = all[l].c[i];
    }
  }
  auto value = [bf16](uint16_t h) { return bf16 ? pa_cpu::bf16_to_f32(h) : pa_cpu::f16_to_f32(h); };
  const int lane = lane_id();
  for (int i = 0; i < 4; ++i) {
    const int r = mfma_frag::c_row(lane, i), n = mfma_frag::c_col(lane, i);
    float s = tc[r][n];
    for (int k = 0; k < 16; ++k) s = fmaf(value(ta[r][k]), value(tb[k][n]), s);
    d[i] = s;
  }
}

}  // namespace pa_sim

#endif  // PAGEDATTN_GPUSIM_MFMA_H
