# vulkan.cmake — the Vulkan compute backend (src/vulkan, docs/gpu.md).
# CELLM_VULKAN: AUTO (default) builds it when the Vulkan headers
# (vulkan/vulkan.h, Debian libvulkan-dev) and the GLSL compiler glslc
# (Debian glslc) are found, ON requires them, OFF leaves it out. Either way
# the library links no Vulkan library: the loader is opened at run time
# with dlopen. Without the backend, src/vulkan/vk_stub.c answers every
# entry point with CELLM_ERR_UNSUPPORTED ("built without Vulkan").
# Expects CELLM_LIB_SOURCES (the library's sources) and the target cellm_obj;
# sets CELLM_HAVE_VULKAN.
set(CELLM_VULKAN AUTO CACHE STRING "Build the Vulkan compute backend: AUTO, ON or OFF")
set_property(CACHE CELLM_VULKAN PROPERTY STRINGS AUTO ON OFF)

set(CELLM_HAVE_VULKAN OFF)
if(CELLM_VULKAN STREQUAL "OFF")
  message(STATUS "cellm: Vulkan backend off (CELLM_VULKAN=OFF)")
else()
  find_path(VULKAN_HEADER_DIR vulkan/vulkan.h)
  find_program(GLSLC_EXECUTABLE glslc)
  if(VULKAN_HEADER_DIR AND GLSLC_EXECUTABLE)
    set(CELLM_HAVE_VULKAN ON)
  elseif(CELLM_VULKAN STREQUAL "ON")
    message(FATAL_ERROR "CELLM_VULKAN=ON needs vulkan/vulkan.h (libvulkan-dev) and glslc (glslc): "
                        "header ${VULKAN_HEADER_DIR}, compiler ${GLSLC_EXECUTABLE}")
  else()
    message(STATUS "cellm: Vulkan backend off (vulkan/vulkan.h: ${VULKAN_HEADER_DIR}, "
                   "glslc: ${GLSLC_EXECUTABLE}; scripts/setup.sh installs both)")
  endif()
endif()

if(NOT CELLM_HAVE_VULKAN)
  # Only the stub answers for the backend.
  list(FILTER CELLM_LIB_SOURCES EXCLUDE REGEX "/src/vulkan/[^/]*\\.c$")
  list(APPEND CELLM_LIB_SOURCES ${PROJECT_SOURCE_DIR}/src/vulkan/vk_stub.c)
  return()
endif()
message(STATUS "cellm: Vulkan backend on (glslc: ${GLSLC_EXECUTABLE})")
list(FILTER CELLM_LIB_SOURCES EXCLUDE REGEX "/src/vulkan/vk_stub\\.c$")

