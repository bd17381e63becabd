#include "agreement.h"

#include <ATen/ATen.h>

#include <vector>

namespace fsdp::checkpoint {

ErrorContext Agreement::in_phase(const char* phase) const {
  return ErrorContext{g_.rank(), "", str_cat(op_, " (", phase, ")")};
}

void Agreement::check_same_contents(uint64_t fingerprint) {
  at::Tensor mine = at::tensor({static_cast<int64_t>(fingerprint)}, at::kLong);
  at::Tensor all = at::empty({g_.size()}, at::kLong);
  g_.all_gather_into_tensor(all, mine)->wait();
  run("comparing the ranks' files", [&] {
    std::string differ;
    for (int r = 0; r < g_.size(); ++r) {
      if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    }
    FSDP_CHECK(differ.empty(), ErrorKind::kInvalidArgument, in_phase("comparing the ranks' files"),
               "the ranks read different files at this path: rank(s) ", differ,
               " hold other contents than rank 0 (fingerprints of what each read differ); give every rank the same "
               "files");
  });
}

Error Agreement::placed(const Error& e, const char* phase) const {
  std::string message = e.message();
  if (e.where().rank >= 0 || message.rfind("[fsdp rank ", 0) == 0) return e;  // already placed
  if (message.rfind("[fsdp] ", 0) == 0) message = message.substr(7);  // a message with its own prefix
  if (!e.where().op.empty()) message = e.where().op + ": " + message;
  ErrorContext where = in_phase(phase);
  where.unit = e.where().unit;
  return Error(e.kind(), std::move(where), message);
}

void Agreement::settle(const char* phase, const std::optional<Error>& mine) {
  at::Tensor who = at::tensor({mine ? int64_t(g_.rank()) : int64_t(-1)}, at::kLong);
  g_.all_reduce(who, comm::ReduceOp::kMax, comm::OpTag{"", op_})->wait();
  const int64_t failed = who.item<int64_t>();
  if (failed < 0) return;
  // "<kind>\n<what>" from each failing rank, "" from the others.
  const std::string payload =
      mine ? str_cat(static_cast<int>(mine->kind()), "\n", mine->what()) : std::string();
  const std::vector<std::string> all = comm::all_gather_strings(g_, payload);
  if (mine) throw *mine;
  const std::string& theirs = all.at(static_cast<size_t>(failed));
  const size_t nl = theirs.find('\n');
  ErrorKind kind = ErrorKind::kCollective;  // a malformed payload cannot happen; be safe anyway
  std::string what = theirs;
  if (nl != std::string::npos && nl > 0) {
    kind = static_cast<ErrorKind>(std::stoi(theirs.substr(0, nl)));
    what = theirs.substr(nl + 1);
  }
  throw Error(kind, ErrorContext{g_.rank(), "", op_},
              str_cat("failed on rank ", failed, " during ", phase, ": ", what));
}

}  // namespace fsdp::checkpoint
