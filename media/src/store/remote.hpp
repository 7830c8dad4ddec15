// The parts of the object store shared by its files: where an s3:// object
// is and how requests to it are signed (s3_settings.cpp), and libcurl
// requests with retries (http_object.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "media/object_store.hpp"

namespace dlop::media::store {

// How to reach one remote object.
struct Target {
  std::string location;  // as the user wrote it: errors name it
  std::string url;       // the http(s) URL requested
  bool s3 = false;       // sign with SigV4
  std::string region;
  std::string access_key;
  std::string secret_key;
  std::string session_token;
};

// s3://bucket/key with the usual AWS settings: AWS_ENDPOINT_URL_S3 or
// AWS_ENDPOINT_URL (path-style requests; otherwise AWS's virtual-hosted
// https://bucket.s3.REGION.amazonaws.com), AWS_REGION or AWS_DEFAULT_REGION
// (else the profile's region, else us-east-1), AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else the profile AWS_PROFILE
// (default "default") of AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and
// AWS_CONFIG_FILE (~/.aws/config). http(s) URLs are taken as they are.
Target resolve(const std::string& location);

std::unique_ptr<ObjectReader> open_remote(const std::string& location);
// `object` behind the local range cache when DLOP_STORE_CACHE_DIR is set
// (range_cache.cpp), else `object` itself.
std::unique_ptr<ObjectReader> with_cache(std::unique_ptr<ObjectReader> object);
void put_remote(const std::string& location, const std::filesystem::path& file);

}  // namespace dlop::media::store