# The shaders: NAME SOURCE [glslc flags...]. One source may build several
# modules (a weight type per #define); NAME is what vk_shaders.c asks for.
set(CELLM_VK_SHADERS
    "matmul_f32|matmul.comp|-DW_F32"
    "matmul_f16|matmul.comp|-DW_F16"
    "matmul_q4_0|matmul.comp|-DW_Q4_0"
    "matmul_q4_1|matmul.comp|-DW_Q4_1"
    "matmul_q5_0|matmul.comp|-DW_Q5_0"
    "matmul_q8_0|matmul.comp|-DW_Q8_0"
    "matmul_q4_k|matmul.comp|-DW_Q4_K"
    "matmul_q5_k|matmul.comp|-DW_Q5_K"
    "matmul_q6_k|matmul.comp|-DW_Q6_K"
    "matmulL_f32|matmul.comp|-DW_F32|-DLANE_PER_OUTPUT"
    "matmulL_f16|matmul.comp|-DW_F16|-DLANE_PER_OUTPUT"
    "matmulL_q4_0|matmul.comp|-DW_Q4_0|-DLANE_PER_OUTPUT"
    "matmulL_q4_1|matmul.comp|-DW_Q4_1|-DLANE_PER_OUTPUT"
    "matmulL_q5_0|matmul.comp|-DW_Q5_0|-DLANE_PER_OUTPUT"
    "matmulL_q8_0|matmul.comp|-DW_Q8_0|-DLANE_PER_OUTPUT"
    "matmulL_q4_k|matmul.comp|-DW_Q4_K|-DLANE_PER_OUTPUT"
    "matmulL_q5_k|matmul.comp|-DW_Q5_K|-DLANE_PER_OUTPUT"
    "matmulL_q6_k|matmul.comp|-DW_Q6_K|-DLANE_PER_OUTPUT"
    "matmulG_f32|matmul.comp|-DW_F32|-DX_GLU"
    "matmulG_f16|matmul.comp|-DW_F16|-DX_GLU"
    "matmulG_q4_0|matmul.comp|-DW_Q4_0|-DX_GLU"
    "matmulG_q4_1|matmul.comp|-DW_Q4_1|-DX_GLU"
    "matmulG_q5_0|matmul.comp|-DW_Q5_0|-DX_GLU"
    "matmulG_q8_0|matmul.comp|-DW_Q8_0|-DX_GLU"
    "matmulG_q4_k|matmul.comp|-DW_Q4_K|-DX_GLU"
    "matmulG_q5_k|matmul.comp|-DW_Q5_K|-DX_GLU"
    "matmulG_q6_k|matmul.comp|-DW_Q6_K|-DX_GLU"
    "matmulQ_f16|matmul.comp|-DW_F16|-DX_Q8"
    "matmulQ_q4_0|matmul.comp|-DW_Q4_0|-DX_Q8"
    "matmulQ_q4_1|matmul.comp|-DW_Q4_1|-DX_Q8"
    "matmulQ_q5_0|matmul.comp|-DW_Q5_0|-DX_Q8"
    "matmulQ_q8_0|matmul.comp|-DW_Q8_0|-DX_Q8"
    "matmulQ_q4_k|matmul.comp|-DW_Q4_K|-DX_Q8"
    "matmulQ_q5_k|matmul.comp|-DW_Q5_K|-DX_Q8"
    "matmulQ_q6_k|matmul.comp|-DW_Q6_K|-DX_Q8"
    "matmulLQ_f16|matmul.comp|-DW_F16|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q4_0|matmul.comp|-DW_Q4_0|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q4_1|matmul.comp|-DW_Q4_1|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q5_0|matmul.comp|-DW_Q5_0|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q8_0|matmul.comp|-DW_Q8_0|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q4_k|matmul.comp|-DW_Q4_K|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q5_k|matmul.comp|-DW_Q5_K|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulLQ_q6_k|matmul.comp|-DW_Q6_K|-DLANE_PER_OUTPUT|-DX_Q8"
    "matmulGQ_f16|matmul.comp|-DW_F16|-DX_GLU|-DX_Q8"
    "matmulGQ_q4_0|matmul.comp|-DW_Q4_0|-DX_GLU|-DX_Q8"
    "matmulGQ_q4_1|matmul.comp|-DW_Q4_1|-DX_GLU|-DX_Q8"
    "matmulGQ_q5_0|matmul.comp|-DW_Q5_0|-DX_GLU|-DX_Q8"
    "matmulGQ_q8_0|matmul.comp|-DW_Q8_0|-DX_GLU|-DX_Q8"
    "matmulGQ_q4_k|matmul.comp|-DW_Q4_K|-DX_GLU|-DX_Q8"
    "matmulGQ_q5_k|matmul.comp|-DW_Q5_K|-DX_GLU|-DX_Q8"
    "matmulGQ_q6_k|matmul.comp|-DW_Q6_K|-DX_GLU|-DX_Q8"
    "matmulT_f32|matmul.comp|-DW_F32|-DTILED"
    "matmulT_f16|matmul.comp|-DW_F16|-DTILED"
    "matmulT_q4_0|matmul.comp|-DW_Q4_0|-DTILED"
    "matmulT_q4_1|matmul.comp|-DW_Q4_1|-DTILED"
    "matmulT_q5_0|matmul.comp|-DW_Q5_0|-DTILED"
    "matmulT_q8_0|matmul.comp|-DW_Q8_0|-DTILED"
    "matmulT_q4_k|matmul.comp|-DW_Q4_K|-DTILED"
    "matmulT_q5_k|matmul.comp|-DW_Q5_K|-DTILED"
    "matmulT_q6_k|matmul.comp|-DW_Q6_K|-DTILED"
    "matmulTG_f32|matmul.comp|-DW_F32|-DTILED|-DX_GLU"
    "matmulTG_f16|matmul.comp|-DW_F16|-DTILED|-DX_GLU"
    "matmulTG_q4_0|matmul.comp|-DW_Q4_0|-DTILED|-DX_GLU"
    "matmulTG_q4_1|matmul.comp|-DW_Q4_1|-DTILED|-DX_GLU"
    "matmulTG_q5_0|matmul.comp|-DW_Q5_0|-DTILED|-DX_GLU"
    "matmulTG_q8_0|matmul.comp|-DW_Q8_0|-DTILED|-DX_GLU"
    "matmulTG_q4_k|matmul.comp|-DW_Q4_K|-DTILED|-DX_GLU"
    "matmulTG_q5_k|matmul.comp|-DW_Q5_K|-DTILED|-DX_GLU"
    "matmulTG_q6_k|matmul.comp|-DW_Q6_K|-DTILED|-DX_GLU"
    "rmsnorm|rmsnorm.comp"
    "qk_prep|qk_prep.comp"
    "attention|attention.comp"
    "attention_prefill|attention.comp|-DPREFILL|-DINFLIGHT=2"
    "act|act.comp"
    "add_norm|add_norm.comp"
    "logits|logits.comp"
    "top|top.comp")

