/* lib/planner.cpp — batch planning: one validation pass over the caller's lengths, block tables
 * and slot mapping (messages name the index and value), then the fill pass that computes
 * query_start, the copied tables (at the capacity width), the slot mappings and the summary.
 * Nothing is written into `out` until every check has passed. */
#include <algorithm>
#include <climits>

#include "planner.h"

namespace pa {

namespace {

/* a / b rounded up, for a >= 0, b > 0, without forming a + b - 1 (a may be INT64_MAX). */
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

/* Checks the first `need` entries of table row i. */
void check_row(const int32_t* row, int32_t i, int64_t need, int32_t num_blocks, const char* what) {
  for (int64_t j = 0; j < need; ++j) {
    const int32_t id = row[j];
    if (id < 0)
      fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "%s[%d][%lld] = %d < 0", what, i,
           static_cast<long long>(j), id);
    if (id >= num_blocks)
      fail(PAGEDATTN_ERROR_OUT_OF_RANGE, "%s[%d][%lld] = %d >= num_blocks %d", what, i,
           static_cast<long long>(j), id, num_blocks);
  }
}

/* Create: a capacity field of desc must cover the batch; 0 picks `dflt` (never below
 * `actual`). */
int64_t pick_cap(int64_t given, int64_t actual, int64_t dflt, const char* field) {
  if (given < 0) fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->%s = %lld < 0", field,
                      static_cast<long long>(given));
  if (given == 0) return std::max(actual, dflt);
  if (given < actual)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->%s = %lld < %lld needed by this batch", field,
         static_cast<long long>(given), static_cast<long long>(actual));
  return given;
}

/* Update: the batch must fit the capacities planned at create. */
/* rep = the two rows of the first slot (in slot order) that two rows share; -1s if none.
 * Padding rows (-1) share nothing. */
void find_slot_repeat(const std::vector<int64_t>& slots, int64_t rep[2]) {
  rep[0] = rep[1] = -1;
  std::vector<int64_t> order;
  order.reserve(slots.size());
  for (size_t t = 0; t < slots.size(); ++t)
    if (slots[t] >= 0) order.push_back(static_cast<int64_t>(t));
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return slots[a] != slots[b] ? slots[a] < slots[b] : a < b;
  });
  for (size_t k = 1; k < order.size(); ++k)
    if (slots[order[k]] == slots[order[k - 1]]) {
      rep[0] = order[k - 1];
      rep[1] = order[k];
      return;
    }
}

void check_cap(int64_t actual, int64_t cap, const char* what, const char* field) {
  if (actual > cap)
    fail(PAGEDATTN_ERROR_CAPACITY, "%s %lld > %s %lld the batch was planned for", what,
         static_cast<long long>(actual), field, static_cast<long long>(cap));
}

int32_t self_stride(const PlanCaps& caps, const Geometry& self) {
  return self.present ? std::max<int32_t>(1, caps.blocks_per_seq) : 0;
}

/* Cross table width for max_seq_len: plan() refuses capacities where it exceeds int32. */
int32_t cross_stride(const PlanCaps& caps, const Geometry& cross) {
  if (!cross.present) return 0;
  return static_cast<int32_t>(std::max<int64_t>(1, ceil_div(caps.seq_len, cross.block_size)));
}

}  // namespace

