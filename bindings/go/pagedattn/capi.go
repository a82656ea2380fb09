package pagedattn

// Everything that touches C lives in this file (the link flags come from cgo_pkgconfig.go,
// cgo_static.go, cgo_flags.go or cgo_flags_static.go, by build tag), except the log callback's exported Go entry point, which cgo
// requires in a file whose preamble defines nothing (log.go). Each wrapper below calls one
// pagedattn function and, on failure, copies pagedattn_last_error() into the caller's buffer
// within the same C call: the message is thread-local and a goroutine may move to another thread
// between two cgo calls. Tensor and batch descriptors hold pointers, so they are assembled here
// in C from pointer-free Go structs plus the data pointers passed as direct arguments (cgo's
// pointer rules).

/*
#include <stdlib.h>
#include <string.h>
#include <pagedattn/pagedattn.h>

#define GO_ERR_LEN 1024
#define GO_MAX_DIMS 4

static pagedattn_status go_keep(pagedattn_status st, char* err) {
  if (st != PAGEDATTN_OK) {
    strncpy(err, pagedattn_last_error(), GO_ERR_LEN - 1);
    err[GO_ERR_LEN - 1] = 0;
  }
  return st;
}

// A tensor descriptor without pointers (shape and strides inline).
typedef struct {
  int32_t device_type, device_id, ndim, has_strides;
  uint8_t code, bits;
  uint16_t lanes;
  uint64_t byte_offset;
  int64_t shape[GO_MAX_DIMS];
  int64_t strides[GO_MAX_DIMS];
} go_tensor;

static pagedattn_tensor* go_fill(pagedattn_tensor* t, go_tensor* d, void* data) {
  if (!d) return NULL;
  t->data = data;
  t->device.device_type = d->device_type;
  t->device.device_id = d->device_id;
  t->ndim = d->ndim;
  t->dtype.code = d->code;
  t->dtype.bits = d->bits;
  t->dtype.lanes = d->lanes;
  t->shape = d->shape;
  t->strides = d->has_strides ? d->strides : NULL;
  t->byte_offset = d->byte_offset;
  return t;
}

static pagedattn_status go_backend_get_info(pagedattn_backend_info* info, int32_t i, char* err) {
  info->struct_size = sizeof *info;
  return go_keep(pagedattn_backend_get_info(info, i), err);
}

static pagedattn_status go_backend_create(pagedattn_backend** out, const char* name, int32_t device,
                                          int32_t threads, uint32_t flags, uint64_t limit, char* err) {
  pagedattn_backend_options o;
  pagedattn_backend_options_init(&o);
  o.device_index = device;
  o.num_threads = threads;
  o.flags = flags;
  o.memory_limit = limit;
  return go_keep(pagedattn_backend_create(out, name, &o), err);
}

static pagedattn_status go_capabilities(pagedattn_capabilities* c, pagedattn_backend* b, char* err) {
  c->struct_size = sizeof *c;
  return go_keep(pagedattn_backend_get_capabilities(c, b), err);
}

static pagedattn_status go_memory_usage(pagedattn_memory_usage* u, pagedattn_backend* b, char* err) {
  memset(u, 0, sizeof *u);
  u->struct_size = sizeof *u;
  return go_keep(pagedattn_backend_get_memory_usage(u, b), err);
}

// The log callback: the library calls go_log_trampoline with user_data = a cgo.Handle of the Go
// func, and it calls the Go side (log.go). go_in_log marks the thread as inside the callback:
// there a goroutine stays on its thread, so SetLogCallback can refuse before taking its lock.
extern void goPagedattnLog(uintptr_t handle, int level, char* message);
static __thread int go_in_log;

static void go_log_trampoline(void* user, pagedattn_log_level level, const char* message) {
  go_in_log = 1;
  goPagedattnLog((uintptr_t)user, (int)level, (char*)message);
  go_in_log = 0;
}

static int go_log_inside(void) { return go_in_log; }

static pagedattn_status go_set_log_callback(uintptr_t handle, int32_t level, char* err) {
  return go_keep(pagedattn_set_log_callback(handle ? go_log_trampoline : NULL, (void*)handle,
                                            (pagedattn_log_level)level), err);
}

static pagedattn_status go_synchronize(pagedattn_backend* b, void* stream, char* err) {
  return go_keep(pagedattn_backend_synchronize(b, stream), err);
}

static pagedattn_status go_bytes_per_block(uint64_t* out, pagedattn_kv_cache_desc* d, char* err) {
  d->struct_size = sizeof *d;
  return go_keep(pagedattn_kv_cache_bytes_per_block(out, d), err);
}

static pagedattn_status go_cache_create(pagedattn_kv_cache** out, pagedattn_backend* b,
                                        pagedattn_kv_cache_desc* d, char* err) {
  d->struct_size = sizeof *d;
  return go_keep(pagedattn_kv_cache_create(out, b, d), err);
}

static pagedattn_status go_cache_wrap(pagedattn_kv_cache** out, pagedattn_backend* b,
                                      pagedattn_kv_cache_desc* d, uintptr_t* k, uintptr_t* v,
                                      int64_t bst, int64_t sst, int64_t hst, int32_t dev_type,
                                      int32_t dev_id, char* err) {
  d->struct_size = sizeof *d;
  pagedattn_kv_cache_memory m;
  memset(&m, 0, sizeof m);
  m.struct_size = sizeof m;
  m.k_layers = (void* const*)k;
  m.v_layers = (void* const*)v;
  m.block_stride = bst;
  m.slot_stride = sst;
  m.head_stride = hst;
  m.device.device_type = dev_type;
  m.device.device_id = dev_id;
  return go_keep(pagedattn_kv_cache_wrap(out, b, d, &m), err);
}

static pagedattn_status go_cache_get_desc(pagedattn_kv_cache_desc* d, pagedattn_kv_cache* c, char* err) {
  d->struct_size = sizeof *d;
  return go_keep(pagedattn_kv_cache_get_desc(d, c), err);
}

static pagedattn_status go_cache_get_layer(uintptr_t* k, uintptr_t* v, int64_t* strides,
                                           pagedattn_kv_cache* c, int32_t layer, char* err) {
  void* kp = NULL;
  void* vp = NULL;
  pagedattn_status st = go_keep(pagedattn_kv_cache_get_layer(&kp, &vp, strides, c, layer), err);
  *k = (uintptr_t)kp;
  *v = (uintptr_t)vp;
  return st;
}

static pagedattn_status go_cache_write(pagedattn_kv_cache* c, int32_t layer, go_tensor* k, void* kd,
                                       go_tensor* v, void* vd, go_tensor* s, void* sd, float ks,
                                       float vs, void* stream, char* err) {
  pagedattn_tensor tk, tv, ts;
  return go_keep(pagedattn_kv_cache_write(c, layer, go_fill(&tk, k, kd), go_fill(&tv, v, vd),
                                          go_fill(&ts, s, sd), ks, vs, stream), err);
}

static pagedattn_status go_cache_write_scaled(pagedattn_kv_cache* c, int32_t layer, go_tensor* k, void* kd,
                                              go_tensor* v, void* vd, go_tensor* s, void* sd, go_tensor* ks,
                                              void* ksd, go_tensor* vs, void* vsd, void* stream, char* err) {
  pagedattn_tensor tk, tv, ts, tks, tvs;
  return go_keep(pagedattn_kv_cache_write_scaled(c, layer, go_fill(&tk, k, kd), go_fill(&tv, v, vd),
                                                 go_fill(&ts, s, sd), go_fill(&tks, ks, ksd),
                                                 go_fill(&tvs, vs, vsd), stream), err);
}

static pagedattn_status go_cache_write_latent(pagedattn_kv_cache* c, int32_t layer, go_tensor* kc, void* kcd,
                                              go_tensor* pe, void* ped, go_tensor* s, void* sd, float scale,
                                              void* stream, char* err) {
  pagedattn_tensor tkc, tpe, ts;
  return go_keep(pagedattn_kv_cache_write_latent(c, layer, go_fill(&tkc, kc, kcd), go_fill(&tpe, pe, ped),
                                                 go_fill(&ts, s, sd), scale, stream), err);
}

static pagedattn_status go_copy_blocks(pagedattn_kv_cache* c, int32_t* pairs, size_t n, void* stream,
                                       char* err) {
  return go_keep(pagedattn_kv_cache_copy_blocks(c, pairs, n, stream), err);
}

static pagedattn_status go_swap_blocks(pagedattn_kv_cache* dst, pagedattn_kv_cache* src, int32_t* pairs,
                                       size_t n, void* stream, char* err) {
  return go_keep(pagedattn_kv_cache_swap_blocks(dst, src, pairs, n, stream), err);
}

static pagedattn_status go_read_blocks(pagedattn_kv_cache* c, int32_t* ids, size_t n, void* buf,
                                       size_t bytes, void* stream, char* err) {
  return go_keep(pagedattn_kv_cache_read_blocks(c, ids, n, buf, bytes, stream), err);
}

static pagedattn_status go_load_blocks(pagedattn_kv_cache* c, int32_t* ids, size_t n, void* buf,
                                       size_t bytes, void* stream, char* err) {
  return go_keep(pagedattn_kv_cache_load_blocks(c, ids, n, buf, bytes, stream), err);
}

// Batch arrays come as direct arguments; the scalar fields in a pointer-free struct.
typedef struct {
  int32_t num_seqs, block_table_stride, cross_block_table_stride, max_num_seqs, max_blocks_per_seq,
      lens_form;
  int64_t max_num_tokens, max_num_encoder_tokens, max_seq_len, max_tree_mask_bytes;
} go_batch_desc;

// The 0.2 struct (init_sized); in the SEQ form q and c carry seq_lens and query_start_loc.
static void go_batch_fill(pagedattn_batch_desc* d, go_batch_desc* g, int32_t* q, int32_t* c,
                          int32_t* tables, int64_t* slots, int32_t* enc, int32_t* xtables,
                          uint8_t* tree, int64_t* tree_indptr) {
  pagedattn_batch_desc_init_sized(d, sizeof *d);
  d->num_seqs = g->num_seqs;
  if (g->lens_form == PAGEDATTN_BATCH_LENS_SEQ) {
    d->lens_form = PAGEDATTN_BATCH_LENS_SEQ;
    d->seq_lens = q;
    d->query_start_loc = c;
  } else {
    d->query_lens = q;
    d->context_lens = c;
  }
  d->block_tables = tables;
  d->block_table_stride = g->block_table_stride;
  d->slot_mapping = slots;
  d->encoder_lens = enc;
  d->cross_block_tables = xtables;
  d->cross_block_table_stride = g->cross_block_table_stride;
  d->max_num_seqs = g->max_num_seqs;
  d->max_num_tokens = g->max_num_tokens;
  d->max_blocks_per_seq = g->max_blocks_per_seq;
  d->max_num_encoder_tokens = g->max_num_encoder_tokens;
  d->max_seq_len = g->max_seq_len;
  d->tree_mask = tree;
  d->tree_mask_indptr = tree_indptr;
  d->max_tree_mask_bytes = g->max_tree_mask_bytes;
}

static pagedattn_status go_batch_create(pagedattn_batch** out, pagedattn_backend* b, pagedattn_kv_cache* c,
                                        pagedattn_kv_cache* x, go_batch_desc* g, int32_t* q, int32_t* cl,
                                        int32_t* tables, int64_t* slots, int32_t* enc, int32_t* xtables,
                                        uint8_t* tree, int64_t* tree_indptr, char* err) {
  pagedattn_batch_desc d;
  go_batch_fill(&d, g, q, cl, tables, slots, enc, xtables, tree, tree_indptr);
  return go_keep(pagedattn_batch_create(out, b, c, x, &d), err);
}

static pagedattn_status go_batch_update(pagedattn_batch* b, go_batch_desc* g, int32_t* q, int32_t* cl,
                                        int32_t* tables, int64_t* slots, int32_t* enc, int32_t* xtables,
                                        uint8_t* tree, int64_t* tree_indptr, char* err) {
  pagedattn_batch_desc d;
  go_batch_fill(&d, g, q, cl, tables, slots, enc, xtables, tree, tree_indptr);
  return go_keep(pagedattn_batch_update(b, &d), err);
}

static pagedattn_status go_batch_info(pagedattn_batch_info* i, pagedattn_batch* b, char* err) {
  i->struct_size = sizeof *i;
  return go_keep(pagedattn_batch_get_info(i, b), err);
}

// Copies one of the batch's arrays (which: 0 slot mapping, 1 query start, 2 cross slot mapping)
// into C memory the caller frees; the count is returned through *n.
static pagedattn_status go_batch_array(void** out, int64_t* n, pagedattn_batch* b, int which, char* err) {
  const void* p = NULL;
  size_t esize = 8;
  pagedattn_status st;
  if (which == 1) {
    int32_t c = 0;
    st = pagedattn_batch_get_query_start((const int32_t**)&p, &c, b);
    *n = c;
    esize = 4;
  } else if (which == 0) {
    st = pagedattn_batch_get_slot_mapping((const int64_t**)&p, n, b);
  } else {
    st = pagedattn_batch_get_cross_slot_mapping((const int64_t**)&p, n, b);
  }
  if (go_keep(st, err) != PAGEDATTN_OK) return st;
  *out = malloc(*n ? (size_t)*n * esize : 1);
  if (!*out) {
    strcpy(err, "pagedattn (Go): out of memory copying a batch array");
    return PAGEDATTN_ERROR_OUT_OF_MEMORY;
  }
  if (*n) memcpy(*out, p, (size_t)*n * esize);
  return st;
}

typedef struct {
  int32_t num_heads, num_kv_heads, head_size, sliding_window, attention_type, write_kv, has_alibi,
      attention_chunk;
  float scale, soft_cap, k_scale, v_scale;
  uint32_t flags;
} go_options;

static void go_options_fill(pagedattn_attention_options* opts, go_options* g) {
  pagedattn_attention_options_init_sized(opts, sizeof *opts);
  opts->num_heads = g->num_heads;
  opts->num_kv_heads = g->num_kv_heads;
  opts->head_size = g->head_size;
  opts->scale = g->scale;
  opts->soft_cap = g->soft_cap;
  opts->sliding_window = g->sliding_window;
  opts->attention_type = (pagedattn_attention_type)g->attention_type;
  opts->write_kv = g->write_kv;
  opts->k_scale = g->k_scale;
  opts->v_scale = g->v_scale;
  opts->flags = g->flags;
  opts->attention_chunk = g->attention_chunk;
}

// The option tensors (ALiBi slopes, sinks, K and V head scales) come as descriptor and data pairs.
static pagedattn_status go_forward(pagedattn_backend* be, pagedattn_batch* b, pagedattn_kv_cache* c,
                                   int32_t layer, go_options* g, go_tensor* al, void* ald,
                                   go_tensor* sk, void* skd, go_tensor* kh, void* khd,
                                   go_tensor* vh, void* vhd,
                                   go_tensor* q, void* qd, go_tensor* k, void* kd, go_tensor* v,
                                   void* vd, go_tensor* o, void* od, go_tensor* l, void* ld,
                                   void* stream, char* err) {
  pagedattn_attention_options opts;
  go_options_fill(&opts, g);
  pagedattn_tensor ta, ts, tkh, tvh, tq, tk, tv, to, tl;
  opts.alibi_slopes = go_fill(&ta, al, ald);
  opts.sinks = go_fill(&ts, sk, skd);
  opts.k_head_scales = go_fill(&tkh, kh, khd);
  opts.v_head_scales = go_fill(&tvh, vh, vhd);
  return go_keep(pagedattn_forward(be, b, c, layer, &opts, go_fill(&tq, q, qd), go_fill(&tk, k, kd),
                                   go_fill(&tv, v, vd), go_fill(&to, o, od), go_fill(&tl, l, ld),
                                   stream), err);
}

// As go_forward, with q_nope and q_pe in place of q, k and v.
static pagedattn_status go_forward_mla(pagedattn_backend* be, pagedattn_batch* b, pagedattn_kv_cache* c,
                                       int32_t layer, go_options* g, go_tensor* al, void* ald,
                                       go_tensor* sk, void* skd, go_tensor* kh, void* khd,
                                       go_tensor* vh, void* vhd, go_tensor* qn, void* qnd,
                                       go_tensor* qp, void* qpd, go_tensor* o, void* od, go_tensor* l,
                                       void* ld, void* stream, char* err) {
  pagedattn_attention_options opts;
  go_options_fill(&opts, g);
  pagedattn_tensor ta, ts, tkh, tvh, tqn, tqp, to, tl;
  opts.alibi_slopes = go_fill(&ta, al, ald);
  opts.sinks = go_fill(&ts, sk, skd);
  opts.k_head_scales = go_fill(&tkh, kh, khd);
  opts.v_head_scales = go_fill(&tvh, vh, vhd);
  return go_keep(pagedattn_forward_mla(be, b, c, layer, &opts, go_fill(&tqn, qn, qnd),
                                       go_fill(&tqp, qp, qpd), go_fill(&to, o, od),
                                       go_fill(&tl, l, ld), stream), err);
}

static pagedattn_status go_merge(pagedattn_backend* be, go_tensor* o, void* od, go_tensor* lo, void* lod,
                                 go_tensor* o1, void* o1d, go_tensor* l1, void* l1d, go_tensor* o2,
                                 void* o2d, go_tensor* l2, void* l2d, void* stream, char* err) {
  pagedattn_tensor to, tlo, t1, tl1, t2, tl2;
  return go_keep(pagedattn_merge_states(be, go_fill(&to, o, od), go_fill(&tlo, lo, lod),
                                        go_fill(&t1, o1, o1d), go_fill(&tl1, l1, l1d),
                                        go_fill(&t2, o2, o2d), go_fill(&tl2, l2, l2d), stream), err);
}

static pagedattn_status go_dtype_from_dlpack(pagedattn_dtype* out, uint8_t code, uint8_t bits,
                                             uint16_t lanes, char* err) {
  pagedattn_dlpack_dtype d = {code, bits, lanes};
  return go_keep(pagedattn_dtype_from_dlpack(out, d), err);
}

static pagedattn_status go_dtype_to_dlpack(pagedattn_dlpack_dtype* out, pagedattn_dtype d, char* err) {
  return go_keep(pagedattn_dtype_to_dlpack(out, d), err);
}
*/
import "C"

