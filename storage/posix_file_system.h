// The real file system: io_uring for reads and writes (several transfers in
// flight, O_DIRECT where the file system allows), pread/pwrite when a ring
// cannot be set up.
#pragma once

#include <memory>
#include <string>

#include "storage/file_system.h"

namespace ckptd::storage {

struct PosixFileSystemOptions {
  // Use io_uring when the kernel allows it; false forces pread/pwrite.
  bool use_io_uring = true;
  // Transfers one file keeps in flight on its ring.
  unsigned queue_depth = 16;
};

class PosixFileSystem;

std::unique_ptr<PosixFileSystem> NewPosixFileSystem(const PosixFileSystemOptions& options = {});

class PosixFileSystem : public FileSystem {
 public:
  // True when files from this instance use io_uring (probed at construction).
  virtual bool uses_io_uring() const = 0;
};

}  // namespace ckptd::storage
