/* lib/registry.cpp — known backends and the plugin loader. "cpu" is built in; "onednn", "cuda"
 * and "hip" are libpagedattn-<name>.so, searched in the directories of PAGEDATTN_PLUGIN_PATH,
 * then beside libpagedattn.so. A plugin is loaded once (the outcome, success or error, is
 * cached per name), checked for its plugin ABI and its op table, and never unloaded so its
 * function pointers stay valid for the life of the process. */
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdio>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "registry.h"

namespace pa {

namespace {

const char* const kNames[kNumBackends] = {"cpu", "onednn", "cuda", "hip"};

struct LoadResult {
  std::once_flag once;
  pagedattn_status status = PAGEDATTN_ERROR_INTERNAL;
  std::string message;
  std::string path; /* the plugin file loaded (empty for the built-in backend) */
  const pa_backend_ops* ops = nullptr;
};

LoadResult g_results[kNumBackends];

/* Every op the core calls without a NULL check. */
const char* missing_op(const pa_backend_ops* o) {
  if (!o->probe) return "probe";
  if (!o->create) return "create";
  if (!o->destroy) return "destroy";
  if (!o->get_capabilities) return "get_capabilities";
  if (!o->alloc) return "alloc";
  if (!o->free) return "free";
  if (!o->cache_write) return "cache_write";
  if (!o->copy_blocks) return "copy_blocks";
  if (!o->swap_blocks) return "swap_blocks";
  if (!o->read_blocks) return "read_blocks";
  if (!o->load_blocks) return "load_blocks";
  if (!o->plan_batch) return "plan_batch";
  if (!o->free_batch) return "free_batch";
  if (!o->forward) return "forward";
  if (!o->merge_states) return "merge_states";
  if (!o->synchronize) return "synchronize";
  return nullptr;
}

/* Directory holding this library, found through one of our own symbols. A name without a slash
 * is a program that linked the core statically and was started through PATH: it has no
 * directory to trust, and the working directory is never searched. */
std::string own_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&backend_ops), &info) == 0 || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

std::vector<std::string> search_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("PAGEDATTN_PLUGIN_PATH")) {
    std::string s = env;
    size_t start = 0;
    while (start <= s.size()) {
      size_t end = s.find(':', start);
      if (end == std::string::npos) end = s.size();
      if (end > start) dirs.push_back(s.substr(start, end - start));
      start = end + 1;
    }
  }
  const std::string own = own_directory();
  if (!own.empty()) dirs.push_back(own);
  return dirs;
}

const pa_backend_ops* check_table(const pa_backend_ops* ops, const char* name,
                                  const std::string& where, pagedattn_status* st,
                                  std::string* msg) {
  if (!ops) {
    *st = PAGEDATTN_ERROR_PLUGIN;
    *msg = format("%s: pagedattn_plugin_ops() returned NULL", where.c_str());
    return nullptr;
  }
  if (ops->abi_version != PA_PLUGIN_ABI_VERSION || ops->struct_size < sizeof(pa_backend_ops)) {
    *st = PAGEDATTN_ERROR_PLUGIN_ABI;
    *msg = format("%s: op table has ABI %u and size %u, core expects ABI %u and size >= %zu",
                  where.c_str(), ops->abi_version, ops->struct_size, PA_PLUGIN_ABI_VERSION,
                  sizeof(pa_backend_ops));
    return nullptr;
  }
  if (!ops->name || std::strcmp(ops->name, name) != 0) {
    *st = PAGEDATTN_ERROR_PLUGIN;
    *msg = format("%s: op table is for backend \"%s\", expected \"%s\"", where.c_str(),
                  ops->name ? ops->name : "(null)", name);
    return nullptr;
  }
  if (const char* op = missing_op(ops)) {
    *st = PAGEDATTN_ERROR_PLUGIN;
    *msg = format("%s: op table lacks required op %s", where.c_str(), op);
    return nullptr;
  }
  *st = PAGEDATTN_OK;
  return ops;
}

/* dlopen maps segments as the program headers say; a truncated file then faults (SIGBUS) inside
 * the loader instead of failing. Check that every loadable segment lies within the file first.
 * Returns "" when fine (or not an ELF file at all: dlopen reports that itself). */
std::string elf_problem(const std::string& path, off_t file_size) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return format("cannot open: %s", std::strerror(errno));
  std::string why;
  ElfW(Ehdr) eh;
  const uint64_t size = static_cast<uint64_t>(file_size);
  if (std::fread(&eh, sizeof eh, 1, f) == 1 && std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
      eh.e_ident[EI_CLASS] == (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32)) {
    const uint64_t ph_end = static_cast<uint64_t>(eh.e_phoff) +
                            static_cast<uint64_t>(eh.e_phnum) * eh.e_phentsize;
    if (eh.e_phentsize != sizeof(ElfW(Phdr)) || ph_end > size) {
      why = format("truncated or corrupt ELF: program headers end at %llu > file size %llu",
                   static_cast<unsigned long long>(ph_end), static_cast<unsigned long long>(size));
    } else {
      for (unsigned i = 0; i < eh.e_phnum && why.empty(); ++i) {
        ElfW(Phdr) ph;
        if (std::fseek(f, static_cast<long>(eh.e_phoff + i * sizeof ph), SEEK_SET) != 0 ||
            std::fread(&ph, sizeof ph, 1, f) != 1) {
          why = "truncated or corrupt ELF: unreadable program header";
          break;
        }
        const uint64_t end = static_cast<uint64_t>(ph.p_offset) + ph.p_filesz;
        if ((ph.p_type == PT_LOAD || ph.p_type == PT_DYNAMIC) && end > size)
          why = format("truncated or corrupt ELF: segment %u ends at byte %llu > file size %llu",
                       i, static_cast<unsigned long long>(end),
                       static_cast<unsigned long long>(size));
      }
    }
  }
  std::fclose(f);
  return why;
}

