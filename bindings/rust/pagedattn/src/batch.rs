//! Planned batches (the metadata of one step).

use std::ptr::{self, NonNull};

use crate::backend::Backend;
use crate::cache::KvCache;
use crate::{check, from_c, sys, to_c_i32, to_c_i64, Error, Result, Status};

/// One step's sequences (`pagedattn_batch_desc`), borrowed from the caller's arrays. The arrays
/// go to C as they are, so they have C's element types; the scalar sizes are `usize`, checked to
/// fit C's int32 / int64 when the description is used.
///
/// The lengths come in one of two forms: `query_lens` + `context_lens` (the CONTEXT form), or
/// `seq_lens` + `query_start_loc` (the SEQ form, as vLLM v1 and FlashInfer hold them), with the
/// other form's fields left empty. Both plan the same batch:
///
/// ```
/// # use pagedattn::BatchDesc;
/// let tables = [3, 7, 1, 4];
/// let context = BatchDesc { query_lens: &[1, 2], context_lens: &[16, 0], block_tables: Some(&tables),
///                           block_table_stride: 2, ..BatchDesc::default() };
/// let seq = BatchDesc { seq_lens: Some(&[17, 2]), query_start_loc: Some(&[0, 1, 3]),
///                       block_tables: Some(&tables), block_table_stride: 2, ..BatchDesc::default() };
/// # let _ = (context, seq);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchDesc<'d> {
    /// New tokens per sequence (>= 0); its length is the number of sequences. Empty in the SEQ
    /// form.
    pub query_lens: &'d [i32],
    /// Tokens already in the cache per sequence. Empty in the SEQ form.
    pub context_lens: &'d [i32],
    /// Block tables, row-major `[num_seqs][block_table_stride]`; `None` only for encoder-only.
    pub block_tables: Option<&'d [i32]>,
    /// Entries per block-table row.
    pub block_table_stride: usize,
    /// Optional caller slot mapping (`sum(query_lens)` slots, -1 = padding).
    pub slot_mapping: Option<&'d [i64]>,
    /// Cross attention: encoder tokens per sequence.
    pub encoder_lens: Option<&'d [i32]>,
    /// Cross attention: `[num_seqs][cross_block_table_stride]`.
    pub cross_block_tables: Option<&'d [i32]>,
    /// Entries per cross block-table row.
    pub cross_block_table_stride: usize,
    /// Capacity for updates: sequences (0 = this batch's).
    pub max_num_seqs: usize,
    /// Capacity: tokens (0 = this batch's).
    pub max_num_tokens: usize,
    /// Capacity: table width (0 = `block_table_stride`).
    pub max_blocks_per_seq: usize,
    /// Capacity: encoder tokens (0 = this batch's).
    pub max_num_encoder_tokens: usize,
    /// Capacity: context_len + query_len (and encoder_len); 0 = what the tables address
    /// (`max_blocks_per_seq * block_size`, or the cross tables' reach if larger).
    pub max_seq_len: usize,
    /// The SEQ form: context + new tokens per sequence; its length is then the number of
    /// sequences. Goes with `query_start_loc`.
    pub seq_lens: Option<&'d [i32]>,
    /// The SEQ form: the row offsets, `seq_lens.len() + 1` entries (0, then the running sum of
    /// the query lengths).
    pub query_start_loc: Option<&'d [i32]>,
    /// Speculative-decoding tree masks (docs/semantics.md 4.7), packed: sequence i's segment is
    /// `tree_mask[tree_mask_indptr[i]..tree_mask_indptr[i + 1]]`, empty (causal among its new
    /// tokens) or a `q x q` bit matrix (q its query length), row-major, least significant bit
    /// first: bit `r * q + j` set = new token r sees new token j. Every diagonal bit is set and
    /// none above it; the context is always visible. Goes with `tree_mask_indptr`;
    /// [`pack_tree_masks`] builds both from boolean matrices.
    pub tree_mask: Option<&'d [u8]>,
    /// The masks' byte offsets: `num_seqs + 1` entries, 0 then non-decreasing.
    pub tree_mask_indptr: Option<&'d [i64]>,
    /// Capacity for updates: mask bytes (0 = this step's `tree_mask_indptr[num_seqs]`, so a
    /// batch that updates into masked steps is created with this set).
    pub max_tree_mask_bytes: usize,
}

