package pagedattn

import "math"

// Conversions between float32 and the bit patterns of bfloat16 and IEEE float16, the element
// encodings of BFloat16Tensor and Float16Tensor. Narrowing rounds to nearest, ties to even, as the
// library does: values past the largest finite one become infinities, small ones become
// subnormals or signed zeros, and a NaN stays a quiet NaN of the same sign (bfloat16 keeps the
// top of its payload, float16 gets the canonical 0x7E00). Widening is exact.

// BFloat16FromFloat32 returns the bit pattern of the bfloat16 nearest to f.
func BFloat16FromFloat32(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7FFFFFFF > 0x7F800000 {
		return uint16(u>>16) | 0x40 // NaN: the quiet bit set, the sign and top payload kept
	}
	// Adding just under half a unit, plus the kept low bit, rounds ties to even; a carry out of
	// the mantissa moves to the next binade, and past the largest finite value to infinity.
	u += 0x7FFF + (u>>16)&1
	return uint16(u >> 16)
}

// Float32FromBFloat16 returns the value of the bfloat16 bit pattern b.
func Float32FromBFloat16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// Float16FromFloat32 returns the bit pattern of the IEEE float16 nearest to f.
func Float16FromFloat32(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7FFFFFFF
	switch {
	case a > 0x7F800000: // NaN
		return sign | 0x7E00
	case a >= 0x477FF000: // 65520 and up round to infinity (65504 is the largest finite)
		return sign | 0x7C00
	case a < 0x38800000: // below 2^-14, the smallest normal: a subnormal in units of 2^-24
		e := a >> 23
		if e < 102 { // below 2^-25, half the smallest subnormal
			return sign
		}
		m := a&0x7FFFFF | 0x800000 // f = m * 2^(e-150) = (m >> (126-e)) units of 2^-24
		shift := 126 - e
		q, rest, half := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
		if rest > half || rest == half && q&1 == 1 {
			q++ // may reach 0x400, which encodes the smallest normal
		}
		return sign | uint16(q)
	}
	// Normal: drop 13 mantissa bits, rounding ties to even, and move the exponent bias from 127
	// to 15.
	r := a + 0xFFF + (a>>13)&1
	return sign | uint16(r>>13-112<<10)
}

// Float32FromFloat16 returns the value of the IEEE float16 bit pattern h.
func Float32FromFloat16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e, m := uint32(h>>10)&0x1F, uint32(h&0x3FF)
	switch e {
	case 0: // zero or subnormal: m * 2^-24, exact in float32
		return math.Float32frombits(math.Float32bits(float32(m)*0x1p-24) | sign)
	case 31: // infinity or NaN, payload kept
		return math.Float32frombits(sign | 0x7F800000 | m<<13)
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// ToBFloat16 returns the bfloat16 bit patterns of xs (see BFloat16FromFloat32), ready for
// BFloat16Tensor.
func ToBFloat16(xs []float32) []uint16 {
	out := make([]uint16, len(xs))
	for i, x := range xs {
		out[i] = BFloat16FromFloat32(x)
	}
	return out
}

// FromBFloat16 returns the values of the bfloat16 bit patterns bits.
func FromBFloat16(bits []uint16) []float32 {
	out := make([]float32, len(bits))
	for i, b := range bits {
		out[i] = Float32FromBFloat16(b)
	}
	return out
}

// ToFloat16 returns the float16 bit patterns of xs (see Float16FromFloat32), ready for
// Float16Tensor.
func ToFloat16(xs []float32) []uint16 {
	out := make([]uint16, len(xs))
	for i, x := range xs {
		out[i] = Float16FromFloat32(x)
	}
	return out
}

// FromFloat16 returns the values of the float16 bit patterns bits.
func FromFloat16(bits []uint16) []float32 {
	out := make([]float32, len(bits))
	for i, b := range bits {
		out[i] = Float32FromFloat16(b)
	}
	return out
}
