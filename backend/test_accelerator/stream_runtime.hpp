// The runtime of the test accelerator dlop_test: devices, streams and events.
//
// Each stream is a worker thread that runs the operations queued on it one
// after another, in the order they were queued. A stream is named by a
// c10::StreamId on its device: 0 is the default stream, 1..kPoolSize are the
// pool's streams, later ids are streams made by getNewStream. Workers start on
// first use and live until the process exits (the registry joins them then).
//
// An event is a marker queued on a stream: it is passed when the stream has
// run everything queued before it. Waiting on an event from a stream queues a
// task that blocks that stream's worker (never the host) until the marker is
// passed. Waits only name markers that are already queued, so no cycle can form.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dlop::test_accelerator {

// How late and how slow queued work is (see docs/test_accelerator.md).
// Initialised from DLOP_TEST_DEVICE_{DELAY_US,COPY_GBPS,MEM_GBPS,OP_US,TFLOPS,
// QUERY_US} on first use; configure() changes them for the work queued afterwards.
struct Timing {
  std::chrono::microseconds delay{0};  // every copy takes at least this long
  double copy_gbps = 0;                // > 0: a copy of n bytes to or from the host takes at least n / rate
  // A copy within a device reads and writes its n bytes: 2n / rate. kFollowLink:
  // kMemPerLink times copy_gbps, a GPU's proportion (H200: 4.8 TB/s of HBM
  // to a 55 GB/s PCIe 5 link), so an unlimited link means free device copies.
  double mem_gbps = kFollowLink;
  static constexpr double kFollowLink = -1;
  static constexpr double kMemPerLink = 90;
  double device_copy_gbps() const { return mem_gbps == kFollowLink ? kMemPerLink * copy_gbps : mem_gbps; }
  std::chrono::microseconds op{0};     // every queued operator takes at least this long
  double tflops = 0;                   // > 0: matmul and convolution FLOPs take flops / rate more
  std::chrono::microseconds query{0};  // an event query costs the host this long
};
Timing timing();
void configure(const Timing& timing);
// How many times events were queried in this process: a device's driver is
// asked that often, so tests can hold the backend to polling sparingly.
uint64_t event_queries();

// The engines of a device, shared by all its streams: one computes, one copies
// to the device, one copies to the host. A task holds its engine while it runs,
// so work on two streams of one engine takes turns, as on a GPU. Processes of
// one sharing key (share_key()) share the engines of each device index too
// (a lock file per engine): their compute time-slices one device. When an
// engine frees up, a task of a high-priority stream waiting for it goes
// first, as a GPU schedules a high-priority stream's blocks first.
enum class EngineKind { kCompute, kToDevice, kToHost };
class Engine {
 public:
  Engine(c10::DeviceIndex index, EngineKind kind);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  void lock();
  void unlock();

 private:
  std::mutex mutex_;
  std::condition_variable free_;
  bool busy_ = false;     // mutex_
  int high_waiting_ = 0;  // mutex_
  int lock_fd_ = -1;  // the sharing key's lock file, else none (private engines)
};
Engine& engine(c10::DeviceIndex index, EngineKind kind);
// Which processes share the engines of a device index: by default those
// started by the same parent process (the ranks of one launcher: torchrun,
// mp.spawn, a test's Popen), so that two test workers on one machine do not
// time-slice each other by accident; DLOP_TEST_DEVICE_SHARE=NAME shares
// across launchers, =0 gives each process engines of its own. Empty: private.
const std::string& share_key();

// DLOP_TEST_DEVICE_COUNT (default 2), read once.
c10::DeviceIndex device_count() noexcept;
// Throws unless 0 <= index < device_count().
void check_device(c10::DeviceIndex index);

// The calling thread's current device (0 until set).
c10::DeviceIndex current_device() noexcept;
void set_current_device(c10::DeviceIndex index);
// A device with index -1 means the current device.
c10::Device resolve(c10::Device device);

// A stream's worker: a thread running queued tasks in order.
class StreamWorker {
 public:
  // A high-priority stream's worker goes first for an engine.
  explicit StreamWorker(bool high_priority = false);
  ~StreamWorker();
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Queues task; returns its position (1 for the first task ever queued).
  uint64_t enqueue(std::function<void()> task);
  // Whether the worker has run every task up to position `position`. Both
  // re-throw the first error a task of this stream threw.
  bool passed(uint64_t position) const;
  // Blocks the calling thread until passed(position).
  void wait_passed(uint64_t position) const;
  // The position of the last task queued (0: none yet).
  uint64_t last_queued() const;

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  mutable std::condition_variable task_done_;
  std::deque<std::function<void()>> queue_;
  uint64_t queued_ = 0;
  uint64_t done_ = 0;
  std::exception_ptr error_;  // the first task that threw; sticks
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// Streams of every device: 0 the default stream, then the low- and the
// high-priority pool (kPoolSize each), then streams of their own.
constexpr c10::StreamId kPoolSize = 4;
StreamWorker& worker(const c10::Stream& stream);
c10::Stream default_stream(c10::DeviceIndex index);
// Round robin over a pool.
c10::Stream pool_stream(c10::DeviceIndex index, bool high_priority = false);
// A stream of its own; priority < 0 is high, as in CUDA.
c10::Stream new_stream(c10::DeviceIndex index, int priority = 0);
// 0, or -1 for high priority: the engines run a high-priority stream's waiting task first.
int stream_priority(const c10::Stream& stream);
// The calling thread's current stream of a device (its default stream until
// exchanged); exchange_stream returns the previous one.
c10::Stream current_stream(c10::DeviceIndex index);
c10::Stream exchange_stream(const c10::Stream& stream);
// The workers of a device's streams made so far.
std::vector<StreamWorker*> stream_workers(c10::DeviceIndex index);
// Blocks the host until everything queued on the streams of a device so far
// has run.
void synchronize_device(c10::DeviceIndex index);
// How many times the calling thread blocked until a stream had run its work
// (synchronize, a blocking copy, an operator that runs at once): a host that
// should run ahead of its device never does.
uint64_t host_waits() noexcept;
// Whether the calling thread is a stream's worker (which must never wait for
// its own device).
bool on_stream_worker() noexcept;

// An event: the last marker recorded, if any. Owned through the void* that
// c10::Event holds (create on first record, destroy_event).
class Event {
 public:
  // Queues a marker on stream; the event then stands for that marker.
  void record(const c10::Stream& stream);
  // Queues on stream a wait for the marker recorded last (none: nothing).
  void block(const c10::Stream& stream) const;
  // True once the marker recorded last has been passed, or if none was.
  bool query() const;
  // Blocks the host until query() is true, spinning as a driver's event wait
  // does by default (cudaEventSynchronize without a blocking-sync flag): the
  // waiting thread burns a core for the whole wait.
  void synchronize() const;
  // Milliseconds between the passing of two events' markers; both must have passed.
  static double elapsed_ms(const Event& start, const Event& end);

 private:
  struct Marker {
    StreamWorker* worker = nullptr;
    uint64_t position = 0;
    std::shared_ptr<std::chrono::steady_clock::time_point> passed_at;
  };
  Marker last() const;

  mutable std::mutex mutex_;
  Marker marker_;
};

}  // namespace dlop::test_accelerator