import (
	"math"
	"runtime/cgo"
	"sync"
	"unsafe"
)

const maxDims = C.GO_MAX_DIMS

// errBuf receives the library's message inside the failing C call.
type errBuf [C.GO_ERR_LEN]C.char

func (e *errBuf) ptr() *C.char { return &e[0] }

// result turns a status and its captured message into an error (nil on success).
func result(st C.pagedattn_status, e *errBuf) error {
	if st == C.PAGEDATTN_OK {
		return nil
	}
	return &Error{Code: Code(st), Msg: C.GoString(e.ptr())}
}

// ints converts Go ints to C's int32_t fields and arguments, keeping the first that does not fit:
// C would otherwise see another number (a layer of 1<<32 would run as layer 0).
type ints struct{ err error }

func (c *ints) i32(name string, v int) C.int32_t {
	if c.err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
		c.err = goError(Overflow, "%s = %d does not fit int32", name, v)
	}
	return C.int32_t(v)
}

// deviceID is a tensor's device ordinal for C; one that does not fit int32 becomes -1, which the
// library refuses (WRONG_DEVICE) rather than reading as another device.
func deviceID(id int) C.int32_t {
	if id < 0 || id > math.MaxInt32 {
		return -1
	}
	return C.int32_t(id)
}

func cStatusString(c Code) string {
	return C.GoString(C.pagedattn_status_string(C.pagedattn_status(c)))
}

