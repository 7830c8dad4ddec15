#include "core/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include "core/config.hpp"
#include "core/error.hpp"

namespace dlop {

spdlog::logger& log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("dlop");
    const auto level = spdlog::level::from_str(config().log_level);
    if (level == spdlog::level::off && config().log_level != "off") {
      throw_error(Errc::kInvalidArgument,
                  fmt::format("DLOP_LOG_LEVEL='{}' is not one of trace, debug, info, warn, error, off",
                              config().log_level));
    }
    l->set_level(level);
    l->set_pattern(fmt::format("[%H:%M:%S.%e] [dlop %^%l%$] [pid {}] %v", ::getpid()));
    return l;
  }();
  return *logger;
}

}  // namespace dlop
