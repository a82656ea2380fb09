package pagedattn

import (
	"runtime"
	"unsafe"
)

// BackendInfo is one entry of the backend list.
type BackendInfo struct {
	Name      string // "cpu", "onednn", "cuda", "hip"
	Available bool   // whether NewBackend(Name) can succeed with device 0
	Reason    string // why it is unavailable ("" when available)
}

// Backends lists every backend the library knows of, available or not (probing plugins).
func Backends() ([]BackendInfo, error) { return cBackends() }

// BackendOptions configures NewBackendWithOptions; the zero value is the library's default.
type BackendOptions struct {
	DeviceIndex int    // GPU ordinal; 0 on CPU
	NumThreads  int    // CPU backends: worker threads, 0 = one per online core
	Flags       uint32 // reserved, must be 0
	MemoryLimit uint64 // bytes for caches and batch workspaces, 0 = unlimited
}

// Features is a set of PAGEDATTN_FEATURE_* bits.
type Features uint32

// Feature bits.
const (
	FeatureALiBi          Features = 1 << 0
	FeatureSoftCap        Features = 1 << 1
	FeatureSlidingWindow  Features = 1 << 2
	FeatureCrossAttention Features = 1 << 3
	FeatureEncoder        Features = 1 << 4
	FeatureFP8Cache       Features = 1 << 5
	FeatureLSE            Features = 1 << 6
	FeatureMergeStates    Features = 1 << 7
	FeatureChunkedPrefill Features = 1 << 8
	FeatureHostSwap       Features = 1 << 9
	FeatureGraphCapture   Features = 1 << 10
	FeatureWrapCache      Features = 1 << 11
	FeatureSinks          Features = 1 << 12 // attention sinks (AttentionOptions.Sinks)
	FeatureChunkedLocal   Features = 1 << 13 // AttentionOptions.AttentionChunk
	FeatureHeadScales     Features = 1 << 14 // per-KV-head fp8 scales (AttentionOptions, KVCache.WriteScaled)
	FeatureTreeMask       Features = 1 << 15 // speculative-decoding tree masks (BatchDesc.TreeMask)
	FeatureMLA            Features = 1 << 16 // latent caches (CacheLatent), WriteLatent, ForwardMLA
)

// Has reports whether every bit of f is set.
func (fs Features) Has(f Features) bool { return fs&f == f }

// Capabilities says what a backend can do.
type Capabilities struct {
	Name          string
	Device        Device // where tensors and caches must live
	Features      Features
	DTypes        uint32 // q/k/v/out dtypes: DType.Bit() mask
	CacheDTypes   uint32 // cache dtypes: DType.Bit() mask
	Layouts       uint32 // bit 1<<Layout
	BlockSizes    uint32 // bit k = block size 2^k
	HeadSizes     uint32 // bit i = head size 8*(i+1)
	MaxNumThreads int    // CPU: worker threads; GPU: 0
	TotalMemory   uint64 // GPU memory in bytes, 0 if unknown or host
	// Target is the code path the backend runs, which decides how results round: on CPU
	// backends the SIMD target as PAGEDATTN_CPU_TARGET spells it ("AVX3_BF16", "AVX2"...), on
	// GPU backends the device architecture ("sm_90", "gfx942").
	Target string
	// Settings is one line: what the backend chose when it was created and the value of every
	// environment variable it read (e.g. "PAGEDATTN_CPU_SPIN_US=100").
	Settings string
	// LatentSizes are the latent (MLA) row sizes: bit i = row size 32*(i+1); 0 without
	// FeatureMLA.
	LatentSizes uint32
}

// MemoryUsage is what a backend holds at the time of the call (a snapshot while other
// goroutines allocate).
type MemoryUsage struct {
	// BytesInUse counts the caches the backend allocated (not those over caller memory), batch
	// metadata and batch workspaces, on the device and in host memory: what MemoryLimit bounds.
	BytesInUse  uint64
	MemoryLimit uint64 // the backend's BackendOptions.MemoryLimit; 0 = unlimited
	NumCaches   int    // caches created from the backend and not yet closed
	NumBatches  int    // batches likewise
}

