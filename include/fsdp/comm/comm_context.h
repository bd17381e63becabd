// CommContext: where the collectives of an FSDP unit put their buffers (FSDP2's comm context).
// On the CPU it is the device alone; a device build adds what its collectives run on.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>

namespace fsdp::comm {

class ProcessGroup;

/// What the unit collectives (src/runtime/unit_collectives.h) need to know of the device they
/// communicate on, taken from the group so that no runtime file names a device. Copyable, cheap.
struct CommContext {
  /// Where communication buffers (all-gather outputs, reduce-scatter inputs and outputs) live:
  /// the group's device (the CPU for MPI, threads and Gloo; meta on a simulated group).
  c10::Device buffer_device = c10::Device(c10::kCPU);
  /// Where small tensors the library reads back after a collective live (flags, lengths,
  /// counts): the group's device, the CPU on a simulated group (which moves no data but answers
  /// such exchanges by its own rule).
  c10::Device flag_device = c10::Device(c10::kCPU);

  /// Options of a communication buffer of `dtype` (on buffer_device).
  at::TensorOptions buffer_options(c10::ScalarType dtype) const { return at::dtype(dtype).device(buffer_device); }
  /// Options of a flag tensor of `dtype` (on flag_device).
  at::TensorOptions flag_options(c10::ScalarType dtype) const { return at::dtype(dtype).device(flag_device); }

  /// The context of collectives over `group` (its backend's device). Not collective.
  static CommContext for_group(const ProcessGroup& group);
};

}  // namespace fsdp::comm
