// dlop._C.offload.EpochPlan and LeaseManager: the trainer side of offloading
// for dlop.data.OffloadLoader. A yielded batch is handed out as tensors that
// view the manager's pool buffer (no copy); Python releases the slot when
// the consumer moves on, and the tensors keep the manager alive. They are
// made here rather than through numpy and torch.from_numpy, which cost a
// tenth of the trainer's CPU per batch.
#include <ATen/Context.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>
#include <unistd.h>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>

#include "bindings.hpp"
#include "offload/lease_manager.hpp"
#include "offload/protocol_messages.hpp"

namespace py = pybind11;

namespace dlop::python {
namespace {

using namespace dlop::offload;

py::dict cursor_dict(const Cursor& c) {
  using namespace pybind11::literals;
  return py::dict("epoch"_a = c.epoch, "position"_a = c.position, "seed"_a = c.seed,
                  "dataset_size"_a = c.dataset_size, "batch_size"_a = c.batch_size, "rank"_a = c.rank,
                  "world"_a = c.world, "shuffle"_a = c.shuffle, "drop_last"_a = c.drop_last, "shards"_a = c.shards);
}

Cursor dict_cursor(const py::dict& d) {
  Cursor c;
  c.epoch = d["epoch"].cast<std::uint64_t>();
  c.position = d["position"].cast<std::uint64_t>();
  c.seed = d["seed"].cast<std::uint64_t>();
  c.dataset_size = d["dataset_size"].cast<std::uint64_t>();
  c.batch_size = d["batch_size"].cast<std::uint32_t>();
  c.rank = d["rank"].cast<std::uint32_t>();
  c.world = d["world"].cast<std::uint32_t>();
  c.shuffle = d["shuffle"].cast<bool>();
  c.drop_last = d["drop_last"].cast<bool>();
  c.shards = d.contains("shards") ? d["shards"].cast<std::uint64_t>() : 0;  // cursors saved before shard plans had none
  return c;
}

// The pool in the pinned host memory of `device` (a device or a device
// type), from the allocator torch's pin_memory() uses for it: its batches
// are is_pinned() for that device, and their upload needs no copy and does
// not wait. A device without one fails here, when the loader is made.
PoolAllocator pinned_allocator(const std::string& device) {
  const c10::DeviceType type = c10::Device(device).type();
  if (type == c10::DeviceType::CPU) return {};
  at::Allocator* allocator = nullptr;
  try {
    allocator = at::globalContext().getPinnedMemoryAllocator(type);
  } catch (const c10::Error& e) {
    throw py::value_error("OffloadLoader: no pinned host memory for device " + device + ": " + e.what_without_backtrace());
  }
  return [allocator](std::size_t bytes) {
    auto owner = std::make_shared<c10::DataPtr>(allocator->allocate(bytes));
    return std::shared_ptr<std::byte>(owner, static_cast<std::byte*>(owner->get()));
  };
}

// (position, samples, labels, slot, skipped, lengths): samples, labels and
// lengths (None when the layout has none) are tensors viewing the slot. The
// Python path: (position, blob, None, slot, skipped, None), blob a uint8
// numpy view.
py::object batch_tuple(const std::shared_ptr<LeaseManager>& m, const Batch& b) {
  const BatchLayout& l = m->layout();
  if (l.dtype == protocol::Dtype::kPythonBlob) {
    // The capsule holds a reference to the manager so the buffer outlives it.
    auto* keep = new std::shared_ptr<LeaseManager>(m);
    py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<LeaseManager>*>(p); });
    py::array_t<std::uint8_t> blob({static_cast<py::ssize_t>(b.bytes)}, reinterpret_cast<std::uint8_t*>(b.images), base);
    return py::make_tuple(b.position, blob, py::none(), b.slot, b.skipped, py::none());
  }
  const auto count = static_cast<std::int64_t>(b.count);
  const auto keep = [m](void*) {};  // the copy of m is the reference
  std::vector<std::int64_t> shape{count};
  shape.insert(shape.end(), l.shape.begin(), l.shape.end());
  const auto of = [](at::ScalarType t) { return at::TensorOptions().dtype(t); };
  const at::Tensor samples =
      at::from_blob(b.images, shape, keep, of(l.dtype == protocol::Dtype::kUint8 ? at::kByte : at::kFloat));
  const at::Tensor labels =
      l.label_width == 1 ? at::from_blob(b.labels, {count}, keep, of(at::kLong))
                         : at::from_blob(b.labels, {count, static_cast<std::int64_t>(l.label_width)}, keep, of(at::kLong));
  py::object lengths = py::none();
  if (b.lengths != nullptr) lengths = py::cast(at::from_blob(b.lengths, {count}, keep, of(at::kLong)));
  return py::make_tuple(b.position, samples, labels, b.slot, b.skipped, lengths);
}

}  // namespace