// SupportsDType reports whether q/k/v/out may have dtype d.
func (c Capabilities) SupportsDType(d DType) bool { return c.DTypes&d.Bit() != 0 }

// SupportsCacheDType reports whether a cache may have dtype d.
func (c Capabilities) SupportsCacheDType(d DType) bool { return c.CacheDTypes&d.Bit() != 0 }

// SupportsBlockSize reports whether n tokens per block is supported.
func (c Capabilities) SupportsBlockSize(n int) bool {
	for k := 0; k < 32; k++ {
		if n == 1<<k {
			return c.BlockSizes&(1<<k) != 0
		}
	}
	return false
}

// SupportsHeadSize reports whether head size n is supported.
func (c Capabilities) SupportsHeadSize(n int) bool {
	return n > 0 && n%8 == 0 && n/8 <= 32 && c.HeadSizes&(1<<(n/8-1)) != 0
}

// SupportsLatentSize reports whether latent (MLA) caches may have rows of n values.
func (c Capabilities) SupportsLatentSize(n int) bool {
	return n > 0 && n%32 == 0 && n/32 <= 32 && c.LatentSizes&(1<<(n/32-1)) != 0
}

// Backend is a compute backend: one device driven by one implementation. Its methods may be
// called from many goroutines at once for distinct batches, outputs and cache regions.
type Backend struct {
	h handle
}

// NewBackend creates a backend by name ("cpu", "onednn", "cuda", "hip" or "auto") with defaults.
func NewBackend(name string) (*Backend, error) {
	return NewBackendWithOptions(name, BackendOptions{})
}

// NewBackendWithOptions creates a backend with options.
func NewBackendWithOptions(name string, opts BackendOptions) (*Backend, error) {
	p, err := cBackendCreate(name, opts)
	if err != nil {
		return nil, err
	}
	b := &Backend{h: handle{p: p, kind: "backend"}}
	runtime.SetFinalizer(b, func(b *Backend) { _ = b.Close() })
	return b, nil
}

// Close destroys the backend. Caches and batches still open keep the C backend alive until they
// are closed. Closing twice returns an error.
func (b *Backend) Close() error {
	if b == nil {
		return goError(NullPointer, "nil backend")
	}
	runtime.SetFinalizer(b, nil)
	return b.h.close(cBackendDestroy)
}

// Capabilities reports what the backend can do.
func (b *Backend) Capabilities() (Capabilities, error) {
	p, err := b.handle().acquire()
	if err != nil {
		return Capabilities{}, err
	}
	defer b.h.release()
	return cCapabilities(p)
}

// MemoryUsage reports the bytes, caches and batches the backend holds now.
func (b *Backend) MemoryUsage() (MemoryUsage, error) {
	p, err := b.handle().acquire()
	if err != nil {
		return MemoryUsage{}, err
	}
	defer b.h.release()
	return cMemoryUsage(p)
}

// Synchronize waits for the work queued on the stream (default: the default stream) and reports
// asynchronous device errors. CPU backends return at once.
func (b *Backend) Synchronize(opts ...CallOption) error {
	p, err := b.handle().acquire()
	if err != nil {
		return err
	}
	defer b.h.release()
	return cSynchronize(p, configure(opts).stream)
}

func (b *Backend) handle() *handle {
	if b == nil {
		return nil
	}
	return &b.h
}

// AttentionType selects the attention a forward computes.
type AttentionType int

// Attention types.
const (
	Decoder     AttentionType = 0 // causal self-attention over the paged cache
	Encoder     AttentionType = 1 // bidirectional among each sequence's tokens; may write the cache
	EncoderOnly AttentionType = 2 // as Encoder, without a cache
	Cross       AttentionType = 3 // decoder queries over the encoder's K/V in the cross cache
)