func cVersion() (int, int, int) {
	var ma, mi, pa C.int32_t
	C.pagedattn_version(&ma, &mi, &pa)
	return int(ma), int(mi), int(pa)
}

func cVersionString() string { return C.GoString(C.pagedattn_version_string()) }

const (
	headerMajor = int(C.PAGEDATTN_VERSION_MAJOR)
	headerMinor = int(C.PAGEDATTN_VERSION_MINOR)
	headerPatch = int(C.PAGEDATTN_VERSION_PATCH)
)

func cDTypeName(d DType) string { return C.GoString(C.pagedattn_dtype_name(C.pagedattn_dtype(d))) }
func cDTypeSize(d DType) int    { return int(C.pagedattn_dtype_size(C.pagedattn_dtype(d))) }

func cDTypeToDLPack(d DType) (DataType, error) {
	var e errBuf
	var out C.pagedattn_dlpack_dtype
	if err := result(C.go_dtype_to_dlpack(&out, C.pagedattn_dtype(d), e.ptr()), &e); err != nil {
		return DataType{}, err
	}
	return DataType{Code: uint8(out.code), Bits: uint8(out.bits), Lanes: uint16(out.lanes)}, nil
}

func cDTypeFromDLPack(t DataType) (DType, error) {
	var e errBuf
	var out C.pagedattn_dtype
	st := C.go_dtype_from_dlpack(&out, C.uint8_t(t.Code), C.uint8_t(t.Bits), C.uint16_t(t.Lanes), e.ptr())
	if err := result(st, &e); err != nil {
		return 0, err
	}
	return DType(out), nil
}

