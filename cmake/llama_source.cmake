# The llama.cpp source tree streamtts builds against: the copy vendored by the
# llama-cpp-python sdist (pinned version and SHA256 below), or a tree the user names.
#
# Included by the top-level CMakeLists.txt, and run as a script by native/build.sh:
#   cmake -DSTREAMTTS_SOURCE_CACHE=<dir> -DOUT_FILE=<file> -P cmake/llama_source.cmake
# which writes the llama.cpp folder it found (or downloaded) into OUT_FILE.
#
# Inputs (CMake variables, else the environment variable of the same name):
#   LLAMA_CPP_DIR            a llama.cpp source tree: used as is, nothing is downloaded
#   STREAMTTS_SOURCE_CACHE   where the sdist is unpacked and kept between builds
#                            (default: <build folder>/_llama_src)
# Output: STREAMTTS_LLAMA_DIR (the llama.cpp folder), STREAMTTS_LLAMA_SOURCE_ID (a label:
# "llama-cpp-python==<version>" or "dir:<folder>").

set(STREAMTTS_LLAMA_CPP_PYTHON_VERSION "0.3.36")
set(STREAMTTS_LLAMA_SDIST_SHA256 "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e")
set(STREAMTTS_LLAMA_SDIST_URL
    "https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-${STREAMTTS_LLAMA_CPP_PYTHON_VERSION}.tar.gz")

function(streamtts_llama_source)
    if(NOT LLAMA_CPP_DIR AND DEFINED ENV{LLAMA_CPP_DIR} AND NOT "$ENV{LLAMA_CPP_DIR}" STREQUAL "")
        set(LLAMA_CPP_DIR "$ENV{LLAMA_CPP_DIR}")
    endif()
    if(LLAMA_CPP_DIR)
        get_filename_component(dir "${LLAMA_CPP_DIR}" ABSOLUTE)
        if(NOT EXISTS "${dir}/include/llama.h")
            message(FATAL_ERROR "LLAMA_CPP_DIR=${LLAMA_CPP_DIR} has no include/llama.h: "
                                "point it at a llama.cpp source tree (e.g. vendor/llama.cpp of the "
                                "llama-cpp-python ${STREAMTTS_LLAMA_CPP_PYTHON_VERSION} sdist)")
        endif()
        set(STREAMTTS_LLAMA_DIR "${dir}" PARENT_SCOPE)
        set(STREAMTTS_LLAMA_SOURCE_ID "dir:${dir}" PARENT_SCOPE)
        return()
    endif()

    set(cache "${STREAMTTS_SOURCE_CACHE}")
    if(NOT cache AND DEFINED ENV{STREAMTTS_SOURCE_CACHE})
        set(cache "$ENV{STREAMTTS_SOURCE_CACHE}")
    endif()
    if(NOT cache)
        set(cache "${CMAKE_BINARY_DIR}/_llama_src")
    endif()
    set(name "llama_cpp_python-${STREAMTTS_LLAMA_CPP_PYTHON_VERSION}")
    set(dir "${cache}/${name}/vendor/llama.cpp")
    set(STREAMTTS_LLAMA_SOURCE_ID "llama-cpp-python==${STREAMTTS_LLAMA_CPP_PYTHON_VERSION}" PARENT_SCOPE)
    set(STREAMTTS_LLAMA_DIR "${dir}" PARENT_SCOPE)
    if(EXISTS "${dir}/include/llama.h")
        message(STATUS "llama.cpp source (cached): ${dir}")
        return()
    endif()

    # download and unpack beside the final folder, then rename: an interrupted run leaves
    # no half-unpacked tree that a later run would take for a complete one
    string(RANDOM LENGTH 8 tag)
    set(tmp "${cache}/.download-${tag}")
    file(MAKE_DIRECTORY "${tmp}")
    set(tarball "${tmp}/${name}.tar.gz")
    message(STATUS "downloading ${STREAMTTS_LLAMA_SDIST_URL}")
    file(DOWNLOAD "${STREAMTTS_LLAMA_SDIST_URL}" "${tarball}" STATUS status TLS_VERIFY ON)
    list(GET status 0 code)
    if(NOT code EQUAL 0)
        list(GET status 1 why)
        file(REMOVE_RECURSE "${tmp}")
        message(FATAL_ERROR "could not download the llama.cpp source (the llama-cpp-python "
                            "${STREAMTTS_LLAMA_CPP_PYTHON_VERSION} sdist) from "
                            "${STREAMTTS_LLAMA_SDIST_URL}: ${why}. Offline? Set LLAMA_CPP_DIR to a "
                            "llama.cpp source tree (e.g. vendor/llama.cpp of that sdist, unpacked)")
    endif()
    file(SHA256 "${tarball}" got)
    if(NOT got STREQUAL STREAMTTS_LLAMA_SDIST_SHA256)
        file(REMOVE_RECURSE "${tmp}")
        message(FATAL_ERROR "${STREAMTTS_LLAMA_SDIST_URL}: SHA256 ${got}, expected "
                            "${STREAMTTS_LLAMA_SDIST_SHA256} (a corrupted or replaced download)")
    endif()
    message(STATUS "unpacking ${name}/vendor/llama.cpp")
    file(ARCHIVE_EXTRACT INPUT "${tarball}" DESTINATION "${tmp}"
         PATTERNS "${name}/vendor/llama.cpp")
    if(NOT EXISTS "${tmp}/${name}/vendor/llama.cpp/include/llama.h")
        file(REMOVE_RECURSE "${tmp}")
        message(FATAL_ERROR "${name}.tar.gz has no vendor/llama.cpp/include/llama.h")
    endif()
    file(REMOVE_RECURSE "${cache}/${name}")
    file(RENAME "${tmp}/${name}" "${cache}/${name}")
    file(REMOVE_RECURSE "${tmp}")
    message(STATUS "llama.cpp source: ${dir}")
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
    if(NOT STREAMTTS_SOURCE_CACHE AND NOT LLAMA_CPP_DIR AND NOT DEFINED ENV{LLAMA_CPP_DIR})
        message(FATAL_ERROR "script mode: pass -DSTREAMTTS_SOURCE_CACHE=<dir> (or LLAMA_CPP_DIR)")
    endif()
    streamtts_llama_source()
    if(OUT_FILE)
        file(WRITE "${OUT_FILE}" "${STREAMTTS_LLAMA_DIR}\n${STREAMTTS_LLAMA_SOURCE_ID}\n")
    else()
        message("${STREAMTTS_LLAMA_DIR}")
    endif()
endif()