void bind_offload_loader(py::module_& root) {
  // module.cpp made the submodule; these classes join it.
  py::module_ m = root.attr("offload").cast<py::module_>();
  // The span each busy fraction a loader reports covers (dlop.scaling.controller waits it out).
  m.attr("BUSY_WINDOW_SECONDS") = static_cast<double>(protocol::BatchReady::kBusyWindow.count());

  py::class_<EpochPlan>(m, "EpochPlan", "which samples make which batch of one rank in one epoch")
      .def(py::init([](std::uint64_t dataset_size, std::uint32_t batch_size, std::uint64_t seed, bool shuffle,
                       bool drop_last, std::uint32_t rank, std::uint32_t world,
                       std::vector<std::uint64_t> shard_sizes) {
             return EpochPlan{dataset_size, batch_size, seed, shuffle, drop_last, rank, world, std::move(shard_sizes)};
           }),
           py::arg("dataset_size"), py::arg("batch_size"), py::arg("seed") = 0, py::arg("shuffle") = true,
           py::arg("drop_last") = false, py::arg("rank") = 0, py::arg("world") = 1,
           py::arg("shard_sizes") = std::vector<std::uint64_t>{},
           "shard_sizes (samples per shard, in index order): the shard-ordered plan; empty: sample order")
      .def("order", &EpochPlan::order, py::arg("epoch"))
      .def("batches", &EpochPlan::batches, py::arg("epoch"))
      .def("batch_count", &EpochPlan::batch_count)
      .def("shards_digest", &EpochPlan::shards_digest);

  py::class_<PreparedDaemon, std::shared_ptr<PreparedDaemon>>(
      m, "PreparedDaemon", "a daemon LeaseManager.prepare_daemon connected and configured, for adopt_daemon")
      .def_property_readonly("address", &PreparedDaemon::address);

  py::class_<LeaseManager, std::shared_ptr<LeaseManager>>(m, "LeaseManager",
                                                          "leases this rank's batches to dlop-offloaders")
      .def(py::init([](const std::string& source, const std::string& transform, std::uint64_t seed,
                       std::uint32_t batch_size, const std::string& token, bool shuffle, bool drop_last,
                       std::uint32_t rank, std::uint32_t world, std::size_t prefetch, std::size_t per_daemon,
                       double lease_timeout, double no_daemon_timeout, double connect_timeout,
                       const py::bytes& python, std::shared_ptr<DataPacer> pacer,
                       std::vector<std::uint64_t> shard_sizes, const std::optional<std::string>& pin_for) {
             LeaseOptions o;
             const std::string job = python;
             o.config = {source, transform, seed, batch_size, std::vector<std::uint8_t>(job.begin(), job.end())};
             o.token = token;
             o.shuffle = shuffle;
             o.drop_last = drop_last;
             o.rank = rank;
             o.world = world;
             o.shard_sizes = std::move(shard_sizes);
             o.prefetch = prefetch;
             o.per_daemon = per_daemon;
             const auto ms = [](double s) { return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000)); };
             o.lease_timeout = ms(lease_timeout);
             o.no_daemon_timeout = ms(no_daemon_timeout);
             o.connect_timeout = ms(connect_timeout);
             o.pacer = std::move(pacer);
             if (pin_for) o.allocator = pinned_allocator(*pin_for);
             // A process forked from this one (the local fallback's workers,
             // a user's) may drop its copy: closing UCX there would abort, so
             // only the process that made the manager destroys it.
             const pid_t owner = ::getpid();
             return std::shared_ptr<LeaseManager>(new LeaseManager(std::move(o)), [owner](LeaseManager* p) {
               if (::getpid() == owner) delete p;
             });
           }),
           py::arg("source"), py::arg("transform"), py::arg("seed"), py::arg("batch_size"), py::arg("token"),
           py::arg("shuffle") = true, py::arg("drop_last") = false, py::arg("rank") = 0, py::arg("world") = 1,
           py::arg("prefetch") = 4, py::arg("per_daemon") = 2, py::arg("lease_timeout") = 30.0,
           py::arg("no_daemon_timeout") = 10.0, py::arg("connect_timeout") = 10.0, py::arg("python") = py::bytes(),
           py::arg("pacer") = std::shared_ptr<DataPacer>(), py::arg("shard_sizes") = std::vector<std::uint64_t>{},
           py::arg("pin_for") = py::none(),
           "pin_for: a device (\"cuda\", \"dlop_test:1\"): the pool is that device's pinned host memory; "
           "None: page-locked memory the device does not know")
      .def("add_daemon", &LeaseManager::add_daemon, py::arg("host"), py::arg("port"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "prepare_daemon",
          [](const LeaseManager& manager, const std::string& host, std::uint16_t port) {
            const pid_t owner = ::getpid();  // as for the manager: a forked copy is never destroyed
            return std::shared_ptr<PreparedDaemon>(new PreparedDaemon(manager.prepare_daemon(host, port)),
                                                   [owner](PreparedDaemon* p) {
                                                     if (::getpid() == owner) delete p;
                                                   });
          },
          py::arg("host"), py::arg("port"), py::call_guard<py::gil_scoped_release>(),
          "add_daemon's slow half (connect, configure), safe on another thread than next()'s")
      .def(
          "adopt_daemon", [](LeaseManager& manager, PreparedDaemon& d) { manager.adopt_daemon(std::move(d)); },
          py::arg("daemon"), py::call_guard<py::gil_scoped_release>(),
          "add_daemon's other half, on next()'s thread: the prepared daemon gets work from the next next()")
      .def("live_daemons", &LeaseManager::live_daemons)
      .def("set_epoch", &LeaseManager::set_epoch, py::arg("epoch"), py::call_guard<py::gil_scoped_release>())
      .def(
          "next",
          [](const std::shared_ptr<LeaseManager>& self) -> py::object {
            std::optional<Batch> b;
            {
              py::gil_scoped_release release;
              // A signal's Python handler (Ctrl-C, a test's timeout) runs while next() waits.
              b = self->next([] {
                py::gil_scoped_acquire acquire;
                if (PyErr_CheckSignals() != 0) throw py::error_already_set();
              });
            }
            if (!b) return py::none();
            return batch_tuple(self, *b);
          },
          "-> (position, images, labels, slot, skipped, lengths) viewing a pool buffer until release(slot), or None; "
          "a signal's handler runs while it waits, and what it raises leaves next()")
      .def("release", &LeaseManager::release, py::arg("slot"))
      .def("close", &LeaseManager::close, py::call_guard<py::gil_scoped_release>(),
           "closes the daemons' connections quietly, keeping the buffers batches view")
      .def("state", [](const LeaseManager& self) { return cursor_dict(self.state()); })
      .def(
          "restore", [](LeaseManager& self, const py::dict& d) { self.restore(dict_cursor(d)); }, py::arg("cursor"))
      .def("batch_count", &LeaseManager::batch_count)
      .def_property_readonly("dataset_size", [](const LeaseManager& self) { return self.layout().dataset_size; })
      .def("leases_issued", &LeaseManager::leases_issued)
      .def("leases_reissued", &LeaseManager::leases_reissued)
      .def("completed_per_daemon", &LeaseManager::completed_per_daemon)
      .def("busy_per_daemon", &LeaseManager::busy_per_daemon,
           "each daemon's busy fraction as its latest batch gave it (add_daemon order); NaN: none yet, or dead");

  m.def(
      "daemon_stats",
      [](const std::string& host, std::uint16_t port, const std::string& token, double timeout) {
        protocol::Stats stats;
        {
          py::gil_scoped_release release;
          OffloadClient client(host, port, token,
                               {.name = "dlop offloader-stats",
                                .timeout = std::chrono::milliseconds(static_cast<std::int64_t>(timeout * 1000))});
          stats = client.stats();
        }
        py::list stages;
        for (const auto& st : stats.stages) {
          py::dict d;
          d["name"] = st.name;
          d["items"] = st.items;
          d["seconds"] = st.seconds;
          d["bytes"] = st.bytes;
          stages.append(d);
        }
        py::dict counters;
        for (const auto& [name, value] : stats.counters) counters[py::str(name)] = value;
        py::dict out;
        out["stages"] = stages;
        out["counters"] = counters;
        return out;
      },
      py::arg("host"), py::arg("port"), py::arg("token"), py::arg("timeout") = 10.0,
      "a daemon's STATS: {'stages': [{name, items, seconds, bytes}], 'counters': {name: value}}");
}

}  // namespace dlop::python