uint64_t plan_host_bytes(const PlanCaps& caps, const Geometry& self, const Geometry& cross) {
  const uint64_t seqs = static_cast<uint64_t>(caps.num_seqs);
  /* query_lens, context_lens, query_start (+1), self tables; slots (int64) */
  uint64_t total = 0, t = 0;
  bool ovf = __builtin_mul_overflow(seqs, 4ull * (3 + static_cast<uint64_t>(self_stride(caps, self))),
                                    &total);
  ovf = ovf || __builtin_add_overflow(total, 4ull, &total);
  ovf = ovf || __builtin_mul_overflow(static_cast<uint64_t>(caps.num_tokens), 8ull, &t) ||
        __builtin_add_overflow(total, t, &total);
  if (cross.present) {
    /* encoder_lens, cross tables; cross slots (int64) */
    ovf = ovf ||
          __builtin_mul_overflow(seqs, 4ull * (1 + static_cast<uint64_t>(cross_stride(caps, cross))),
                                 &t) ||
          __builtin_add_overflow(total, t, &total);
    ovf = ovf || __builtin_mul_overflow(static_cast<uint64_t>(caps.num_encoder_tokens), 8ull, &t) ||
          __builtin_add_overflow(total, t, &total);
  }
  /* tree masks and their indptr */
  if (caps.tree_mask_bytes > 0)
    ovf = ovf || __builtin_add_overflow(total, static_cast<uint64_t>(caps.tree_mask_bytes), &total) ||
          __builtin_mul_overflow(seqs + 1, 8ull, &t) || __builtin_add_overflow(total, t, &total);
  return ovf ? UINT64_MAX : total;
}

namespace {

/* The SEQ form (seq_lens + query_start_loc) turned into the query and context lengths the rest
 * of planning reads; the CONTEXT form's arrays are checked to be the only ones set. */
void read_lens_form(const pagedattn_batch_desc& d, std::vector<int32_t>& qlens,
                    std::vector<int32_t>& ctxs, const int32_t** q_out, const int32_t** c_out) {
  const int32_t n = d.num_seqs;
  const int32_t form = raw_enum(d.lens_form);
  *q_out = d.query_lens;
  *c_out = d.context_lens;
  if (form == PAGEDATTN_BATCH_LENS_CONTEXT) {
    if (d.seq_lens || d.query_start_loc)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "desc->%s is set but desc->lens_form is PAGEDATTN_BATCH_LENS_CONTEXT (query_lens + "
           "context_lens); set lens_form = PAGEDATTN_BATCH_LENS_SEQ to pass seq_lens with "
           "query_start_loc",
           d.seq_lens ? "seq_lens" : "query_start_loc");
    if (n > 0 && !d.query_lens)
      fail(PAGEDATTN_ERROR_NULL_POINTER, "desc->query_lens is NULL (num_seqs = %d)", n);
    if (n > 0 && !d.context_lens)
      fail(PAGEDATTN_ERROR_NULL_POINTER, "desc->context_lens is NULL (num_seqs = %d)", n);
    return;
  }
  if (form != PAGEDATTN_BATCH_LENS_SEQ)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->lens_form = %d is not PAGEDATTN_BATCH_LENS_CONTEXT (0) or "
         "PAGEDATTN_BATCH_LENS_SEQ (1)",
         form);
  if (d.query_lens || d.context_lens)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->%s is set but desc->lens_form is PAGEDATTN_BATCH_LENS_SEQ (seq_lens + "
         "query_start_loc); pass one form only",
         d.query_lens ? "query_lens" : "context_lens");
  if (n > 0 && !d.seq_lens)
    fail(PAGEDATTN_ERROR_NULL_POINTER, "desc->seq_lens is NULL (num_seqs = %d)", n);
  if (n > 0 && !d.query_start_loc)
    fail(PAGEDATTN_ERROR_NULL_POINTER,
         "desc->query_start_loc is NULL (num_seqs = %d; it has num_seqs + 1 entries)", n);
  qlens.resize(static_cast<size_t>(n));
  ctxs.resize(static_cast<size_t>(n));
  if (n == 0) return;
  if (d.query_start_loc[0] != 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
         "desc->query_start_loc[0] = %d, must be 0 (the first sequence starts at row 0)",
         d.query_start_loc[0]);
  for (int32_t i = 0; i < n; ++i) {
    const int64_t q =
        static_cast<int64_t>(d.query_start_loc[i + 1]) - d.query_start_loc[i];
    if (q < 0)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "desc->query_start_loc[%d] = %d < query_start_loc[%d] = %d: sequence %d would have "
           "a negative query length",
           i + 1, d.query_start_loc[i + 1], i, d.query_start_loc[i], i);
    const int32_t sl = d.seq_lens[i];
    if (sl < q)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "desc->seq_lens[%d] = %d < %lld, the query length of sequence %d (query_start_loc[%d] "
           "- query_start_loc[%d]): seq_lens counts the cached tokens and this step's",
           i, sl, static_cast<long long>(q), i, i + 1, i);
    qlens[static_cast<size_t>(i)] = static_cast<int32_t>(q);
    ctxs[static_cast<size_t>(i)] = static_cast<int32_t>(sl - q);
  }
  *q_out = qlens.data();
  *c_out = ctxs.data();
}

