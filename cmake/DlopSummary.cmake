message(STATUS "dlop ${PROJECT_VERSION}: UCX ${UCX_VERSION}, MPI=${DLOP_HAVE_MPI}, media=${DLOP_HAVE_MEDIA}, "
               "tests=${DLOP_BUILD_TESTS}, bench=${DLOP_BUILD_BENCH}, sanitize='${DLOP_SANITIZE}'")