/// Packs per-sequence tree masks as [`BatchDesc::tree_mask`] and
/// [`BatchDesc::tree_mask_indptr`] hold them. Each entry is `None` (causal among the sequence's
/// new tokens) or its `q x q` boolean matrix, row-major (`m[r * q + j]`: new token r sees new
/// token j), packed into exactly `ceil(q * q / 8)` bytes, least significant bit first (numpy's
/// `packbits(m.reshape(-1), bitorder="little")`). Returns the bytes and the `masks.len() + 1`
/// offsets; an [`Status::InvalidArgument`] error for a matrix whose length is not a square.
///
/// ```
/// // Two drafts under the root token: both see the root and themselves, not each other.
/// let tree = [true, false, false,
///             true, true, false,
///             true, false, true];
/// let (mask, indptr) = pagedattn::pack_tree_masks(&[None, Some(&tree[..])]).unwrap();
/// assert_eq!((mask, indptr), (vec![0b0101_1001, 0b1], vec![0, 0, 2]));
/// ```
pub fn pack_tree_masks<M: AsRef<[bool]>>(masks: &[Option<M>]) -> Result<(Vec<u8>, Vec<i64>)> {
    let mut bytes = Vec::new();
    let mut indptr = Vec::with_capacity(masks.len() + 1);
    indptr.push(0i64);
    for (i, m) in masks.iter().enumerate() {
        if let Some(m) = m {
            let bits = m.as_ref();
            // The side of the square (no usize::isqrt: it needs Rust 1.84).
            let q = (0..=bits.len()).find(|&q| q * q >= bits.len()).unwrap_or(0);
            if q * q != bits.len() {
                return Err(Error::binding(
                    Status::InvalidArgument,
                    format!("tree mask {i} has {} entries, not the q * q of a square matrix", bits.len()),
                ));
            }
            let at = bytes.len();
            bytes.resize(at + bits.len().div_ceil(8), 0u8);
            for (b, &set) in bits.iter().enumerate() {
                if set {
                    bytes[at + b / 8] |= 1 << (b % 8);
                }
            }
        }
        indptr.push(to_c_i64("tree mask bytes", bytes.len())?);
    }
    Ok((bytes, indptr))
}

fn too_short(what: &str, len: usize, need: usize) -> Error {
    Error::binding(Status::InvalidArgument, format!("{what} has {len} entries, needs {need}"))
}

fn opt_ptr<T>(s: Option<&[T]>) -> *const T {
    s.map_or(ptr::null(), <[T]>::as_ptr)
}