/* Validates the tree masks of a batch (batch.h, docs/semantics.md 4.7); returns the bytes they
 * use (tree_mask_indptr[n]), or -1 without masks. */
int64_t check_tree_masks(const pagedattn_batch_desc& d, int32_t n) {
  if (!d.tree_mask && !d.tree_mask_indptr) return -1;
  if (!d.tree_mask_indptr)
    fail(PAGEDATTN_ERROR_NULL_POINTER, "desc->tree_mask is set but desc->tree_mask_indptr is NULL");
  const int64_t* ip = d.tree_mask_indptr;
  if (ip[0] != 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->tree_mask_indptr[0] = %lld, must be 0",
         static_cast<long long>(ip[0]));
  for (int32_t i = 0; i < n; ++i) {
    if (ip[i + 1] < ip[i])
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "desc->tree_mask_indptr[%d] = %lld < tree_mask_indptr[%d] = %lld", i + 1,
           static_cast<long long>(ip[i + 1]), i, static_cast<long long>(ip[i]));
    if (ip[i + 1] == ip[i]) continue;  /* the causal rule */
    const int64_t q = d.query_lens[i];
    const int64_t need = ceil_div(q * q, 8);
    if (ip[i + 1] - ip[i] < need)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "sequence %d's tree mask has %lld bytes (tree_mask_indptr[%d] - [%d]) < %lld, the "
           "%lld x %lld bits of its query length",
           i, static_cast<long long>(ip[i + 1] - ip[i]), i + 1, i, static_cast<long long>(need),
           static_cast<long long>(q), static_cast<long long>(q));
    if (!d.tree_mask)
      fail(PAGEDATTN_ERROR_NULL_POINTER,
           "desc->tree_mask is NULL but tree_mask_indptr gives sequence %d a mask", i);
    const uint8_t* m = d.tree_mask + ip[i];
    for (int64_t r = 0; r < q; ++r)
      for (int64_t j = 0; j < q; ++j) {
        const int64_t b = r * q + j;
        const bool set = (m[b >> 3] >> (b & 7)) & 1;
        if (j == r && !set)
          fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "sequence %d's tree mask: row %lld does not see itself (bit %lld, the diagonal, "
               "is clear)",
               i, static_cast<long long>(r), static_cast<long long>(b));
        if (j > r && set)
          fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
               "sequence %d's tree mask: row %lld sees the later token %lld (bit %lld, above the "
               "diagonal); drafts come in topological order, so a token sees earlier ones only",
               i, static_cast<long long>(r), static_cast<long long>(j), static_cast<long long>(b));
      }
  }
  return ip[n];
}

}  // namespace