void load_plugin(int32_t index, LoadResult& r) {
  const char* name = kNames[index];
  const std::string file = format("libpagedattn-%s.so", name);
  const std::vector<std::string> dirs = search_dirs();
  std::string path;
  off_t file_size = 0;
  for (const std::string& dir : dirs) {
    const std::string candidate = dir + "/" + file;
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      path = candidate;
      file_size = st.st_size;
      break;
    }
  }
  if (path.empty()) {
    std::string searched;
    for (const std::string& dir : dirs) searched += (searched.empty() ? "" : ", ") + dir;
    /* common.h: PLUGIN covers "a plugin file is missing" (the maintainers' loader test too). */
    r.status = PAGEDATTN_ERROR_PLUGIN;
    r.message = format("%s: plugin %s not found (searched: %s)", name, file.c_str(),
                       searched.empty() ? "no directories" : searched.c_str());
    return;
  }
  const std::string problem = elf_problem(path, file_size);
  if (!problem.empty()) {
    r.status = PAGEDATTN_ERROR_PLUGIN;
    r.message = format("%s: cannot load %s: %s", name, path.c_str(), problem.c_str());
    return;
  }
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    r.status = PAGEDATTN_ERROR_PLUGIN;
    r.message = format("%s: cannot load %s: %s", name, path.c_str(), err ? err : "unknown error");
    return;
  }
  dlerror();
  auto abi_fn = reinterpret_cast<pa_plugin_abi_version_fn>(
      dlsym(handle, "pagedattn_plugin_abi_version"));
  auto ops_fn = reinterpret_cast<pa_plugin_ops_fn>(dlsym(handle, "pagedattn_plugin_ops"));
  if (!abi_fn || !ops_fn) {
    r.status = PAGEDATTN_ERROR_PLUGIN;
    r.message = format("%s: %s is not a pagedattn plugin: missing symbol %s", name, path.c_str(),
                       !abi_fn ? "pagedattn_plugin_abi_version" : "pagedattn_plugin_ops");
    dlclose(handle);
    return;
  }
  const uint32_t abi = abi_fn();
  if (abi != PA_PLUGIN_ABI_VERSION) {
    r.status = PAGEDATTN_ERROR_PLUGIN_ABI;
    r.message = format("%s: %s: plugin ABI %u, core expects %u", name, path.c_str(), abi,
                       PA_PLUGIN_ABI_VERSION);
    dlclose(handle);
    return;
  }
  pagedattn_status st;
  std::string msg;
  const pa_backend_ops* ops = check_table(ops_fn(), name, format("%s: %s", name, path.c_str()),
                                          &st, &msg);
  if (!ops) {
    r.status = st;
    r.message = msg;
    dlclose(handle);
    return;
  }
  r.path = path;
  r.status = PAGEDATTN_OK;
  r.ops = ops; /* handle intentionally kept open for the life of the process */
}

void load(int32_t index, LoadResult& r) {
  try {
    if (index == 0) {
      pagedattn_status st;
      std::string msg;
      r.ops = check_table(pa_cpu_backend_ops(), "cpu", "cpu: built-in backend", &st, &msg);
      r.status = r.ops ? PAGEDATTN_OK : PAGEDATTN_ERROR_INTERNAL;
      r.message = msg;
    } else {
      load_plugin(index, r);
    }
  } catch (const std::bad_alloc&) {
    r.status = PAGEDATTN_ERROR_OUT_OF_MEMORY;
    r.message = "out of host memory while loading a plugin";
  }
}

}  // namespace

const char* backend_name_at(int32_t index) {
  return index >= 0 && index < kNumBackends ? kNames[index] : nullptr;
}

int32_t backend_index(const char* name) {
  for (int32_t i = 0; i < kNumBackends; ++i)
    if (std::strcmp(name, kNames[i]) == 0) return i;
  return -1;
}

const pa_backend_ops* backend_ops(int32_t index) {
  LoadResult& r = g_results[index];
  std::call_once(r.once, [&] { load(index, r); });
  if (r.status != PAGEDATTN_OK) throw Error{r.status, r.message};
  return r.ops;
}

std::string backend_origin(int32_t index) {
  const LoadResult& r = g_results[index];
  return r.path.empty() ? std::string(kNames[index]) : format("%s: %s", kNames[index], r.path.c_str());
}

std::string known_backend_names() {
  std::string s;
  for (const char* n : kNames) s += std::string(s.empty() ? "" : ", ") + n;
  return s + ", auto";
}

}  // namespace pa
