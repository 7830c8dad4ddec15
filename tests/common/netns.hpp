// Several hosts on one machine for tests: network namespaces joined through a
// bridge, as bench/common/netns.py makes them (same names and addresses,
// no link shaping). Needs root; failed() says why they could not be made.
#pragma once

#include <string>
#include <vector>

namespace dlop::test {

class NetnsHosts {
 public:
  // Host i is namespace "dlh<pid>-<i>" with device dl0 at 10.214.0.<i+1>/24.
  // First removes such namespaces and links left by dead processes.
  explicit NetnsHosts(int n);
  ~NetnsHosts();  // removes the namespaces, veths and bridge
  NetnsHosts(const NetnsHosts&) = delete;
  NetnsHosts& operator=(const NetnsHosts&) = delete;

  // Empty once the hosts are up; else the command that failed.
  const std::string& failed() const { return failed_; }
  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int host) const { return names_.at(static_cast<std::size_t>(host)); }
  const std::string& address(int host) const { return addresses_.at(static_cast<std::size_t>(host)); }

 private:
  std::vector<std::string> names_, addresses_, outers_;  // outers_: the veths' ends in this namespace
  std::string bridge_, failed_;
};

// Moves the calling process into network namespace `name` as `ip netns exec`
// does, /sys included (UCX lists network devices in /sys/class/net). Call it
// in a fresh child before any thread or UCX context exists. Returns an empty
// string, or what failed.
std::string enter_netns(const std::string& name);

}  // namespace dlop::test
