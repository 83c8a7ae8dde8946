# The sources of speculative prefill in the common library, included by common/CMakeLists.txt (patch 0008): a new file
# of the feature is listed here, not in the patch.
target_sources(${TARGET} PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill.cpp
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill.h
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-arg.cpp
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-arg.h
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-graph.cpp
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-graph.h
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-params.h
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-plan.cpp
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-plan.h
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-select.cpp
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-select.h
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-settings.cpp
    ${CMAKE_CURRENT_LIST_DIR}/spec-prefill-settings.h)
