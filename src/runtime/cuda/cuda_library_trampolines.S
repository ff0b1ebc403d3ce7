// An entry point for each function of cuda_library_symbols.def: a jump through its slot
// (gpucloud_cuda_slot_<name>, in cuda_libraries.cpp), which require() points at the library's
// function. Arguments are left untouched, so one jump serves every signature. Hidden: they serve
// gpucloud alone and never interpose on a program's own copy of the libraries.
#if defined(__x86_64__)
        .text
        .macro GPUCLOUD_TRAMPOLINE name
        .globl \name
        .hidden \name
        .type \name, @function
        .p2align 4
\name:
        .cfi_startproc
        jmp *gpucloud_cuda_slot_\name(%rip)
        .cfi_endproc
        .size \name, .-\name
        .endm
#define GPUCLOUD_CUDA_SYMBOL(library, name) GPUCLOUD_TRAMPOLINE name
#elif defined(__aarch64__)
        .text
        .macro GPUCLOUD_TRAMPOLINE name
        .globl \name
        .hidden \name
        .type \name, %function
        .p2align 4
\name:
        .cfi_startproc
        adrp x16, gpucloud_cuda_slot_\name
        ldr x16, [x16, #:lo12:gpucloud_cuda_slot_\name]
        br x16
        .cfi_endproc
        .size \name, .-\name
        .endm
#define GPUCLOUD_CUDA_SYMBOL(library, name) GPUCLOUD_TRAMPOLINE name
#else
#error "CUDA libraries loaded at run time need x86-64 or AArch64: configure with GPUCLOUD_CUDA_LIBRARIES_AT_RUNTIME=OFF"
#endif

#include "cuda_library_symbols.def"

#if defined(__x86_64__)
        .section .note.GNU-stack,"",@progbits
#else
        .section .note.GNU-stack,"",%progbits
#endif
