/* lib/api_attention.cpp — entry points of attention.h: forward (options, handles, attention-type
 * rules, tensors and capabilities checked, then one backend op) and merge_states. */
#include <algorithm>
#include <cmath>
#include <mutex>

#include "handles.h"
#include "validate.h"

namespace pa {

namespace {

const char* type_name(pagedattn_attention_type t) {
  switch (t) {
    case PAGEDATTN_ATTENTION_DECODER: return "decoder";
    case PAGEDATTN_ATTENTION_ENCODER: return "encoder";
    case PAGEDATTN_ATTENTION_ENCODER_ONLY: return "encoder-only";
    case PAGEDATTN_ATTENTION_CROSS: return "cross";
  }
  return "unknown";
}

void check_dtype_supported(const pagedattn_backend* b, pagedattn_dtype dt, const char* name) {
  if (!(b->caps.dtypes & PAGEDATTN_DTYPE_BIT(dt)))
    fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: %s dtype %s is not supported (supported: %s)",
         backend_name(b), name, dtype_name(dt), dtype_mask_names(b->caps.dtypes).c_str());
}

void check_finite_positive(float x, const char* name) {
  if (!std::isfinite(x) || !(x > 0.0f))
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->%s = %g must be finite and > 0", name,
         static_cast<double>(x));
}

/* A cache used by a forward must be the one (geometry) the batch was planned with. */
void check_planned_geometry(const pagedattn_kv_cache* c, const Geometry& g, const char* what) {
  if (!g.present)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "the batch was planned without a %s", what);
  if (c->desc.block_size != g.block_size)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "cache block_size %d != %d of the %s the batch was planned with", c->desc.block_size,
         g.block_size, what);
  if (c->desc.num_blocks != g.num_blocks)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "cache num_blocks %d != %d of the %s the batch was planned with", c->desc.num_blocks,
         g.num_blocks, what);
}

/* Two sequences' computed slots collide where their positions ran past what their tables
 * hold: the usual sign of vLLM's seq_lens (context + new tokens) passed as context_lens, which
 * puts every token query_len positions late, into the table's padding entries (often block 0).
 * True when the slots were computed, the rows are of two sequences and both have
 * context_len >= query_len (as a seq_len passed there would). */
constexpr const char* kSeqLensHint =
    "; these rows are of two sequences whose context_lens are at least their query_lens: if "
    "context_lens holds vLLM's seq_lens (cached + new tokens), pass them as desc->seq_lens with "
    "query_start_loc and lens_form = PAGEDATTN_BATCH_LENS_SEQ, or subtract query_lens";

bool looks_like_seq_lens(const Plan& p, const int64_t rep[2]) {
  if (p.caller_slots) return false;
  int32_t seq[2];
  for (int k = 0; k < 2; ++k) {
    const auto it = std::upper_bound(p.query_start.begin(), p.query_start.end(),
                                     static_cast<int32_t>(rep[k]));
    seq[k] = static_cast<int32_t>(it - p.query_start.begin()) - 1;
    if (seq[k] < 0 || seq[k] >= p.num_seqs) return false;
    if (p.context_lens[seq[k]] < p.query_lens[seq[k]]) return false;
  }
  return seq[0] != seq[1];
}

/* The backend and batch of a forward, checked and matched. */
pagedattn_backend* check_forward_handles(pagedattn_backend* backend, const pagedattn_batch* batch,
                                         const pagedattn_batch** h) {
  pagedattn_backend* b = check_backend(backend, "backend");
  *h = check_batch(batch, "batch");
  if ((*h)->backend != b)
    fail(PAGEDATTN_ERROR_INVALID_HANDLE, "batch belongs to another backend (%s)",
         backend_name((*h)->backend));
  return b;
}

