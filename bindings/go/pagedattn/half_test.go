package pagedattn

import (
	"math"
	"testing"
)

// halfFormat is one 16-bit format under test: its conversions and its encoding's constants.
type halfFormat struct {
	name   string
	dtype  DType
	narrow func(float32) uint16
	widen  func(uint16) float32
	inf    uint16  // bits of +infinity
	past   float64 // the value +infinity stands for when rounding: the largest finite + 1 ulp
	mant   uint    // mantissa bits
}

var halfFormats = []halfFormat{
	{"bfloat16", BFloat16, BFloat16FromFloat32, Float32FromBFloat16, 0x7F80, 0x1p128, 7},
	{"float16", Float16, Float16FromFloat32, Float32FromFloat16, 0x7C00, 65536, 10},
}

func isNaN32(f float32) bool { return f != f }

// nearest is the reference narrowing: the finite patterns are ordered by value, so it searches
// for the two neighbours of f and picks the closer in float64 (exact here), ties to the even
// pattern, with infinity standing for the value one ulp past the largest finite.
func (h halfFormat) nearest(f float32) uint16 {
	x := float64(f)
	sign := uint16(0)
	if math.Signbit(x) {
		sign, x = 0x8000, -x
	}
	value := func(b uint16) float64 {
		if b == h.inf {
			return h.past
		}
		return float64(h.widen(b))
	}
	if x >= h.past {
		return sign | h.inf
	}
	lo, hi := uint16(0), h.inf // value(lo) <= x < value(hi)
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if value(mid) <= x {
			lo = mid
		} else {
			hi = mid
		}
	}
	dlo, dhi := x-value(lo), value(hi)-x
	if dlo < dhi || dlo == dhi && lo&1 == 0 {
		return sign | lo
	}
	return sign | hi
}

// testFloats returns float32 values that probe rounding: every exponent with mantissas at and
// around each format's halfway points, plus pseudo-random bit patterns.
func testFloats() []float32 {
	var fs []float32
	for e := uint32(0); e < 255; e++ {
		for _, m := range []uint32{0, 1, 0x7FFFFF, 0x8000, 0x7FFF, 0x8001, 0x18000, 0x1000, 0xFFF,
			0x1001, 0x3000, 0x7FE000, 0x7FF000, 0x7FEFFF, 0x7FF001, 0x400000, 0x2AAAAA} {
			fs = append(fs, math.Float32frombits(e<<23|m), math.Float32frombits(0x80000000|e<<23|m))
		}
	}
	s := uint32(0x9E3779B9)
	for i := 0; i < 200000; i++ {
		s ^= s << 13
		s ^= s >> 17
		s ^= s << 5
		fs = append(fs, math.Float32frombits(s))
	}
	return append(fs, 65504, 65519.99, 65520, 65536, 0x1p-24, 0x1p-25, 0x1.8p-25, 0x1p-25+0x1p-40,
		0x1.fep127, 0x1.ff8p127, float32(math.Inf(1)), float32(math.Inf(-1)))
}

func TestHalfKnownValues(t *testing.T) {
	for _, c := range []struct {
		f      float32
		bf, hf uint16
	}{
		{0, 0x0000, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000, 0x8000},
		{1, 0x3F80, 0x3C00},
		{-2, 0xC000, 0xC000},
		{65504, 0x4780, 0x7BFF},
		{65519, 0x4780, 0x7BFF},
		{65520, 0x4780, 0x7C00},
		{0x1p-24, 0x3380, 0x0001},
		{0x1p-25, 0x3300, 0x0000},     // a tie: float16 rounds to the even 0
		{0x1.8p-24, 0x33C0, 0x0002},   // a tie between 1 and 2 units: even 2
		{0x1.004p0, 0x3F80, 0x3C01},   // below half a bfloat16 ulp, one float16 ulp
		{0x1.01p0, 0x3F80, 0x3C04},    // exactly half a bfloat16 ulp: even
		{0x1.03p0, 0x3F82, 0x3C0C},    // 1.5 ulps: rounds up to the even 2
		{0x1.ffep-15, 0x3880, 0x0400}, // rounds up into float16's smallest normal
		{0x1p-133, 0x0001, 0x0000},    // bfloat16's smallest subnormal
		{0x1.fep127, 0x7F7F, 0x7C00},  // bfloat16's largest finite
		{0x1.ffp127, 0x7F80, 0x7C00},  // halfway past it: infinity
		{float32(math.Inf(-1)), 0xFF80, 0xFC00},
	} {
		if got := BFloat16FromFloat32(c.f); got != c.bf {
			t.Errorf("BFloat16FromFloat32(%g) = %#04x, want %#04x", c.f, got, c.bf)
		}
		if got := Float16FromFloat32(c.f); got != c.hf {
			t.Errorf("Float16FromFloat32(%g) = %#04x, want %#04x", c.f, got, c.hf)
		}
	}
	// A NaN stays a quiet NaN with its sign; bfloat16 keeps the top of the payload.
	nan := math.Float32frombits(0xFFA12345) // negative, signalling, payload 0x212345
	if got := BFloat16FromFloat32(nan); got != 0xFFE1 {
		t.Errorf("bfloat16 of NaN %#x = %#04x, want 0xffe1", math.Float32bits(nan), got)
	}
	if got := Float16FromFloat32(nan); got != 0xFE00 {
		t.Errorf("float16 of NaN %#x = %#04x, want 0xfe00", math.Float32bits(nan), got)
	}
	if got := BFloat16FromFloat32(math.Float32frombits(0x7F800001)); got != 0x7FC0 {
		t.Errorf("bfloat16 of the NaN 0x7f800001 = %#04x, want 0x7fc0 (not infinity)", got)
	}
	if got := Float32FromFloat16(0x0001); got != 0x1p-24 {
		t.Errorf("Float32FromFloat16(1) = %g", got)
	}
	if got := Float32FromBFloat16(0x8001); got != -0x1p-133 {
		t.Errorf("Float32FromBFloat16(0x8001) = %g", got)
	}
	if got := FromFloat16(ToFloat16([]float32{0.5, -3, 1e6})); got[0] != 0.5 || got[1] != -3 || !math.IsInf(float64(got[2]), 1) {
		t.Errorf("FromFloat16(ToFloat16(...)) = %v", got)
	}
	if got := FromBFloat16(ToBFloat16([]float32{0.5, -3, 1e6})); got[0] != 0.5 || got[1] != -3 || got[2] != 999424 {
		t.Errorf("FromBFloat16(ToBFloat16(...)) = %v", got)
	}
}

