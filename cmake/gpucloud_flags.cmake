# Warning and sanitizer flags, applied per target through gpucloud_project_options.
add_library(gpucloud_project_options INTERFACE)
target_compile_options(gpucloud_project_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>)
# __FILE__ relative to the project root: an error names src/comm/agreement.cpp:73, not the path of
# the machine that built the library (debug information keeps full paths).
get_filename_component(_gpucloud_root "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
target_compile_options(gpucloud_project_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-fmacro-prefix-map=${_gpucloud_root}/=>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fmacro-prefix-map=${_gpucloud_root}/=>)
if(GPUCLOUD_WARNINGS_AS_ERRORS)
  target_compile_options(gpucloud_project_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror> $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
if(GPUCLOUD_SANITIZE)
  set(_san "-fsanitize=${GPUCLOUD_SANITIZE};-fno-omit-frame-pointer")
  if(GPUCLOUD_SANITIZE MATCHES "undefined")
    list(APPEND _san "-fno-sanitize-recover=undefined")
  endif()
  target_compile_options(gpucloud_project_options INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${_san}>)
  target_link_options(gpucloud_project_options INTERFACE ${_san})
endif()
