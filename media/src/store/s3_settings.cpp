// Where an s3:// object is and whose keys sign its requests, from the
// environment and the AWS CLI's files (their documented precedence: the
// environment first, then the profile).
#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>

#include "core/error.hpp"
#include "remote.hpp"

namespace dlop::media::store {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

// The `key = value` lines of one [section] of an INI file; empty when the
// file or the section is missing.
std::map<std::string, std::string> ini_section(const std::string& path, const std::string& section) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      inside = trim(line.substr(1, line.size() - 2)) == section;
      continue;
    }
    const auto eq = line.find('=');
    if (inside && eq != std::string::npos) out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* variable, const char* relative) {
  std::string path = env(variable);
  if (path.empty() && !env("HOME").empty()) path = env("HOME") + relative;
  return path;
}

// S3's URI encoding of a key: unreserved characters and '/' stay.
std::string encode_key(const std::string& key) {
  std::string out;
  for (const unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

}  // namespace

Target resolve(const std::string& location) {
  Target t;
  t.location = location;
  if (location.rfind("s3://", 0) != 0) {
    t.url = location;
    return t;
  }
  const std::string rest = location.substr(5);
  const auto slash = rest.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size()) {
    throw_error(Errc::kInvalidArgument, fmt::format("{}: not s3://bucket/key", location));
  }
  const std::string bucket = rest.substr(0, slash);
  const std::string key = rest.substr(slash + 1);
  t.s3 = true;

  std::string profile = env("AWS_PROFILE");
  if (profile.empty()) profile = "default";
  const auto credentials = ini_section(home_file("AWS_SHARED_CREDENTIALS_FILE", "/.aws/credentials"), profile);
  const std::string config_file = home_file("AWS_CONFIG_FILE", "/.aws/config");
  auto config = ini_section(config_file, profile == "default" ? "default" : "profile " + profile);
  const auto get = [](const std::map<std::string, std::string>& m, const char* k) {
    const auto it = m.find(k);
    return it == m.end() ? std::string() : it->second;
  };

  t.region = env("AWS_REGION");
  if (t.region.empty()) t.region = env("AWS_DEFAULT_REGION");
  if (t.region.empty()) t.region = get(config, "region");
  if (t.region.empty()) t.region = "us-east-1";

  t.access_key = env("AWS_ACCESS_KEY_ID");
  t.secret_key = env("AWS_SECRET_ACCESS_KEY");
  t.session_token = env("AWS_SESSION_TOKEN");
  if (t.access_key.empty() || t.secret_key.empty()) {
    t.access_key = get(credentials, "aws_access_key_id");
    t.secret_key = get(credentials, "aws_secret_access_key");
    t.session_token = get(credentials, "aws_session_token");
  }
  if (t.access_key.empty() || t.secret_key.empty()) {
    throw_error(Errc::kInvalidArgument,
                fmt::format("{}: no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile "
                            "'{}' in ~/.aws/credentials (AWS_PROFILE chooses it)",
                            location, profile));
  }

  std::string endpoint = env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = get(config, "endpoint_url");
  if (endpoint.empty()) {
    t.url = fmt::format("https://{}.s3.{}.amazonaws.com/{}", bucket, t.region, encode_key(key));
  } else {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    t.url = fmt::format("{}/{}/{}", endpoint, bucket, encode_key(key));
  }
  return t;
}

}  // namespace dlop::media::store