impl BatchDesc<'_> {
    /// The C struct, after checking that every array is as long as the C side will read.
    fn raw_desc(&self) -> Result<sys::pagedattn_batch_desc> {
        let seq_form = match (self.seq_lens, self.query_start_loc) {
            (None, None) => None,
            (Some(s), Some(q)) => Some((s, q)),
            _ => {
                return Err(Error::binding(Status::InvalidArgument, "seq_lens and query_start_loc go together"));
            }
        };
        if seq_form.is_some() && !(self.query_lens.is_empty() && self.context_lens.is_empty()) {
            return Err(Error::binding(
                Status::InvalidArgument,
                "pass query_lens and context_lens or seq_lens and query_start_loc, not both forms",
            ));
        }
        let n = seq_form.map_or(self.query_lens.len(), |(s, _)| s.len());
        let mut raw = sys::pagedattn_batch_desc::default();
        // SAFETY: valid pointer and its size; zeroes the struct (the CONTEXT form) and sets
        // struct_size, the fields since 0.2 included.
        unsafe { sys::pagedattn_batch_desc_init_sized(&mut raw, std::mem::size_of::<sys::pagedattn_batch_desc>() as u32) };
        // Scalars first: a size C cannot hold is refused as such, whatever the arrays.
        raw.num_seqs = to_c_i32("num_seqs", n)?;
        raw.block_table_stride = to_c_i32("block_table_stride", self.block_table_stride)?;
        raw.cross_block_table_stride = to_c_i32("cross_block_table_stride", self.cross_block_table_stride)?;
        raw.max_num_seqs = to_c_i32("max_num_seqs", self.max_num_seqs)?;
        raw.max_num_tokens = to_c_i64("max_num_tokens", self.max_num_tokens)?;
        raw.max_blocks_per_seq = to_c_i32("max_blocks_per_seq", self.max_blocks_per_seq)?;
        raw.max_num_encoder_tokens = to_c_i64("max_num_encoder_tokens", self.max_num_encoder_tokens)?;
        raw.max_seq_len = to_c_i64("max_seq_len", self.max_seq_len)?;
        raw.max_tree_mask_bytes = to_c_i64("max_tree_mask_bytes", self.max_tree_mask_bytes)?;
        if let Some((_, starts)) = seq_form {
            if starts.len() != n + 1 {
                return Err(too_short("query_start_loc", starts.len(), n + 1));
            }
        } else if self.context_lens.len() != n {
            return Err(too_short("context_lens", self.context_lens.len(), n));
        }
        let table_need = |stride: usize| n.saturating_mul(stride);
        if let Some(t) = self.block_tables {
            if t.len() < table_need(self.block_table_stride) {
                return Err(too_short("block_tables", t.len(), table_need(self.block_table_stride)));
            }
        }
        if let Some(s) = self.slot_mapping {
            let tokens: usize = match seq_form {
                Some((_, starts)) => starts.last().map_or(0, |&t| usize::try_from(t).unwrap_or(0)),
                None => self.query_lens.iter().map(|&q| usize::try_from(q).unwrap_or(0)).sum(),
            };
            if s.len() < tokens {
                return Err(too_short("slot_mapping", s.len(), tokens));
            }
        }
        if let Some(e) = self.encoder_lens {
            if e.len() != n {
                return Err(too_short("encoder_lens", e.len(), n));
            }
        }
        if let Some(t) = self.cross_block_tables {
            if t.len() < table_need(self.cross_block_table_stride) {
                return Err(too_short("cross_block_tables", t.len(), table_need(self.cross_block_table_stride)));
            }
        }
        match (self.tree_mask, self.tree_mask_indptr) {
            (None, None) => {}
            (Some(mask), Some(indptr)) => {
                if indptr.len() != n + 1 {
                    return Err(too_short("tree_mask_indptr", indptr.len(), n + 1));
                }
                // The library reads a sequence's bytes up to its next offset.
                let reach = indptr.iter().map(|&o| usize::try_from(o).unwrap_or(0)).max().unwrap_or(0);
                if mask.len() < reach {
                    return Err(Error::binding(
                        Status::InvalidArgument,
                        format!("tree_mask has {} bytes, tree_mask_indptr reaches {reach}", mask.len()),
                    ));
                }
            }
            _ => {
                return Err(Error::binding(Status::InvalidArgument, "tree_mask and tree_mask_indptr go together"));
            }
        }
        // The arrays were checked against what the C side reads.
        if let Some((seq_lens, starts)) = seq_form {
            raw.lens_form = sys::PAGEDATTN_BATCH_LENS_SEQ;
            raw.seq_lens = seq_lens.as_ptr();
            raw.query_start_loc = starts.as_ptr();
        } else {
            raw.query_lens = self.query_lens.as_ptr();
            raw.context_lens = self.context_lens.as_ptr();
        }
        raw.block_tables = opt_ptr(self.block_tables);
        raw.slot_mapping = opt_ptr(self.slot_mapping);
        raw.encoder_lens = opt_ptr(self.encoder_lens);
        raw.cross_block_tables = opt_ptr(self.cross_block_tables);
        raw.tree_mask = opt_ptr(self.tree_mask);
        raw.tree_mask_indptr = opt_ptr(self.tree_mask_indptr);
        Ok(raw)
    }
}

