# cmake -DREADME=<README.md> -DEXAMPLES=<file;file> -P CheckReadmeExamples.cmake
# Fails unless README.md contains each example file verbatim (docs say it once; the examples
# are compiled and run, so the README's code is too).
file(READ "${README}" readme)
foreach(example IN LISTS EXAMPLES)
  file(READ "${example}" text)
  string(FIND "${readme}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "README.md does not contain ${example} verbatim: update one from the other")
  endif()
endforeach()