// AttentionOptions are one forward's options. Start from NewAttentionOptions for the library's
// defaults.
type AttentionOptions struct {
	NumHeads, NumKVHeads, HeadSize int
	Scale                          float32 // 0 = 1/sqrt(HeadSize)
	SoftCap                        float32 // > 0: s = cap * tanh(s / cap)
	SlidingWindow                  int     // > 0: only keys with p - key_pos < W (decoder)
	Type                           AttentionType
	WriteKV                        bool           // write the step's k/v into the cache first
	KScale, VScale                 float32        // fp8 dequantisation scales
	AlibiSlopes                    *Tensor        // float32 [NumHeads] or nil (decoder)
	Flags                          uint32         // reserved, must be 0
	Stream                         unsafe.Pointer // CUDA/HIP stream; nil = default
	// Sinks (gpt-oss): float32 [NumHeads] or nil. Sinks[h] is a logit that joins the softmax of
	// every row of head h without a value; the row's lse includes it. Any attention type.
	Sinks *Tensor
	// AttentionChunk (Llama 4), decoder only: C > 0 lets the token at position p see only keys
	// k <= p with k / C == p / C; 0 = off. With a sliding window both apply.
	AttentionChunk int
	// KHeadScales and VHeadScales are per-KV-head fp8 scales, float32 [NumKVHeads] or nil (then
	// KScale / VScale): an fp8 cache loads head h as float(fp8) * scales[h], and a WriteKV
	// stores fp8(x / scales[h]); other caches ignore them.
	KHeadScales, VHeadScales *Tensor
}

// NewAttentionOptions returns the defaults (pagedattn_attention_options_init) for a shape.
func NewAttentionOptions(numHeads, numKVHeads, headSize int) AttentionOptions {
	return AttentionOptions{NumHeads: numHeads, NumKVHeads: numKVHeads, HeadSize: headSize,
		WriteKV: true, KScale: 1, VScale: 1}
}

// ForwardArgs are the arguments of one Forward. Batch, Options, Q and Out are required; a nil
// Batch or Cache goes to the library as NULL, which refuses it with its own message.
type ForwardArgs struct {
	Batch   *Batch            // the planned step
	Cache   *KVCache          // self-attention cache (Decoder, Encoder) or cross cache (Cross); nil only for EncoderOnly
	Layer   int               // layer of the cache
	Options *AttentionOptions // from NewAttentionOptions, adjusted as needed
	Q       *Tensor           // [tokens, H, D]
	K, V    *Tensor           // [rows, Hkv, D]; nil when not needed (no WriteKV, not an encoder)
	Out     *Tensor           // [tokens, H, D] of Q's dtype
	LSE     *Tensor           // optional float32 [tokens, H]
}

// Forward runs one layer of attention for a planned batch. On error nothing is written: a tensor
// refused by its constructor (see Tensor.Err) is reported before the library is called.
// Goroutines may run forwards on one cache at once with distinct batches and outputs, when the
// blocks they write are disjoint from those the others touch.
func (b *Backend) Forward(a ForwardArgs) error {
	if a.Options == nil || a.Q == nil || a.Out == nil {
		return goError(NullPointer, "Options, Q and Out are required")
	}
	o := a.Options
	if err := checkTensors(a.Q, a.K, a.V, a.Out, a.LSE, o.AlibiSlopes, o.Sinks, o.KHeadScales, o.VHeadScales); err != nil {
		return err
	}
	bp, err := b.handle().acquire()
	if err != nil {
		return err
	}
	defer b.h.release()
	var tp, cp unsafe.Pointer
	if a.Batch != nil {
		if tp, err = a.Batch.h.acquire(); err != nil {
			return err
		}
		defer a.Batch.h.release()
	}
	if a.Cache != nil {
		if cp, err = a.Cache.h.acquire(); err != nil {
			return err
		}
		defer a.Cache.h.release()
	}
	err = cForward(bp, tp, cp, a.Layer, a.Options, a.Q, a.K, a.V, a.Out, a.LSE)
	keepAlive(a.Q, a.K, a.V, a.Out, a.LSE, o.AlibiSlopes, o.Sinks, o.KHeadScales, o.VHeadScales)
	return err
}