set(shader_dir ${PROJECT_SOURCE_DIR}/src/vulkan/shaders)
file(GLOB shader_includes CONFIGURE_DEPENDS ${shader_dir}/*.glsl)
set(spv_names "")
set(spv_files "")
foreach(entry ${CELLM_VK_SHADERS})
  string(REPLACE "|" ";" parts "${entry}")
  list(POP_FRONT parts name src)
  set(spv ${PROJECT_BINARY_DIR}/shaders/${name}.spv)
  # Vulkan 1.1 is the floor (phones' drivers); -O for the drivers that
  # compile SPIR-V as given.
  add_custom_command(OUTPUT ${spv}
    COMMAND ${GLSLC_EXECUTABLE} --target-env=vulkan1.1 -Werror ${parts}
            -o ${spv} ${shader_dir}/${src}
    DEPENDS ${shader_dir}/${src} ${shader_includes}
    COMMENT "glslc ${name}"
    VERBATIM)
  list(APPEND spv_names ${name})
  list(APPEND spv_files ${spv})
endforeach()
file(MAKE_DIRECTORY ${PROJECT_BINARY_DIR}/shaders)
set(spirv_c ${PROJECT_BINARY_DIR}/shaders/vk_spirv.c)
string(REPLACE ";" "\\;" spv_names_arg "${spv_names}")
string(REPLACE ";" "\\;" spv_files_arg "${spv_files}")
add_custom_command(OUTPUT ${spirv_c}
  COMMAND ${CMAKE_COMMAND} -DOUT=${spirv_c} -DNAMES=${spv_names_arg} -DFILES=${spv_files_arg}
          -P ${PROJECT_SOURCE_DIR}/cmake/spv2c.cmake
  DEPENDS ${spv_files} ${PROJECT_SOURCE_DIR}/cmake/spv2c.cmake
  COMMENT "embedding ${spv_names}"
  VERBATIM)
list(APPEND CELLM_LIB_SOURCES ${spirv_c})
