// Small explicit thread stacks in CUDA builds. An executable that links libgpucloud links cuBLASLt
// at startup, and cuBLASLt's thread-local storage (about 92 KiB) then becomes static TLS, which
// glibc places at the top of every thread's stack. A thread created with a small explicit stack
// (civetweb, the HTTP server under prometheus-cpp's exposer, asks for 100 KiB) then fails with
// EINVAL: "Cannot create first worker thread". Explicit stack sizes below 1 MiB are raised to
// 1 MiB (address space, not memory: stack pages are touched on use). Where libgpucloud is loaded
// by dlopen (the Python extension), cuBLASLt's TLS is dynamic and this interposer is not reached;
// nor is it needed there.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

extern "C" __attribute__((visibility("default"))) int pthread_attr_setstacksize(pthread_attr_t* attr,
                                                                                std::size_t size) {
  using Real = int (*)(pthread_attr_t*, std::size_t);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr std::size_t kFloor = std::size_t{1} << 20;
  return real(attr, size < kFloor ? kFloor : size);
}
