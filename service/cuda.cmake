# The CUDA backend (included by service/CMakeLists.txt when CUDA is on, or by its tests before that
# wiring exists). Needs only the service's headers, so it also builds with VERIFYD_BUILD_SERVICE=OFF.
if(NOT TARGET verifyd_kvstore_cuda)
  include(${PROJECT_SOURCE_DIR}/kvstore/cuda.cmake)
endif()
add_library(verifyd_cuda_backend STATIC
  ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_graph_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_plan_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_slot_mirror.cc
  ${CMAKE_CURRENT_LIST_DIR}/cuda_slot_scatter.cu
  ${CMAKE_CURRENT_LIST_DIR}/cuda_verify_staging.cc
  ${CMAKE_CURRENT_LIST_DIR}/host_copy_pool.cc)
# The slot scatter kernel is C++17 device code (kernels/cuda.cmake says why not C++20).
set_target_properties(verifyd_cuda_backend PROPERTIES
  CUDA_STANDARD 17
  CUDA_EXTENSIONS OFF
  CUDA_RUNTIME_LIBRARY Static)
target_link_libraries(verifyd_cuda_backend PUBLIC verifyd_kvstore_cuda verifyd_kernels_cuda
                      verifyd_kernels_cpu CUDA::cudart_static absl::flat_hash_map
                      absl::flat_hash_set absl::status absl::statusor absl::span absl::strings
                      Threads::Threads)

# Included from service/CMakeLists.txt: the daemon gets the backend (backend_factory.cc's hooks).
if(TARGET verifyd_service_lib AND CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_CURRENT_LIST_DIR)
  target_compile_definitions(verifyd_service_lib PRIVATE VERIFYD_HAVE_CUDA_BACKEND)
  target_link_libraries(verifyd_service_lib PUBLIC verifyd_cuda_backend)
endif()
