#include "core/process.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "core/config.hpp"

namespace dlop {
namespace {

// Reads fields 3 (state) and 22 (starttime) of /proc/<pid>/stat. The command
// name (field 2) may contain spaces and parentheses, so parse after the last ')'.
bool read_stat(pid_t pid, char& state, std::uint64_t& start_time) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[1024];
  const ssize_t n = ::read(fd, buffer, sizeof(buffer) - 1);
  ::close(fd);
  if (n <= 0) return false;
  const std::string text(buffer, static_cast<std::size_t>(n));
  const auto close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  fields >> state;
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;
  fields >> start_time;
  return static_cast<bool>(fields);
}

}  // namespace

ProcessId ProcessId::self() {
  ProcessId id{::getpid(), 0};
  char state = 0;
  read_stat(id.pid, state, id.start_time);
  return id;
}

bool ProcessId::alive() const {
  char state = 0;
  std::uint64_t start = 0;
  if (!read_stat(pid, state, start)) return false;
  return start == start_time && state != 'Z' && state != 'X';
}

namespace {

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

std::string boot_id() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  return id;
}

}  // namespace

std::string machine_identity() {
  std::string id = boot_id();
  return id.empty() ? hostname() : id;
}

std::string host_identity() {
  if (!config().host_id.empty()) return config().host_id;
  // "net:[4026531840]": processes in other network namespaces of this kernel
  // reach us only through the network, so they are other hosts.
  char net[64] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", net, sizeof(net) - 1);
  return hostname() + "/" + boot_id() + "/" + (n > 0 ? std::string(net, static_cast<std::size_t>(n)) : "net:?");
}

}  // namespace dlop
