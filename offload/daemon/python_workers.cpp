#include "python_workers.hpp"

#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dlop::offload::daemon {

namespace {

constexpr const char* kNoWorkerLeft = "generic Python path: every Python worker of this connection died";

using Clock = std::chrono::steady_clock;

// Largest answer a worker may send: the daemon's bound on one batch (as for
// native batches) and on an error text.
constexpr std::uint64_t kMaxBlob = 2ull << 30;
constexpr std::uint32_t kMaxText = 64 * 1024;
// The first worker must have loaded the dataset (torch imported, the job
// unpickled, len() taken) within this many seconds.
constexpr time_t kLoadSeconds = 120;

class WorkerGone : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The worker ran and could not load the job: its own reason (the client's
// code raised).
class LoadRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bytes process `pid` has read through read(2) and its kin (its rchar, not
// its socket receives): what a worker's Dataset read, from files or the page
// cache alike; 0 when unknown.
std::uint64_t bytes_read(pid_t pid) {
  std::ifstream io("/proc/" + std::to_string(pid) + "/io");
  std::string key;
  std::uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

void write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw WorkerGone(std::string("writing to the Python worker: ") + std::strerror(errno));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void read_all(int fd, void* data, std::size_t n) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) throw WorkerGone("the Python worker did not answer in time");
    if (r == 0) throw WorkerGone("the Python worker exited");
    if (r < 0) throw WorkerGone(std::string("reading from the Python worker: ") + std::strerror(errno));
    p += r;
    n -= static_cast<std::size_t>(r);
  }
}

template <class T>
T read_value(int fd) {
  T v{};
  read_all(fd, &v, sizeof(v));
  return v;
}

// Reads an error answer's text (after its status byte).
std::string read_text(int fd) {
  const auto n = read_value<std::uint32_t>(fd);
  if (n > kMaxText) throw WorkerGone("the Python worker sent an error text of " + std::to_string(n) + " bytes");
  std::string text(n, '\0');
  read_all(fd, text.data(), n);
  return text;
}

pid_t spawn(const std::string& python, int child_fd) {
  const std::string fd_arg = std::to_string(child_fd);
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork (Python worker)");
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The worker dies with the
    // daemon, so that a killed daemon leaves no orphans working.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    const char* argv[] = {python.c_str(), "-m", "dlop.data._python_worker", fd_arg.c_str(), nullptr};
    ::execvp(python.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }
  return pid;
}

}  // namespace

std::string default_python() {
  if (const char* p = std::getenv("DLOP_OFFLOADER_PYTHON"); p != nullptr && *p != '\0') return p;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto beside = exe.parent_path() / "python3";
    if (::access(beside.c_str(), X_OK) == 0) return beside.string();
  }
  return "python3";
}

PythonWorkers::PythonWorkers(const std::string& python, std::size_t count, const protocol::Bytes& job,
                             DaemonStats& stats, std::function<void(JobResult)> deliver, std::function<void()> wake)
    : stats_(stats),
      deliver_(std::move(deliver)),
      wake_(std::move(wake)),
      python_(python),
      workers_(std::max<std::size_t>(1, count)) {
  try {
    start(python, job);
  } catch (...) {
    // No worker may outlive a refused CONFIGURE, nor stay a zombie.
    for (Worker& w : workers_) {
      if (w.pid <= 0) continue;
      ::kill(w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
    }
    throw;
  }
  alive_ = workers_.size();
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    workers_[i].thread = std::thread([this, i] { serve(workers_[i], i == 0); });
  }
}

void PythonWorkers::start(const std::string& python, const protocol::Bytes& job) {
  for (Worker& w : workers_) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw_errno("socketpair (Python worker)");
    w.fd = transport::net::UniqueFd(fds[0]);
    transport::net::UniqueFd child(fds[1]);
    // Batches are tens of MiB: larger socket buffers mean fewer switches
    // between the worker and the thread reading it (the kernel may clamp).
    const int buffer = 4 << 20;
    for (const int fd : fds) {
      ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof(buffer));
      ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof(buffer));
    }
    // The child's end must survive exec: clear CLOEXEC on it alone, in the
    // parent, just for the fork (other threads do not exec).
    ::fcntl(child.get(), F_SETFD, 0);
    w.pid = spawn(python, child.get());
    const std::uint64_t n = job.size();
    try {
      write_all(w.fd.get(), &n, sizeof(n));
      write_all(w.fd.get(), job.data(), job.size());
    } catch (const WorkerGone&) {
      // Its first answer will say why (or that it is gone).
    }
  }
}

std::uint64_t PythonWorkers::await_load(Worker& w) {
  const int fd = w.fd.get();
  timeval limit{kLoadSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  if (read_value<std::uint8_t>(fd) != 0) throw LoadRefused(read_text(fd));
  const auto size = read_value<std::uint64_t>(fd);
  limit = timeval{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  return size;
}

PythonWorkers::LoadState PythonWorkers::load_state() const {
  std::lock_guard lock(mutex_);
  return load_state_;
}

std::string PythonWorkers::load_error() const {
  std::lock_guard lock(mutex_);
  return load_error_;
}

std::uint64_t PythonWorkers::dataset_size() const {
  std::lock_guard lock(mutex_);
  return dataset_size_;
}

PythonWorkers::~PythonWorkers() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (Worker& w : workers_) {
    if (w.pid > 0) ::kill(w.pid, SIGKILL);
    ::shutdown(w.fd.get(), SHUT_RDWR);  // a thread blocked on it returns
  }
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
    if (w.pid > 0) ::waitpid(w.pid, nullptr, 0);
  }
}