/// Summary of a planned batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchInfo {
    /// Sequences.
    pub num_seqs: usize,
    /// sum(query_lens): rows of q/k/v/out.
    pub num_tokens: usize,
    /// Rows of k/v in a cross forward that writes the cross cache.
    pub num_encoder_tokens: usize,
    /// Sequences with query_len == 1.
    pub num_decode_seqs: usize,
    /// Sequences with query_len > 1.
    pub num_prefill_seqs: usize,
    /// Longest query.
    pub max_query_len: usize,
    /// max(context_len + query_len).
    pub max_seq_len: usize,
    /// Capacity: sequences.
    pub max_num_seqs: usize,
    /// Capacity: tokens.
    pub max_num_tokens: usize,
    /// Capacity: table width.
    pub max_blocks_per_seq: usize,
    /// Block size of the cache planned against.
    pub block_size: usize,
    /// Bytes of the planned host metadata (lengths, tables, slot mappings), sized for the
    /// capacities so that updates keep it; counts against the backend's memory limit.
    pub host_bytes: u64,
    /// Bytes of the backend's own workspace: on CPU backends the workers' scratch and split-KV
    /// partials (host memory), on GPUs the device copy of the metadata, work lists and partials.
    /// Sized for the capacities; counts against the backend's memory limit.
    pub workspace_bytes: u64,
    /// Capacity: encoder tokens.
    pub max_num_encoder_tokens: usize,
    /// Capacity: what `max_seq_len` may reach through updates.
    pub max_seq_len_capacity: usize,
    /// Capacity: tree mask bytes a step may use (0: none).
    pub max_tree_mask_bytes: usize,
}

/// A validated and planned batch (`pagedattn_batch`). It holds a clone of its [`Backend`],
/// which therefore lives at least as long, and borrows nothing: an engine can own it, and it
/// can move to other threads.
#[derive(Debug)]
pub struct Batch {
    raw: NonNull<sys::pagedattn_batch>,
    backend: Backend,
}

// SAFETY: batch.h ties no batch to a thread; update and destroy need `&mut`/ownership here.
unsafe impl Send for Batch {}
// SAFETY: batch.h: a batch may serve concurrent forwards when none updates it (the CPU backend
// serialises forwards sharing a batch's workspace); update takes `&mut self`.
unsafe impl Sync for Batch {}

impl Batch {
    /// Validates and plans a batch against `cache` (and `cross_cache` for cross attention).
    /// `cache` may be `None` only without block tables (encoder-only). The caches are read only
    /// now; the batch stays valid after they are dropped. The batch keeps a clone of `backend`.
    pub fn new(
        backend: &Backend,
        cache: Option<&KvCache<'_>>,
        cross_cache: Option<&KvCache<'_>>,
        desc: &BatchDesc<'_>,
    ) -> Result<Self> {
        let raw = desc.raw_desc()?;
        let mut out = ptr::null_mut();
        // SAFETY: arrays checked against what the C side reads; live handles.
        check(unsafe {
            sys::pagedattn_batch_create(
                &mut out,
                backend.as_ptr(),
                cache.map_or(ptr::null(), |c| c.as_ptr() as *const _),
                cross_cache.map_or(ptr::null(), |c| c.as_ptr() as *const _),
                &raw,
            )
        })?;
        NonNull::new(out)
            .map(|raw| Batch { raw, backend: backend.clone() })
            .ok_or_else(|| Error::binding(Status::Internal, "batch_create returned OK and NULL"))
    }

    /// Replaces the contents in place with a new step of no larger capacity (graph replay).
    /// On failure the batch keeps its previous contents.
    pub fn update(&mut self, desc: &BatchDesc<'_>) -> Result<()> {
        let raw = desc.raw_desc()?;
        // SAFETY: as new; exclusive access through `&mut self`.
        check(unsafe { sys::pagedattn_batch_update(self.raw.as_ptr(), &raw) })
    }