func cBackends() ([]BackendInfo, error) {
	n := int(C.pagedattn_backend_count())
	list := make([]BackendInfo, 0, n)
	for i := 0; i < n; i++ {
		var e errBuf
		var info C.pagedattn_backend_info
		if err := result(C.go_backend_get_info(&info, C.int32_t(i), e.ptr()), &e); err != nil {
			return nil, err
		}
		list = append(list, BackendInfo{Name: C.GoString(info.name), Available: info.available != 0,
			Reason: C.GoString(info.reason)})
	}
	return list, nil
}

func cBackendCreate(name string, o BackendOptions) (unsafe.Pointer, error) {
	var e errBuf
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var out *C.pagedattn_backend
	var ck ints
	dev, threads := ck.i32("DeviceIndex", o.DeviceIndex), ck.i32("NumThreads", o.NumThreads)
	if ck.err != nil {
		return nil, ck.err
	}
	st := C.go_backend_create(&out, cname, dev, threads, C.uint32_t(o.Flags), C.uint64_t(o.MemoryLimit), e.ptr())
	return unsafe.Pointer(out), result(st, &e)
}

func cBackendDestroy(p unsafe.Pointer) { C.pagedattn_backend_destroy((*C.pagedattn_backend)(p)) }

func cCapabilities(p unsafe.Pointer) (Capabilities, error) {
	var e errBuf
	var c C.pagedattn_capabilities
	if err := result(C.go_capabilities(&c, (*C.pagedattn_backend)(p), e.ptr()), &e); err != nil {
		return Capabilities{}, err
	}
	return Capabilities{
		Name:          C.GoString(c.name),
		Device:        Device{Type: DeviceType(c.device.device_type), ID: int(c.device.device_id)},
		Features:      Features(c.features),
		DTypes:        uint32(c.dtypes),
		CacheDTypes:   uint32(c.cache_dtypes),
		Layouts:       uint32(c.layouts),
		BlockSizes:    uint32(c.block_sizes),
		HeadSizes:     uint32(c.head_sizes),
		MaxNumThreads: int(c.max_num_threads),
		TotalMemory:   uint64(c.total_memory),
		// Copied while the caller holds the backend, which owns them.
		Target:      C.GoString(c.target),
		Settings:    C.GoString(c.settings),
		LatentSizes: uint32(c.latent_sizes),
	}, nil
}