/* The option values every forward checks alike (the head counts' rules differ per kind). */
void check_option_values(const pagedattn_attention_options& o) {
  if (o.flags != 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->flags = 0x%x, must be 0", o.flags);
  if (o.num_heads <= 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->num_heads = %d <= 0", o.num_heads);
  if (o.head_size <= 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->head_size = %d <= 0", o.head_size);
  if (!std::isfinite(o.scale) || o.scale < 0.0f)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->scale = %g must be finite and >= 0",
         static_cast<double>(o.scale));
  if (!std::isfinite(o.soft_cap) || o.soft_cap < 0.0f)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->soft_cap = %g must be finite and >= 0",
         static_cast<double>(o.soft_cap));
  if (o.sliding_window < 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->sliding_window = %d < 0", o.sliding_window);
  if (o.attention_chunk < 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->attention_chunk = %d < 0", o.attention_chunk);
}

}  // namespace

}  // namespace pa

extern "C" {

PAGEDATTN_API pagedattn_status pagedattn_attention_options_init(
    pagedattn_attention_options* opts) {
  return pagedattn_attention_options_init_sized(
      opts, static_cast<uint32_t>(pa::first_size<pagedattn_attention_options>()));
}

PAGEDATTN_API pagedattn_status pagedattn_attention_options_init_sized(
    pagedattn_attention_options* opts, uint32_t size) {
  return pa::guard([&] {
    if (!opts) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "opts is NULL");
    pa::check_struct_size(size, pa::first_size<pagedattn_attention_options>(), sizeof *opts,
                          "opts");
    /* Every field past the 0.1 layout defaults to zero, so only `size` bytes are written. */
    pagedattn_attention_options d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = size;
    d.attention_type = PAGEDATTN_ATTENTION_DECODER;
    d.write_kv = 1;
    d.k_scale = 1.0f;
    d.v_scale = 1.0f;
    std::memcpy(opts, &d, size);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_forward(pagedattn_backend* backend,
                                                const pagedattn_batch* batch,
                                                pagedattn_kv_cache* cache, int32_t layer,
                                                const pagedattn_attention_options* opts,
                                                const pagedattn_tensor* q,
                                                const pagedattn_tensor* k,
                                                const pagedattn_tensor* v,
                                                pagedattn_tensor* out, pagedattn_tensor* lse,
                                                void* stream) {
  return pa::guard([&] {
    const pagedattn_batch* h = nullptr;
    pagedattn_backend* b = pa::check_forward_handles(backend, batch, &h);
    const pagedattn_attention_options o = pa::read_struct(opts, "opts");
    const int32_t raw_type = pa::raw_enum(o.attention_type);
    if (raw_type < PAGEDATTN_ATTENTION_DECODER || raw_type > PAGEDATTN_ATTENTION_CROSS)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->attention_type = %d is not valid",
               raw_type);
    const pagedattn_attention_type type = static_cast<pagedattn_attention_type>(raw_type);
    const bool decoder = type == PAGEDATTN_ATTENTION_DECODER;
    const bool encoder_like =
        type == PAGEDATTN_ATTENTION_ENCODER || type == PAGEDATTN_ATTENTION_ENCODER_ONLY;
    const bool cross = type == PAGEDATTN_ATTENTION_CROSS;
    pa::check_option_values(o);
    if (o.num_kv_heads <= 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->num_kv_heads = %d <= 0", o.num_kv_heads);
    if (o.num_heads % o.num_kv_heads != 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->num_heads %d is not a multiple of opts->num_kv_heads %d", o.num_heads,
               o.num_kv_heads);
    if (o.write_kv != 0 && o.write_kv != 1)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->write_kv = %d is not 0 or 1", o.write_kv);
    pa::check_finite_positive(o.k_scale, "k_scale");
    pa::check_finite_positive(o.v_scale, "v_scale");
    if (!decoder && o.alibi_slopes)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->alibi_slopes is set but ALiBi applies to decoder attention only (type %s)",
               pa::type_name(type));
    if (!decoder && o.sliding_window > 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->sliding_window = %d but a window applies to decoder attention only (type "
               "%s)",
               o.sliding_window, pa::type_name(type));
    if (!decoder && o.attention_chunk > 0)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->attention_chunk = %d but chunked local attention applies to decoder "
               "attention only (type %s)",
               o.attention_chunk, pa::type_name(type));
    if (type == PAGEDATTN_ATTENTION_ENCODER_ONLY && o.write_kv)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->write_kv = 1 with encoder-only attention (it has no cache)");
    const pa_batch& pb = h->pb;
    /* A batch planned for tree masks (this step's or an update's, which a captured graph would
     * replay) takes plain decoder attention only: the tokens of a tree have no positions that
     * ALiBi, a window or a chunk could use. */
    const bool tree = h->plan.any_tree || h->caps.tree_mask_bytes > 0;
    if (tree) {
      const char* what = !decoder ? pa::type_name(type)
                         : o.alibi_slopes ? "ALiBi"
                         : o.sliding_window > 0 ? "a sliding window"
                         : o.attention_chunk > 0 ? "an attention chunk"
                                                 : nullptr;
      if (what)
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
                 "the batch is planned with tree masks (speculative decoding), which take plain "
                 "decoder attention: %s%s is not supported with them",
                 what, !decoder ? " attention" : "");
    }
    if (encoder_like && !pb.all_context_zero)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "%s attention needs every context_len == 0 in the batch", pa::type_name(type));

    /* The cache. */
    const bool uses_cache = type != PAGEDATTN_ATTENTION_ENCODER_ONLY;
    pagedattn_kv_cache* c = nullptr;
    if (uses_cache) {
      c = pa::check_cache(cache, "cache");
      if (c->backend != b)
        pa::fail(PAGEDATTN_ERROR_INVALID_HANDLE, "cache belongs to another backend (%s)",
                 pa::backend_name(c->backend));
      if (layer < 0 || layer >= c->desc.num_layers)
        pa::fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = %d is not in [0, %d)", layer,
                 c->desc.num_layers);
      if (c->pc.host)
        pa::fail(PAGEDATTN_ERROR_WRONG_DEVICE,
                 "cache is a host cache (%s); attention needs it on %s",
                 pa::device_str(c->pc.device).c_str(), pa::device_str(b->caps.device).c_str());
      if (c->pc.latent)
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
                 "cache is a latent (MLA) cache: attend over it with pagedattn_forward_mla");
      if (cross) {
        if (!pb.encoder_lens)
          pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
                   "cross attention needs a batch planned with encoder_lens");
        pa::check_planned_geometry(c, h->cross, "cross cache");
      } else {
        pa::check_planned_geometry(c, h->self, "cache");
      }
      if (o.head_size != c->desc.head_size)
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->head_size %d != cache head_size %d",
                 o.head_size, c->desc.head_size);
      if (o.num_kv_heads != c->desc.num_kv_heads)
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
                 "opts->num_kv_heads %d != cache num_kv_heads %d", o.num_kv_heads,
                 c->desc.num_kv_heads);
    }

    /* Tensors. */
    const int64_t T = pb.num_tokens;
    const int32_t H = o.num_heads, Hkv = o.num_kv_heads, D = o.head_size;
    const pagedattn_device& dev = b->caps.device;
    const pagedattn_dtype dt = pa::tensor_float_dtype(q, "q");
    pa_forward_args a;
    std::memset(&a, 0, sizeof a);
    /* q/k/v/out/lse may have more rows than the batch (a token dimension padded for a captured
     * graph): the backends get the batch's rows only, so padding rows are neither read nor
     * written. */
    a.q = pa::resolve3(q, "q", T, H, D, dt, dev, true);
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    const pagedattn_dtype odt = pa::tensor_float_dtype(out, "out");
    if (odt != dt)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "q: dtype %s != out dtype %s", pa::dtype_name(dt),
               pa::dtype_name(odt));
    a.out = pa::resolve3(out, "out", T, H, D, dt, dev, true);
    const int64_t kv_rows = cross ? pb.num_encoder_tokens : T;
    const bool need_kv = encoder_like || (o.write_kv && kv_rows > 0);
    if (need_kv) {
      const char* why = encoder_like ? (o.write_kv ? "write_kv and encoder attention"
                                                   : "encoder attention, which reads k/v directly")
                                     : "write_kv";
      if (!k) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "k is NULL (needed by %s)", why);
      if (!v) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "v is NULL (needed by %s)", why);
      const pagedattn_dtype kdt = pa::tensor_float_dtype(k, "k");
      if (kdt != dt)
        pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "k: dtype %s != q dtype %s", pa::dtype_name(kdt),
                 pa::dtype_name(dt));
      const pagedattn_dtype vdt = pa::tensor_float_dtype(v, "v");
      if (vdt != dt)
        pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "v: dtype %s != q dtype %s", pa::dtype_name(vdt),
                 pa::dtype_name(dt));
      a.k = pa::resolve3(k, "k", kv_rows, Hkv, D, dt, dev, true);
      a.v = pa::resolve3(v, "v", kv_rows, Hkv, D, dt, dev, true);
    } else {
      a.k.dtype = a.v.dtype = dt;
      a.k.heads = a.v.heads = Hkv;
      a.k.dim = a.v.dim = D;
    }
    if (lse) a.lse = pa::resolve_lse(lse, "lse", T, H, dev, true);
    if (c && o.write_kv && kv_rows > 0) {
      /* Two rows of one write into one slot: which would land is not defined, so refuse. */
      const int64_t* rep = cross ? h->plan.cross_slot_repeat : h->plan.slot_repeat;
      if (rep[0] >= 0) {
        const std::vector<int64_t>& slots = cross ? h->plan.cross_slots : h->plan.slots;
        const int64_t s = slots[static_cast<size_t>(rep[0])];
        const int32_t bs = c->desc.block_size;
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
                 "write_kv: %s rows %lld and %lld of this batch both write slot %lld (block "
                 "%lld, offset %lld) of the %scache; a call writes each slot at most once "
                 "(block tables that share a block both write into, or a repeated slot_mapping "
                 "entry)%s",
                 cross ? "encoder k/v" : "token", static_cast<long long>(rep[0]),
                 static_cast<long long>(rep[1]), static_cast<long long>(s),
                 static_cast<long long>(s / bs), static_cast<long long>(s % bs),
                 cross ? "cross " : "",
                 !cross && pa::looks_like_seq_lens(h->plan, rep) ? pa::kSeqLensHint : "");
      }
    }
    if (c) {
      const pagedattn_dtype cdt = c->desc.dtype;
      const bool fp8 = cdt == PAGEDATTN_DTYPE_FP8_E4M3 || cdt == PAGEDATTN_DTYPE_FP8_E5M2;
      if (!fp8 && cdt != dt)
        pa::fail(PAGEDATTN_ERROR_UNSUPPORTED,
                 "q dtype %s with a %s cache is not supported (the cache must be %s or fp8)",
                 pa::dtype_name(dt), pa::dtype_name(cdt), pa::dtype_name(dt));
    }
    if (o.alibi_slopes)
      a.alibi_slopes =
          pa::resolve_vec_f32(o.alibi_slopes, "opts->alibi_slopes", H, "num_heads", dev);
    if (o.sinks) a.sinks = pa::resolve_vec_f32(o.sinks, "opts->sinks", H, "num_heads", dev);
    /* Per-head scales are checked whatever the cache, but only an fp8 cache uses them. */
    const float* khs = o.k_head_scales ? pa::resolve_vec_f32(o.k_head_scales,
                                                             "opts->k_head_scales", Hkv,
                                                             "num_kv_heads", dev, true)
                                       : nullptr;
    const float* vhs = o.v_head_scales ? pa::resolve_vec_f32(o.v_head_scales,
                                                             "opts->v_head_scales", Hkv,
                                                             "num_kv_heads", dev, true)
                                       : nullptr;
    if (c && (c->desc.dtype == PAGEDATTN_DTYPE_FP8_E4M3 ||
              c->desc.dtype == PAGEDATTN_DTYPE_FP8_E5M2)) {
      a.k_head_scales = khs;
      a.v_head_scales = vhs;
    }

    /* What the backend can do. */
    pa::check_dtype_supported(b, dt, "q");
    if (o.soft_cap > 0.0f) pa::need_feature(b, PAGEDATTN_FEATURE_SOFT_CAP, "soft cap");
    if (o.alibi_slopes) pa::need_feature(b, PAGEDATTN_FEATURE_ALIBI, "ALiBi");
    if (o.sliding_window > 0)
      pa::need_feature(b, PAGEDATTN_FEATURE_SLIDING_WINDOW, "sliding window");
    if (o.sinks) pa::need_feature(b, PAGEDATTN_FEATURE_SINKS, "attention sinks");
    if (tree) pa::need_feature(b, PAGEDATTN_FEATURE_TREE_MASK, "tree masks");
    if (o.attention_chunk > 0)
      pa::need_feature(b, PAGEDATTN_FEATURE_CHUNKED_LOCAL, "chunked local attention");
    if (o.k_head_scales || o.v_head_scales)
      pa::need_feature(b, PAGEDATTN_FEATURE_HEAD_SCALES, "per-head fp8 scales");
    if (cross) pa::need_feature(b, PAGEDATTN_FEATURE_CROSS_ATTENTION, "cross attention");
    if (encoder_like) pa::need_feature(b, PAGEDATTN_FEATURE_ENCODER, "encoder attention");
    if (lse) pa::need_feature(b, PAGEDATTN_FEATURE_LSE, "log-sum-exp output");
    if (decoder && h->plan.has_chunked_prefill)
      pa::need_feature(b, PAGEDATTN_FEATURE_CHUNKED_PREFILL,
                       "chunked prefill (query_len > 1 with context_len > 0)");
    if (c) pa::check_cache_caps(c->desc, b->caps);

    a.batch = &pb;
    a.cache = c ? &c->pc : nullptr;
    a.layer = c ? layer : 0;
    a.num_heads = H;
    a.num_kv_heads = Hkv;
    a.head_size = D;
    a.scale = o.scale > 0.0f ? o.scale : 1.0f / std::sqrt(static_cast<float>(D));
    a.soft_cap = o.soft_cap;
    a.sliding_window = o.sliding_window;
    a.attention_chunk = o.attention_chunk;
    a.attention_type = type;
    a.write_kv = o.write_kv;
    a.k_scale = o.k_scale;
    a.v_scale = o.v_scale;
    a.stream = stream;
    /* No rows and nothing to store: there is no work for the backend. */
    if (T == 0 && !(o.write_kv && kv_rows > 0)) return;
    std::lock_guard<std::mutex> lock(h->in_use);
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->forward(b->state, &a, msg), pa::backend_name(b), "forward", msg);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_forward_mla(pagedattn_backend* backend,
                                                    const pagedattn_batch* batch,
                                                    pagedattn_kv_cache* cache, int32_t layer,
                                                    const pagedattn_attention_options* opts,
                                                    const pagedattn_tensor* q_nope,
                                                    const pagedattn_tensor* q_pe,
                                                    pagedattn_tensor* out, pagedattn_tensor* lse,
                                                    void* stream) {
  return pa::guard([&] {
    const pagedattn_batch* h = nullptr;
    pagedattn_backend* b = pa::check_forward_handles(backend, batch, &h);
    const pagedattn_attention_options o = pa::read_struct(opts, "opts");
    if (pa::raw_enum(o.attention_type) != PAGEDATTN_ATTENTION_DECODER)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->attention_type = %d: MLA attention is decoder attention (type 0) only",
               pa::raw_enum(o.attention_type));
    pa::check_option_values(o);
    if (o.num_kv_heads != 1)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->num_kv_heads = %d: MLA reads one latent row per token, num_kv_heads 1",
               o.num_kv_heads);
    pa::check_finite_positive(o.k_scale, "k_scale");
    if (o.k_head_scales || o.v_head_scales)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "opts->%s_head_scales is set: a latent cache has one head; use opts->k_scale",
               o.k_head_scales ? "k" : "v");
    const bool tree = h->plan.any_tree || h->caps.tree_mask_bytes > 0;
    if (tree) {
      const char* what = o.alibi_slopes           ? "ALiBi"
                         : o.sliding_window > 0   ? "a sliding window"
                         : o.attention_chunk > 0  ? "an attention chunk"
                                                  : nullptr;
      if (what)
        pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
                 "the batch is planned with tree masks (speculative decoding), which take plain "
                 "decoder attention: %s is not supported with them",
                 what);
    }

    /* The cache. */
    pagedattn_kv_cache* c = pa::check_cache(cache, "cache");
    if (c->backend != b)
      pa::fail(PAGEDATTN_ERROR_INVALID_HANDLE, "cache belongs to another backend (%s)",
               pa::backend_name(c->backend));
    if (layer < 0 || layer >= c->desc.num_layers)
      pa::fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "layer = %d is not in [0, %d)", layer,
               c->desc.num_layers);
    if (c->pc.host)
      pa::fail(PAGEDATTN_ERROR_WRONG_DEVICE, "cache is a host cache (%s); attention needs it on %s",
               pa::device_str(c->pc.device).c_str(), pa::device_str(b->caps.device).c_str());
    if (!c->pc.latent)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "cache is not a latent (MLA) cache (PAGEDATTN_KV_CACHE_LATENT): attend over it "
               "with pagedattn_forward");
    pa::check_planned_geometry(c, h->self, "cache");
    if (o.head_size != c->desc.head_size)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "opts->head_size %d != cache head_size %d",
               o.head_size, c->desc.head_size);

    /* Tensors: out's last extent is the value size R; q_nope is [T, H, R] beside q_pe, or whole
     * rows. */
    const pa_batch& pb = h->pb;
    const int64_t T = pb.num_tokens;
    const int32_t H = o.num_heads, D = o.head_size;
    const pagedattn_device& dev = b->caps.device;
    const pagedattn_dtype dt = pa::tensor_float_dtype(q_nope, "q_nope");
    if (!out) pa::fail(PAGEDATTN_ERROR_NULL_POINTER, "out is NULL");
    const pagedattn_dtype odt = pa::tensor_float_dtype(out, "out");
    if (odt != dt)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "q_nope: dtype %s != out dtype %s",
               pa::dtype_name(dt), pa::dtype_name(odt));
    if (out->ndim != 3 || !out->shape)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "out: ndim %d != 3 (expected [T, H, R])", out->ndim);
    const int64_t R = out->shape[2];
    if (R < 1 || R >= D)
      pa::fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "out: value size (last extent) %lld is not in [1, head_size %d)",
               static_cast<long long>(R), D);
    pa_forward_args a;
    std::memset(&a, 0, sizeof a);
    a.out = pa::resolve3(out, "out", T, H, static_cast<int32_t>(R), dt, dev, true);
    a.q = pa::resolve3(q_nope, "q_nope", T, H, q_pe ? static_cast<int32_t>(R) : D, dt, dev,
                       true);
    if (q_pe) {
      const pagedattn_dtype pdt = pa::tensor_float_dtype(q_pe, "q_pe");
      if (pdt != dt)
        pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "q_pe: dtype %s != q_nope dtype %s",
                 pa::dtype_name(pdt), pa::dtype_name(dt));
      a.q_pe = pa::resolve3(q_pe, "q_pe", T, H, D - static_cast<int32_t>(R), dt, dev, true);
    } else {
      a.q_pe.dtype = dt;
      a.q_pe.heads = H;
      a.q_pe.dim = D - static_cast<int32_t>(R);
    }
    a.k.dtype = a.v.dtype = dt;
    a.k.heads = a.v.heads = 1;
    a.k.dim = a.v.dim = D;
    if (lse) a.lse = pa::resolve_lse(lse, "lse", T, H, dev, true);
    const pagedattn_dtype cdt = c->desc.dtype;
    const bool fp8 = cdt == PAGEDATTN_DTYPE_FP8_E4M3 || cdt == PAGEDATTN_DTYPE_FP8_E5M2;
    if (!fp8 && cdt != dt)
      pa::fail(PAGEDATTN_ERROR_UNSUPPORTED,
               "q dtype %s with a %s cache is not supported (the cache must be %s or fp8)",
               pa::dtype_name(dt), pa::dtype_name(cdt), pa::dtype_name(dt));
    if (o.alibi_slopes)
      a.alibi_slopes =
          pa::resolve_vec_f32(o.alibi_slopes, "opts->alibi_slopes", H, "num_heads", dev);
    if (o.sinks) a.sinks = pa::resolve_vec_f32(o.sinks, "opts->sinks", H, "num_heads", dev);

    /* What the backend can do. */
    pa::need_feature(b, PAGEDATTN_FEATURE_MLA, "multi-head latent attention");
    pa::check_dtype_supported(b, dt, "q_nope");
    if (o.soft_cap > 0.0f) pa::need_feature(b, PAGEDATTN_FEATURE_SOFT_CAP, "soft cap");
    if (o.alibi_slopes) pa::need_feature(b, PAGEDATTN_FEATURE_ALIBI, "ALiBi");
    if (o.sliding_window > 0)
      pa::need_feature(b, PAGEDATTN_FEATURE_SLIDING_WINDOW, "sliding window");
    if (o.sinks) pa::need_feature(b, PAGEDATTN_FEATURE_SINKS, "attention sinks");
    if (tree) pa::need_feature(b, PAGEDATTN_FEATURE_TREE_MASK, "tree masks");
    if (o.attention_chunk > 0)
      pa::need_feature(b, PAGEDATTN_FEATURE_CHUNKED_LOCAL, "chunked local attention");
    if (lse) pa::need_feature(b, PAGEDATTN_FEATURE_LSE, "log-sum-exp output");
    if (h->plan.has_chunked_prefill)
      pa::need_feature(b, PAGEDATTN_FEATURE_CHUNKED_PREFILL,
                       "chunked prefill (query_len > 1 with context_len > 0)");
    pa::check_cache_caps(c->desc, b->caps);
    if (!b->ops->forward_mla)
      pa::fail(PAGEDATTN_ERROR_UNSUPPORTED, "%s: multi-head latent attention is not supported",
               pa::backend_name(b));

    a.batch = &pb;
    a.cache = &c->pc;
    a.layer = layer;
    a.num_heads = H;
    a.num_kv_heads = 1;
    a.head_size = D;
    a.value_size = static_cast<int32_t>(R);
    a.scale = o.scale > 0.0f ? o.scale : 1.0f / std::sqrt(static_cast<float>(D));
    a.soft_cap = o.soft_cap;
    a.sliding_window = o.sliding_window;
    a.attention_chunk = o.attention_chunk;
    a.attention_type = PAGEDATTN_ATTENTION_DECODER;
    a.write_kv = 0;
    a.k_scale = fp8 ? o.k_scale : 1.0f;
    a.v_scale = a.k_scale;
    a.stream = stream;
    if (T == 0) return; /* no rows: no work for the backend */
    std::lock_guard<std::mutex> lock(h->in_use);
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->forward_mla(b->state, &a, msg), pa::backend_name(b), "forward_mla", msg);
  });
}

