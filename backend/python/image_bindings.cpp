// dlop._C.media's image parts: decode and encode, the ops, and the image
// pipeline, numpy in and out. Images are uint8 arrays of shape (H, W, 3)
// (PIL's layout); tensors the pipeline makes are CHW. The heavy calls release
// the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.hpp"
#include "media/codec.hpp"
#include "media/image_pipeline.hpp"
#include "media/ops.hpp"

namespace py = pybind11;

namespace dlop::python {
namespace {

using namespace dlop::media;
using U8Array = py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>;
using Size = std::pair<int, int>;

Image to_image(const U8Array& a) {
  if (a.ndim() != 3 || a.shape(2) != 3) {
    throw py::value_error("expected a uint8 image of shape (H, W, 3)");
  }
  Image img;
  img.reshape(static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1)));
  std::memcpy(img.pixels.data(), a.data(), img.pixels.size());
  return img;
}

U8Array to_array(const Image& img) {
  U8Array a({img.height, img.width, Image::kChannels});
  std::memcpy(a.mutable_data(), img.pixels.data(), img.pixels.size());
  return a;
}

// Bytes-like input (bytes, bytearray, memoryview, uint8 numpy array), read
// in place while the caller keeps it alive.
std::span<const std::uint8_t> as_bytes(const py::buffer& b, py::buffer_info& info) {
  info = b.request();
  py::ssize_t stride = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    if (info.shape[i] > 1 && info.strides[i] != stride) throw py::value_error("expected contiguous bytes");
    stride *= info.shape[i];
  }
  return {static_cast<const std::uint8_t*>(info.ptr), static_cast<std::size_t>(info.size * info.itemsize)};
}

py::tuple box_tuple(const CropBox& b) { return py::make_tuple(b.top, b.left, b.height, b.width); }

py::array tensor_array(Tensor&& t) {
  const std::vector<py::ssize_t> shape{t.shape.channels, t.shape.height, t.shape.width};
  if (t.dtype == OutputType::kUint8) {
    py::array_t<std::uint8_t> a(shape);
    std::memcpy(a.mutable_data(), t.data.data(), t.data.size());
    return a;
  }
  py::array_t<float> a(shape);
  std::memcpy(a.mutable_data(), t.data.data(), t.data.size());
  return a;
}

void bind_ops(py::module_& m) {
  m.def(
      "decode",
      [](const py::buffer& data, const std::string& name, bool load_truncated) {
        py::buffer_info info;
        const auto bytes = as_bytes(data, info);
        Image img;
        {
          py::gil_scoped_release release;
          decode_image(bytes, name, img, DecodeOptions{load_truncated});
        }
        return to_array(img);
      },
      py::arg("data"), py::arg("name") = "", py::arg("load_truncated") = false,
      "JPEG or PNG bytes -> uint8 (H, W, 3), as PIL's open(...).convert('RGB'); raises SampleError. "
      "load_truncated: as PIL.ImageFile.LOAD_TRUNCATED_IMAGES, for JPEGs");
  m.def(
      "encode_jpeg",
      [](const U8Array& a, int quality) {
        if (a.ndim() != 2 && !(a.ndim() == 3 && a.shape(2) == 3)) throw py::value_error("expected (H, W) or (H, W, 3)");
        const auto v = encode_jpeg(a.data(), static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1)),
                                   a.ndim() == 2 ? 1 : 3, quality);
        return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
      },
      py::arg("image"), py::arg("quality") = 90, "uint8 (H, W) or (H, W, 3) -> baseline JPEG bytes (4:2:0)");
  m.def(
      "encode_png",
      [](const U8Array& a) {
        const int channels = a.ndim() == 2 ? 1 : static_cast<int>(a.shape(2));
        if (a.ndim() != 2 && a.ndim() != 3) throw py::value_error("expected (H, W) or (H, W, C)");
        const auto v = encode_png(a.data(), static_cast<int>(a.shape(0)), static_cast<int>(a.shape(1)), channels);
        return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
      },
      py::arg("image"), "uint8 (H, W) or (H, W, 1-4) -> PNG bytes");
  m.def(
      "resize",
      [](const U8Array& a, Size size, bool antialias) {
        const Image src = to_image(a);
        Image dst;
        {
          py::gil_scoped_release release;
          resize(src, CropBox{0, 0, src.height, src.width}, size.first, size.second, antialias, dst);
        }
        return to_array(dst);
      },
      py::arg("image"), py::arg("size"), py::arg("antialias") = true, "bilinear resize to size=(h, w), as PIL");
  m.def(
      "resized_crop",
      [](const U8Array& a, int top, int left, int height, int width, Size size, bool antialias) {
        const Image src = to_image(a);
        Image dst;
        {
          py::gil_scoped_release release;
          resize(src, CropBox{top, left, height, width}, size.first, size.second, antialias, dst);
        }
        return to_array(dst);
      },
      py::arg("image"), py::arg("top"), py::arg("left"), py::arg("height"), py::arg("width"), py::arg("size"),
      py::arg("antialias") = true, "torchvision's F.resized_crop: crop the box, resize it to size=(h, w)");
  m.def(
      "crop",
      [](const U8Array& a, int top, int left, int height, int width) {
        Image dst;
        crop(to_image(a), CropBox{top, left, height, width}, dst);
        return to_array(dst);
      },
      py::arg("image"), py::arg("top"), py::arg("left"), py::arg("height"), py::arg("width"),
      "crop a box (zeros where it reaches outside)");
  m.def(
      "center_crop",
      [](const U8Array& a, Size size) {
        const Image src = to_image(a);
        Image dst;
        crop(src, center_crop_box(src.height, src.width, size.first, size.second), dst);
        return to_array(dst);
      },
      py::arg("image"), py::arg("size"), "torchvision's CenterCrop(size=(h, w)), zero-padded when larger");
  m.def(
      "hflip",
      [](const U8Array& a) {
        Image img = to_image(a);
        hflip(img);
        return to_array(img);
      },
      py::arg("image"));
  m.def(
      "to_chw",
      [](const U8Array& a, const std::string& dtype, std::array<float, 3> mean, std::array<float, 3> std) -> py::array {
        const Image img = to_image(a);
        if (dtype == "uint8") {
          py::array_t<std::uint8_t> out({3, img.height, img.width});
          to_chw_uint8(img, out.mutable_data());
          return out;
        }
        if (dtype != "float32") throw py::value_error("dtype must be 'float32' or 'uint8'");
        py::array_t<float> out({3, img.height, img.width});
        to_chw_float(img, mean, std, out.mutable_data());
        return out;
      },
      py::arg("image"), py::arg("dtype") = "float32", py::arg("mean") = std::array<float, 3>{0, 0, 0},
      py::arg("std") = std::array<float, 3>{1, 1, 1},
      "(H, W, 3) uint8 -> CHW: uint8, or float32 (x / 255 - mean) / std as ToTensor + Normalize");
  m.def("resize_shorter_side", &resize_shorter_side, py::arg("height"), py::arg("width"), py::arg("size"),
        py::arg("max_size") = 0, "torchvision's Resize(int) output size: (height, width)");
  m.def(
      "center_crop_box",
      [](int h, int w, int ch, int cw) { return box_tuple(center_crop_box(h, w, ch, cw)); }, py::arg("height"),
      py::arg("width"), py::arg("crop_height"), py::arg("crop_width"));
  m.def(
      "random_resized_crop_box",
      [](int height, int width, std::uint64_t seed, std::uint64_t epoch, std::uint64_t index, std::uint64_t stream,
         std::array<double, 2> scale, std::array<double, 2> ratio) {
        SampleRng rng(SampleKey{seed, epoch, index}, stream);
        return box_tuple(random_resized_crop_box(height, width, scale, ratio, rng));
      },
      py::arg("height"), py::arg("width"), py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("stream") = 0,
      py::arg("scale") = std::array<double, 2>{0.08, 1.0}, py::arg("ratio") = std::array<double, 2>{3.0 / 4, 4.0 / 3},
      "(top, left, height, width) of torchvision's RandomResizedCrop, drawn from (seed, epoch, index, stream); "
      "a pipeline's op number i uses stream i");
}

