# The CUDA properties every target with device code shares, in one place.
# CMake 3.25 cannot pass C++20 to nvcc 13 (it has no CUDA20 dialect flags for it); the device code
# needs C++17 only. The runtime is linked statically so the binaries carry no libcudart dependency.
function(verifyd_cuda_target target)
  set_target_properties(${target} PROPERTIES
    CUDA_STANDARD 17
    CUDA_EXTENSIONS OFF
    CUDA_RUNTIME_LIBRARY Static
    CUDA_SEPARABLE_COMPILATION OFF)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills>)
endfunction()
