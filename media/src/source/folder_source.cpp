#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "media/image.hpp"
#include "media/object_store.hpp"
#include "concrete_sources.hpp"

namespace dlop::media {
namespace fs = std::filesystem;

const std::vector<std::string>& media_extensions(MediaKind kind) {
  static const std::vector<std::string> image{".jpg", ".jpeg", ".png"};
  static const std::vector<std::string> video{".mp4", ".mkv", ".webm", ".mov", ".avi"};
  static const std::vector<std::string> audio{".wav", ".flac", ".ogg", ".opus", ".mp3"};
  return kind == MediaKind::kImage ? image : kind == MediaKind::kVideo ? video : audio;
}

namespace {

// What torchvision's ImageFolder lists (IMG_EXTENSIONS): a folder of images
// lists these too, so that a file the native decoders cannot read is refused
// by name instead of silently left out of the dataset torch would see.
const std::vector<std::string>& listed_extensions(MediaKind kind) {
  static const std::vector<std::string> image{".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
  return kind == MediaKind::kImage ? image : media_extensions(kind);
}

bool has_extension(const fs::path& p, const std::vector<std::string>& wanted) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(wanted.begin(), wanted.end(), ext) != wanted.end();
}

std::string or_list(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

// torchvision walks each class folder with os.walk(followlinks=True), sorts
// the (folder, sub-folders, files) tuples (so folders by their path string),
// and each folder's file names; strings compare bytewise in both.
void collect(const fs::path& root, const std::string& class_name, std::int64_t label, MediaKind kind,
             std::vector<std::pair<std::string, std::int64_t>>& out) {
  std::vector<std::string> folders{class_name};
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root / class_name, fs::directory_options::follow_directory_symlink, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) folders.push_back(fs::relative(it->path(), root).generic_string());
  }
  if (ec) throw_error(Errc::kSystem, fmt::format("ImageFolder: cannot list {}: {}", (root / class_name).string(), ec.message()));
  std::sort(folders.begin(), folders.end());
  for (const std::string& folder : folders) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(root / folder, ec)) {
      if (!entry.is_directory(ec) && has_extension(entry.path(), listed_extensions(kind))) names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) out.emplace_back(folder + "/" + name, label);
  }
}

}  // namespace

FolderSource::FolderSource(const fs::path& root, MediaKind kind) : root_(root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    throw_error(Errc::kInvalidArgument, fmt::format("ImageFolder: {} is not a folder", root.string()));
  }
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (entry.is_directory(ec)) classes_.push_back(entry.path().filename().string());
  }
  std::sort(classes_.begin(), classes_.end());
  if (classes_.empty()) {
    throw_error(Errc::kInvalidArgument, fmt::format("ImageFolder: no class sub-folders in {}", root.string()));
  }
  std::vector<std::pair<std::string, std::int64_t>> files;
  std::vector<std::string> empty;
  for (std::size_t c = 0; c < classes_.size(); ++c) {
    const std::size_t before = files.size();
    collect(root, classes_[c], static_cast<std::int64_t>(c), kind, files);
    if (files.size() == before) empty.push_back(classes_[c]);
  }
  if (!empty.empty()) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("ImageFolder: no {} file in class folder(s) {} of {}", or_list(listed_extensions(kind)),
                            fmt::join(empty, ", "), root.string()));
  }
  std::vector<std::string> unreadable;
  for (const auto& [rel, label] : files) {
    if (!has_extension(rel, media_extensions(kind))) unreadable.push_back(rel);
  }
  if (!unreadable.empty()) {
    const std::size_t shown = std::min<std::size_t>(unreadable.size(), 5);
    throw_error(Errc::kInvalidArgument,
                fmt::format("ImageFolder: {} file(s) of {} that torchvision's ImageFolder lists are not {} files, "
                            "which the native decoders read: {}{}; convert them, or run the dataset on the generic "
                            "Python path (dataset=)",
                            unreadable.size(), root.string(), or_list(media_extensions(kind)),
                            fmt::join(unreadable.begin(), unreadable.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                            unreadable.size() > shown ? fmt::format(" and {} more", unreadable.size() - shown) : ""));
  }
  files_.reserve(files.size());
  for (auto& [rel, label] : files) files_.push_back(Entry{std::move(rel), label});
}

std::int64_t FolderSource::label(std::size_t i) const {
  if (i >= files_.size()) throw_error(Errc::kInvalidArgument, fmt::format("ImageFolder: index {} out of range", i));
  return files_[i].label;
}

const std::string& FolderSource::relative_path(std::size_t i) const {
  if (i >= files_.size()) throw_error(Errc::kInvalidArgument, fmt::format("ImageFolder: index {} out of range", i));
  return files_[i].relative;
}

std::string FolderSource::name(std::size_t i) const { return (root_ / relative_path(i)).string(); }

std::span<const std::uint8_t> read_file(const std::string& path, std::vector<std::uint8_t>& scratch) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw SampleError(path, fmt::format("cannot open: {}", std::strerror(errno)));
  const std::streamoff size = in.tellg();
  if (size < 0) throw SampleError(path, "cannot read its size");
  scratch.resize(static_cast<std::size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(scratch.data()), size)) {
    throw SampleError(path, "read failed (file shrank while reading?)");
  }
  return {scratch.data(), scratch.size()};
}

std::span<const std::uint8_t> FolderSource::read(std::size_t i, std::vector<std::uint8_t>& scratch) const {
  return read_file(name(i), scratch);
}

std::unique_ptr<Source> open_source(const fs::path& path, MediaKind kind) {
  if (names_tar_shards(path.string())) return std::make_unique<TarShards>(path.string(), kind);
  const std::string ext = path.extension().string();
  if (is_remote(path.string())) {
    if (ext == ".csv" || ext == ".jsonl") {
      throw_error(Errc::kInvalidArgument, fmt::format("{}: a manifest is read from a local file (its samples may not be)",
                                                      path.string()));
    }
    return std::make_unique<RecordFile>(path);
  }
  std::error_code ec;
  if (fs::is_directory(path, ec)) return std::make_unique<FolderSource>(path, kind);
  // A path that is not there is no record file either: the message names what it is not.
  if (!fs::exists(path, ec)) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("{}: no such folder or file (a source is a folder by class, a manifest, a record "
                            "file or tar shards)", path.string()));
  }
  if (ext == ".csv" || ext == ".jsonl") return std::make_unique<Manifest>(path);
  return std::make_unique<RecordFile>(path);
}

}  // namespace dlop::media
