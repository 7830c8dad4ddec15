# The layers' arrows, checked once every target is defined (at the end of the
# root CMakeLists.txt, which includes this file): each library
# below may link only the libraries it names, and those they name in turn.
# Include folders are per target, so a library that cannot link another
# cannot see its headers either; the check also refuses a library whose own
# sources or include folders lie in another library's folder, which would
# reach around the links. A violation stops the configure.
#
# media and offload sit side by side: neither links the other. Only the
# executables that join them (dlop-offloader, dlop._C) link both.
set(DLOP_LAYER_ARROWS
  "dlop_core:"
  "dlop_transport:dlop_core"
  "dlop_collectives:dlop_transport"
  "dlop_scheduler:dlop_collectives"
  "dlop_media:dlop_core"
  "dlop_offload:dlop_transport"
  "dlop_backend:dlop_scheduler")

# The dlop libraries `target` links, directly or through others (private
# links included: a static library's private links are still its code's).
function(_dlop_linked_libraries target out)
  set(seen)
  set(todo ${target})
  while(todo)
    list(POP_FRONT todo t)
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(libs ${t} ${prop})
      if(NOT libs)
        continue()
      endif()
      foreach(lib IN LISTS libs)
        string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
        if(lib MATCHES "^dlop_" AND TARGET ${lib} AND NOT lib IN_LIST seen)
          list(APPEND seen ${lib})
          list(APPEND todo ${lib})
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(dlop_check_layers)
  # Each library's allowed set: what its arrows reach.
  set(libraries)
  foreach(arrow IN LISTS DLOP_LAYER_ARROWS)
    string(REPLACE ":" ";" parts "${arrow}")
    list(POP_FRONT parts lib)
    list(APPEND libraries ${lib})
    set(_below_${lib} ${parts})
  endforeach()
  foreach(lib IN LISTS libraries)
    set(allowed)
    set(todo ${_below_${lib}})
    while(todo)
      list(POP_FRONT todo b)
      if(NOT b IN_LIST allowed)
        list(APPEND allowed ${b})
        list(APPEND todo ${_below_${b}})
      endif()
    endwhile()
    set(_allowed_${lib} ${allowed})
  endforeach()

  set(errors)
  foreach(lib IN LISTS libraries)
    if(NOT TARGET ${lib})  # dlop_backend without torch
      continue()
    endif()
    _dlop_linked_libraries(${lib} linked)
    list(JOIN _allowed_${lib} ", " may)
    if(NOT may)
      set(may "no dlop library")
    endif()
    foreach(l IN LISTS linked)
      if(l IN_LIST libraries AND NOT l IN_LIST _allowed_${lib} AND NOT l STREQUAL lib)
        list(APPEND errors "${lib} links ${l} (it may link: ${may})")
      endif()
    endforeach()

    # Its own sources and include folders: inside its own folder (or the build tree).
    get_target_property(home ${lib} SOURCE_DIR)
    get_target_property(sources ${lib} SOURCES)
    get_target_property(dirs ${lib} INCLUDE_DIRECTORIES)
    foreach(path IN LISTS sources dirs)
      if(NOT path OR path MATCHES "\\$<")
        continue()
      endif()
      cmake_path(ABSOLUTE_PATH path BASE_DIRECTORY ${home} NORMALIZE OUTPUT_VARIABLE abs)
      cmake_path(IS_PREFIX PROJECT_SOURCE_DIR "${abs}" NORMALIZE in_tree)
      cmake_path(IS_PREFIX home "${abs}" NORMALIZE at_home)
      cmake_path(IS_PREFIX PROJECT_BINARY_DIR "${abs}" NORMALIZE in_build)
      if(in_tree AND NOT at_home AND NOT in_build)
        list(APPEND errors "${lib} compiles or includes ${abs}, outside ${home}")
      endif()
    endforeach()
  endforeach()
  if(errors)
    list(JOIN errors "\n  " text)
    message(FATAL_ERROR "dlop: layering (cmake/DlopLayers.cmake):\n  ${text}")
  endif()
endfunction()

cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL dlop_check_layers)
