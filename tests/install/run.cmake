# ctest's install.consumer: installs this build's `dev` component into a
# scratch prefix, configures and builds tests/install against it (no
# network, nothing outside the scratch folder), and runs the program.
# Arguments: -DBUILD_DIR=<refit build> -DSOURCE_DIR=<tests/install>
#            -DWORK_DIR=<scratch> -DGENERATOR=<CMake generator>
#            -DCONSUMER_CXX_FLAGS=<flags> -DCONSUMER_LINKER_FLAGS=<flags>
#            (the refit build's own, e.g. its sanitizers)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${what}: ok")
endfunction()
run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
    --component dev)
run("configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_CXX_FLAGS=${CONSUMER_CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${CONSUMER_LINKER_FLAGS}")
run("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run("run" ${WORK_DIR}/build/consumer ${WORK_DIR})
file(REMOVE_RECURSE ${WORK_DIR})