void plan(const pagedattn_batch_desc& desc, const Geometry& self, const Geometry& cross,
          const PlanCaps* caps, PlanCaps* caps_out, Plan& out,
          const std::function<void(const PlanCaps&)>& admit) {
  const int32_t n = desc.num_seqs;
  if (n < 0) fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->num_seqs = %d < 0", n);
  /* Either form becomes query_lens + context_lens; `d` is desc with those two set. */
  std::vector<int32_t> seq_qlens, seq_ctxs;
  pagedattn_batch_desc d = desc;
  read_lens_form(desc, seq_qlens, seq_ctxs, &d.query_lens, &d.context_lens);
  if (d.block_tables && !self.present)
    fail(PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL but desc->block_tables is set");
  if (d.slot_mapping && !self.present)
    fail(PAGEDATTN_ERROR_NULL_POINTER, "cache is NULL but desc->slot_mapping is set");
  if (d.block_table_stride < 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->block_table_stride = %d < 0",
         d.block_table_stride);
  const bool use_cross = d.encoder_lens != nullptr;
  if (use_cross && !cross.present)
    fail(PAGEDATTN_ERROR_NULL_POINTER, "cross_cache is NULL but desc->encoder_lens is set");
  if (use_cross && d.cross_block_table_stride < 0)
    fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->cross_block_table_stride = %d < 0",
         d.cross_block_table_stride);

  /* Pass 1: validate and summarise; nothing is written. */
  int64_t tokens = 0, sum_enc = 0, enc_tokens = 0, max_seq = 0;
  int32_t max_q = 0, max_blocks = 0, max_cross_blocks = 0, n_decode = 0, n_prefill = 0;
  bool all_ctx_zero = true, chunked = false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t q = d.query_lens[i], c = d.context_lens[i];
    if (q < 0) fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "query_lens[%d] = %d < 0", i, q);
    if (c < 0) fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "context_lens[%d] = %d < 0", i, c);
    const int64_t len = static_cast<int64_t>(q) + c;
    if (len > INT32_MAX)
      fail(PAGEDATTN_ERROR_OVERFLOW,
           "context_lens[%d] + query_lens[%d] = %lld overflows int32 positions", i, i,
           static_cast<long long>(len));
    tokens += q;
    if (tokens > INT32_MAX)
      fail(PAGEDATTN_ERROR_OVERFLOW, "sum(query_lens) overflows int32 at sequence %d", i);
    if (self.present) {
      const int64_t need = ceil_div(len, self.block_size);
      if (need > 0) {
        if (!d.block_tables)
          fail(PAGEDATTN_ERROR_NULL_POINTER,
               "desc->block_tables is NULL but sequence %d needs %lld blocks", i,
               static_cast<long long>(need));
        if (need > d.block_table_stride)
          fail(PAGEDATTN_ERROR_OUT_OF_RANGE,
               "block_table_stride %d < %lld blocks needed by sequence %d (context %d + query "
               "%d, block size %d)",
               d.block_table_stride, static_cast<long long>(need), i, c, q, self.block_size);
        check_row(d.block_tables + static_cast<int64_t>(i) * d.block_table_stride, i, need,
                  self.num_blocks, "block_tables");
        max_blocks = std::max(max_blocks, static_cast<int32_t>(need));
      }
    }
    if (use_cross) {
      const int32_t e = d.encoder_lens[i];
      if (e < 0) fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "encoder_lens[%d] = %d < 0", i, e);
      sum_enc += e;
      if (sum_enc > INT32_MAX)
        fail(PAGEDATTN_ERROR_OVERFLOW, "sum(encoder_lens) overflows int32 at sequence %d", i);
      if (c == 0) enc_tokens += e;
      max_seq = std::max<int64_t>(max_seq, e);
      const int64_t need = ceil_div(e, cross.block_size);
      if (need > 0) {
        if (!d.cross_block_tables)
          fail(PAGEDATTN_ERROR_NULL_POINTER,
               "desc->cross_block_tables is NULL but sequence %d needs %lld blocks", i,
               static_cast<long long>(need));
        if (need > d.cross_block_table_stride)
          fail(PAGEDATTN_ERROR_OUT_OF_RANGE,
               "cross_block_table_stride %d < %lld blocks needed by sequence %d (encoder %d, "
               "block size %d)",
               d.cross_block_table_stride, static_cast<long long>(need), i, e, cross.block_size);
        check_row(d.cross_block_tables + static_cast<int64_t>(i) * d.cross_block_table_stride, i,
                  need, cross.num_blocks, "cross_block_tables");
        max_cross_blocks = std::max(max_cross_blocks, static_cast<int32_t>(need));
      }
    }
    max_q = std::max(max_q, q);
    max_seq = std::max(max_seq, len);
    if (c != 0) all_ctx_zero = false;
    if (q > 1 && c > 0) chunked = true;
    if (q == 1) ++n_decode;
    if (q > 1) ++n_prefill;
  }
  const int64_t tree_bytes = check_tree_masks(d, n);
  if (d.slot_mapping) {
    const int64_t limit = static_cast<int64_t>(self.num_blocks) * self.block_size;
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t s = d.slot_mapping[t];
      if (s < -1)
        fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->slot_mapping[%lld] = %lld < -1",
             static_cast<long long>(t), static_cast<long long>(s));
      if (s >= limit)
        fail(PAGEDATTN_ERROR_OUT_OF_RANGE,
             "desc->slot_mapping[%lld] = %lld >= num_blocks*block_size %lld",
             static_cast<long long>(t), static_cast<long long>(s),
             static_cast<long long>(limit));
    }
  }

  PlanCaps cp;
  if (caps) {
    check_cap(n, caps->num_seqs, "num_seqs", "max_num_seqs");
    check_cap(tokens, caps->num_tokens, "sum(query_lens)", "max_num_tokens");
    check_cap(max_blocks, caps->blocks_per_seq, "table width needed", "max_blocks_per_seq");
    check_cap(sum_enc, caps->num_encoder_tokens, "sum(encoder_lens)", "max_num_encoder_tokens");
    check_cap(max_seq, caps->seq_len, "max sequence length", "max_seq_len");
    check_cap(std::max<int64_t>(tree_bytes, 0), caps->tree_mask_bytes,
              "tree_mask_indptr[num_seqs]", "max_tree_mask_bytes");
    cp = *caps;
  } else {
    cp.num_seqs = static_cast<int32_t>(pick_cap(d.max_num_seqs, n, n, "max_num_seqs"));
    cp.num_tokens = pick_cap(d.max_num_tokens, tokens, tokens, "max_num_tokens");
    if (cp.num_tokens > INT32_MAX)
      fail(PAGEDATTN_ERROR_OVERFLOW, "desc->max_num_tokens = %lld overflows int32",
           static_cast<long long>(cp.num_tokens));
    /* Table capacities default to what the tables passed can address, so a batch planned at a
     * prefill step takes the decode steps that follow through update. */
    const bool tables = self.present && d.block_tables;
    cp.blocks_per_seq = static_cast<int32_t>(pick_cap(
        d.max_blocks_per_seq, max_blocks, tables ? d.block_table_stride : 0, "max_blocks_per_seq"));
    cp.num_encoder_tokens =
        pick_cap(d.max_num_encoder_tokens, sum_enc, sum_enc, "max_num_encoder_tokens");
    int64_t reach = tables ? static_cast<int64_t>(cp.blocks_per_seq) * self.block_size : 0;
    if (use_cross && d.cross_block_tables)
      reach = std::max<int64_t>(
          reach, static_cast<int64_t>(d.cross_block_table_stride) * cross.block_size);
    cp.seq_len = pick_cap(d.max_seq_len, max_seq, std::min<int64_t>(reach, INT32_MAX),
                          "max_seq_len");
    /* max_seq_len sizes the cross tables' rows; a width past int32 would be truncated, and the
     * rows copied into a table allocated that narrow. */
    if (cross.present && ceil_div(cp.seq_len, cross.block_size) > INT32_MAX)
      fail(PAGEDATTN_ERROR_OVERFLOW,
           "desc->max_seq_len = %lld needs %lld cross table entries per sequence (block size "
           "%d): more than int32",
           static_cast<long long>(cp.seq_len),
           static_cast<long long>(ceil_div(cp.seq_len, cross.block_size)), cross.block_size);
    if (d.max_tree_mask_bytes < 0)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT, "desc->max_tree_mask_bytes = %lld < 0",
           static_cast<long long>(d.max_tree_mask_bytes));
    const int64_t tb = std::max<int64_t>(tree_bytes, 0);
    if (d.max_tree_mask_bytes != 0 && d.max_tree_mask_bytes < tb)
      fail(PAGEDATTN_ERROR_INVALID_ARGUMENT,
           "desc->max_tree_mask_bytes = %lld < tree_mask_indptr[num_seqs] = %lld",
           static_cast<long long>(d.max_tree_mask_bytes), static_cast<long long>(tb));
    cp.tree_mask_bytes = d.max_tree_mask_bytes != 0 ? d.max_tree_mask_bytes : tb;
    if (caps_out) *caps_out = cp;
  }
  if (admit) admit(cp);

  /* Pass 2: fill. */
  out.num_seqs = n;
  out.num_tokens = tokens;
  out.has_tables = self.present;
  out.has_cross = use_cross;
  out.num_encoder_tokens = use_cross ? enc_tokens : 0;
  out.sum_encoder_lens = sum_enc;
  out.max_blocks_used = max_blocks;
  out.max_cross_blocks_used = max_cross_blocks;
  out.max_query_len = max_q;
  out.max_seq_len = max_seq;
  out.all_context_zero = all_ctx_zero;
  out.has_chunked_prefill = chunked;
  out.num_decode = n_decode;
  out.num_prefill = n_prefill;

  out.query_lens.assign(d.query_lens, d.query_lens + n);
  out.context_lens.assign(d.context_lens, d.context_lens + n);
  out.query_start.resize(static_cast<size_t>(n) + 1);
  out.query_start[0] = 0;
  for (int32_t i = 0; i < n; ++i) out.query_start[i + 1] = out.query_start[i] + d.query_lens[i];

  out.table_stride = self_stride(cp, self);
  out.tables.assign(static_cast<size_t>(n) * out.table_stride, 0);
  out.slots.assign(static_cast<size_t>(tokens), -1);
  if (self.present) {
    const int32_t bs = self.block_size;
    for (int32_t i = 0; i < n; ++i) {
      const int64_t need = ceil_div(static_cast<int64_t>(d.query_lens[i]) + d.context_lens[i], bs);
      if (need == 0) continue;
      const int32_t* src = d.block_tables + static_cast<int64_t>(i) * d.block_table_stride;
      std::copy(src, src + need, out.tables.begin() + static_cast<int64_t>(i) * out.table_stride);
    }
    if (d.slot_mapping) {
      std::copy(d.slot_mapping, d.slot_mapping + tokens, out.slots.begin());
    } else {
      for (int32_t i = 0; i < n; ++i) {
        const int32_t* row = out.tables.data() + static_cast<int64_t>(i) * out.table_stride;
        const int64_t base = out.query_start[i];
        for (int32_t j = 0; j < d.query_lens[i]; ++j) {
          const int64_t p = static_cast<int64_t>(d.context_lens[i]) + j;
          out.slots[base + j] = static_cast<int64_t>(row[p / bs]) * bs + p % bs;
        }
      }
    }
  }

  out.cross_table_stride = use_cross ? cross_stride(cp, cross) : 0;
  if (use_cross) {
    const int32_t bs = cross.block_size;
    out.encoder_lens.assign(d.encoder_lens, d.encoder_lens + n);
    out.cross_tables.assign(static_cast<size_t>(n) * out.cross_table_stride, 0);
    out.cross_slots.resize(static_cast<size_t>(enc_tokens));
    int64_t k = 0;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t e = d.encoder_lens[i];
      const int64_t need = ceil_div(e, bs);
      if (need == 0) continue;
      const int32_t* src =
          d.cross_block_tables + static_cast<int64_t>(i) * d.cross_block_table_stride;
      int32_t* dst = out.cross_tables.data() + static_cast<int64_t>(i) * out.cross_table_stride;
      std::copy(src, src + need, dst);
      if (d.context_lens[i] != 0) continue;
      for (int32_t p = 0; p < e; ++p)
        out.cross_slots[k++] = static_cast<int64_t>(dst[p / bs]) * bs + p % bs;
    }
  } else {
    out.encoder_lens.clear();
    out.cross_tables.clear();
    out.cross_slots.clear();
  }
  out.has_tree = tree_bytes >= 0;
  out.any_tree = false;
  if (out.has_tree) {
    out.tree_indptr.assign(d.tree_mask_indptr, d.tree_mask_indptr + n + 1);
    out.tree_mask.assign(d.tree_mask ? d.tree_mask : nullptr,
                         d.tree_mask ? d.tree_mask + tree_bytes : nullptr);
    for (int32_t i = 0; i < n; ++i) out.any_tree |= out.tree_indptr[i + 1] > out.tree_indptr[i];
  } else {
    out.tree_indptr.clear();
    out.tree_mask.clear();
  }
  out.caller_slots = self.present && d.slot_mapping;
  find_slot_repeat(out.slots, out.slot_repeat);
  find_slot_repeat(out.cross_slots, out.cross_slot_repeat);
}

