// dlop's logger: spdlog, named "dlop", level from DLOP_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

namespace dlop {

spdlog::logger& log();

}  // namespace dlop
