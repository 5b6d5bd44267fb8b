# Compiler flags for arcpool's own targets. Nothing here leaks into consumers.

# arcpool_target_flags(<target>): warnings (as errors when ARCPOOL_WERROR) and the sanitizer.
function(arcpool_target_flags target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${ARCPOOL_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${ARCPOOL_WERROR}>>:-Werror=all-warnings>)
endfunction()

if(ARCPOOL_SANITIZER STREQUAL "address")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=all>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=address,undefined)
elseif(ARCPOOL_SANITIZER STREQUAL "fuzzer")
  # libFuzzer's coverage everywhere, ASan + UBSan; the fuzz target links the fuzzer itself.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(ARCPOOL_SANITIZER STREQUAL "thread")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread>
                      $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=thread)
elseif(NOT ARCPOOL_SANITIZER STREQUAL "")
  message(FATAL_ERROR
    "ARCPOOL_SANITIZER must be '', 'address', 'thread' or 'fuzzer', not '${ARCPOOL_SANITIZER}'")
endif()
