// Queries and compositions over a ProcessGroup that need no access to its inside.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "fsdp/comm/comm_context.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/common/check.h"

namespace fsdp::comm {

int uniform_ranks_per_host(const ProcessGroup& group) {
  const std::vector<int>& hosts = group.host_of_ranks();
  const int n = group.size();
  const int k = n / group.num_hosts();
  bool ok = k * group.num_hosts() == n;
  for (int r = 0; ok && r < n; ++r) ok = hosts[static_cast<size_t>(r)] == r / k;
  if (!ok) {
    std::ostringstream layout;
    for (int h = 0; h < group.num_hosts(); ++h) {
      layout << (h ? "; " : "") << "host " << h << ": ranks";
      for (int r = 0; r < n; ++r) {
        if (hosts[static_cast<size_t>(r)] == h) layout << ' ' << r;
      }
    }
    FSDP_CHECK(false, ErrorKind::kUnsupported, (ErrorContext{group.rank(), "", "uniform_ranks_per_host"}),
               "expected the same number of consecutive ranks on every host (one shard group per host), "
               "got ", group.size(), " ranks on ", group.num_hosts(), " hosts (", layout.str(),
               "); launch the same number of ranks per host, mapped by slot (mpirun -npernode K, "
               "srun --ntasks-per-node K)");
  }
  return k;
}

std::vector<std::string> all_gather_strings(ProcessGroup& group, const std::string& mine, const OpTag& tag) {
  const int n = group.size();
  const CommContext ctx = CommContext::for_group(group);
  at::Tensor len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong).to(ctx.flag_device);
  at::Tensor lens = at::empty({n}, ctx.flag_options(at::kLong));
  group.all_gather_into_tensor(lens, len, tag)->wait();
  const at::Tensor host_lens = lens.to(at::TensorOptions().device());  // read on the host
  const int64_t max_len = std::max<int64_t>(host_lens.max().item<int64_t>(), 1);
  at::Tensor buf = at::zeros({max_len}, at::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  at::Tensor all = at::empty({n * max_len}, ctx.flag_options(at::kByte));
  group.all_gather_into_tensor(all, buf.to(ctx.flag_device), tag)->wait();
  const at::Tensor host_all = all.to(at::TensorOptions().device());
  std::vector<std::string> out;
  out.reserve(n);
  const char* base = static_cast<const char*>(host_all.data_ptr());
  const int64_t* l = host_lens.data_ptr<int64_t>();
  for (int r = 0; r < n; ++r) out.emplace_back(base + r * max_len, static_cast<size_t>(l[r]));
  return out;
}

}  // namespace fsdp::comm
