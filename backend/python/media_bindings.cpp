// dlop._C.media: sources and `dlop pack`, batch makers (the "image", "video"
// and "audio" specs) and the audio steps, each callable on its own so tests
// can check it against a reference. numpy in and out; the heavy calls release
// the GIL. The image steps join it from image_bindings.cpp.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.hpp"
#include "core/config_features.hpp"
#include "media/audio.hpp"
#include "media/batch_maker.hpp"
#include "media/source.hpp"

namespace py = pybind11;

namespace dlop::python {
namespace {

using namespace dlop::media;

py::dict layout_dict(const SampleLayout& l) {
  py::dict d;
  d["shape"] = l.shape;
  d["dtype"] = l.dtype == OutputType::kUint8 ? "uint8" : "float32";
  d["label_width"] = l.label_width;
  d["lengths"] = l.lengths;
  return d;
}

MediaKind media_kind(const std::string& kind) {
  if (kind == "image") return MediaKind::kImage;
  if (kind == "video") return MediaKind::kVideo;
  if (kind == "audio") return MediaKind::kAudio;
  throw py::value_error("kind must be \"image\", \"video\" or \"audio\", not \"" + kind + "\"");
}

void bind_sources(py::module_& m) {
  py::class_<Source, std::shared_ptr<Source>>(m, "Source", "a folder by class, a manifest or a record file (open_source)")
      .def("__len__", &Source::size)
      .def_property_readonly("classes", &Source::classes)
      .def("label", &Source::label, py::arg("index"))
      .def("name", &Source::name, py::arg("index"))
      .def_property_readonly("multi_label", &Source::multi_label)
      .def("labels", &Source::labels, py::arg("index"))
      .def_property_readonly("shard_sizes", &Source::shard_sizes,
                             "samples per shard, in index order (tar shards); [] for other sources")
      .def(
          "time_span", [](const Source& s, std::size_t i) { return py::make_tuple(s.time_span(i).start, s.time_span(i).end); },
          py::arg("index"), "(start, end) seconds; end < 0: to the end")
      .def(
          "read",
          [](const Source& s, std::size_t i) {
            std::vector<std::uint8_t> scratch;
            std::span<const std::uint8_t> bytes;
            {
              py::gil_scoped_release release;
              bytes = s.read(i, scratch);
            }
            return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          py::arg("index"), "the sample's encoded bytes");
  m.def(
      // Paths as str (os.fspath on the Python side): torch < 2.8 bundles a
      // pybind11 without stl/filesystem.h.
      "open_source",
      [](const std::string& p, const std::string& kind) {
        const MediaKind k = media_kind(kind);
        py::gil_scoped_release release;  // a remote source may wait out a store's outage
        return std::shared_ptr<Source>(open_source(p, k));
      },
      py::arg("path"), py::arg("kind") = "image",
      "a folder opens as a folder by class of that kind (torchvision's order and labels), a .csv or .jsonl file as "
      "a manifest, any other file, or an s3:// or http(s):// URL, as a record file");
  m.def(
      "pack",
      [](const std::string& root, const std::string& out, const std::string& kind) {
        const MediaKind k = media_kind(kind);
        PackStats s;
        {
          py::gil_scoped_release release;
          s = pack_path(root, out, k);
        }
        py::dict d;
        d["records"] = s.records;
        d["classes"] = s.classes;
        d["bytes"] = s.bytes;
        return d;
      },
      py::arg("root"), py::arg("out"), py::arg("kind") = "image",
      "dlop pack: a folder by class of that kind, or a manifest, into one checksummed record file");
}

void bind_batch_maker(py::module_& m) {
  py::class_<BatchMaker>(m, "BatchMaker", "a transform spec of any kind (image, video, audio), run natively")
      .def(py::init([](const std::string& json) { return make_batch_maker(json); }), py::arg("spec"))
      .def_property_readonly("kind", [](const BatchMaker& b) { return std::string(b.kind()); })
      .def_property_readonly("spec", &BatchMaker::to_json)
      .def(
          "layout", [](const BatchMaker& b, const Source& s) { return layout_dict(b.layout(s)); }, py::arg("source"),
          "one sample's {shape, dtype, label_width, lengths} from this source")
      .def(
          "run_batch",
          [](const BatchMaker& b, const Source& source, const std::vector<std::uint64_t>& indices, std::uint64_t seed,
             std::uint64_t epoch, std::size_t threads) {
            const SampleLayout l = b.layout(source);
            const auto n = static_cast<py::ssize_t>(indices.size());
            std::vector<py::ssize_t> dims{n};
            dims.insert(dims.end(), l.shape.begin(), l.shape.end());
            py::array samples = l.dtype == OutputType::kUint8 ? py::array(py::array_t<std::uint8_t>(dims))
                                                              : py::array(py::array_t<float>(dims));
            py::array_t<std::int64_t> labels(l.label_width == 1 ? std::vector<py::ssize_t>{n}
                                                                 : std::vector<py::ssize_t>{n, l.label_width});
            py::array_t<std::int64_t> lengths(l.lengths ? n : 0);
            const BatchOut out{{static_cast<std::byte*>(samples.mutable_data()), static_cast<std::size_t>(samples.nbytes())},
                               {labels.mutable_data(), static_cast<std::size_t>(labels.size())},
                               {lengths.mutable_data(), static_cast<std::size_t>(lengths.size())}};
            BatchResult r;
            {
              py::gil_scoped_release release;
              WorkerPool pool(threads);
              r = b.run_batch(source, indices, seed, epoch, out, &pool);
            }
            py::list skipped;
            for (const auto& s : r.skipped) skipped.append(py::make_tuple(s.index, s.reason));
            const py::slice kept(0, static_cast<py::ssize_t>(r.count), 1);
            py::object len = l.lengths ? py::object(lengths[kept]) : py::none();
            return py::make_tuple(samples[kept], labels[kept], len, skipped);
          },
          py::arg("source"), py::arg("indices"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("threads") = 1,
          "-> (samples N x shape, labels (N or N x classes), lengths N or None, [(index, reason) skipped])");
}

#if DLOP_HAVE_MEDIA
// Without media (DLOP_WITH_MEDIA=OFF) there is no dlop._C.audio.
using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

F32Array array_of(const std::vector<float>& v, std::vector<py::ssize_t> shape) {
  F32Array a(shape);
  std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(float));
  return a;
}

std::span<const float> floats(const F32Array& a) { return {a.data(), static_cast<std::size_t>(a.size())}; }

std::span<const std::uint8_t> bytes_of(const py::bytes& b) {
  const std::string_view v(b);
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size()};
}

void bind_audio(py::module_& m) {
  py::module_ a = m.def_submodule("audio", "the audio pipeline's steps, for tests and tools");
  const auto spec_of = [](const std::string& json) { return AudioSpec::from_json(json); };
  a.def(
      "decode",
      [](const py::bytes& data, double start, double end, const std::string& name) {
        const Audio audio = decode_audio(bytes_of(data), name, TimeSpan{start, end});
        return py::make_tuple(array_of(audio.samples, {static_cast<py::ssize_t>(audio.frames()), audio.channels}),
                              audio.sample_rate);
      },
      py::arg("data"), py::arg("start") = 0.0, py::arg("end") = -1.0, py::arg("name") = "",
      "-> (float32 frames x channels, sample rate)");
  a.def(
      "resample",
      [](const F32Array& mono, int from_rate, int to_rate) {
        const auto out = resample(floats(mono), from_rate, to_rate);
        return array_of(out, {static_cast<py::ssize_t>(out.size())});
      },
      py::arg("mono"), py::arg("from_rate"), py::arg("to_rate"));
  a.def(
      "crop",
      [=](const py::bytes& data, const std::string& spec, std::uint64_t seed, std::uint64_t epoch, std::uint64_t index,
          double start, double end) {
        const auto out = audio_crop(bytes_of(data), spec_of(spec), SampleKey{seed, epoch, index}, TimeSpan{start, end});
        return array_of(out, {static_cast<py::ssize_t>(out.size())});
      },
      py::arg("data"), py::arg("spec"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("index") = 0,
      py::arg("start") = 0.0, py::arg("end") = -1.0, "the mono crop at the spec's rate a sample's features are made of");
  a.def(
      "mel_filter_bank",
      [=](const std::string& spec) {
        const AudioSpec s = spec_of(spec);
        return array_of(mel_filter_bank(s), {s.n_mels, s.n_fft / 2 + 1});
      },
      py::arg("spec"), "n_mels x (n_fft / 2 + 1)");
  a.def(
      "power_spectrogram",
      [=](const F32Array& signal, const std::string& spec) {
        const AudioSpec s = spec_of(spec);
        std::size_t frames = 0;
        const auto p = power_spectrogram(floats(signal), s, frames);
        return array_of(p, {static_cast<py::ssize_t>(frames), s.n_fft / 2 + 1});
      },
      py::arg("signal"), py::arg("spec"), "frames x (n_fft / 2 + 1)");
  a.def(
      "log_mel",
      [=](const F32Array& power, const F32Array& filters, const std::string& spec) {
        const AudioSpec s = spec_of(spec);
        const auto frames = static_cast<std::size_t>(power.ndim() == 2 ? power.shape(0) : 0);
        const auto out = log_mel(floats(power), frames, floats(filters), s);
        return array_of(out, {s.n_mels, static_cast<py::ssize_t>(frames)});
      },
      py::arg("power"), py::arg("filters"), py::arg("spec"), "n_mels x frames");
  a.def(
      "spec_augment",
      [=](const F32Array& features, const std::string& spec, std::uint64_t seed, std::uint64_t epoch,
          std::uint64_t index, std::uint64_t stream) {
        const AudioSpec s = spec_of(spec);
        std::vector<float> v(features.data(), features.data() + features.size());
        SampleRng rng(SampleKey{seed, epoch, index}, stream);
        const auto frames = static_cast<std::size_t>(features.ndim() == 2 ? features.shape(1) : 0);
        spec_augment(v, frames, s, rng);
        return array_of(v, {s.n_mels, static_cast<py::ssize_t>(frames)});
      },
      py::arg("features"), py::arg("spec"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("index") = 0,
      py::arg("stream") = 2, "the masks a sample gets (the pipeline draws them from stream 2)");
  a.def(
      "features",
      [=](const py::bytes& data, const std::string& spec, std::uint64_t seed, std::uint64_t epoch, std::uint64_t index,
          double start, double end) {
        const AudioSpec s = spec_of(spec);
        std::size_t frames = 0;
        std::vector<float> f;
        {
          const auto bytes = bytes_of(data);
          py::gil_scoped_release release;
          f = audio_features(bytes, s, SampleKey{seed, epoch, index}, TimeSpan{start, end}, frames);
        }
        return array_of(f, {s.n_mels, static_cast<py::ssize_t>(frames)});
      },
      py::arg("data"), py::arg("spec"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("index") = 0,
      py::arg("start") = 0.0, py::arg("end") = -1.0, "one sample's n_mels x frames features, as the pipeline makes them");
}
#endif

}  // namespace

void bind_media(py::module_& root) {
  py::module_ m = root.def_submodule("media", "the native media pipelines (sources, batch makers, image and audio steps)");
  // A bad sample is a ValueError subclass, so callers can catch just those
  // (raised as such by error_bindings.cpp).
  m.attr("SampleError") = py::module_::import("dlop.errors").attr("SampleError");
  bind_sources(m);
  bind_batch_maker(m);
#if DLOP_HAVE_MEDIA
  bind_audio(m);
#endif
}

}  // namespace dlop::python