void PythonWorkers::submit(Job job) {
  {
    std::lock_guard lock(mutex_);
    if (alive_ > 0) {
      queue_.push_back(std::move(job));
      cv_.notify_one();
      return;
    }
  }
  // No worker is left to make it: it fails now, as the queued ones did.
  JobResult r;
  r.job = std::move(job);
  r.error = protocol::ErrorMsg{r.job.lease, protocol::ErrorCode::kInternal, kNoWorkerLeft};
  stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
  deliver_(std::move(r));
}

bool PythonWorkers::cancel_queued(std::uint64_t lease) {
  std::lock_guard lock(mutex_);
  return std::erase_if(queue_, [&](const Job& j) { return j.lease == lease; }) > 0;
}

void PythonWorkers::serve(Worker& w, bool first) {
  pthread_setname_np(pthread_self(), "dlop-python");
  try {
    const std::uint64_t size = await_load(w);
    if (first) {
      {
        std::lock_guard lock(mutex_);
        dataset_size_ = size;
        load_state_ = LoadState::kLoaded;
      }
      wake_();
    }
  } catch (const std::runtime_error& e) {  // WorkerGone or LoadRefused
    if (first) {
      {
        std::lock_guard lock(mutex_);
        load_state_ = LoadState::kFailed;
        load_error_ = dynamic_cast<const LoadRefused*>(&e) != nullptr
                          ? std::string("generic Python path: ") + e.what()
                          : std::string("generic Python path: the worker (") + python_ +
                                " -m dlop.data._python_worker) did not start: " + e.what() +
                                " (is dlop importable by that Python? see --python)";
      }
      wake_();
    } else {
      log().warn("offloader: a Python worker could not load the dataset: {}", e.what());
    }
    std::lock_guard lock(mutex_);
    --alive_;
    return;  // the others serve
  }
  while (true) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    bool died = false;
    JobResult r = execute(w, std::move(job), died);
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    deliver_(std::move(r));
    if (died) {
      ::kill(w.pid, SIGKILL);  // whatever it still does, its stream is lost
      break;
    }
  }
  // This worker is gone (killed, out of memory): the others go on; when none
  // is left, what is queued fails now rather than at the client's timeout.
  std::deque<Job> orphans;
  {
    std::lock_guard lock(mutex_);
    if (--alive_ > 0 || stop_) return;
    orphans.swap(queue_);
  }
  log().warn("offloader: every Python worker of a connection died; failing {} queued batches", orphans.size());
  for (Job& j : orphans) {
    JobResult r;
    r.job = std::move(j);
    r.error = protocol::ErrorMsg{r.job.lease, protocol::ErrorCode::kInternal, kNoWorkerLeft};
    stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
    deliver_(std::move(r));
  }
}

JobResult PythonWorkers::execute(Worker& w, Job job, bool& died) {
  JobResult r;
  r.job = std::move(job);
  r.ready.lease = r.job.lease;
  r.ready.batch = r.job.batch;
  const auto fail = [&](protocol::ErrorCode code, const std::string& message) {
    r.error = protocol::ErrorMsg{r.job.lease, code, message.substr(0, protocol::kMaxText)};
    stats_.batches_failed.fetch_add(1, std::memory_order_relaxed);
  };
  // One worker of the connection's: its share of the pool (the capacity is
  // the daemon's --threads, which is also each connection's worker count).
  const BusyMeter::Scope busy(stats_.busy, 1);
  try {
    const int fd = w.fd.get();
    const auto start = Clock::now();
    const std::uint64_t read_before = bytes_read(w.pid);
    const std::uint64_t head[2] = {r.job.dataset->seed, r.job.epoch};
    const auto n = static_cast<std::uint32_t>(r.job.indices.size());
    write_all(fd, head, sizeof(head));
    write_all(fd, &n, sizeof(n));
    write_all(fd, r.job.indices.data(), n * sizeof(std::uint64_t));
    if (read_value<std::uint8_t>(fd) != 0) {
      fail(protocol::ErrorCode::kSample, read_text(fd));
      return r;
    }
    const auto count = read_value<std::uint32_t>(fd);
    const auto bytes = read_value<std::uint64_t>(fd);
    if (count > n || bytes > kMaxBlob) throw WorkerGone("the Python worker sent a batch of " + std::to_string(bytes) + " bytes");
    Staging s = spare_->take(bytes, spare_);
    read_all(fd, s.data.get(), bytes);
    stats_.batch.add(1, Clock::now() - start, bytes);
    // The Dataset's reads are not timed apart from the rest of its work.
    const std::uint64_t read_after = bytes_read(w.pid);
    stats_.read.add(n, std::chrono::nanoseconds(0), read_after >= read_before ? read_after - read_before : 0);
    stats_.samples_made.fetch_add(count, std::memory_order_relaxed);
    // A batch short of its n samples left the rest out under the skip policy.
    stats_.samples_skipped.fetch_add(n - count, std::memory_order_relaxed);
    r.ready.count = count;
    r.ready.bytes = bytes;
    r.bytes = bytes;
    r.staging = std::move(s);
  } catch (const WorkerGone& e) {
    died = true;
    fail(protocol::ErrorCode::kInternal, std::string("generic Python path: ") + e.what());
  } catch (const std::exception& e) {  // out of memory, among others
    fail(protocol::ErrorCode::kInternal, e.what());
  }
  return r;
}

}  // namespace dlop::offload::daemon