void bind_image_pipeline(py::module_& m) {
  m.def("transform_ops", &describe_ops,
        "the native ops a transform spec may name, with their parameters (JSON text: a list of "
        "{op, params: [{name, kind, required, default, expected}]})");
  py::class_<ImagePipeline>(m, "ImagePipeline", "an image transform spec (JSON) run natively")
      .def(py::init([](const std::string& json) { return ImagePipeline::from_json(json); }), py::arg("spec"))
      .def_property_readonly("spec", [](const ImagePipeline& p) { return p.spec().to_json(); })
      .def_property_readonly("fixed_shape",
                             [](const ImagePipeline& p) -> py::object {
                               const auto s = p.fixed_shape();
                               if (!s) return py::none();
                               return py::make_tuple(s->channels, s->height, s->width);
                             })
      .def(
          "run",
          [](const ImagePipeline& p, const py::buffer& data, std::uint64_t seed, std::uint64_t epoch, std::uint64_t index,
             const std::string& name) {
            py::buffer_info info;
            const auto bytes = as_bytes(data, info);
            Tensor t;
            {
              py::gil_scoped_release release;
              t = p.run(bytes, SampleKey{seed, epoch, index}, name);
            }
            return tensor_array(std::move(t));
          },
          py::arg("data"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("index") = 0, py::arg("name") = "",
          "one sample's encoded bytes -> CHW array; raises SampleError whatever the policy")
      .def(
          "run_batch",
          [](const ImagePipeline& p, const Source& source, const std::vector<std::uint64_t>& indices, std::uint64_t seed,
             std::uint64_t epoch, std::size_t threads) {
            const auto shape = p.fixed_shape();
            if (!shape) throw py::value_error("run_batch needs a spec with a fixed output size");
            const std::vector<py::ssize_t> dims{static_cast<py::ssize_t>(indices.size()), shape->channels,
                                                shape->height, shape->width};
            py::array images = p.spec().output == OutputType::kUint8 ? py::array(py::array_t<std::uint8_t>(dims))
                                                                     : py::array(py::array_t<float>(dims));
            py::array_t<std::int64_t> labels(static_cast<py::ssize_t>(indices.size()));
            const std::span<std::byte> image_span(static_cast<std::byte*>(images.mutable_data()),
                                                  static_cast<std::size_t>(images.nbytes()));
            const std::span<std::int64_t> label_span(labels.mutable_data(), indices.size());
            BatchResult r;
            {
              py::gil_scoped_release release;
              WorkerPool pool(threads);
              r = p.run_batch(source, indices, seed, epoch, image_span, label_span, &pool);
            }
            py::list skipped;
            for (const auto& s : r.skipped) skipped.append(py::make_tuple(s.index, s.reason));
            const py::slice kept(0, static_cast<py::ssize_t>(r.count), 1);
            return py::make_tuple(images[kept], labels[kept], skipped);
          },
          py::arg("source"), py::arg("indices"), py::arg("seed") = 0, py::arg("epoch") = 0, py::arg("threads") = 1,
          "-> (images N x C x H x W, labels int64 N, [(index, reason) skipped])");
}

}  // namespace

void bind_image(py::module_& root) {
  py::module_ m = root.attr("media").cast<py::module_>();
  bind_ops(m);
  bind_image_pipeline(m);
}

}  // namespace dlop::python