func cMemoryUsage(p unsafe.Pointer) (MemoryUsage, error) {
	var e errBuf
	var u C.pagedattn_memory_usage
	if err := result(C.go_memory_usage(&u, (*C.pagedattn_backend)(p), e.ptr()), &e); err != nil {
		return MemoryUsage{}, err
	}
	return MemoryUsage{BytesInUse: uint64(u.bytes_in_use), MemoryLimit: uint64(u.memory_limit),
		NumCaches: int(u.num_caches), NumBatches: int(u.num_batches)}, nil
}

// logMu orders SetLogCallback calls, so that logHandle is the func the library holds. The
// trampoline never takes it: a setter holds it while the library waits for callbacks in flight.
var (
	logMu     sync.Mutex
	logHandle cgo.Handle // the func the library calls now; 0 for none
)

func cSetLogCallback(fn func(level LogLevel, msg string), level LogLevel) error {
	if C.go_log_inside() != 0 {
		// Waiting for logMu here could deadlock against a setter waiting for this callback.
		return goError(InvalidArgument, "SetLogCallback called from inside the log callback")
	}
	var ck ints
	lv := ck.i32("level", int(level))
	if ck.err != nil {
		return ck.err
	}
	var h cgo.Handle
	if fn != nil {
		h = cgo.NewHandle(fn)
	}
	logMu.Lock()
	defer logMu.Unlock()
	var e errBuf
	if err := result(C.go_set_log_callback(C.uintptr_t(h), lv, e.ptr()), &e); err != nil {
		if h != 0 {
			h.Delete()
		}
		return err
	}
	// The library no longer calls the old func, so its handle can go.
	if logHandle != 0 {
		logHandle.Delete()
	}
	logHandle = h
	return nil
}

func cSynchronize(p unsafe.Pointer, stream unsafe.Pointer) error {
	var e errBuf
	return result(C.go_synchronize((*C.pagedattn_backend)(p), stream, e.ptr()), &e)
}

func cacheDesc(d CacheDesc) (C.pagedattn_kv_cache_desc, error) {
	var c C.pagedattn_kv_cache_desc
	C.pagedattn_kv_cache_desc_init(&c)
	var ck ints
	c.num_layers = ck.i32("NumLayers", d.NumLayers)
	c.num_blocks = ck.i32("NumBlocks", d.NumBlocks)
	c.block_size = ck.i32("BlockSize", d.BlockSize)
	c.num_kv_heads = ck.i32("NumKVHeads", d.NumKVHeads)
	c.head_size = ck.i32("HeadSize", d.HeadSize)
	c.dtype = C.pagedattn_dtype(d.DType)
	c.layout = C.pagedattn_layout(d.Layout)
	c.flags = C.uint32_t(d.Flags)
	return c, ck.err
}

func cBytesPerBlock(d CacheDesc) (uint64, error) {
	var e errBuf
	c, err := cacheDesc(d)
	if err != nil {
		return 0, err
	}
	var out C.uint64_t
	err = result(C.go_bytes_per_block(&out, &c, e.ptr()), &e)
	return uint64(out), err
}

func cCacheCreate(be unsafe.Pointer, d CacheDesc) (unsafe.Pointer, error) {
	var e errBuf
	c, err := cacheDesc(d)
	if err != nil {
		return nil, err
	}
	var out *C.pagedattn_kv_cache
	err = result(C.go_cache_create(&out, (*C.pagedattn_backend)(be), &c, e.ptr()), &e)
	return unsafe.Pointer(out), err
}

func cCacheWrap(be unsafe.Pointer, d CacheDesc, k, v []uintptr, strides [3]int64, dev Device) (unsafe.Pointer, error) {
	var e errBuf
	c, err := cacheDesc(d)
	if err != nil {
		return nil, err
	}
	var out *C.pagedattn_kv_cache
	var kp, vp *C.uintptr_t
	if len(k) > 0 {
		kp = (*C.uintptr_t)(unsafe.Pointer(&k[0]))
	}
	if len(v) > 0 {
		vp = (*C.uintptr_t)(unsafe.Pointer(&v[0]))
	}
	var ck ints
	devID := ck.i32("Device.ID", dev.ID)
	if ck.err != nil {
		return nil, ck.err
	}
	st := C.go_cache_wrap(&out, (*C.pagedattn_backend)(be), &c, kp, vp, C.int64_t(strides[0]), C.int64_t(strides[1]),
		C.int64_t(strides[2]), C.int32_t(dev.Type), devID, e.ptr())
	return unsafe.Pointer(out), result(st, &e)
}

