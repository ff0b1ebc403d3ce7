// Internal: the host loops' run-time CPU dispatch (not API). A function marked
// GPUCLOUD_HOST_CLONES is compiled for AVX-512, AVX2 and the baseline x86-64 with GCC's
// target_clones, and the dynamic loader picks the version the CPU runs (an ifunc), as NumPy and
// oneDNN dispatch at run time; GPUCLOUD_HOST_CLONES_FLATTEN also inlines every call inside into
// each version. Elsewhere (another compiler or CPU) both mark nothing and one portable version is
// built; so do ThreadSanitizer builds: an ifunc in an executable (a test that compiles one of these
// sources itself) is resolved while the program is relocated, before TSan's runtime is up, and
// crashes it.
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define GPUCLOUD_HOST_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define GPUCLOUD_HOST_CLONES_FLATTEN __attribute__((target_clones("avx512f", "avx2", "default"), flatten))
#else
#define GPUCLOUD_HOST_CLONES
#define GPUCLOUD_HOST_CLONES_FLATTEN
#endif