void reserve_plan(Plan& p, const PlanCaps& caps, const Geometry& self, const Geometry& cross) {
  const size_t seqs = static_cast<size_t>(caps.num_seqs);
  /* Refuse absurd capacities plainly instead of asking the allocator for petabytes. */
  const long double bytes =
      static_cast<long double>(seqs) * (3 * 4 + 4.0L * self_stride(caps, self)) +
      8.0L * caps.num_tokens +
      (cross.present ? static_cast<long double>(seqs) * (4 + 4.0L * cross_stride(caps, cross)) +
                           8.0L * caps.num_encoder_tokens
                     : 0.0L) +
      static_cast<long double>(caps.tree_mask_bytes);
  constexpr long double kMaxPlanBytes = 1024.0L * 1024 * 1024 * 1024; /* 1 TiB */
  if (bytes > kMaxPlanBytes)
    fail(PAGEDATTN_ERROR_OUT_OF_MEMORY,
         "batch capacities (max_num_seqs %d, max_blocks_per_seq %d, max_num_tokens %lld, "
         "max_seq_len %lld) need %.3Lg bytes of host metadata",
         caps.num_seqs, caps.blocks_per_seq, static_cast<long long>(caps.num_tokens),
         static_cast<long long>(caps.seq_len), bytes);
  p.query_lens.reserve(seqs);
  p.context_lens.reserve(seqs);
  p.query_start.reserve(seqs + 1);
  p.tables.reserve(seqs * static_cast<size_t>(self_stride(caps, self)));
  p.slots.reserve(static_cast<size_t>(caps.num_tokens));
  if (caps.tree_mask_bytes > 0) {
    p.tree_mask.reserve(static_cast<size_t>(caps.tree_mask_bytes));
    p.tree_indptr.reserve(seqs + 1);
  }
  if (cross.present) {
    p.encoder_lens.reserve(seqs);
    p.cross_tables.reserve(seqs * static_cast<size_t>(cross_stride(caps, cross)));
    p.cross_slots.reserve(static_cast<size_t>(caps.num_encoder_tokens));
  }
}

