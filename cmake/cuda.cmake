# The CUDA build (FSDP_WITH_CUDA=ON; scripts/build_cuda.sh): the NCCL backend and the gpu tests.
# Included after find_package(Torch), which has already found the CUDA toolkit (a CUDA libtorch
# enables the CUDA language and runs find_package(CUDAToolkit) in its own config).
if(NOT TORCH_CUDA_LIBRARIES OR NOT TARGET CUDA::cudart)
  message(FATAL_ERROR "FSDP_WITH_CUDA=ON but the libtorch found (${Torch_DIR}) has no CUDA: point "
    "CMAKE_PREFIX_PATH at a CUDA build of PyTorch (torch.version.cuda not None)")
endif()
# The CUDA driver (libcuda) is not a link dependency of this project (the CUDA runtime and
# libtorch load it when they start); libtorch's config names it, so a build host without a
# driver (where the toolkit comes from pip wheels) gets an empty target in its place.
if(NOT TARGET CUDA::cuda_driver)
  message(STATUS "fsdp: no CUDA driver library (libcuda.so) on this host: linking without it")
  add_library(CUDA::cuda_driver INTERFACE IMPORTED)
endif()

# NCCL: the one next to libtorch first (the nvidia-nccl wheel that libtorch_cuda loads), then
# NCCL_ROOT, the CUDA toolkit and the system.
get_filename_component(_fsdp_site_packages "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS "${_fsdp_site_packages}/nvidia/nccl/include" "${NCCL_ROOT}/include" ${CUDAToolkit_INCLUDE_DIRS})
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
  HINTS "${_fsdp_site_packages}/nvidia/nccl/lib" "${NCCL_ROOT}/lib" "${CUDAToolkit_LIBRARY_DIR}")
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "FSDP_WITH_CUDA=ON but NCCL was not found (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: "
    "${NCCL_LIBRARY}): install the nvidia-nccl wheel beside torch or the system's libnccl-dev, or set NCCL_ROOT")
endif()
file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _fsdp_nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
string(REGEX REPLACE ".*NCCL_MAJOR +([0-9]+).*NCCL_MINOR +([0-9]+).*NCCL_PATCH +([0-9]+).*" "\\1.\\2.\\3"
  NCCL_VERSION "${_fsdp_nccl_version}")
# ncclCommSplit (split) came with NCCL 2.18.
if(NCCL_VERSION VERSION_LESS 2.18)
  message(FATAL_ERROR "NCCL ${NCCL_VERSION} at ${NCCL_INCLUDE_DIR} is older than 2.18 (ncclCommSplit)")
endif()
message(STATUS "fsdp: CUDA ${CUDAToolkit_VERSION}, NCCL ${NCCL_VERSION} (${NCCL_LIBRARY})")

target_sources(fsdp PRIVATE src/comm/nccl_backend.cpp)
# Its own translation unit: the CUDA and NCCL headers stay out of the other files' batches.
set_source_files_properties(src/comm/nccl_backend.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
target_include_directories(fsdp PRIVATE ${NCCL_INCLUDE_DIR})
target_link_libraries(fsdp PUBLIC ${NCCL_LIBRARY} CUDA::cudart)
target_compile_definitions(fsdp PUBLIC FSDP_WITH_CUDA=1)
