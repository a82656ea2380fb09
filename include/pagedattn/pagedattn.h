/* pagedattn/pagedattn.h — umbrella header of pagedattn, attention over a paged KV cache.
 *
 * Typical use (one decoder layer step):
 *   pagedattn_backend* be;  pagedattn_backend_create(&be, "auto", NULL);
 *   pagedattn_kv_cache* kv; pagedattn_kv_cache_create(&kv, be, &cache_desc);
 *   pagedattn_batch* b;     pagedattn_batch_create(&b, be, kv, NULL, &batch_desc);
 *   for each layer: pagedattn_forward(be, b, kv, layer, &opts, &q, &k, &v, &out, NULL, stream);
 *   pagedattn_batch_destroy(b); pagedattn_kv_cache_destroy(kv); pagedattn_backend_destroy(be);
 *
 * C99 and C++ compatible. See each area's header for documentation.
 */
#ifndef PAGEDATTN_PAGEDATTN_H
#define PAGEDATTN_PAGEDATTN_H

#include "pagedattn/version.h"
#include "pagedattn/common.h"
#include "pagedattn/tensor.h"
#include "pagedattn/backend.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/batch.h"
#include "pagedattn/attention.h"

#endif /* PAGEDATTN_PAGEDATTN_H */
