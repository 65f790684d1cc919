# The device KV pool (included by kvstore/CMakeLists.txt when CUDA is on, or by the CUDA backend's
# tests before that wiring exists). Sources are named from this file's folder so either works.
add_library(verifyd_kvstore_cuda STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cuda_device_memory.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_kv_kernels.cu
  ${CMAKE_CURRENT_LIST_DIR}/cuda_kv_storage.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_write_batch.cc)
# CMake 3.25 cannot pass C++20 to nvcc 13; the kernels need C++17 only (as in kernels/cuda.cmake).
set_target_properties(verifyd_kvstore_cuda PROPERTIES
  CUDA_STANDARD 17
  CUDA_EXTENSIONS OFF
  CUDA_RUNTIME_LIBRARY Static
  CUDA_SEPARABLE_COMPILATION OFF)
target_compile_options(verifyd_kvstore_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xptxas=-warn-spills>)
target_link_libraries(verifyd_kvstore_cuda PUBLIC verifyd_kvstore verifyd_kernels_cuda
                      CUDA::cudart_static absl::flat_hash_map absl::status absl::statusor absl::span
                      absl::strings)