// Every 16-bit pattern widens to a value that narrows back to it (NaNs to a NaN), and every
// float32 probed narrows to the nearest pattern, ties to even.
func TestHalfAgainstReference(t *testing.T) {
	fs := testFloats()
	for _, h := range halfFormats {
		for i := 0; i < 1<<16; i++ {
			b := uint16(i)
			f := h.widen(b)
			if isNaN32(f) {
				if !isNaN32(h.widen(h.narrow(f))) || math.Signbit(float64(f)) != (h.narrow(f)&0x8000 != 0) {
					t.Fatalf("%s: NaN %#04x narrows to %#04x", h.name, b, h.narrow(f))
				}
				continue
			}
			if got := h.narrow(f); got != b {
				t.Fatalf("%s: %#04x widens to %g, which narrows to %#04x", h.name, b, f, got)
			}
		}
		for _, f := range fs {
			got := h.narrow(f)
			if isNaN32(f) {
				if !isNaN32(h.widen(got)) {
					t.Fatalf("%s: NaN %#x narrows to the non-NaN %#04x", h.name, math.Float32bits(f), got)
				}
				continue
			}
			if want := h.nearest(f); got != want {
				t.Fatalf("%s: %g (%#x) narrows to %#04x, want %#04x", h.name, f, math.Float32bits(f), got, want)
			}
		}
	}
}

// The library converts when it loads and stores 16-bit tensors. MergeStates with weights 1 and
// 0 (lse -inf) stores each input element as it loaded it, and with equal lse it stores (a+b)/2:
// over every 16-bit pattern a, against partners b at many exponent distances, the library's
// result must equal narrowing the same float32 sum here.
func TestHalfMatchesLibrary(t *testing.T) {
	be := cpuBackend(t)
	const rows, heads, dim = 256, 2, 128 // one element per 16-bit pattern
	caps := must(be.Capabilities())
	negInf := float32(math.Inf(-1))
	for _, h := range halfFormats {
		if !caps.SupportsDType(h.dtype) {
			t.Logf("%s: the cpu backend lacks it", h.name)
			continue
		}
		a := make([]uint16, 1<<16)
		for i := range a {
			a[i] = uint16(i)
		}
		expMask := uint16(0x7FFF) >> h.mant << h.mant
		s := uint32(12345)
		next := func() uint16 {
			s ^= s << 13
			s ^= s >> 17
			s ^= s << 5
			return uint16(s >> 8)
		}
		type round struct {
			name     string
			l2       float32 // lse2; lse1 is 0
			partners func(i int) uint16
		}
		rounds := []round{
			{"alone", negInf, func(int) uint16 { return 0 }},
			{"next pattern", 0, func(i int) uint16 { return uint16(i + 1) }},
			{"random", 0, func(int) uint16 { return next() }},
		}
		for _, gap := range []uint16{1, 2, 4, 7, 8, 9, 11, 12, 16, 20, 24} {
			gap := gap
			rounds = append(rounds, round{"exponent gap", 0, func(i int) uint16 {
				e := a[i] & expMask >> h.mant
				if e <= gap || e == expMask>>h.mant {
					return next()
				}
				return a[i]&0x8000 ^ next()&0x8000 | (e-gap)<<h.mant | next()&(1<<h.mant-1)
			}})
		}
		lse1 := make([]float32, rows*heads)
		for _, r := range rounds {
			b := make([]uint16, len(a))
			for i := range b {
				b[i] = r.partners(i)
			}
			lse2 := make([]float32, rows*heads)
			for i := range lse2 {
				lse2[i] = r.l2
			}
			out := make([]uint16, len(a))
			if err := be.MergeStates(HostTensor(out, h.dtype, rows, heads, dim), nil,
				HostTensor(a, h.dtype, rows, heads, dim), Float32Tensor(lse1, rows, heads),
				HostTensor(b, h.dtype, rows, heads, dim), Float32Tensor(lse2, rows, heads)); err != nil {
				t.Fatal(err)
			}
			// The library's weights: exp(0)/sum, with sum 1 or 2; a zero weight skips its input.
			w1, w2 := float32(1), float32(0)
			if r.l2 == 0 {
				w1, w2 = 0.5, 0.5
			}
			for i := range a {
				x1 := float32(h.widen(a[i]) * w1)
				x2 := float32(0)
				if w2 != 0 {
					x2 = float32(h.widen(b[i]) * w2)
				}
				sum := float32(x1 + x2)
				want := h.narrow(sum)
				if isNaN32(sum) {
					if !isNaN32(h.widen(out[i])) {
						t.Fatalf("%s, %s: (%#04x, %#04x) gives %#04x, want a NaN", h.name, r.name, a[i], b[i], out[i])
					}
					continue
				}
				if out[i] != want {
					t.Fatalf("%s, %s: (%#04x, %#04x): the library stores %g as %#04x, this package as %#04x",
						h.name, r.name, a[i], b[i], sum, out[i], want)
				}
			}
		}
	}
}