namespace {
template <class V>
void assign_in_place(V& dst, const V& src) {
  /* Within the reserved capacity, assign() keeps dst's buffer (no reallocation). */
  dst.assign(src.begin(), src.end());
}
}  // namespace

void copy_plan(Plan& dst, const Plan& src) {
  assign_in_place(dst.query_lens, src.query_lens);
  assign_in_place(dst.context_lens, src.context_lens);
  assign_in_place(dst.query_start, src.query_start);
  assign_in_place(dst.tables, src.tables);
  assign_in_place(dst.encoder_lens, src.encoder_lens);
  assign_in_place(dst.cross_tables, src.cross_tables);
  assign_in_place(dst.slots, src.slots);
  assign_in_place(dst.cross_slots, src.cross_slots);
  assign_in_place(dst.tree_mask, src.tree_mask);
  assign_in_place(dst.tree_indptr, src.tree_indptr);
  dst.has_tree = src.has_tree;
  dst.any_tree = src.any_tree;
  dst.num_seqs = src.num_seqs;
  dst.num_tokens = src.num_tokens;
  dst.table_stride = src.table_stride;
  dst.cross_table_stride = src.cross_table_stride;
  dst.has_tables = src.has_tables;
  dst.has_cross = src.has_cross;
  dst.num_encoder_tokens = src.num_encoder_tokens;
  dst.sum_encoder_lens = src.sum_encoder_lens;
  dst.max_blocks_used = src.max_blocks_used;
  dst.max_cross_blocks_used = src.max_cross_blocks_used;
  dst.max_query_len = src.max_query_len;
  dst.max_seq_len = src.max_seq_len;
  dst.all_context_zero = src.all_context_zero;
  dst.has_chunked_prefill = src.has_chunked_prefill;
  dst.num_decode = src.num_decode;
  dst.num_prefill = src.num_prefill;
  dst.caller_slots = src.caller_slots;
  std::copy(src.slot_repeat, src.slot_repeat + 2, dst.slot_repeat);
  std::copy(src.cross_slot_repeat, src.cross_slot_repeat + 2, dst.cross_slot_repeat);
}

