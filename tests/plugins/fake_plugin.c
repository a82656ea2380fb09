/* Fake plugins for the loader's failure paths (tests/plugins/<kind>/). FAKE_KIND:
 *   1: reports a plugin ABI version the core does not speak
 *   2: exports the ABI version but not pagedattn_plugin_ops
 *   3: a well-formed plugin whose probe fails with a reason
 *   4: a well-formed plugin whose probe succeeds and whose create fails (OUT_OF_MEMORY with a
 *      reason), leaving garbage in *state: the core must neither keep nor destroy it.
 *      fake_plugin_calls() counts create and destroy calls for the test. */
#include <stdio.h>

#include "plugin_abi.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

#if FAKE_KIND == 1
#define FAKE_ABI (PA_PLUGIN_ABI_VERSION + 1000u)
#else
#define FAKE_ABI PA_PLUGIN_ABI_VERSION
#endif

FAKE_EXPORT uint32_t pagedattn_plugin_abi_version(void);
FAKE_EXPORT uint32_t pagedattn_plugin_abi_version(void) { return FAKE_ABI; }

#if FAKE_KIND != 2

#define FAKE_REASON "fake probe: no accelerator attached (pagedattn test plugin)"
#define FAKE_CREATE_REASON "fake create: cannot reserve the device pool (pagedattn test plugin)"

static void fail(char* msg) { snprintf(msg, PA_MSG_LEN, "fake plugin: must not be called"); }

static int32_t creates, destroys;

FAKE_EXPORT void fake_plugin_calls(int32_t* create_calls, int32_t* destroy_calls);
FAKE_EXPORT void fake_plugin_calls(int32_t* create_calls, int32_t* destroy_calls) {
  *create_calls = creates;
  *destroy_calls = destroys;
}

static pagedattn_status fake_probe(int32_t device_index, char* msg) {
  (void)device_index;
#if FAKE_KIND == 4
  (void)msg;
  return PAGEDATTN_OK;
#else
  snprintf(msg, PA_MSG_LEN, "%s", FAKE_REASON);
  return PAGEDATTN_ERROR_BACKEND_UNAVAILABLE;
#endif
}
static pagedattn_status fake_create(void** state, const pagedattn_backend_options* o, char* msg) {
  (void)o;
  ++creates;
#if FAKE_KIND == 4
  *state = (void*)(uintptr_t)0xdeadbeef; /* a failed create may leave anything here */
  snprintf(msg, PA_MSG_LEN, "%s", FAKE_CREATE_REASON);
  return PAGEDATTN_ERROR_OUT_OF_MEMORY;
#else
  (void)state; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
#endif
}
static void fake_destroy(void* s) { (void)s; ++destroys; }
static void fake_caps(void* s, pagedattn_capabilities* c) { (void)s; (void)c; }
static pagedattn_status fake_alloc(void* s, size_t n, int32_t h, void** p, char* msg) {
  (void)s; (void)n; (void)h; (void)p; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static void fake_free(void* s, void* p, int32_t h) { (void)s; (void)p; (void)h; }
static pagedattn_status fake_write(void* s, const pa_write_args* a, char* msg) {
  (void)s; (void)a; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_copy(void* s, const pa_cache* c, const int32_t* p, size_t n, void* st,
                                  char* msg) {
  (void)s; (void)c; (void)p; (void)n; (void)st; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_swap(void* s, const pa_cache* d, const pa_cache* c, const int32_t* p,
                                  size_t n, void* st, char* msg) {
  (void)s; (void)d; (void)c; (void)p; (void)n; (void)st; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_read(void* s, const pa_cache* c, const int32_t* i, size_t n, void* b,
                                  void* st, char* msg) {
  (void)s; (void)c; (void)i; (void)n; (void)b; (void)st; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_load(void* s, const pa_cache* c, const int32_t* i, size_t n,
                                  const void* b, void* st, char* msg) {
  (void)s; (void)c; (void)i; (void)n; (void)b; (void)st; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_plan(void* s, pa_batch* b, int32_t u, char* msg) {
  (void)s; (void)b; (void)u; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static void fake_free_batch(void* s, pa_batch* b) { (void)s; (void)b; }
static pagedattn_status fake_forward(void* s, const pa_forward_args* a, char* msg) {
  (void)s; (void)a; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_merge(void* s, const pa_merge_args* a, char* msg) {
  (void)s; (void)a; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}
static pagedattn_status fake_sync(void* s, void* st, char* msg) {
  (void)s; (void)st; fail(msg);
  return PAGEDATTN_ERROR_INTERNAL;
}

static const pa_backend_ops fake_ops = {
    FAKE_ABI, sizeof(pa_backend_ops), "onednn",
    fake_probe, fake_create, fake_destroy, fake_caps,
    fake_alloc, fake_free, NULL, NULL,
    fake_write, fake_copy, fake_swap, fake_read, fake_load,
    fake_plan, fake_free_batch, fake_forward, fake_merge, fake_sync,
    NULL, /* forward_mla */
};

FAKE_EXPORT const pa_backend_ops* pagedattn_plugin_ops(void);
FAKE_EXPORT const pa_backend_ops* pagedattn_plugin_ops(void) { return &fake_ops; }

#endif