PAGEDATTN_API pagedattn_status pagedattn_merge_states(pagedattn_backend* backend,
                                                     pagedattn_tensor* out,
                                                     pagedattn_tensor* lse_out,
                                                     const pagedattn_tensor* o1,
                                                     const pagedattn_tensor* lse1,
                                                     const pagedattn_tensor* o2,
                                                     const pagedattn_tensor* lse2,
                                                     void* stream) {
  return pa::guard([&] {
    pagedattn_backend* b = pa::check_backend(backend, "backend");
    const pagedattn_device& dev = b->caps.device;
    const pagedattn_dtype dt = pa::tensor_float_dtype(o1, "o1");
    if (o1->ndim != 3 || !o1->shape)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "o1: ndim %d != 3 (expected [T, H, D])", o1->ndim);
    const int64_t T = o1->shape[0];
    const int64_t H = o1->shape[1], D = o1->shape[2];
    if (T < 0 || H <= 0 || D <= 0 || H > INT32_MAX || D > INT32_MAX)
      pa::fail(PAGEDATTN_ERROR_BAD_TENSOR, "o1: shape [%lld, %lld, %lld] is not a valid [T, H, D]",
               static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(D));
    pa_merge_args a;
    std::memset(&a, 0, sizeof a);
    a.o1 = pa::resolve3(o1, "o1", T, static_cast<int32_t>(H), static_cast<int32_t>(D), dt, dev);
    a.o2 = pa::resolve3(o2, "o2", T, static_cast<int32_t>(H), static_cast<int32_t>(D), dt, dev);
    a.out = pa::resolve3(out, "out", T, static_cast<int32_t>(H), static_cast<int32_t>(D), dt, dev);
    a.lse1 = pa::resolve_lse(lse1, "lse1", T, static_cast<int32_t>(H), dev);
    a.lse2 = pa::resolve_lse(lse2, "lse2", T, static_cast<int32_t>(H), dev);
    if (lse_out) a.lse_out = pa::resolve_lse(lse_out, "lse_out", T, static_cast<int32_t>(H), dev);
    pa::check_dtype_supported(b, dt, "o1");
    pa::need_feature(b, PAGEDATTN_FEATURE_MERGE_STATES, "merge_states");
    a.stream = stream;
    char msg[PA_MSG_LEN] = {0};
    pa::check_op(b->ops->merge_states(b->state, &a, msg), pa::backend_name(b), "merge_states", msg);
  });
}

}  // extern "C"