void fill_pa_batch(pa_batch& pb, const Plan& p, const PlanCaps& caps, const Geometry& self,
                   const Geometry& cross) {
  pb.num_seqs = p.num_seqs;
  pb.num_tokens = p.num_tokens;
  pb.query_lens = p.query_lens.data();
  pb.context_lens = p.context_lens.data();
  pb.query_start = p.query_start.data();
  pb.block_tables = p.has_tables ? p.tables.data() : nullptr;
  pb.table_stride = p.has_tables ? p.table_stride : 0;
  pb.slot_mapping = p.slots.data();
  pb.block_size = self.present ? self.block_size : 0;
  pb.num_blocks = self.present ? self.num_blocks : 0;
  pb.encoder_lens = p.has_cross ? p.encoder_lens.data() : nullptr;
  pb.cross_tables = p.has_cross ? p.cross_tables.data() : nullptr;
  pb.cross_table_stride = p.has_cross ? p.cross_table_stride : 0;
  pb.cross_block_size = cross.present ? cross.block_size : 0;
  pb.cross_num_blocks = cross.present ? cross.num_blocks : 0;
  pb.num_encoder_tokens = p.num_encoder_tokens;
  pb.cross_slot_mapping = p.has_cross ? p.cross_slots.data() : nullptr;
  /* NULL when no sequence of this step has a mask, so the kernels take their plain paths. */
  pb.tree_mask = p.any_tree ? p.tree_mask.data() : nullptr;
  pb.tree_indptr = p.any_tree ? p.tree_indptr.data() : nullptr;
  pb.max_query_len = p.max_query_len;
  pb.max_seq_len = p.max_seq_len;
  pb.all_context_zero = p.all_context_zero ? 1 : 0;
  pb.cap_num_seqs = caps.num_seqs;
  pb.cap_num_tokens = caps.num_tokens;
  pb.cap_blocks_per_seq = caps.blocks_per_seq;
  pb.cap_num_encoder_tokens = caps.num_encoder_tokens;
  pb.cap_seq_len = caps.seq_len;
  pb.cap_tree_mask_bytes = caps.tree_mask_bytes;
}

}  // namespace pa
