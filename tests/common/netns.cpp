#include "netns.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <string_view>
#include <sstream>

namespace dlop::test {
namespace {

bool run(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

std::string output_of(const std::string& command) {
  std::string text;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) text.append(buffer, n);
    ::pclose(pipe);
  }
  return text;
}

// Whether `name` is "dlh<pid>-...", "dlh<pid>b" or "dlh<pid>v..." of a dead
// pid: left by a test that crashed (the Python helper uses the same names).
// (No std::regex: GCC 12 warns inside it under ASan, and warnings are errors.)
bool stale(const std::string& name) {
  if (!name.starts_with("dlh")) return false;
  std::size_t end = 3;
  while (end < name.size() && end < 12 && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == 3 || end == name.size() || std::string_view("-bv").find(name[end]) == std::string_view::npos) return false;
  return ::kill(std::stoi(name.substr(3, end - 3)), 0) != 0 && errno == ESRCH;
}

void sweep_stale() {
  std::istringstream namespaces(output_of("ip netns list 2>/dev/null"));
  for (std::string line; std::getline(namespaces, line);) {
    const std::string name = line.substr(0, line.find(' '));
    if (stale(name)) run("ip netns del " + name);
  }
  // "3: dlh12v0@if2: <BROADCAST,..." per link.
  std::istringstream links(output_of("ip -o link show 2>/dev/null"));
  for (std::string line; std::getline(links, line);) {
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    const auto begin = colon + 2;
    const std::string name = line.substr(begin, line.find_first_of(":@", begin) - begin);
    if (stale(name)) run("ip link del " + name);
  }
}

}  // namespace

NetnsHosts::NetnsHosts(int n) {
  const std::string tag = "dlh" + std::to_string(::getpid());
  bridge_ = tag + "b";
  for (int i = 0; i < n; ++i) {
    names_.push_back(tag + "-" + std::to_string(i));
    addresses_.push_back("10.214.0." + std::to_string(i + 1));
  }
  sweep_stale();
  std::vector<std::string> commands = {"ip link add " + bridge_ + " type bridge", "ip link set " + bridge_ + " up"};
  for (int i = 0; i < n; ++i) {
    const std::string& ns = names_[static_cast<std::size_t>(i)];
    const std::string& outer = outers_.emplace_back(tag + "v" + std::to_string(i));
    for (const std::string& c : {
             "ip netns add " + ns, "ip link add " + outer + " type veth peer name " + outer + "i",
             "ip link set " + outer + "i netns " + ns, "ip -n " + ns + " link set " + outer + "i name dl0",
             "ip -n " + ns + " addr add " + addresses_[static_cast<std::size_t>(i)] + "/24 dev dl0",
             "ip -n " + ns + " link set dl0 up", "ip -n " + ns + " link set lo up",
             "ip link set " + outer + " master " + bridge_, "ip link set " + outer + " up"}) {
      commands.push_back(c);
    }
  }
  for (const std::string& c : commands) {
    if (!run(c)) {
      failed_ = "'" + c + "' failed";
      return;
    }
  }
}

NetnsHosts::~NetnsHosts() {
  // Deleting a namespace takes its veth's outer end only later, in the
  // background: a next NetnsHosts of this process (the same names) would
  // collide with it. Deleting the outer end takes both ends now.
  for (const std::string& outer : outers_) run("ip link del " + outer);
  for (const std::string& ns : names_) run("ip netns del " + ns);
  run("ip link del " + bridge_);
}

std::string enter_netns(const std::string& name) {
  const int fd = ::open(("/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "open /run/netns/" + name + ": " + std::strerror(errno);
  const int joined = ::setns(fd, CLONE_NEWNET);
  const int setns_errno = errno;
  ::close(fd);
  if (joined != 0) return "setns " + name + ": " + std::strerror(setns_errno);
  if (::unshare(CLONE_NEWNS) != 0 || ::mount("", "/", nullptr, MS_SLAVE | MS_REC, nullptr) != 0 ||
      ::umount2("/sys", MNT_DETACH) != 0 || ::mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0) {
    return "remount /sys in " + name + ": " + std::strerror(errno);
  }
  return {};
}

}  // namespace dlop::test