func cCacheDestroy(p unsafe.Pointer) { C.pagedattn_kv_cache_destroy((*C.pagedattn_kv_cache)(p)) }

func cCacheDesc(p unsafe.Pointer) (CacheDesc, error) {
	var e errBuf
	var c C.pagedattn_kv_cache_desc
	if err := result(C.go_cache_get_desc(&c, (*C.pagedattn_kv_cache)(p), e.ptr()), &e); err != nil {
		return CacheDesc{}, err
	}
	return CacheDesc{NumLayers: int(c.num_layers), NumBlocks: int(c.num_blocks), BlockSize: int(c.block_size),
		NumKVHeads: int(c.num_kv_heads), HeadSize: int(c.head_size), DType: DType(c.dtype),
		Layout: Layout(c.layout), Flags: uint32(c.flags)}, nil
}

func cCacheLayer(p unsafe.Pointer, layer int) (LayerMemory, error) {
	var e errBuf
	var k, v C.uintptr_t
	var s [3]C.int64_t
	var ck ints
	l := ck.i32("layer", layer)
	if ck.err != nil {
		return LayerMemory{}, ck.err
	}
	if err := result(C.go_cache_get_layer(&k, &v, &s[0], (*C.pagedattn_kv_cache)(p), l, e.ptr()), &e); err != nil {
		return LayerMemory{}, err
	}
	return LayerMemory{K: uintptr(k), V: uintptr(v), Strides: [3]int64{int64(s[0]), int64(s[1]), int64(s[2])}}, nil
}

// cTensor converts a Tensor into the pointer-free descriptor and its data pointer.
func cTensor(t *Tensor) (*C.go_tensor, unsafe.Pointer) {
	if t == nil {
		return nil, nil
	}
	d := &C.go_tensor{
		device_type: C.int32_t(t.device.Type),
		device_id:   deviceID(t.device.ID),
		ndim:        C.int32_t(len(t.shape)),
		code:        C.uint8_t(t.dtype.Code),
		bits:        C.uint8_t(t.dtype.Bits),
		lanes:       C.uint16_t(t.dtype.Lanes),
		byte_offset: C.uint64_t(t.byteOffset),
	}
	for i, n := range t.shape {
		d.shape[i] = C.int64_t(n)
	}
	if t.strides != nil {
		d.has_strides = 1
		for i, s := range t.strides {
			d.strides[i] = C.int64_t(s)
		}
	}
	return d, t.data
}

func cCacheWrite(p unsafe.Pointer, layer int, k, v, slots *Tensor, ks, vs float32, stream unsafe.Pointer) error {
	var e errBuf
	kd, kp := cTensor(k)
	vd, vp := cTensor(v)
	sd, sp := cTensor(slots)
	var ck ints
	l := ck.i32("layer", layer)
	if ck.err != nil {
		return ck.err
	}
	st := C.go_cache_write((*C.pagedattn_kv_cache)(p), l, kd, kp, vd, vp, sd, sp, C.float(ks),
		C.float(vs), stream, e.ptr())
	return result(st, &e)
}

func cCacheWriteScaled(p unsafe.Pointer, layer int, k, v, slots, ks, vs *Tensor, stream unsafe.Pointer) error {
	var e errBuf
	kd, kp := cTensor(k)
	vd, vp := cTensor(v)
	sd, sp := cTensor(slots)
	ksd, ksp := cTensor(ks)
	vsd, vsp := cTensor(vs)
	var ck ints
	l := ck.i32("layer", layer)
	if ck.err != nil {
		return ck.err
	}
	st := C.go_cache_write_scaled((*C.pagedattn_kv_cache)(p), l, kd, kp, vd, vp, sd, sp, ksd, ksp, vsd, vsp,
		stream, e.ptr())
	return result(st, &e)
}

func cCacheWriteLatent(p unsafe.Pointer, layer int, kvC, kPE, slots *Tensor, scale float32, stream unsafe.Pointer) error {
	var e errBuf
	cd, cp := cTensor(kvC)
	pd, pp := cTensor(kPE)
	sd, sp := cTensor(slots)
	var ck ints
	l := ck.i32("layer", layer)
	if ck.err != nil {
		return ck.err
	}
	st := C.go_cache_write_latent((*C.pagedattn_kv_cache)(p), l, cd, cp, pd, pp, sd, sp, C.float(scale), stream, e.ptr())
	return result(st, &e)
}

func pairsPtr(pairs [][2]int32) *C.int32_t {
	if len(pairs) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&pairs[0][0]))
}

func cCopyBlocks(p unsafe.Pointer, pairs [][2]int32, stream unsafe.Pointer) error {
	var e errBuf
	st := C.go_copy_blocks((*C.pagedattn_kv_cache)(p), pairsPtr(pairs), C.size_t(len(pairs)), stream, e.ptr())
	return result(st, &e)
}

func cSwapBlocks(dst, src unsafe.Pointer, pairs [][2]int32, stream unsafe.Pointer) error {
	var e errBuf
	st := C.go_swap_blocks((*C.pagedattn_kv_cache)(dst), (*C.pagedattn_kv_cache)(src), pairsPtr(pairs),
		C.size_t(len(pairs)), stream, e.ptr())
	return result(st, &e)
}

