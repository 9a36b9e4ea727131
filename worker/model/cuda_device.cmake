# Included by worker/model/CMakeLists.txt: the device options (every build) and, where the build
# has CUDA, the CUDA device and its GPU test.

# worker/device_options.h: --device / --gpu / --dtype / --gpu-memory-utilization / --cuda-graphs.
add_library(carpool_device_options ${CMAKE_CURRENT_SOURCE_DIR}/../device_options.cc)
target_link_libraries(carpool_device_options PUBLIC carpool_common absl::status absl::statusor
                                                    absl::strings PRIVATE carpool_warnings)
target_link_libraries(carpool_model PUBLIC carpool_device_options)

if(CARPOOL_WITH_CUDA)
  add_library(carpool_cuda_device ${CMAKE_CURRENT_SOURCE_DIR}/cuda_device.cc)
  target_link_libraries(carpool_cuda_device
    PUBLIC carpool_kernels_cuda carpool_weights carpool_common
    PRIVATE carpool_warnings)
  target_compile_definitions(carpool_cuda_device PUBLIC CARPOOL_HAVE_CUDA=1)
  # StorageTypeName and the rest of model_device.h live in carpool_model (a cycle of static
  # libraries, which CMake links by repeating them).
  target_link_libraries(carpool_cuda_device PUBLIC carpool_model)
  target_link_libraries(carpool_device_options PUBLIC carpool_cuda_device)
  target_compile_definitions(carpool_device_options PUBLIC CARPOOL_HAVE_CUDA=1)

  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/cuda_device_test.cc)
    carpool_test(carpool_cuda_device_test gpu
      SOURCES cuda_device_test.cc
      LIBS carpool_cuda_device carpool_kernels_cpu carpool_engine carpool_testing)
    if(TARGET carpool_gpu_checks)
      add_dependencies(carpool_gpu_checks carpool_cuda_device_test)
    endif()
  endif()
  # The whole model on the GPU through Engine::Create, against the CPU.
  carpool_test(carpool_cuda_model_test gpu
    SOURCES cuda_model_test.cc
    LIBS carpool_engine carpool_testing)
  if(TARGET carpool_gpu_checks)
    add_dependencies(carpool_gpu_checks carpool_cuda_model_test)
  endif()
  # Sampling on the GPU against the CPU sampler, and the engine with device sampling on and off.
  carpool_test(carpool_cuda_sampling_test gpu
    SOURCES cuda_sampling_test.cc
    LIBS carpool_cuda_device carpool_engine carpool_sampler carpool_testing)
  if(TARGET carpool_gpu_checks)
    add_dependencies(carpool_gpu_checks carpool_cuda_sampling_test)
  endif()
  # Tensor parallelism on GPUs: two ranks on one GPU over host staging, two GPUs over NCCL.
  set(carpool_cuda_tp_libs carpool_model carpool_cuda_device)
  if(CARPOOL_WITH_NCCL)
    list(APPEND carpool_cuda_tp_libs carpool_cluster_nccl)
  endif()
  carpool_test(carpool_cuda_tp_test gpu
    SOURCES cuda_tp_test.cc
    LIBS ${carpool_cuda_tp_libs})
  if(TARGET carpool_gpu_checks)
    add_dependencies(carpool_gpu_checks carpool_cuda_tp_test)
  endif()
endif()

# BuiltWithNccl() (worker/device_options.h), and carpool-worker's NCCL transport.
if(CARPOOL_WITH_NCCL)
  target_compile_definitions(carpool_device_options PUBLIC CARPOOL_HAVE_NCCL=1)
endif()
