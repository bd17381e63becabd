// What fsdp-train does on SIGINT (Ctrl-C) and SIGTERM (a scheduler, or the launcher ending the
// job): rank 0 writes one line naming the step, the newest complete checkpoint and how to go on,
// and every rank exits at once with 128 + the signal's number (130, 143). Checkpoints are
// published atomically (a directory renamed into place), so a save the signal cuts short leaves
// the previous checkpoint the newest. Documented in apps/README.md, "Signals".
#pragma once

#include <cstdint>
#include <string>

namespace apps::train {

/// Installs the SIGINT and SIGTERM handlers; `rank` decides who writes the line (rank 0). Call
/// once, before the set-up. Not collective.
void install_interrupt_handlers(int rank);

/// From now on SIGINT and SIGTERM end the process as by default, without the line (a failure is
/// being reported). Not collective.
void quiet_interrupt_handlers();

/// What the line says from now on: the step in progress (0: the set-up, before step 1; past `steps`:
/// the exports after the last step) of `steps`,
/// and the newest complete checkpoint (empty: none; `save_dir` is --save, empty without it).
/// Called by the trainer between steps and after each save. Not collective; not thread-safe
/// (one caller), safe against the handler (the line is built here and swapped in whole).
/// `saving`: the checkpoint of `step` is being written (the step itself is done).
void set_interrupt_state(int64_t step, int64_t steps, const std::string& newest_checkpoint, const std::string& save_dir,
                         bool saving = false);

}  // namespace apps::train