func idsPtr(ids []int32) *C.int32_t {
	if len(ids) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&ids[0]))
}

func cReadBlocks(p unsafe.Pointer, ids []int32, buf unsafe.Pointer, bytes int, stream unsafe.Pointer) error {
	var e errBuf
	st := C.go_read_blocks((*C.pagedattn_kv_cache)(p), idsPtr(ids), C.size_t(len(ids)), buf, C.size_t(bytes), stream, e.ptr())
	return result(st, &e)
}

func cLoadBlocks(p unsafe.Pointer, ids []int32, buf unsafe.Pointer, bytes int, stream unsafe.Pointer) error {
	var e errBuf
	st := C.go_load_blocks((*C.pagedattn_kv_cache)(p), idsPtr(ids), C.size_t(len(ids)), buf, C.size_t(bytes), stream, e.ptr())
	return result(st, &e)
}

func i32Ptr(s []int32) *C.int32_t {
	if s == nil {
		return nil
	}
	if len(s) == 0 {
		// A non-NULL pointer for an empty array (num_seqs 0): C reads nothing from it.
		return (*C.int32_t)(unsafe.Pointer(&emptyArray[0]))
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

var emptyArray [1]int64

// lensArrays returns the two length arrays of d's form: QueryLens and ContextLens, or SeqLens and
// QueryStartLoc.
func lensArrays(d *BatchDesc) (*C.int32_t, *C.int32_t) {
	if d.seqForm() {
		return i32Ptr(d.SeqLens), i32Ptr(d.QueryStartLoc)
	}
	return i32Ptr(d.QueryLens), i32Ptr(d.ContextLens)
}

// treeArrays returns d's tree mask bytes and offsets (NULL when nil; a non-NULL pointer for an
// empty mask, from which C reads nothing).
func treeArrays(d *BatchDesc) (*C.uint8_t, *C.int64_t) {
	var mask *C.uint8_t
	var indptr *C.int64_t
	if d.TreeMask != nil {
		mask = (*C.uint8_t)(unsafe.Pointer(&emptyArray[0]))
		if len(d.TreeMask) > 0 {
			mask = (*C.uint8_t)(unsafe.Pointer(&d.TreeMask[0]))
		}
	}
	if len(d.TreeMaskIndptr) > 0 {
		indptr = (*C.int64_t)(unsafe.Pointer(&d.TreeMaskIndptr[0]))
	}
	return mask, indptr
}

func cBatchDesc(d *BatchDesc) (C.go_batch_desc, *C.int64_t, error) {
	var ck ints
	g := C.go_batch_desc{
		num_seqs:                 ck.i32("number of sequences", d.numSeqs()),
		block_table_stride:       ck.i32("BlockTableStride", d.BlockTableStride),
		cross_block_table_stride: ck.i32("CrossBlockTableStride", d.CrossBlockTableStride),
		max_num_seqs:             ck.i32("MaxNumSeqs", d.MaxNumSeqs),
		max_blocks_per_seq:       ck.i32("MaxBlocksPerSeq", d.MaxBlocksPerSeq),
		max_num_tokens:           C.int64_t(d.MaxNumTokens),
		max_num_encoder_tokens:   C.int64_t(d.MaxNumEncoderTokens),
		max_seq_len:              C.int64_t(d.MaxSeqLen),
		max_tree_mask_bytes:      C.int64_t(d.MaxTreeMaskBytes),
	}
	if d.seqForm() {
		g.lens_form = C.PAGEDATTN_BATCH_LENS_SEQ
	}
	var slots *C.int64_t
	if d.SlotMapping != nil {
		if len(d.SlotMapping) == 0 {
			slots = (*C.int64_t)(unsafe.Pointer(&emptyArray[0]))
		} else {
			slots = (*C.int64_t)(unsafe.Pointer(&d.SlotMapping[0]))
		}
	}
	return g, slots, ck.err
}

func cBatchCreate(be, cache, cross unsafe.Pointer, d *BatchDesc) (unsafe.Pointer, error) {
	var e errBuf
	g, slots, err := cBatchDesc(d)
	if err != nil {
		return nil, err
	}
	var out *C.pagedattn_batch
	q, c := lensArrays(d)
	tree, treeIndptr := treeArrays(d)
	st := C.go_batch_create(&out, (*C.pagedattn_backend)(be), (*C.pagedattn_kv_cache)(cache),
		(*C.pagedattn_kv_cache)(cross), &g, q, c, i32Ptr(d.BlockTables),
		slots, i32Ptr(d.EncoderLens), i32Ptr(d.CrossBlockTables), tree, treeIndptr, e.ptr())
	return unsafe.Pointer(out), result(st, &e)
}

func cBatchUpdate(b unsafe.Pointer, d *BatchDesc) error {
	var e errBuf
	g, slots, err := cBatchDesc(d)
	if err != nil {
		return err
	}
	q, c := lensArrays(d)
	tree, treeIndptr := treeArrays(d)
	st := C.go_batch_update((*C.pagedattn_batch)(b), &g, q, c,
		i32Ptr(d.BlockTables), slots, i32Ptr(d.EncoderLens), i32Ptr(d.CrossBlockTables), tree, treeIndptr, e.ptr())
	return result(st, &e)
}

func cBatchDestroy(p unsafe.Pointer) { C.pagedattn_batch_destroy((*C.pagedattn_batch)(p)) }

func cBatchInfo(p unsafe.Pointer) (BatchInfo, error) {
	var e errBuf
	var i C.pagedattn_batch_info
	if err := result(C.go_batch_info(&i, (*C.pagedattn_batch)(p), e.ptr()), &e); err != nil {
		return BatchInfo{}, err
	}
	return BatchInfo{NumSeqs: int(i.num_seqs), NumTokens: int64(i.num_tokens),
		NumEncoderTokens: int64(i.num_encoder_tokens), NumDecodeSeqs: int(i.num_decode_seqs),
		NumPrefillSeqs: int(i.num_prefill_seqs), MaxQueryLen: int(i.max_query_len), MaxSeqLen: int64(i.max_seq_len),
		MaxNumSeqs: int(i.max_num_seqs), MaxNumTokens: int64(i.max_num_tokens),
		MaxBlocksPerSeq: int(i.max_blocks_per_seq), BlockSize: int(i.block_size),
		HostBytes: uint64(i.host_bytes), WorkspaceBytes: uint64(i.workspace_bytes),
		MaxNumEncoderTokens: int64(i.max_num_encoder_tokens), MaxSeqLenCapacity: int64(i.max_seq_len_capacity),
		MaxTreeMaskBytes: int64(i.max_tree_mask_bytes)}, nil
}

func cBatchI64(p unsafe.Pointer, which int) ([]int64, error) {
	var e errBuf
	var out unsafe.Pointer
	var n C.int64_t
	if err := result(C.go_batch_array(&out, &n, (*C.pagedattn_batch)(p), C.int(which), e.ptr()), &e); err != nil {
		return nil, err
	}
	defer C.free(out)
	res := make([]int64, int(n))
	copy(res, unsafe.Slice((*int64)(out), int(n)))
	return res, nil
}

func cBatchQueryStart(p unsafe.Pointer) ([]int32, error) {
	var e errBuf
	var out unsafe.Pointer
	var n C.int64_t
	if err := result(C.go_batch_array(&out, &n, (*C.pagedattn_batch)(p), 1, e.ptr()), &e); err != nil {
		return nil, err
	}
	defer C.free(out)
	res := make([]int32, int(n))
	copy(res, unsafe.Slice((*int32)(out), int(n)))
	return res, nil
}

// goOptions converts the options into their pointer-free C form, keeping the first int that does
// not fit in ck.
func goOptions(o *AttentionOptions, ck *ints) C.go_options {
	g := C.go_options{
		num_heads: ck.i32("NumHeads", o.NumHeads), num_kv_heads: ck.i32("NumKVHeads", o.NumKVHeads),
		head_size: ck.i32("HeadSize", o.HeadSize), sliding_window: ck.i32("SlidingWindow", o.SlidingWindow),
		attention_type: ck.i32("Type", int(o.Type)), attention_chunk: ck.i32("AttentionChunk", o.AttentionChunk),
		scale: C.float(o.Scale), soft_cap: C.float(o.SoftCap), k_scale: C.float(o.KScale),
		v_scale: C.float(o.VScale), flags: C.uint32_t(o.Flags),
	}
	if o.WriteKV {
		g.write_kv = 1
	}
	return g
}

func cForward(be, batch, cache unsafe.Pointer, layer int, o *AttentionOptions, q, k, v, out, lse *Tensor) error {
	var e errBuf
	var ck ints
	g := goOptions(o, &ck)
	ad, ap := cTensor(o.AlibiSlopes)
	sd, sp := cTensor(o.Sinks)
	khd, khp := cTensor(o.KHeadScales)
	vhd, vhp := cTensor(o.VHeadScales)
	qd, qp := cTensor(q)
	kd, kp := cTensor(k)
	vd, vp := cTensor(v)
	od, op := cTensor(out)
	ld, lp := cTensor(lse)
	l := ck.i32("layer", layer)
	if ck.err != nil {
		return ck.err
	}
	st := C.go_forward((*C.pagedattn_backend)(be), (*C.pagedattn_batch)(batch), (*C.pagedattn_kv_cache)(cache),
		l, &g, ad, ap, sd, sp, khd, khp, vhd, vhp, qd, qp, kd, kp, vd, vp, od, op, ld, lp, o.Stream, e.ptr())
	return result(st, &e)
}

func cForwardMLA(be, batch, cache unsafe.Pointer, layer int, o *AttentionOptions, qNope, qPE, out, lse *Tensor) error {
	var e errBuf
	var ck ints
	g := goOptions(o, &ck)
	ad, ap := cTensor(o.AlibiSlopes)
	sd, sp := cTensor(o.Sinks)
	khd, khp := cTensor(o.KHeadScales)
	vhd, vhp := cTensor(o.VHeadScales)
	qnd, qnp := cTensor(qNope)
	qpd, qpp := cTensor(qPE)
	od, op := cTensor(out)
	ld, lp := cTensor(lse)
	l := ck.i32("layer", layer)
	if ck.err != nil {
		return ck.err
	}
	st := C.go_forward_mla((*C.pagedattn_backend)(be), (*C.pagedattn_batch)(batch), (*C.pagedattn_kv_cache)(cache),
		l, &g, ad, ap, sd, sp, khd, khp, vhd, vhp, qnd, qnp, qpd, qpp, od, op, ld, lp, o.Stream, e.ptr())
	return result(st, &e)
}

func cMerge(be unsafe.Pointer, out, lseOut, o1, lse1, o2, lse2 *Tensor, stream unsafe.Pointer) error {
	var e errBuf
	od, op := cTensor(out)
	lod, lop := cTensor(lseOut)
	d1, p1 := cTensor(o1)
	l1d, l1p := cTensor(lse1)
	d2, p2 := cTensor(o2)
	l2d, l2p := cTensor(lse2)
	st := C.go_merge((*C.pagedattn_backend)(be), od, op, lod, lop, d1, p1, l1d, l1p, d2, p2, l2d, l2p, stream, e.ptr())
	return result(st, &e)
}