// NewMLAOptions returns the options of ForwardMLA for numHeads query heads over latent rows of
// headSize values (the cache's, e.g. 576): one KV head, decoder, no WriteKV (an MLA forward never
// writes the cache), scales 1.
func NewMLAOptions(numHeads, headSize int) AttentionOptions {
	return AttentionOptions{NumHeads: numHeads, NumKVHeads: 1, HeadSize: headSize, KScale: 1, VScale: 1}
}

// MLAForwardArgs are the arguments of one ForwardMLA. Batch, Cache, Options, QNope and Out are
// required; a nil Batch or Cache goes to the library as NULL, which refuses it with its own
// message.
type MLAForwardArgs struct {
	Batch   *Batch            // the planned step
	Cache   *KVCache          // the latent cache (CacheLatent), holding this step's rows already
	Layer   int               // layer of the cache
	Options *AttentionOptions // from NewMLAOptions: NumKVHeads 1, HeadSize the rows' D, Decoder
	QNope   *Tensor           // [tokens, H, R], already multiplied by W_UK; or whole rows [tokens, H, D] with QPE nil
	QPE     *Tensor           // [tokens, H, D-R], the rotary part, or nil
	Out     *Tensor           // [tokens, H, R] of the query's dtype: its last extent is the value size R
	LSE     *Tensor           // optional float32 [tokens, H]
}

// ForwardMLA runs multi-head latent attention (MLA: DeepSeek V2/V3/R1, Kimi K2) in the absorbed
// form over a latent cache (FeatureMLA). Every query head reads each key's latent row of D
// values: the score is Scale * (q . row) over all D, then soft cap, masks and softmax as decoder
// attention, and the output is the weights times the rows' leading R values. Options.KScale
// dequantises an fp8 cache. The forward writes nothing to the cache (write the step's rows with
// KVCache.WriteLatent first). A plain cache is refused (InvalidArgument), as Forward refuses a
// latent one; on error nothing is written.
func (b *Backend) ForwardMLA(a MLAForwardArgs) error {
	if a.Options == nil || a.QNope == nil || a.Out == nil {
		return goError(NullPointer, "Options, QNope and Out are required")
	}
	o := a.Options
	if err := checkTensors(a.QNope, a.QPE, a.Out, a.LSE, o.AlibiSlopes, o.Sinks, o.KHeadScales, o.VHeadScales); err != nil {
		return err
	}
	bp, err := b.handle().acquire()
	if err != nil {
		return err
	}
	defer b.h.release()
	var tp, cp unsafe.Pointer
	if a.Batch != nil {
		if tp, err = a.Batch.h.acquire(); err != nil {
			return err
		}
		defer a.Batch.h.release()
	}
	if a.Cache != nil {
		if cp, err = a.Cache.h.acquire(); err != nil {
			return err
		}
		defer a.Cache.h.release()
	}
	err = cForwardMLA(bp, tp, cp, a.Layer, a.Options, a.QNope, a.QPE, a.Out, a.LSE)
	keepAlive(a.QNope, a.QPE, a.Out, a.LSE, o.AlibiSlopes, o.Sinks, o.KHeadScales, o.VHeadScales)
	return err
}

// MergeStates combines two partial results over disjoint key sets into the exact one: o1, o2,
// out [T, H, D]; lse1, lse2, lseOut float32 [T, H] (lseOut may be nil). out may be o1 or o2.
func (b *Backend) MergeStates(out, lseOut, o1, lse1, o2, lse2 *Tensor, opts ...CallOption) error {
	if out == nil || o1 == nil || lse1 == nil || o2 == nil || lse2 == nil {
		return goError(NullPointer, "out, o1, lse1, o2 and lse2 are required")
	}
	if err := checkTensors(out, lseOut, o1, lse1, o2, lse2); err != nil {
		return err
	}
	p, err := b.handle().acquire()
	if err != nil {
		return err
	}
	defer b.h.release()
	err = cMerge(p, out, lseOut, o1, lse1, o2, lse2, configure(opts).stream)
	keepAlive(out, lseOut, o1, lse1, o2, lse2)
	return err
}
