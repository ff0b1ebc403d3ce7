# cmake -DMODE=find_package|add_subdirectory -DSOURCE_DIR=... -DBUILD_DIR=... -DWORK_DIR=... -P run_consumer.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()

set(consumer_src ${SOURCE_DIR}/tests/consumer)
if(MODE STREQUAL "find_package")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/build -DGPUCLOUD_CONSUMER_MODE=find_package
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release)
else()
  # The host-only configuration keeps this test fast; the CUDA build is covered by the main tree.
  run(${CMAKE_COMMAND} -S ${consumer_src} -B ${WORK_DIR}/build -DGPUCLOUD_CONSUMER_MODE=add_subdirectory
      -DGPUCLOUD_SOURCE_DIR=${SOURCE_DIR} -DGPUCLOUD_CUDA=OFF -DCMAKE_BUILD_TYPE=Release)
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j2)
run(${WORK_DIR}/build/consumer)
# The CUDA libraries are gpucloud's private business: the consumer links libgpucloud alone, and
# libgpucloud carries a RUNPATH to the libraries it needs (so neither the consumer's link nor its
# run relies on ld.so.conf naming the toolkit, as it happens to on the CI machines).
find_program(READELF readelf)
if(READELF AND MODE STREQUAL "find_package")
  execute_process(COMMAND ${READELF} -d ${WORK_DIR}/build/consumer OUTPUT_VARIABLE dyn)
  if(dyn MATCHES "cublas|cudnn|nccl|cudart")
    message(FATAL_ERROR "the consumer links CUDA libraries directly:\n${dyn}")
  endif()
  file(GLOB libs ${WORK_DIR}/prefix/lib*/libgpucloud.so.*.*.*)
  foreach(lib IN LISTS libs)
    execute_process(COMMAND ${READELF} -d ${lib} OUTPUT_VARIABLE dyn)
    if(dyn MATCHES "libcublas" AND NOT dyn MATCHES "RUNPATH|RPATH")
      message(FATAL_ERROR "${lib} needs cuBLAS but has no RUNPATH to find it:\n${dyn}")
    endif()
    message("${lib}: ${dyn}")
  endforeach()
endif()
