/* lib/registry.h — the list of known backends and the plugin loader. */
#ifndef PAGEDATTN_LIB_REGISTRY_H
#define PAGEDATTN_LIB_REGISTRY_H

#include <string>

#include "internal.h"

namespace pa {

constexpr int32_t kNumBackends = 4;

/* Name of backend `index` ("cpu", "onednn", "cuda", "hip"). */
const char* backend_name_at(int32_t index);

/* Index of a known backend name, or -1. */
int32_t backend_index(const char* name);

/* The ops of backend `index`, loading its plugin on first use (cached, thread-safe). Raises
 * PLUGIN (not found: the message lists the directories searched; or not loadable) or PLUGIN_ABI,
 * naming the file and why. */
const pa_backend_ops* backend_ops(int32_t index);

/* Where backend `index` comes from, for messages about its own probe or create failing: "<name>:
 * <plugin file>" for a loaded plugin, "<name>" for the built-in one. Call only after
 * backend_ops(index) succeeded. */
std::string backend_origin(int32_t index);

/* Comma-separated list of the known names, for UNKNOWN_BACKEND messages. */
std::string known_backend_names();

}  // namespace pa

#endif /* PAGEDATTN_LIB_REGISTRY_H */
