# GPU side of kernels/ (included by kernels/CMakeLists.txt when CUDA is on): the flash tree-verify
# kernel, its split-KV combine, the naive on-GPU oracle, the KV slot writer and their host launcher.
add_library(verifyd_kernels_cuda STATIC
  split_planner.cc
  mla_verify_launch.cu
  mla_verify_flash.cu
  mla_verify_combine.cu
  mla_verify_naive.cu
  kv_slot_write.cu)
# CMake 3.25 cannot pass C++20 to nvcc 13 (no CUDA20 dialect flags for it); the kernels need C++17 only.
set_target_properties(verifyd_kernels_cuda PROPERTIES
  CUDA_STANDARD 17
  CUDA_EXTENSIONS OFF
  CUDA_RUNTIME_LIBRARY Static
  CUDA_SEPARABLE_COMPILATION OFF)
target_compile_options(verifyd_kernels_cuda PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
target_link_libraries(verifyd_kernels_cuda PUBLIC CUDA::cudart_static absl::status absl::statusor absl::span
                      absl::strings)
