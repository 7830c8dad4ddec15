# Compile options for dlop's own targets: warnings are errors, sanitizers on demand.
add_library(dlop_options INTERFACE)
target_compile_options(dlop_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Wunused -Woverloaded-virtual
  -Wimplicit-fallthrough -Werror
  # Designated initializers may leave members to their defaults on purpose.
  -Wno-missing-field-initializers)
if(DLOP_SANITIZE)
  target_compile_options(dlop_options INTERFACE -fsanitize=${DLOP_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(dlop_options INTERFACE -fsanitize=${DLOP_SANITIZE})
endif()
