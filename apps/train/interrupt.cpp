// SIGINT / SIGTERM in fsdp-train (interrupt.h).
#include "train/interrupt.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace apps::train {
namespace {

// Two buffers: the trainer writes the one the handler does not read, then flips `current`.
constexpr size_t kLineBytes = 2048;
char lines[2][kLineBytes] = {"before step 1 (set-up): nothing was trained and no checkpoint was written\n", ""};
std::atomic<int> current{0};
int writer_rank = -1;

void write_all(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

extern "C" void on_signal(int sig) {
  if (writer_rank == 0) {
    const char* head = sig == SIGINT ? "fsdp-train: interrupted by SIGINT " : "fsdp-train: stopped by SIGTERM ";
    write_all(head, std::strlen(head));
    const char* line = lines[current.load()];
    write_all(line, std::strlen(line));
  }
  ::_exit(128 + sig);
}

}  // namespace

void install_interrupt_handlers(int rank) {
  writer_rank = rank;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

void quiet_interrupt_handlers() {
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

void set_interrupt_state(int64_t step, int64_t steps, const std::string& newest_checkpoint, const std::string& save_dir,
                         bool saving) {
  std::string s = step > steps ? "after the last step (" + std::to_string(steps) + "), in the exports"
                 : saving       ? "while saving the checkpoint of step " + std::to_string(step) + " of " +
                                std::to_string(steps) + " (left incomplete, unused)"
                 : step > 0     ? "during step " + std::to_string(step) + " of " + std::to_string(steps)
                                : std::string("before step 1 (set-up)");
  if (!newest_checkpoint.empty()) {
    s += "; the newest checkpoint is " + newest_checkpoint + ": to continue, run the same command with --resume " +
         newest_checkpoint + (save_dir.empty() ? "" : " (or --resume latest)");
  } else if (!save_dir.empty()) {
    s += "; no checkpoint was written yet (--save-every K writes one every K steps): the run starts over";
  } else {
    s += "; no checkpoint was written (--save DIR --save-every K would let a run continue)";
  }
  s += "\n";
  const int next = 1 - current.load();
  std::strncpy(lines[next], s.c_str(), kLineBytes - 2);
  lines[next][kLineBytes - 2] = '\n';
  lines[next][kLineBytes - 1] = '\0';
  current.store(next);
}

}  // namespace apps::train
