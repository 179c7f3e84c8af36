// ckptctl commands that work on a storage root or a shard file directly,
// without a coordinator: inspect, offline verify, export and start-fresh.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "storage/file_system.h"

namespace ckptd::cli {

// ckptctl inspect <shard file> [--json] [--chunks]
// Returns a base::ExitCode.
int RunInspect(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
               std::ostream& err);

// ckptctl verify --root <dir> [--job J] [--step S] [--json] [--threads N]
// Exit 0 when every committed step checked verifies, 1 when any does not
// (or a named job/step is not committed), 2 on usage errors.
int RunVerify(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
              std::ostream& err);

// ckptctl start-fresh --root <dir> --job J [--note TEXT]
// Records the operator's choice to start J from scratch over its committed
// steps, all damaged (storage::CheckpointStore::AllowFreshStart). Exit 0
// when recorded, 1 when refused (an intact step exists, nothing committed,
// storage errors), 2 on usage errors.
int RunStartFresh(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
                  std::ostream& err);

// ckptctl export --root <dir> --job J [--step S] --out DIR [--format safetensors]
//                [--components LIST] [--max-file-bytes N] [--threads N] [--json]
// Writes a committed step's full tensors as safetensors files
// (storage::ExportSafetensors). Exit 0 when written, 1 when the step cannot
// be exported, 2 on usage errors.
int RunExport(storage::FileSystem* fs, const std::vector<std::string>& argv, std::ostream& out,
              std::ostream& err);

extern const char kExportHelp[];
extern const char kStartFreshHelp[];
extern const char kInspectHelp[];
extern const char kVerifyHelp[];

}  // namespace ckptd::cli
