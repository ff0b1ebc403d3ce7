#include "runtime/cuda/cuda_libraries.hpp"

#include <gpucloud/runtime/error.hpp>

#include <cublasLt.h>
#if GPUCLOUD_WITH_CUDNN
#include <cudnn_version.h>
#endif
#if GPUCLOUD_WITH_NCCL
#include <nccl.h>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#define GPUCLOUD_STRINGIFY_(x) #x
#define GPUCLOUD_STRINGIFY(x) GPUCLOUD_STRINGIFY_(x)

#if GPUCLOUD_CUDA_LIBRARIES_AT_RUNTIME

namespace gpucloud::detail::cuda {

namespace {

// Every function, numbered in the order of the list.
enum Symbol : int {
#define GPUCLOUD_CUDA_SYMBOL(library, name) symbol_##name,
#include "runtime/cuda/cuda_library_symbols.def"
#undef GPUCLOUD_CUDA_SYMBOL
  symbol_count
};

struct SymbolEntry {
  Library library;
  const char* name;
};
constexpr SymbolEntry kSymbols[] = {
#define GPUCLOUD_CUDA_SYMBOL(library, name) {Library::library, #name},
#include "runtime/cuda/cuda_library_symbols.def"
#undef GPUCLOUD_CUDA_SYMBOL
};

// What a slot holds before its library is loaded: a call there is a gpucloud bug (a path that
// calls the library without require()); say which function and stop, rather than jump to null.
[[noreturn]] void called_before_loading(int symbol) noexcept {
  std::fprintf(stderr,
               "gpucloud: internal error: %s was called before gpucloud loaded its library (a missing "
               "require()); please report it\n",
               kSymbols[symbol].name);
  std::abort();
}

template <int S>
[[noreturn]] void unloaded() noexcept {
  called_before_loading(S);
}

struct LoadState {
  bool tried = false;
  void* handle = nullptr;
  std::string failure;  // empty: loaded
};

std::mutex& load_mutex() {
  static std::mutex m;
  return m;
}

LoadState& state_of(Library lib) {
  static LoadState states[3];
  return states[static_cast<int>(lib)];
}

}  // namespace
}  // namespace gpucloud::detail::cuda

