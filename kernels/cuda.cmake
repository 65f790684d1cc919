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

# The Hopper flash kernel uses wgmma, which exists only for sm_90a: it is compiled for that target
# alone (the -gencode form; nvcc 13.0's -arch=sm_90a shorthand also runs a plain sm_90 pass that
# rejects wgmma) and linked into the same library. The launcher uses it only where it has an image.
add_library(verifyd_kernels_sm90a OBJECT mla_verify_flash_sm90.cu)
set_target_properties(verifyd_kernels_sm90a PROPERTIES
  CUDA_ARCHITECTURES OFF
  CUDA_STANDARD 17
  CUDA_EXTENSIONS OFF
  POSITION_INDEPENDENT_CODE ON)
target_compile_options(verifyd_kernels_sm90a PRIVATE
  -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills)
target_sources(verifyd_kernels_cuda PRIVATE $<TARGET_OBJECTS:verifyd_kernels_sm90a>)
