// What every C entry point of lethe's bridges shares: C++ exceptions become an error
// message handed back to Rust (freed by lethe_free_error), never an abort.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace lethe {

// Copies `message` into a malloc'ed C string for the caller.
inline void set_error(char** error, const std::string& message) {
  if (error == nullptr) return;
  *error = static_cast<char*>(std::malloc(message.size() + 1));
  if (*error != nullptr) std::memcpy(*error, message.c_str(), message.size() + 1);
}

// Runs `body`, turning any exception into an error message and a status of -1.
template <typename F>
int guarded(char** error, F body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    set_error(error, e.what());
  } catch (...) {
    set_error(error, "unknown C++ exception");
  }
  return -1;
}

}  // namespace lethe