// The slots the trampolines jump through (hidden: gpucloud's alone).
extern "C" {
#define GPUCLOUD_CUDA_SYMBOL(library, name)                               \
  __attribute__((visibility("hidden"))) void* gpucloud_cuda_slot_##name = \
      reinterpret_cast<void*>(&gpucloud::detail::cuda::unloaded<gpucloud::detail::cuda::symbol_##name>);
#include "runtime/cuda/cuda_library_symbols.def"
#undef GPUCLOUD_CUDA_SYMBOL
}

namespace gpucloud::detail::cuda {

namespace {

void** slot(int symbol) {
  static void** const slots[] = {
#define GPUCLOUD_CUDA_SYMBOL(library, name) &gpucloud_cuda_slot_##name,
#include "runtime/cuda/cuda_library_symbols.def"
#undef GPUCLOUD_CUDA_SYMBOL
  };
  return slots[symbol];
}

// dlopen by soname (the process, LD_LIBRARY_PATH, this library's RUNPATH, ld.so.conf), then in
// each directory of $GPUCLOUD_CUDA_LIBRARY_PATH (the Python package names the nvidia-* wheels'
// there), then $CUDA_HOME and $CUDA_PATH. RTLD_LOCAL: the functions are reached through dlsym only.
void* open_library(const char* soname, std::string& errors) {
  if (void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  errors = dlerror();
  if (const char* dirs = std::getenv("GPUCLOUD_CUDA_LIBRARY_PATH"); dirs != nullptr) {
    std::string list = dirs;
    for (std::size_t start = 0; start <= list.size();) {
      const std::size_t end = std::min(list.find(':', start), list.size());
      const std::string dir = list.substr(start, end - start);
      start = end + 1;
      if (dir.empty()) continue;
      const std::string path = dir + "/" + soname;
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
      errors += "; " + std::string(dlerror());
    }
  }
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* root = std::getenv(var);
    if (root == nullptr || *root == '\0') continue;
    for (const char* sub : {"/lib64/", "/lib/"}) {
      const std::string path = std::string(root) + sub + soname;
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
      errors += "; " + std::string(dlerror());
    }
  }
  return nullptr;
}

// Loads @p lib and fills its slots (load_mutex held).
void load(Library lib, LoadState& st) {
  st.tried = true;
  const LibraryInfo info = library_info(lib);
  std::string errors;
  void* handle = open_library(info.soname, errors);
  const std::string how = std::string(". gpucloud loads ") + info.name +
                          " when a GPU first needs it: install it with pip install 'gpucloud[cuda13]' (the " +
                          info.package + " wheel) or from the CUDA toolkit, and make " + info.soname +
                          " findable (LD_LIBRARY_PATH, GPUCLOUD_CUDA_LIBRARY_PATH, or CUDA_HOME naming the toolkit)";
  if (handle == nullptr) {
    st.failure = std::string(info.name) + " (" + info.soname + ") could not be loaded: " + errors + how;
    return;
  }
  std::vector<std::pair<int, void*>> found;
  for (int s = 0; s < symbol_count; ++s) {
    if (kSymbols[s].library != lib) continue;
    void* f = dlsym(handle, kSymbols[s].name);
    if (f == nullptr) {
      st.failure = std::string(info.name) + " (" + info.soname + ") has no " + kSymbols[s].name +
                   ": it is older than the version gpucloud was built against" + how;
      dlclose(handle);
      return;
    }
    found.emplace_back(s, f);
  }
  for (const auto& [s, f] : found) __atomic_store_n(slot(s), f, __ATOMIC_RELEASE);
  st.handle = handle;  // kept for the process's life: the slots point into it
}

}  // namespace

}  // namespace gpucloud::detail::cuda

#endif  // GPUCLOUD_CUDA_LIBRARIES_AT_RUNTIME

namespace gpucloud::detail::cuda {

LibraryInfo library_info(Library lib) noexcept {
  switch (lib) {
    case Library::cublaslt:
      return {"cuBLASLt", "libcublasLt.so." GPUCLOUD_STRINGIFY(CUBLAS_VER_MAJOR), "nvidia-cublas"};
    case Library::cudnn:
#if GPUCLOUD_WITH_CUDNN
      return {"cuDNN", "libcudnn.so." GPUCLOUD_STRINGIFY(CUDNN_MAJOR), "nvidia-cudnn-cu13"};
#else
      return {"cuDNN", "libcudnn.so", "nvidia-cudnn-cu13"};
#endif
    case Library::nccl:
#if GPUCLOUD_WITH_NCCL
      return {"NCCL", "libnccl.so." GPUCLOUD_STRINGIFY(NCCL_MAJOR), "nvidia-nccl-cu13"};
#else
      return {"NCCL", "libnccl.so", "nvidia-nccl-cu13"};
#endif
  }
  return {"?", "?", "?"};
}

#if GPUCLOUD_CUDA_LIBRARIES_AT_RUNTIME

void require(Library lib) {
  std::lock_guard<std::mutex> lock(load_mutex());
  LoadState& st = state_of(lib);
  if (!st.tried) load(lib, st);
  if (!st.failure.empty()) throw Unsupported(library_info(lib).name, st.failure, __FILE__, __LINE__);
}

bool available(Library lib) noexcept {
  try {
    require(lib);
    return true;
  } catch (...) {
    return false;
  }
}

std::string unavailable_reason(Library lib) {
  std::lock_guard<std::mutex> lock(load_mutex());
  return state_of(lib).failure;
}

#else  // linked: nothing to load

void require(Library) {}
bool available(Library) noexcept { return true; }
std::string unavailable_reason(Library) { return {}; }

#endif

}  // namespace gpucloud::detail::cuda
