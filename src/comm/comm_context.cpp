#include "fsdp/comm/comm_context.h"

#include "fsdp/comm/process_group.h"

namespace fsdp::comm {

CommContext CommContext::for_group(const ProcessGroup& group) {
  CommContext ctx;
  ctx.buffer_device = c10::Device(group.device_type());
  ctx.flag_device = group.simulated() ? c10::Device(c10::kCPU) : ctx.buffer_device;
  return ctx;
}

}  // namespace fsdp::comm