    /// The raw handle, for calls through [`crate::sys`]; it stays owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::pagedattn_batch {
        self.raw.as_ptr()
    }

    /// The backend the batch was planned on (a clone that the batch keeps alive).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Summary of the plan.
    pub fn info(&self) -> Result<BatchInfo> {
        let mut raw = sys::pagedattn_batch_info {
            struct_size: std::mem::size_of::<sys::pagedattn_batch_info>() as u32,
            ..Default::default()
        };
        // SAFETY: valid out struct; live handle.
        check(unsafe { sys::pagedattn_batch_get_info(&mut raw, self.raw.as_ptr()) })?;
        Ok(BatchInfo {
            num_seqs: from_c("num_seqs", raw.num_seqs)?,
            num_tokens: from_c("num_tokens", raw.num_tokens)?,
            num_encoder_tokens: from_c("num_encoder_tokens", raw.num_encoder_tokens)?,
            num_decode_seqs: from_c("num_decode_seqs", raw.num_decode_seqs)?,
            num_prefill_seqs: from_c("num_prefill_seqs", raw.num_prefill_seqs)?,
            max_query_len: from_c("max_query_len", raw.max_query_len)?,
            max_seq_len: from_c("max_seq_len", raw.max_seq_len)?,
            max_num_seqs: from_c("max_num_seqs", raw.max_num_seqs)?,
            max_num_tokens: from_c("max_num_tokens", raw.max_num_tokens)?,
            max_blocks_per_seq: from_c("max_blocks_per_seq", raw.max_blocks_per_seq)?,
            block_size: from_c("block_size", raw.block_size)?,
            host_bytes: raw.host_bytes,
            workspace_bytes: raw.workspace_bytes,
            max_num_encoder_tokens: from_c("max_num_encoder_tokens", raw.max_num_encoder_tokens)?,
            max_seq_len_capacity: from_c("max_seq_len_capacity", raw.max_seq_len_capacity)?,
            max_tree_mask_bytes: from_c("max_tree_mask_bytes", raw.max_tree_mask_bytes)?,
        })
    }

    /// The planned slot mapping (one slot per token). Borrowed from the batch until the next
    /// update.
    pub fn slot_mapping(&self) -> Result<&[i64]> {
        let (mut p, mut n) = (ptr::null(), 0i64);
        // SAFETY: valid out pointers; live handle.
        check(unsafe { sys::pagedattn_batch_get_slot_mapping(&mut p, &mut n, self.raw.as_ptr()) })?;
        let n = from_c("array length", n)?;
        // SAFETY: the batch owns `n` entries at `p` until update/destroy, which need `&mut self`.
        Ok(unsafe { borrowed(p, n) })
    }

    /// The first row of each sequence, then the number of tokens (num_seqs + 1 entries).
    pub fn query_start(&self) -> Result<&[i32]> {
        let (mut p, mut n) = (ptr::null(), 0i32);
        // SAFETY: as slot_mapping.
        check(unsafe { sys::pagedattn_batch_get_query_start(&mut p, &mut n, self.raw.as_ptr()) })?;
        let n = from_c("array length", n)?;
        // SAFETY: as slot_mapping.
        Ok(unsafe { borrowed(p, n) })
    }

    /// Slots of the cross cache for the encoder tokens a cross forward writes (empty without
    /// cross attention).
    pub fn cross_slot_mapping(&self) -> Result<&[i64]> {
        let (mut p, mut n) = (ptr::null(), 0i64);
        // SAFETY: as slot_mapping.
        check(unsafe { sys::pagedattn_batch_get_cross_slot_mapping(&mut p, &mut n, self.raw.as_ptr()) })?;
        let n = from_c("array length", n)?;
        // SAFETY: as slot_mapping.
        Ok(unsafe { borrowed(p, n) })
    }
}

/// # Safety
/// `p` must be valid for `n` reads for the returned lifetime (or `n` == 0).
unsafe fn borrowed<'s, T>(p: *const T, n: usize) -> &'s [T] {
    if n == 0 || p.is_null() { &[] } else { std::slice::from_raw_parts(p, n) }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once, while `self.backend` (dropped after this) still
        // holds the backend.
        unsafe { sys::pagedattn_batch_destroy(self.raw.as_ptr()) }
    }
}
